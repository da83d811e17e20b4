"""The AppWrapper API: the CRD and the pydantic models agree; bad input is explained."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.api import (
    MAX_CONDITIONS,
    MAX_ITEMS,
    AppWrapper,
    Condition,
    InvalidSpec,
    latest,
    parse_appwrapper,
    set_condition,
)
from dispatcher.api.v1beta2 import AppWrapperV2
from dispatcher.controller.webhook.server import CONVERT_PATH

CRD = Path(__file__).parents[2] / "crds" / "appwrappers.workload.codeflare.dev.yaml"


def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD.read_text())


def crd_schema() -> dict[str, Any]:
    (version,) = crd()["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


V1BETA2_PATCH = CRD.parents[1] / "deploy" / "v1beta2" / "version.yaml"


def v1beta2_patch() -> dict[str, Any]:
    """deploy/v1beta2's patch of the CRD, by the path each operation adds."""
    return {op["path"]: op["value"] for op in yaml.safe_load(V1BETA2_PATCH.read_text())}


def model_schema() -> dict[str, Any]:
    return AppWrapper.model_json_schema(mode="validation")


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Follow $ref and drop pydantic's `X | None` (an absent field in the CRD)."""
    if "$ref" in node:
        node = defs[node["$ref"].split("/")[-1]]
    if "anyOf" in node:
        kinds = [k for k in node["anyOf"] if k.get("type") != "null"]
        if len(kinds) == 1:
            merged = {**node, **_resolve(kinds[0], defs)}
            merged.pop("anyOf")
            return merged
    return node


def compare(crd_node: dict[str, Any], model_node: dict[str, Any], defs: dict[str, Any],
            path: str, problems: list[str]) -> None:
    model_node = _resolve(model_node, defs)
    ctype = crd_node.get("type")
    mtype = model_node.get("type")
    if crd_node.get("x-kubernetes-int-or-string"):
        kinds = {k.get("type") for k in model_node.get("anyOf", [])}
        if not {"integer", "string"} <= kinds:
            problems.append(f"{path}: the CRD takes an int-or-string, the model {kinds}")
        return
    if ctype != mtype:
        problems.append(f"{path}: type {ctype} in the CRD, {mtype} in the model")
        return
    for key in ("default", "minimum", "enum", "format"):
        if key in crd_node and crd_node.get(key) != model_node.get(key):
            problems.append(f"{path}: {key} {crd_node.get(key)!r} in the CRD, "
                            f"{model_node.get(key)!r} in the model")
    if ctype == "array":
        compare(crd_node["items"], model_node["items"], defs, f"{path}[]", problems)
    if ctype != "object":
        return
    cprops: dict[str, Any] = crd_node.get("properties", {})
    mprops: dict[str, Any] = model_node.get("properties", {})
    if crd_node.get("x-kubernetes-preserve-unknown-fields") and not cprops:
        if mprops:
            problems.append(f"{path}: free-form in the CRD, but the model lists {sorted(mprops)}")
        return
    for name in sorted(set(cprops) - set(mprops)):
        problems.append(f"{path}.{name}: in the CRD, not in the model")
    for name in sorted(set(mprops) - set(cprops)):
        problems.append(f"{path}.{name}: in the model, not in the CRD (the API server "
                        "would prune it)")
    if set(crd_node.get("required", [])) != set(model_node.get("required", [])):
        problems.append(f"{path}: required {sorted(crd_node.get('required', []))} in the CRD, "
                        f"{sorted(model_node.get('required', []))} in the model")
    if "additionalProperties" in crd_node:
        compare(crd_node["additionalProperties"], model_node.get("additionalProperties", {}),
                defs, f"{path}{{}}", problems)
    for name in sorted(set(cprops) & set(mprops)):
        compare(cprops[name], mprops[name], defs, f"{path}.{name}", problems)


def test_crd_and_models_agree_field_by_field() -> None:
    schema, model = crd_schema(), model_schema()
    defs = model["$defs"]
    problems: list[str] = []
    for part in ("spec", "status"):
        compare(schema["properties"][part], model["properties"][part], defs, part, problems)
    assert problems == []


