"""Conversion between AppWrapper v1beta1 and v1beta2: both ways, nothing lost."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api.conversion import (
    UNCONVERTED_ANNOTATION,
    V1BETA1_FIELDS_ANNOTATION,
    V1BETA2_FIELDS_ANNOTATION,
    ConversionError,
    convert,
    to_v1beta1,
    to_v1beta2,
    v1beta2_fields,
)
from dispatcher.api.conversion_review import conversion_response
from dispatcher.api.models import parse_appwrapper
from dispatcher.api.v1beta2 import parse_appwrapper_v1beta2
from dispatcher.review import review

from .builders import nested

V1 = "workload.codeflare.dev/v1beta1"
V2 = "workload.codeflare.dev/v1beta2"

names = st.text("abcdefghij-", min_size=1, max_size=8).filter(
    lambda s: s[0].isalpha() and s[-1].isalpha())
keys = st.sampled_from(["a", "b/c", "example.com/x", "workload.codeflare.dev/held-by"])
string_maps = st.dictionaries(keys, st.text(max_size=5), max_size=3)
scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=4)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.text("abc", min_size=1, max_size=3), inner, max_size=3), max_leaves=6)
stamps = st.sampled_from(["2024-05-01T10:00:00.123456Z", "2024-05-01T10:00:01Z"])


def templates() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({
        "apiVersion": st.sampled_from(["batch/v1", "v1", "apps/v1"]),
        "kind": st.sampled_from(["Job", "Pod", "Deployment"]),
        "metadata": st.fixed_dictionaries({"name": names}),
    }, optional={"spec": st.dictionaries(st.sampled_from(["a", "b"]), json_values,
                                          max_size=2)})


def metadata() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"name": names},
        optional={"namespace": names, "labels": string_maps, "annotations": string_maps,
                  "uid": st.text("0123abc", max_size=6), "generation": st.integers(0, 9)})


v1_items = st.fixed_dictionaries({"generictemplate": templates()}, optional={
    "replicas": st.integers(0, 4), "minavailable": st.integers(0, 4),
    "priority": st.integers(-3, 3), "completionstatus": st.sampled_from(["Complete", ""]),
    "custompodresources": st.lists(st.fixed_dictionaries(
        {"replicas": st.integers(0, 3), "requests": st.fixed_dictionaries({"cpu": st.just(1)})}),
        max_size=2),
})

v1_statuses = st.fixed_dictionaries({}, optional={
    "state": st.sampled_from(["", "Pending", "Running", "Completed", "Failed", "Deleted"]),
    "queuejobstate": st.sampled_from(["Queueing", "Dispatched", "Running", "PreemptCandidate"]),
    "numberOfRequeueings": st.integers(0, 4),
    "message": st.text(max_size=6),
    "conditions": st.lists(st.fixed_dictionaries(
        {"type": st.sampled_from(["Init", "Dispatched", "Running"])},
        optional={"reason": st.sampled_from(["PodsRunning", "Held", "odd reason"]),
                  "lastTransitionMicroTime": stamps}), max_size=3),
    "wrappedItems": st.lists(st.fixed_dictionaries(
        {"kind": st.just("Job"), "name": names},
        optional={"apiVersion": st.just("batch/v1"), "uid": st.text("abc", max_size=3)}),
        max_size=2),
    "workerCluster": st.sampled_from(["w1", "w2"]), "managerUid": st.text("abc", max_size=3),
})

v1_wrappers = st.fixed_dictionaries({
    "apiVersion": st.just(V1), "kind": st.just("AppWrapper"), "metadata": metadata(),
    "spec": st.fixed_dictionaries(
        {"resources": st.fixed_dictionaries({}, optional={
            "GenericItems": st.lists(v1_items, max_size=3), "Items": st.just([])})},
        optional={"priority": st.integers(-5, 5), "priorityslope": st.floats(0, 1),
                  "schedulingSpec": st.fixed_dictionaries({}, optional={
                      "minAvailable": st.integers(0, 5),
                      "requeuing": st.fixed_dictionaries({"maxNumRequeuings": st.integers(0, 3)})}),
                  "service": st.dictionaries(st.just("spec"), json_values, max_size=1)}),
}, optional={"status": v1_statuses})

pod_sets = st.fixed_dictionaries({"path": st.sampled_from(["template.spec.template", "template"])},
                                 optional={"replicas": st.integers(0, 4),
                                           "annotations": string_maps})
pod_set_infos = st.fixed_dictionaries({}, optional={
    "labels": string_maps, "annotations": string_maps, "nodeSelector": string_maps,
    "tolerations": st.lists(st.fixed_dictionaries({"key": names, "operator": st.just("Exists")}),
                            max_size=1),
    "schedulingGates": st.lists(st.fixed_dictionaries({"name": names}), max_size=1)})
components = st.fixed_dictionaries({"template": templates()}, optional={
    "podSets": st.lists(pod_sets, max_size=2), "podSetInfos": st.lists(pod_set_infos, max_size=2),
    "annotations": string_maps})
meta_conditions = st.lists(st.fixed_dictionaries({
    "type": st.sampled_from(["QuotaReserved", "PodsReady", "Unhealthy"]),
    "status": st.sampled_from(["True", "False"]), "reason": st.sampled_from(["A", "B"]),
    "message": st.text(max_size=5), "lastTransitionTime": st.just("2024-05-01T10:00:00Z")}),
    max_size=3)
v2_statuses = st.fixed_dictionaries({}, optional={
    "phase": st.sampled_from(["", "Suspended", "Resuming", "Running", "Resetting", "Succeeded",
                              "Failed", "Terminating"]),
    "resettingCount": st.integers(0, 4), "conditions": meta_conditions,
    "componentStatus": st.lists(st.fixed_dictionaries({
        "name": names, "kind": st.just("Job"), "apiVersion": st.just("batch/v1"),
        "podSets": st.lists(pod_sets, max_size=1)}), max_size=2),
    "workerCluster": st.sampled_from(["w1", "w2"]), "managerUid": st.text("abc", max_size=3)})

v2_wrappers = st.fixed_dictionaries({
    "apiVersion": st.just(V2), "kind": st.just("AppWrapper"), "metadata": metadata(),
    "spec": st.fixed_dictionaries({"components": st.lists(components, max_size=3)}, optional={
        "suspend": st.booleans(), "managedBy": st.sampled_from(["", "kueue.x-k8s.io/multikueue"])}),
}, optional={"status": v2_statuses})


@settings(max_examples=300)
@given(v1_wrappers)
def test_a_v1beta1_wrapper_converted_to_v1beta2_and_back_is_unchanged(aw: dict[str, Any]) -> None:
    assert to_v1beta1(to_v1beta2(aw)) == aw


@settings(max_examples=300)
@given(v2_wrappers)
def test_a_v1beta2_wrapper_converted_to_v1beta1_and_back_is_unchanged(aw: dict[str, Any]) -> None:
    assert to_v1beta2(to_v1beta1(aw)) == aw


@settings(max_examples=150)
@given(v2_wrappers)
def test_a_v1beta1_form_of_a_v1beta2_wrapper_round_trips_too(aw: dict[str, Any]) -> None:
    # What the API server stores for a wrapper written as v1beta2, read back as v1beta2 by a
    # client, then written again: the stored form is unchanged.
    stored = to_v1beta1(aw)
    assert to_v1beta1(to_v1beta2(stored)) == stored


@settings(max_examples=150)
@given(v2_wrappers, st.fixed_dictionaries({}, optional={
    "priority": st.integers(-5, 5), "priorityslope": st.floats(0, 1)}), string_maps)
def test_a_v1beta2_wrapper_that_gained_v1beta1_fields_stays_written_as_v1beta2(
        aw: dict[str, Any], defaults: dict[str, Any], added: dict[str, str]) -> None:
    # The API server's defaults (MCAD's priority 0) and the webhook's annotations land on
    # the stored form; the admission webhook is sent it through v1beta2 and back.
    stored = to_v1beta1(aw)
    stored["spec"].update(defaults)
    stored["metadata"].setdefault("annotations", {}).update(added)
    again = to_v1beta1(to_v1beta2(stored))
    fields = v1beta2_fields(again["metadata"]["annotations"])
    assert fields.written_as_v1beta2
    assert fields == v1beta2_fields(stored["metadata"]["annotations"])
    # Exactly as stored, but that the annotation may no longer say the wrapper once had no
    # other annotation.
    assert {**again, "metadata": _without_v1beta2_fields(again["metadata"])} == \
        {**stored, "metadata": _without_v1beta2_fields(stored["metadata"])}


def _without_v1beta2_fields(metadata: dict[str, Any]) -> dict[str, Any]:
    annotations = {k: v for k, v in metadata["annotations"].items()
                   if k != V1BETA2_FIELDS_ANNOTATION}
    return {**metadata, "annotations": annotations}


@settings(max_examples=150)
@given(v1_wrappers)
def test_a_v1beta2_form_of_a_v1beta1_wrapper_round_trips_too(aw: dict[str, Any]) -> None:
    shown = to_v1beta2(aw)
    assert to_v1beta2(to_v1beta1(shown)) == shown


@settings(max_examples=100)
@given(v2_wrappers)
def test_a_v1beta2_wrapper_stays_one_through_the_api_servers_defaults(
        aw: dict[str, Any]) -> None:
    # The API server defaults the stored form's spec.priority and priorityslope; read as
    # v1beta2 and written back, the wrapper is still one written as v1beta2 (reset, not
    # requeued), and stored as it was.
    stored = to_v1beta1(aw)
    stored["spec"].update(priority=0, priorityslope=0)
    again = to_v1beta1(to_v1beta2(stored))
    assert again == stored
    assert v1beta2_fields(again["metadata"]["annotations"]).written_as_v1beta2


def mcad_wrapper(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": V1, "kind": "AppWrapper",
        "metadata": {"name": "train", "namespace": "team-a"},
        "spec": {"priority": 5, "schedulingSpec": {"minAvailable": 2}, "resources": {
            "GenericItems": [{"replicas": 1, "generictemplate": {
                "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
                "spec": {"parallelism": 2}}}]}},
        **({"status": status} if status else {}),
    }


def test_an_mcad_wrapper_reads_as_v1beta2_components_with_its_mcad_fields_in_an_annotation(
) -> None:
    shown = to_v1beta2(mcad_wrapper())
    assert shown["apiVersion"] == V2
    assert shown["spec"] == {"components": [{"template": {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
        "spec": {"parallelism": 2}}}]}
    kept = json.loads(shown["metadata"]["annotations"][V1BETA1_FIELDS_ANNOTATION])
    assert kept["spec"] == {"priority": 5, "schedulingSpec": {"minAvailable": 2}}
    assert kept["items"] == [{"replicas": 1}]
    parse_appwrapper_v1beta2(shown)  # a valid v1beta2 wrapper


def test_a_running_mcad_wrapper_shows_v1beta2_phase_and_conditions() -> None:
    shown = to_v1beta2(mcad_wrapper(
        state="Running", queuejobstate="Running", numberOfRequeueings=2,
        conditions=[{"type": "Running", "reason": "PodsRunning",
                     "lastTransitionMicroTime": "2024-05-01T10:00:00.500000Z"}],
        wrappedItems=[{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u1"}]))
    status = shown["status"]
    assert status["phase"] == "Running"
    assert status["resettingCount"] == 2
    by_type = {c["type"]: c for c in status["conditions"]}
    assert {t: c["status"] for t, c in by_type.items()} == {
        "QuotaReserved": "True", "ResourcesDeployed": "True", "PodsReady": "True",
        "Unhealthy": "False"}
    assert by_type["PodsReady"]["lastTransitionTime"] == "2024-05-01T10:00:00Z"
    assert by_type["PodsReady"]["reason"] == "PodsRunning"
    assert status["componentStatus"] == [
        {"name": "train", "kind": "Job", "apiVersion": "batch/v1", "podSets": []}]
    parse_appwrapper_v1beta2(shown)


@pytest.mark.parametrize(("state", "latest", "created", "phase"), [
    ("Pending", "Queueing", False, "Suspended"),
    ("Pending", "Dispatched", True, "Running"),  # codeflare's: every component created
    ("Running", "Dispatched", False, "Resuming"),  # MCAD's state from the dispatch on
    ("Running", "Running", True, "Running"),
    ("Pending", "PreemptCandidate", True, "Suspending"),
    ("Completed", "Completed", True, "Succeeded"),
    ("Failed", "Failed", False, "Failed"),
])
def test_each_mcad_state_has_its_v1beta2_phase(state: str, latest: str, created: bool,
                                                phase: str) -> None:
    items = [{"kind": "Job", "name": "train", "uid": "u"}] if created else []
    shown = to_v1beta2(mcad_wrapper(state=state, queuejobstate=latest, wrappedItems=items))
    assert shown["status"]["phase"] == phase


def test_a_deleted_wrapper_is_terminating_and_deleting_what_it_created() -> None:
    aw = mcad_wrapper(state="Running", wrappedItems=[{"kind": "Job", "name": "t", "uid": "u"}])
    aw["metadata"]["deletionTimestamp"] = "2024-05-01T10:00:00Z"
    status = to_v1beta2(aw)["status"]
    assert status["phase"] == "Terminating"
    assert {"type": "DeletingResources", "status": "True"}.items() <= \
        next(c for c in status["conditions"] if c["type"] == "DeletingResources").items()


def codeflare_wrapper() -> dict[str, Any]:
    return {
        "apiVersion": V2, "kind": "AppWrapper",
        "metadata": {"name": "lws", "namespace": "team-b",
                     "labels": {"kueue.x-k8s.io/queue-name": "default-queue"}},
        "spec": {"suspend": True, "managedBy": "example.com/other", "components": [{
            "podSets": [{"path": "template.spec.leaderWorkerTemplate.leaderTemplate",
                         "replicas": 2}],
            "podSetInfos": [{"nodeSelector": {"pool": "a"}}],
            "annotations": {"note": "x"},
            "template": {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
                         "metadata": {"name": "lws"}}}]},
    }


def test_a_codeflare_wrapper_is_stored_as_v1beta1_items_and_its_v1beta2_fields_are_read_back(
) -> None:
    stored = to_v1beta1(codeflare_wrapper())
    assert stored["spec"] == {"resources": {"GenericItems": [{"generictemplate": {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": "lws"}}}]}}
    aw = parse_appwrapper(stored)
    fields = v1beta2_fields(aw.metadata.annotations)
    assert fields.written_as_v1beta2
    assert fields.suspend is True
    assert fields.managed_by == "example.com/other"
    assert fields.component(0).pod_sets == (
        {"path": "template.spec.leaderWorkerTemplate.leaderTemplate", "replicas": 2},)
    assert fields.component(0).pod_set_infos == ({"nodeSelector": {"pool": "a"}},)
    assert fields.component(1).pod_sets == ()


def test_an_mcad_wrapper_has_no_v1beta2_fields() -> None:
    fields = v1beta2_fields(parse_appwrapper(mcad_wrapper()).metadata.annotations)
    assert not fields.written_as_v1beta2
    assert not fields.suspend


def test_a_status_written_after_the_conversion_wins_over_the_kept_one() -> None:
    # The dispatcher writes v1beta1 status on the stored object; a v1beta2 reader must see
    # that, not the status the wrapper had when a v1beta2 client last wrote it.
    written = {**codeflare_wrapper(), "status": {"phase": "Suspended"}}
    stored = to_v1beta1(written)
    stored["status"] = {"state": "Running", "queuejobstate": "Running",
                        "wrappedItems": [{"kind": "LeaderWorkerSet", "name": "lws", "uid": "u"}]}
    assert to_v1beta2(stored)["status"]["phase"] == "Running"


def test_convert_says_which_versions_it_serves() -> None:
    assert convert(mcad_wrapper(), V1) == mcad_wrapper()
    assert convert(mcad_wrapper(), V2)["apiVersion"] == V2
    with pytest.raises(ConversionError, match=r"serves workload\.codeflare\.dev/v1beta1 and"):
        convert(mcad_wrapper(), "workload.codeflare.dev/v1")
    with pytest.raises(ConversionError, match=r"apiVersion 'mcad\.ibm\.com/v1beta1'"):
        convert({**mcad_wrapper(), "apiVersion": "mcad.ibm.com/v1beta1"}, V2)


def test_a_mangled_annotation_is_refused_with_what_to_do() -> None:
    aw = mcad_wrapper()
    aw["metadata"]["annotations"] = {V1BETA2_FIELDS_ANNOTATION: "{not json"}
    with pytest.raises(ConversionError, match="remove the annotation"):
        to_v1beta2(aw)


def test_a_waiting_wrapper_read_as_v1beta2_shows_its_place_eta_gpus_and_message() -> None:
    """What `kubectl get aw -o wide` prints once v1beta2 is kubectl's default version."""
    shown = to_v1beta2(mcad_wrapper(
        state="Pending", queuejobstate="Backoff", requestedGPUs=16, queuePosition=3,
        estimatedStart="2026-11-01T12:00:00Z", message="needs 16 nvidia.com/gpu"))
    status = shown["status"]
    assert (status["requestedGPUs"], status["queuePosition"], status["estimatedStart"],
            status["message"]) == (16, 3, "2026-11-01T12:00:00Z", "needs 16 nvidia.com/gpu")
    parse_appwrapper_v1beta2(shown)
    back = to_v1beta1(shown)
    assert back["status"]["queuePosition"] == 3
    assert back["status"]["message"] == "needs 16 nvidia.com/gpu"


