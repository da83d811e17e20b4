"""Lifecycle of a dispatched AppWrapper: running, completion, requeue, deadlines."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.api import parse_appwrapper
from dispatcher.api.models import AppWrapper, Requeuing
from dispatcher.kinds.completion import deciding_items, item_outcome, wrapper_outcome
from dispatcher.lifecycle import (
    PODS_UNPLACEABLE,
    REQUEUE_LIMIT_REACHED,
    WRAPPED_OBJECT_FAILED,
    PodCounts,
    judge,
    min_available,
    pods_allowed_seconds,
)


def aw(scheduling: dict[str, Any] | None = None, requeues: int = 0) -> AppWrapper:
    return parse_appwrapper({
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": "a", "namespace": "n"},
        "spec": {"schedulingSpec": scheduling or {}, "resources": {"GenericItems": [
            {"generictemplate": {"apiVersion": "batch/v1", "kind": "Job",
                                 "metadata": {"name": "j"}}}]}},
        "status": {"numberOfRequeueings": requeues},
    })


@pytest.mark.parametrize(("growth", "requeues", "expected"), [
    ("exponential", 0, 60), ("exponential", 1, 120), ("exponential", 3, 480),
    ("linear", 0, 60), ("linear", 2, 180), ("none", 5, 60),
    # MCAD grows the wait only for these two words: any other means no growth.
    ("Exponential", 3, 60), ("quadratic", 3, 60), ("", 3, 60),
])
def test_time_allowed_grows_with_requeues(growth: str, requeues: int, expected: int) -> None:
    r = Requeuing(timeInSeconds=60, growthType=growth)
    assert pods_allowed_seconds(r, requeues) == expected


def test_time_allowed_is_capped() -> None:
    assert pods_allowed_seconds(Requeuing(timeInSeconds=60, maxTimeInSeconds=200), 4) == 200


def test_min_available_defaults_to_every_pod() -> None:
    assert min_available(aw(), 4) == 4
    assert min_available(aw({"minAvailable": 2}), 4) == 2
    assert min_available(aw({"minAvailable": 9}), 4) == 4


def test_running_once_min_available_pods_run() -> None:
    v = judge(aw({"minAvailable": 2}), PodCounts(pending=2, running=2), 4, "running",
              dispatched_at=0, running=False, now=10)
    assert v.action == "running" and v.message == "2 of 4 pods running"


def test_waits_until_the_deadline_then_requeues_with_a_reason() -> None:
    w = aw({"requeuing": {"timeInSeconds": 60}})
    early = judge(w, PodCounts(pending=3, running=1), 4, "running", 100, False, now=150)
    assert early.action == "wait" and early.check_at == 160
    late = judge(w, PodCounts(pending=3, running=1), 4, "running", 100, False, now=160)
    assert late.action == "requeue" and late.reason == "MinPodsNotRunning"
    assert late.message == ("1 of the 4 pods needed (minAvailable) running or succeeded 1m "
                            "after dispatch (3 pending, 0 failed); torn down and requeued, "
                            "2m allowed next time")


def test_requeue_limit_fails_it() -> None:
    w = aw({"requeuing": {"timeInSeconds": 60, "maxNumRequeuings": 2}}, requeues=2)
    v = judge(w, PodCounts(pending=4), 4, "running", 0, False, now=10_000)
    assert v.action == "failed" and v.reason == REQUEUE_LIMIT_REACHED
    assert "already requeued 2 times" in v.message


def test_no_requeue_once_running() -> None:
    w = aw({"requeuing": {"timeInSeconds": 60}})
    v = judge(w, PodCounts(pending=2, running=1, failed=1), 4, "running", 0, True, now=10_000)
    assert v.action == "wait"


def test_dispatch_duration_limit_fails_it() -> None:
    w = aw({"dispatchDuration": {"limit": 300}})
    assert judge(w, PodCounts(running=4), 4, "running", 0, True, now=299).action == "running"
    v = judge(w, PodCounts(running=4), 4, "running", 0, True, now=300)
    assert v.action == "failed" and v.reason == "DispatchDeadlineExceeded"


def test_outcomes_end_it() -> None:
    assert judge(aw(), PodCounts(), 4, "succeeded", 0, True, 1).action == "completed"
    failed = judge(aw(), PodCounts(failed=1), 4, "failed", 0, True, 1)
    assert failed.action == "failed" and failed.reason == WRAPPED_OBJECT_FAILED


def test_without_an_outcome_all_pods_succeeding_completes_it() -> None:
    assert judge(aw(), PodCounts(succeeded=4), 4, None, 0, True, 1).action == "completed"
    assert judge(aw(), PodCounts(succeeded=3, running=1), 4, None, 0, True, 1).action \
        == "running"


def _obj(api: str, kind: str, status: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": "x"}, "status": status}


def _cond(t: str) -> dict[str, Any]:
    return {"conditions": [{"type": t, "status": "True"}]}


@pytest.mark.parametrize(("obj", "expected"), [
    (_obj("batch/v1", "Job", _cond("Complete")), "succeeded"),
    (_obj("batch/v1", "Job", _cond("Failed")), "failed"),
    (_obj("batch/v1", "Job", {}), "running"),
    (_obj("kubeflow.org/v1", "PyTorchJob", _cond("Succeeded")), "succeeded"),
    (_obj("kubeflow.org/v1", "TFJob", _cond("Failed")), "failed"),
    (_obj("kubeflow.org/v1", "MPIJob", _cond("Running")), "running"),
    (_obj("ray.io/v1", "RayJob", {"jobDeploymentStatus": "Complete",
                                  "jobStatus": "SUCCEEDED"}), "succeeded"),
    (_obj("ray.io/v1", "RayJob", {"jobStatus": "FAILED"}), "failed"),
    (_obj("v1", "Pod", {"phase": "Succeeded"}), "succeeded"),
    (_obj("v1", "Pod", {"phase": "Running"}), "running"),
    (_obj("jobset.x-k8s.io/v1alpha2", "JobSet", _cond("Completed")), "succeeded"),
    (_obj("ray.io/v1", "RayCluster", {"state": "ready"}), None),
    (_obj("apps/v1", "Deployment", {}), None),
])
def test_item_outcome_per_kind(obj: dict[str, Any], expected: str | None) -> None:
    assert item_outcome(obj) == expected


def test_completionstatus_overrides_the_kind() -> None:
    deploy = _obj("apps/v1", "Deployment", _cond("Available"))
    assert item_outcome(deploy, "Available") == "succeeded"
    assert item_outcome(_obj("apps/v1", "Deployment", {}), "Available") == "running"


def test_wrapper_outcome() -> None:
    assert wrapper_outcome([None, "succeeded"]) == "succeeded"
    assert wrapper_outcome(["succeeded", "running"]) == "running"
    assert wrapper_outcome(["succeeded", "failed"]) == "failed"
    assert wrapper_outcome([None]) is None


def _mcad_hold_completion() -> AppWrapper:
    """MCAD's kuttl deployment-01 step 03: a Job that decides completion (completionstatus)
    beside a Job that does not."""
    def job(name: str) -> dict[str, Any]:
        return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}}
    return parse_appwrapper({
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": "hold", "namespace": "n"},
        "spec": {"schedulingSpec": {"minAvailable": 1}, "resources": {"GenericItems": [
            {"completionstatus": "Complete", "generictemplate": job("j1")},
            {"generictemplate": job("j2")}]}},
    })


def test_items_with_completionstatus_decide_completion_as_in_mcad() -> None:
    a = _mcad_hold_completion()
    items = [(i.generictemplate, i.completionstatus) for i in a.spec.resources.GenericItems]
    assert deciding_items(items) == (0,)
    # Without any completionstatus, every item whose kind can finish decides.
    assert deciding_items([(t, None) for t, _ in items]) == (0, 1)
    assert deciding_items([({"apiVersion": "apps/v1", "kind": "Deployment"}, None)]) == ()


def test_running_hold_completion_while_other_pods_run_then_completed() -> None:
    a = _mcad_hold_completion()
    v = judge(a, PodCounts(running=1, succeeded=1), 2, "succeeded", dispatched_at=0,
              running=True, now=10)
    assert (v.action, v.reason) == ("holding", "SomeItemsCompleted")
    assert "1 pod still running" in v.message
    v = judge(a, PodCounts(pending=1, succeeded=1), 2, "succeeded", dispatched_at=0,
              running=True, now=10)
    assert v.action == "holding"
    v = judge(a, PodCounts(succeeded=2), 2, "succeeded", dispatched_at=0, running=True, now=10)
    assert v.action == "completed"
    # A wrapper that declares no completionstatus completes as before.
    v = judge(aw(), PodCounts(running=1, succeeded=1), 2, "succeeded", dispatched_at=0,
              running=True, now=10)
    assert v.action == "completed"


def test_a_gang_with_a_pod_that_cannot_be_placed_is_not_running_and_is_requeued() -> None:
    """Its other pods run (enough for minAvailable): still not Running, since a pod of it
    has no room; after the admission grace it is requeued, saying why."""
    why = "pod m-0 asks 2 nvidia.com/gpu: 2 nvidia.com/gpu more than its gang was admitted with"
    w = aw({"minAvailable": 1})
    held = judge(w, PodCounts(pending=1, running=1), 2, "running", dispatched_at=0,
                 running=False, now=10, unplaced=(5.0, why))
    assert held.action == "wait"
    late = judge(w, PodCounts(pending=1, running=1), 2, "running", dispatched_at=0,
                 running=False, now=500, unplaced=(5.0, why))
    assert late.action == "requeue" and late.reason == PODS_UNPLACEABLE
    assert why in late.message