def test_the_v1beta2_crd_and_models_agree_field_by_field() -> None:
    schema = v1beta2_patch()["/spec/versions/-"]["schema"]["openAPIV3Schema"]
    model = AppWrapperV2.model_json_schema(mode="validation")
    problems: list[str] = []
    for part in ("spec", "status"):
        compare(schema["properties"][part], model["properties"][part], model["$defs"], part,
                problems)
    assert problems == []


def test_v1beta2_is_served_beside_v1beta1_stored_and_converted_by_the_webhook() -> None:
    patch = v1beta2_patch()
    version, conversion = patch["/spec/versions/-"], patch["/spec/conversion"]
    assert (version["name"], version["served"], version["storage"]) == ("v1beta2", True, False)
    assert crd()["spec"]["versions"][0]["storage"] is True  # v1beta1 stays stored
    service = conversion["webhook"]["clientConfig"]["service"]
    assert conversion["strategy"] == "Webhook"
    assert (service["name"], service["path"]) == ("dispatcher-webhook", CONVERT_PATH)


def test_the_drift_check_notices_a_field_missing_from_the_crd() -> None:
    schema, model = crd_schema(), model_schema()
    del schema["properties"]["status"]["properties"]["requestedGPUs"]
    schema["properties"]["spec"]["properties"]["priority"]["default"] = 5
    problems: list[str] = []
    for part in ("spec", "status"):
        compare(schema["properties"][part], model["properties"][part], model["$defs"],
                part, problems)
    assert "status.requestedGPUs: in the model, not in the CRD (the API server would prune it)" \
        in problems
    assert "spec.priority: default 5 in the CRD, 0 in the model" in problems


def test_crd_names_status_subresource_and_printer_columns() -> None:
    doc = crd()
    assert doc["metadata"]["name"] == "appwrappers.workload.codeflare.dev"
    assert doc["spec"]["names"]["shortNames"] == ["aw"]
    (version,) = doc["spec"]["versions"]
    assert version["name"] == "v1beta1" and version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["STATE"] == ".status.state"
    assert columns["CONDITION"] == ".status.queuejobstate"
    # Every column points at a field the models know.
    status_fields = set(model_schema()["$defs"]["AppWrapperStatus"]["properties"])
    for path in columns.values():
        section, _, field = path.lstrip(".").partition(".")
        if section == "status":
            assert field in status_fields, path


MCAD_EXAMPLE = """
apiVersion: workload.codeflare.dev/v1beta1
kind: AppWrapper
metadata:
  name: raycluster-complete
  namespace: default
spec:
  priority: 9
  schedulingSpec:
    minAvailable: 3
    requeuing:
      timeInSeconds: 120
      growthType: exponential
  resources:
    GenericItems:
      - replicas: 1
        custompodresources:
          - replicas: 1
            requests: {cpu: 2, memory: 8G, nvidia.com/gpu: 0}
            limits: {cpu: 2, memory: 8G, nvidia.com/gpu: 0}
          - replicas: 2
            requests: {cpu: "500m", memory: 1G, nvidia.com/gpu: 1}
            limits: {cpu: 1, memory: 1G, nvidia.com/gpu: 1}
        generictemplate:
          apiVersion: ray.io/v1
          kind: RayCluster
          metadata:
            name: raycluster-complete
            namespace: default
          spec:
            headGroupSpec:
              template:
                spec:
                  containers: [{name: ray-head, image: rayproject/ray}]
"""


def test_an_mcad_appwrapper_parses_unchanged() -> None:
    aw = parse_appwrapper(yaml.safe_load(MCAD_EXAMPLE))
    assert aw.metadata.name == "raycluster-complete"
    assert aw.spec.priority == 9
    assert aw.spec.schedulingSpec.minAvailable == 3
    assert aw.spec.schedulingSpec.requeuing.timeInSeconds == 120
    item = aw.spec.resources.GenericItems[0]
    assert [c.replicas for c in item.custompodresources] == [1, 2]
    assert item.generictemplate["kind"] == "RayCluster"
    # Defaults a user did not write are the CRD's.
    assert aw.spec.schedulingSpec.requeuing.maxNumRequeuings == 0
    assert aw.status.state == ""


def _invalid(doc: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidSpec) as info:
        parse_appwrapper(doc)
    return info.value.problems


def _aw(items: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": "a", "namespace": "team"},
            "spec": {"resources": {"GenericItems": items}, **spec}}