# --- one wrapper never breaks a v1beta2 list -------------------------------------------------


def test_one_wrapper_that_cannot_be_converted_does_not_fail_a_v1beta2_list() -> None:
    good = mcad_wrapper(state="Running")
    deep = mcad_wrapper(state="Pending")
    deep["metadata"]["name"] = "deep"
    deep["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"]["x"] = nested(600)
    mangled = mcad_wrapper()
    mangled["metadata"].update(name="mangled",
                               annotations={V1BETA2_FIELDS_ANNOTATION: "{not json"})
    answer = conversion_response({"uid": "l1", "desiredAPIVersion": V2,
                                  "objects": [good, deep, mangled]})
    assert answer["result"] == {"status": "Success"}
    shown_good, shown_deep, shown_mangled = answer["convertedObjects"]
    assert shown_good == to_v1beta2(good)
    for shown, original, why in ((shown_deep, deep, "nests too deep"),
                                 (shown_mangled, mangled, "remove the annotation")):
        assert shown["apiVersion"] == V2 and shown["spec"] == {"components": []}
        assert shown["metadata"]["name"] == original["metadata"]["name"]
        assert why in shown["metadata"]["annotations"][UNCONVERTED_ANNOTATION]
    assert shown_deep["status"]["phase"] == "Suspended"
    # What was shown converts back (the API server does so to delete it through v1beta2:
    # a namespace being deleted), and is never written in place of the stored spec.
    back = conversion_response({"uid": "w1", "desiredAPIVersion": V1,
                                "objects": [shown_mangled]})
    assert back["result"] == {"status": "Success"}
    written = back["convertedObjects"][0]
    assert UNCONVERTED_ANNOTATION in written["metadata"]["annotations"]
    refused = review(written, 0.0)
    assert not refused.valid and "edit it as v1beta1" in refused.message


