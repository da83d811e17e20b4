"""A field sent as null is the field left out, never a reason to refuse an AppWrapper.

The API server drops nulls of non-nullable fields before storing an object, and MCAD's
own Go client sends them (every nil map or pointer without `omitempty`): the dispatcher
must read such an AppWrapper as the API server would store it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from dispatcher.admission import queued_from_appwrapper
from dispatcher.api import AppWrapper, InvalidSpec, parse_appwrapper


def go_client_custom_pod_resources_aw() -> dict[str, Any]:
    """The AppWrapper of MCAD's e2e test "custom pod resources"
    (test/e2e/util.go, createGenericDeploymentCustomPodResourcesWithCPUAW), as MCAD's Go
    client serialises it: zero values written out, nil maps and zero times as null."""
    name = "aw-deployment-2-550cpu"
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": "test", "labels": {"app": name}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name},
                             "annotations": {"appwrapper.mcad.ibm.com/appwrapper-name": name}},
                "spec": {"containers": [{
                    "name": name, "image": "kicbase/echo-server:1.0",
                    "resources": {"requests": {"cpu": "550m"}},
                    "ports": [{"containerPort": 80}]}]}}},
    }
    return {
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": "test", "creationTimestamp": None},
        "spec": {
            "service": {"spec": {}},
            "resources": {"GenericItems": [{
                "metadata": {"name": f"{name}-item1", "namespace": "test",
                             "creationTimestamp": None},
                "allocated": 0, "priority": 0, "priorityslope": 0,
                "generictemplate": deployment,
                "custompodresources": [
                    {"replicas": 2, "requests": {"cpu": "550m"}, "limits": None}],
            }]},
            "schedulingSpec": {
                "minAvailable": 2,
                "requeuing": {"timeInSeconds": 60},
                "clusterScheduling": {"policyResult": {"targetCluster": {"name": ""}}},
                "dispatchingWindow": {
                    "start": {"minTimestamp": None, "desiredTimestamp": None,
                              "maxTimestamp": None},
                    "end": {"minTimestamp": None, "desiredTimestamp": None,
                            "maxTimestamp": None}},
                "dispatchDuration": {},
            },
        },
        "status": {"controllerfirsttimestamp": None, "controllerfirstdispatchtimestamp": None},
    }


def test_mcads_custom_pod_resources_appwrapper_is_dispatchable() -> None:
    aw = parse_appwrapper(go_client_custom_pod_resources_aw())
    (item,) = aw.spec.resources.GenericItems
    (custom,) = item.custompodresources
    assert custom.limits == {} and custom.requests == {"cpu": "550m"}
    queued = queued_from_appwrapper(aw, 0.0)
    assert queued.invalid is None
    ((pods, cpu),) = [(g.pod_set.count, g.pod_set.request["cpu"]) for g in queued.gang]
    assert (pods, cpu) == (2, 550)


def test_the_null_fields_users_write_are_absent() -> None:
    doc = {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
           "metadata": {"name": "a", "namespace": "team", "labels": None,
                        "annotations": {"note": None}},
           "spec": {"priority": None, "priorityslope": None, "schedulingSpec": None,
                    "resources": {"GenericItems": [{
                        "replicas": None, "completionstatus": None,
                        "custompodresources": [{"replicas": None,
                                                "requests": {"cpu": 1, "memory": None},
                                                "limits": None}],
                        "generictemplate": {"apiVersion": "batch/v1", "kind": "Job",
                                            "metadata": {"name": "j", "labels": None}}}]}},
           "status": None}
    aw = parse_appwrapper(doc)
    assert aw.metadata.labels == {} and aw.metadata.annotations == {}
    assert aw.spec.priority == 0 and aw.spec.priorityslope == 0.0
    assert aw.spec.schedulingSpec.requeuing.timeInSeconds == 300
    (custom,) = aw.spec.resources.GenericItems[0].custompodresources
    assert (custom.replicas, custom.requests, custom.limits) == (1, {"cpu": 1}, {})


# --- every field of every model ---------------------------------------------------

FULL: dict[str, Any] = {
    "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
    "metadata": {"name": "full", "namespace": "team", "uid": "u", "resourceVersion": "7",
                 "generation": 2, "creationTimestamp": "2026-11-01T10:00:00Z",
                 "deletionTimestamp": "2026-11-01T11:00:00Z",
                 "labels": {"a": "b"}, "annotations": {"c": "d"}},
    "spec": {
        "priority": 3, "priorityslope": 0.5, "service": {"spec": {}}, "selector": {},
        "schedulingSpec": {
            "minAvailable": 1, "nodeSelector": {"zone": "a"},
            "requeuing": {"timeInSeconds": 30, "maxTimeInSeconds": 600, "growthType": "linear",
                          "maxNumRequeuings": 2, "initialTimeInSeconds": 30,
                          "numRequeuings": 1, "forcefulDeletionAfterSeconds": 5},
            "dispatchDuration": {"limit": 100, "expected": 50, "overrun": False},
            "clusterScheduling": {}, "dispatchingWindow": {}},
        "resources": {"GenericItems": [{
            "replicas": 1, "minavailable": 1, "allocated": 0, "priority": 1,
            "priorityslope": 0.1, "completionstatus": "Complete",
            "custompodresources": [{"replicas": 1, "requests": {"cpu": 1},
                                    "limits": {"cpu": 2}}],
            "generictemplate": {"apiVersion": "batch/v1", "kind": "Job",
                                "metadata": {"name": "j"}}}]}},
    "status": {
        "state": "Pending", "queuejobstate": "Init", "systempriority": 1.0,
        "controllerfirsttimestamp": "2026-11-01T10:00:00.000001Z", "pending": 1, "running": 0,
        "Succeeded": 0, "failed": 0, "numberOfRequeueings": 0, "requeueingTimeInSeconds": 0,
        "requestedGPUs": 0, "message": "m",
        "conditions": [{"type": "Init", "status": "True", "reason": "r", "message": "m",
                        "lastUpdateMicroTime": "2026-11-01T10:00:00.000001Z",
                        "lastTransitionMicroTime": "2026-11-01T10:00:00.000001Z"}]},
}


def _model_fields(model: type[BaseModel], doc: Any,
                  path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], bool]]:
    """(path, required) of every model field present in `doc`, nested models included."""
    for name, info in model.model_fields.items():
        if not isinstance(doc, dict) or name not in doc:
            continue
        here = (*path, name)
        yield here, info.is_required()
        sub = _submodel(info.annotation)
        value = doc[name]
        if sub is not None and isinstance(value, dict):
            yield from _model_fields(sub, value, here)
        elif sub is not None and isinstance(value, list) and value:
            yield from _model_fields(sub, value[0], (*here, 0))


def _submodel(annotation: Any) -> type[BaseModel] | None:
    candidates = [annotation, *getattr(annotation, "__args__", ())]
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None


def _set(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    node: Any = out
    for step in path[:-1]:
        node = node[step]
    if value is _ABSENT:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


_ABSENT = object()
FIELDS = list(_model_fields(AppWrapper, FULL))


def test_the_walk_covers_every_model() -> None:
    touched = {p[-1] for p, _ in FIELDS}
    assert {"limits", "growthType", "lastUpdateMicroTime", "labels", "generictemplate",
            "schedulingSpec", "deletionTimestamp", "overrun"} <= touched
    assert len(FIELDS) > 60


@pytest.mark.parametrize(("path", "required"), FIELDS,
                         ids=[".".join(map(str, p)) for p, _ in FIELDS])
def test_a_null_field_reads_as_the_field_left_out(path: tuple[str | int, ...],
                                                  required: bool) -> None:
    def outcome(doc: dict[str, Any]) -> Any:
        try:
            return parse_appwrapper(doc).model_dump()
        except InvalidSpec as e:
            return e.problems

    null, absent = outcome(_set(FULL, path, None)), outcome(_set(FULL, path, _ABSENT))
    assert null == absent
    # Only a required field, or one whose absence the checks refuse, makes it invalid.
    if isinstance(null, list):
        assert required or path[-1] in ("generictemplate", "GenericItems"), null