def _job(name: str = "j", **meta: Any) -> dict[str, Any]:
    return {"generictemplate": {"apiVersion": "batch/v1", "kind": "Job",
                                "metadata": {"name": name, **meta}}}


def test_no_items_says_wrap_something() -> None:
    assert _invalid(_aw([])) == [
        "spec.resources.GenericItems is empty: wrap at least one object"]


def test_an_appwrapper_wraps_at_most_max_items_objects() -> None:
    parse_appwrapper(_aw([_job(f"j{i}") for i in range(MAX_ITEMS)]))
    assert _invalid(_aw([_job(f"j{i}") for i in range(MAX_ITEMS + 1)])) == [
        f"spec.resources.GenericItems: {MAX_ITEMS + 1} items, more than the {MAX_ITEMS} an "
        "AppWrapper may wrap: wrap fewer objects (a gang's size is in their replicas), or "
        "split them into several AppWrappers"]


def test_wrong_types_name_the_field_and_the_value() -> None:
    problems = _invalid(_aw([_job()], priority="high",
                            schedulingSpec={"requeuing": {"timeInSeconds": -1}}))
    assert "spec.priority: must be an integer, got 'high'" in problems
    assert "spec.schedulingSpec.requeuing.timeInSeconds: must be ≥ 0, got -1" in problems


def test_item_problems_are_all_reported_with_their_index() -> None:
    problems = _invalid(_aw([
        _job("same"),
        _job("same"),
        {"generictemplate": {"kind": "Job", "metadata": {"name": "x"}}},
        _job("y", namespace="other"),
        {"generictemplate": {"apiVersion": "workload.codeflare.dev/v1beta1",
                             "kind": "AppWrapper", "metadata": {"name": "inner"}}},
    ]))
    assert any(p.startswith("spec.resources.GenericItems[1].generictemplate: Job 'same' is "
                            "also wrapped by spec.resources.GenericItems[0]") for p in problems)
    assert any("GenericItems[2].generictemplate: missing apiVersion" in p for p in problems)
    assert any("GenericItems[3].generictemplate.metadata.namespace" in p
               and "'team'" in p for p in problems)
    assert any("GenericItems[4]" in p and "cannot be nested" in p for p in problems)


def test_old_mcad_group_gets_a_hint() -> None:
    doc = _aw([_job()])
    doc["apiVersion"] = "mcad.ibm.com/v1beta1"
    (problem,) = _invalid(doc)
    assert "change apiVersion to workload.codeflare.dev/v1beta1" in problem


def test_bad_quantity_is_rejected_with_its_path() -> None:
    item = _job() | {"custompodresources": [{"replicas": 1, "requests": {"cpu": "lots"}}]}
    (problem,) = _invalid(_aw([item]))
    assert problem.startswith("spec.resources.GenericItems[0].custompodresources[0].requests.cpu")


T0 = datetime(2026, 11, 1, 10, 0, tzinfo=UTC)


def test_set_condition_appends_updates_and_reports_no_change() -> None:
    conds, changed = set_condition([], "Queueing", "AwaitingHeadOfLine", "behind a", T0)
    assert changed and [c.type for c in conds] == ["Queueing"]
    same, changed = set_condition(conds, "Queueing", "AwaitingHeadOfLine", "behind a",
                                  T0 + timedelta(seconds=5))
    assert not changed and same == conds
    updated, changed = set_condition(conds, "Queueing", "AwaitingHeadOfLine", "behind b",
                                     T0 + timedelta(seconds=9))
    assert changed and len(updated) == 1
    assert updated[0].message == "behind b"
    assert updated[0].lastUpdateMicroTime == T0 + timedelta(seconds=9)
    assert updated[0].lastTransitionMicroTime == T0  # status did not flip
    moved, _ = set_condition(updated, "HeadOfLine", "FrontOfQueue", "", T0)
    assert [c.type for c in moved] == ["Queueing", "HeadOfLine"]
    assert latest(moved) == moved[-1]
    assert conds[0].message == "behind a"  # the input was not mutated


def test_condition_history_is_bounded() -> None:
    conds: list[Condition] = []
    for i in range(MAX_CONDITIONS + 5):
        conds, _ = set_condition(conds, f"Type{i}", "r", "", T0)
    assert len(conds) == MAX_CONDITIONS