def test_a_v1beta2_write_that_cannot_be_converted_is_refused_with_the_reason() -> None:
    written = to_v1beta2(mcad_wrapper())
    written["metadata"]["annotations"][V1BETA1_FIELDS_ANNOTATION] = "{not json"
    answer = conversion_response({"uid": "w2", "desiredAPIVersion": V1, "objects": [written]})
    assert answer["result"]["status"] == "Failure"
    assert answer["result"]["message"].startswith("AppWrapper team-a/train: annotation")


def test_the_v1beta2_fields_of_one_annotation_are_parsed_once() -> None:
    """Intake, holds, management, admission and item shaping each ask for the fields of
    the same wrapper: the annotation's text is parsed once, and a new text again."""
    annotations = to_v1beta1(codeflare_wrapper())["metadata"]["annotations"]
    first = v1beta2_fields(annotations)
    assert first.written_as_v1beta2
    assert v1beta2_fields(dict(annotations)) is first
    edited = {**annotations, V1BETA2_FIELDS_ANNOTATION: " " + annotations[
        V1BETA2_FIELDS_ANNOTATION]}
    assert v1beta2_fields(edited) == first and v1beta2_fields(edited) is not first


def _forged(shown: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    """`shown` (a v1beta2 reader's form of a stored wrapper) written back as a tenant may:
    its status as the API server keeps it, its annotation holding a v1beta1 status of the
    tenant's own for exactly that status."""
    from dispatcher.api.conversion import _digest

    out = json.loads(json.dumps(shown))
    stash = json.loads(out["metadata"]["annotations"][V1BETA1_FIELDS_ANNOTATION])
    stash.update(status=status, statusOf=_digest(out["status"]))
    out["metadata"]["annotations"][V1BETA1_FIELDS_ANNOTATION] = json.dumps(stash)
    return out


@pytest.mark.parametrize("recorded", [{}, {"workerCluster": "w2", "managerUid": "m-1"}])
def test_a_v1beta2_write_cannot_forge_what_a_dispatcher_recorded_in_status(
        recorded: dict[str, str]) -> None:
    """workerCluster (the worker a manager sent the wrapper to) and managerUid (a worker's
    record of a manager's copy) are written in status by a dispatcher alone. A tenant who
    writes the wrapper as v1beta2 sends the annotation the conversion reads back; the API
    server keeps the stored status, and the recorded fields come from that, never from the
    annotation."""
    stored = mcad_wrapper(state="Pending", message="waiting", **recorded)
    shown = to_v1beta2(stored)
    forged = {**stored["status"], "workerCluster": "w1", "managerUid": "someone-else"}
    back = to_v1beta1(_forged(shown, forged))
    assert {k: back["status"].get(k) for k in ("workerCluster", "managerUid")} == {
        "workerCluster": recorded.get("workerCluster"), "managerUid": recorded.get("managerUid")}
    assert to_v1beta1(shown)["status"] == stored["status"]  # an honest edit keeps it all