def test_conditions_keep_mcad_s_history_each_with_the_generation_it_was_reached_for(
        ) -> None:
    # MCAD's history: a type entered again is appended again; each condition says for
    # which spec generation it was reached (kubectl wait ignores one of an older spec).
    conds: list[Condition] = []
    for type_ in ("Init", "Queueing", "Failed"):
        conds, _ = set_condition(conds, type_, "", "", T0, generation=1)
    for type_ in ("Queueing", "Failed"):
        conds, _ = set_condition(conds, type_, "", "", T0 + timedelta(seconds=5),
                                 generation=2)
    assert [(c.type, c.observedGeneration) for c in conds] == [
        ("Init", 1), ("Queueing", 1), ("Failed", 1), ("Queueing", 2), ("Failed", 2)]
    # The same words for a newer spec are news: the condition is reached for it now.
    again, changed = set_condition(conds, "Failed", "", "", T0, generation=3)
    assert changed and again[-1].observedGeneration == 3 and len(again) == 5


def test_status_round_trips_in_the_api_servers_time_format() -> None:
    doc = _aw([_job()])
    doc["status"] = {"conditions": [{"type": "Init", "lastUpdateMicroTime":
                                     "2026-11-01T10:00:00.123456Z"}]}
    aw = parse_appwrapper(doc)
    dumped = aw.model_dump(mode="json", exclude_none=True)
    assert dumped["status"]["conditions"][0]["lastUpdateMicroTime"] == \
        "2026-11-01T10:00:00.123456Z"


def test_mcad_s_old_items_field_is_in_the_crd_as_in_mcad_s() -> None:
    """codeflare-sdk writes `spec.resources.Items: []` beside GenericItems, and MCAD's CRD
    lists the field: without it, kubectl's strict field validation refuses the manifest
    ('unknown field "spec.resources.Items"')."""
    resources = crd_schema()["properties"]["spec"]["properties"]["resources"]["properties"]
    assert resources["Items"]["type"] == "array"
    aw = parse_appwrapper({
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": "jobtest", "namespace": "default"},
        "spec": {"resources": {"Items": [], "GenericItems": [{"generictemplate": {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}}]}}})
    assert len(aw.spec.resources.GenericItems) == 1


def test_printer_columns_show_the_queue_position_and_the_estimated_start_as_a_time() -> None:
    (version,) = crd()["spec"]["versions"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert (columns["POSITION"]["type"], columns["POSITION"]["jsonPath"]) == (
        "integer", ".status.queuePosition")
    # Typed `date`, kubectl would print the estimate as an age: "<invalid>" while it is
    # still ahead (seen with kubectl 1.34), which is all the time it is of use.
    eta = columns["ETA"]
    assert (eta["type"], eta.get("format"), eta["jsonPath"]) == (
        "string", "date-time", ".status.estimatedStart")


def _columns(version: dict[str, Any]) -> list[dict[str, Any]]:
    columns: list[dict[str, Any]] = version["additionalPrinterColumns"]
    return columns


def test_v1beta2_prints_the_dispatchers_columns_as_v1beta1_does() -> None:
    """Served, v1beta2 is kubectl's default: `kubectl get aw -o wide` must not lose the
    queue position, estimate, GPUs or message; AGE last; CLUSTER in -o wide only."""
    (v1,) = crd()["spec"]["versions"]
    v2 = v1beta2_patch()["/spec/versions/-"]
    status_v2 = v2["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    for version in (v1, v2):
        columns = _columns(version)
        assert columns[-1]["name"] == "AGE"
        wide = {c["name"]: c for c in columns if c.get("priority") == 1}
        assert {"POSITION", "ETA", "GPUS", "MESSAGE", "CLUSTER"} <= set(wide)
    v1_wide = {c["name"]: c for c in _columns(v1) if c.get("priority") == 1}
    v2_wide = {c["name"]: c for c in _columns(v2) if c.get("priority") == 1}
    for name in ("POSITION", "ETA", "GPUS", "MESSAGE", "CLUSTER"):
        assert v2_wide[name] == v1_wide[name], name
        path = v2_wide[name]["jsonPath"]
        if path.startswith(".status."):  # a field the API server keeps in v1beta2
            assert path.removeprefix(".status.") in status_v2, name
