"""The controller under faults, on an in-memory API: one test per defect of issue 16
(restarts, races, watch gaps, API errors, stuck gangs, write storms, two replicas), and
the controller's side of issue 11 (forged owners and labels).

Each test states what a user would see, and fails on the dispatcher before the fix.
"""

from __future__ import annotations

import asyncio
import copy
import sys
import time
from typing import Any

import pytest

from dispatcher.api.labels import APPWRAPPER_LABEL
from dispatcher.cluster import BoundPod, ClusterState, Node
from dispatcher.cluster.state import PlannedPod
from dispatcher.controller.kube.client import ApiError
from dispatcher.controller.kube.lease import LeaderElector
from dispatcher.controller.loop import admitting, runtime
from dispatcher.controller.record.ownership import OwnerRef, Ownership
from dispatcher.queue import Policy
from dispatcher.resources import GPU

from .fake_kube import FakeKube
from .test_runtime import (
    Clock,
    appwrapper,
    aw_status,
    created_job,
    job,
    node,
    pod,
    run,
    started,
    types,
)

AW = ("workload.codeflare.dev/v1beta1", "AppWrapper")


async def dispatched_job(kube: FakeKube, clock: Clock, pods: int
                         ) -> tuple[runtime.Dispatcher, dict[str, Any]]:
    """One 8-GPU node and "a", a Job of `pods` one-GPU pods, dispatched (no pod yet).
    Returns the dispatcher and the Job."""
    kube.put(node("n1", gpus=8))
    kube.put(appwrapper("a", job("a", pods, 1)))
    d = await started(kube, clock)
    await d.cycle()
    return d, created_job(kube, "a")


def get_aw(kube: FakeKube, name: str) -> dict[str, Any]:
    obj = kube.get(*AW, "team", name)
    assert obj is not None
    return obj


def unavailable() -> ApiError:
    return ApiError(503, "ServiceUnavailable", "the server is currently unable to handle it")


def no_answer() -> ApiError:
    return ApiError(0, "TimeoutError", "timed out")


# --- 1. a restart keeps reservations --------------------------------------------------------

def test_restart_reserves_the_unbound_pods_of_a_dispatched_gang_again() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        kube.put(appwrapper("a", job("a", 1, 8), created=1))
        d = await started(kube, clock)
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"  # its pod is not bound yet
        # Restart; then b arrives, wanting the same 8 GPUs.
        kube.put(appwrapper("b", job("b", 1, 8), created=2))
        d2 = await started(kube, clock)
        await d2.cycle()
        assert types(kube, "b")[-1] == "Backoff"
        assert kube.get("batch/v1", "Job", "team", "b") is None

    run(scenario)


def test_a_restart_reads_nothing_for_gangs_whose_items_are_recorded() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        for name in ("a", "b", "c"):
            kube.put(appwrapper(name, job(name, 1, 1)))
        d = await started(kube, clock)
        await d.cycle()
        for name in ("a", "b"):
            j = created_job(kube, name)
            kube.put(pod(name, f"{name}-0", "n1", "Running", 1, j))
            d.on_pod("ADDED", pod(name, f"{name}-0", "n1", "Running", 1, j))
        await d.cycle()
        j = created_job(kube, "a")
        j["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        clock.now += 20
        await d.cycle()
        assert aw_status(kube, "a")["state"] == "Completed"
        assert aw_status(kube, "b")["state"] == "Running"
        kube.reads.clear()
        kube.writes.clear()
        d2 = await started(kube, clock)  # the restart: a finished, b running, c dispatched
        await d2.cycle()
        # Nothing of the finished gang is read (its pods' owner chain included); the
        # others' Jobs are read for their outcome only, never created again.
        assert [p for p in kube.reads if p.endswith("/jobs/a")] == []
        assert [w for w in kube.writes if w[0] == "POST" and "/jobs" in w[1]] == []
        assert types(kube, "b")[-1] == "Running"

    run(scenario)


def test_after_a_restart_pods_are_counted_once_their_unrecorded_item_is_adopted() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        _, j = await dispatched_job(kube, clock, 2)
        # Killed before the Job's uid (a detail) was written: the status names it only.
        status = get_aw(kube, "a")["status"]
        status["wrappedItems"] = [dict(i, uid="") for i in status["wrappedItems"]]
        for i in range(2):
            kube.put(pod("a", f"a-{i}", "n1", "Running", 1, j))
        d2 = await started(kube, clock)
        for _ in range(3):
            clock.now += 1
            await d2.cycle()
        assert types(kube, "a")[-1] == "Running"
        assert aw_status(kube, "a")["running"] == 2

    run(scenario)


# --- 2. decisions are for one object, not one name -------------------------------------------

def _edit_during_admission(d: runtime.Dispatcher, edit: Any) -> None:
    """Make the next admission cycle's decisions come back after `edit` ran on the loop,
    as when a watch event lands while the cycle runs in the executor."""
    real = admitting.admit
    loop = asyncio.get_running_loop()

    def admit_then_edit(*args: Any, **kwargs: Any) -> Any:
        decisions = real(*args, **kwargs)
        loop.call_soon_threadsafe(edit)
        time.sleep(0.05)  # the edit is queued before the result
        return decisions

    admitting.admit = admit_then_edit  # type: ignore[assignment]


def test_an_edit_while_the_cycle_runs_voids_the_decision() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        obj = kube.put(appwrapper("a", job("a", 1, 1)))
        d = await started(kube, clock)
        big = copy.deepcopy(obj)
        big["spec"]["resources"]["GenericItems"][0]["generictemplate"] = job("a", 8, 8)
        big["metadata"]["generation"] = 2
        kube.put(big)
        real = admitting.admit
        try:
            _edit_during_admission(d, lambda: d.on_appwrapper("MODIFIED", big))
            await d.cycle()  # decided for the 1-GPU spec; the edit landed meanwhile
        finally:
            admitting.admit = real
        assert kube.get("batch/v1", "Job", "team", "a") is None
        await d.cycle()  # decided again, for the spec as it is now
        assert "needs 64 nvidia.com/gpu" in aw_status(kube, "a")["message"]

    run(scenario)


def test_a_delete_and_recreate_while_the_cycle_runs_voids_the_decision() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        old = kube.put(appwrapper("a", job("a", 1, 1)))
        d = await started(kube, clock)
        new = appwrapper("a", job("a", 8, 8))
        new["metadata"]["uid"] = "uid-new"
        real = admitting.admit

        def recreate() -> None:
            d.on_appwrapper("DELETED", old)
            kube.put(copy.deepcopy(new))
            d.on_appwrapper("ADDED", get_aw(kube, "a"))

        try:
            _edit_during_admission(d, recreate)
            await d.cycle()
        finally:
            admitting.admit = real
        assert kube.get("batch/v1", "Job", "team", "a") is None
        await d.cycle()
        assert types(kube, "a")[-1] == "Backoff"

    run(scenario)


def test_items_edited_after_dispatch_are_never_created_by_a_restart() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        kube.put(appwrapper("a", job("a", 1, 1)))
        d = await started(kube, clock)
        await d.cycle()
        assert created_job(kube, "a")["spec"]["parallelism"] == 1
        # The user swaps the admitted 1-GPU Job for a 64-GPU one, and the dispatcher
        # restarts before it sees the edit.
        obj = get_aw(kube, "a")
        obj["spec"]["resources"]["GenericItems"][0]["generictemplate"] = job("a2", 8, 8)
        obj["metadata"]["generation"] = 2
        d2 = await started(kube, clock)
        await d2.cycle()
        assert kube.get("batch/v1", "Job", "team", "a2") is None
        assert kube.get("batch/v1", "Job", "team", "a") is None  # torn down
        changed = [c for c in aw_status(kube, "a")["conditions"]
                   if c["type"] == "PreemptCandidate"]
        assert changed[-1]["reason"] == "ItemsChanged"
        assert aw_status(kube, "a").get("numberOfRequeueings", 0) == 0
        await d2.cycle()
        assert "needs 64 nvidia.com/gpu" in aw_status(kube, "a")["message"]

    run(scenario)


def test_a_failed_wrapper_queues_again_when_its_spec_is_edited() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        bad = appwrapper("a", job("a", 1, 1))
        bad["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"][
            "parallelism"] = -2
        kube.put(bad)
        d = await started(kube, clock)
        await d.cycle()
        assert aw_status(kube, "a")["state"] == "Failed"
        fixed = get_aw(kube, "a")
        fixed["spec"]["resources"]["GenericItems"][0]["generictemplate"] = job("a", 1, 1)
        fixed["metadata"]["generation"] = 2
        d.on_appwrapper("MODIFIED", copy.deepcopy(fixed))
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"
        assert created_job(kube, "a") is not None

    run(scenario)


# --- 3. forget only the object you hold --------------------------------------------------

def test_a_late_answer_about_a_deleted_wrapper_does_not_forget_its_successor() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        old = kube.put(appwrapper("a", job("a", 1, 8), created=1))
        d = await started(kube, clock)
        real = kube.request

        async def replaced_during_write(method: str, path: str, body: Any = None,
                                        **kw: Any) -> Any:
            if method == "PATCH" and path.endswith("/appwrappers/a/status") \
                    and body["metadata"]["uid"] == old["metadata"]["uid"]:
                kube.request = real  # type: ignore[method-assign]
                d.on_appwrapper("DELETED", old)
                new = appwrapper("a", job("a", 1, 1), created=3)
                new["metadata"]["uid"] = "uid-new"
                kube.put(new)
                d.on_appwrapper("ADDED", get_aw(kube, "a"))
            return await real(method, path, body, **kw)

        kube.request = replaced_during_write  # type: ignore[method-assign]
        await d.cycle()  # the old "a"'s write answers 409: it was replaced
        await d.cycle()
        assert get_aw(kube, "a")["metadata"]["uid"] == "uid-new"
        assert types(kube, "a")[-1] == "Dispatched"

    run(scenario)


# --- 4. watch gaps ---------------------------------------------------------------------

def test_a_relisting_drops_what_vanished_during_a_watch_gap() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        kube.put(appwrapper("head", job("head", 1, 16), created=1))  # never fits now
        kube.put(appwrapper("next", job("next", 1, 8), created=2))
        kube.put(pod("other", "hog", "n1", "Running", 8))
        d = await started(kube, clock)
        await d.cycle()
        assert types(kube, "next")[-1] in ("Queueing", "Backoff")
        # During a watch gap the hog pod is deleted; a relisting must notice.
        del kube.objects["/api/v1/namespaces/team/pods/hog"]
        d.relisted("Pod", await kube.list(_res("Pod")))
        await d.cycle()
        assert types(kube, "next")[-1] == "Dispatched"

    run(scenario)


def test_a_wrapper_deleted_during_a_watch_gap_leaves_the_head_of_the_queue() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        kube.put(node("n2", gpus=8))
        kube.put(pod("other", "hog", "n1", "Running", 8))
        kube.put(appwrapper("head", job("head", 2, 8), created=1))
        kube.put(appwrapper("next", job("next", 1, 8), created=2))
        d = await started(kube, clock)
        await d.cycle()
        assert types(kube, "next")[-1] == "Queueing"  # behind the head (fifo)
        del kube.objects["/apis/workload.codeflare.dev/v1beta1/namespaces/team/appwrappers/head"]
        d.relisted("AppWrapper", await kube.list(_res("AppWrapper")))
        await d.cycle()
        assert types(kube, "next")[-1] == "Dispatched"

    run(scenario)


def _res(kind: str) -> Any:
    from dispatcher.controller.kube.client import Resource

    return Resource("", kind, "", True)


# --- 5. writes are retried, never turned into verdicts ------------------------------------

def test_a_500_on_the_completed_write_is_written_later() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 4)))
        d = await started(kube, clock)
        await d.cycle()
        j = created_job(kube, "a")
        d.on_pod("ADDED", pod("a", "a-0", "n1", "Running", 4, j))
        await d.cycle()
        j["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        kube.fail_next[("PATCH", "/apis/workload.codeflare.dev")] = [unavailable()]
        d.on_pod("MODIFIED", pod("a", "a-0", "n1", "Succeeded", 4, j))
        await d.cycle()
        assert aw_status(kube, "a")["state"] == "Running"  # the write failed...
        clock.now += 3
        await d.cycle()
        assert aw_status(kube, "a")["state"] == "Completed"  # ...and was written again

    run(scenario)


def test_a_500_on_the_requeue_write_counts_the_requeue_once() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=4))  # its old pod keeps the GPUs: not dispatched again
        kube.put(appwrapper("a", job("a", 1, 4), schedulingSpec={
            "requeuing": {"timeInSeconds": 60}}))
        d = await started(kube, clock)
        await d.cycle()
        j = created_job(kube, "a")
        d.on_pod("ADDED", pod("a", "a-0", "n1", "Pending", 4, j))
        clock.now += 60
        kube.fail_next[("PATCH", "/apis/workload.codeflare.dev")] = [unavailable()]
        await d.cycle()  # the requeue's write fails: nothing torn down yet
        assert created_job(kube, "a") is not None
        assert aw_status(kube, "a").get("numberOfRequeueings", 0) == 0
        clock.now += 3
        await d.cycle()
        status = aw_status(kube, "a")
        assert status["numberOfRequeueings"] == 1
        assert kube.get("batch/v1", "Job", "team", "a") is None

    run(scenario)


def test_a_429_while_creating_items_is_retried_not_a_failure() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 4)))
        d = await started(kube, clock)
        kube.fail[("POST", "/apis/batch/v1")] = ApiError(429, "TooManyRequests", "slow down")
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"
        del kube.fail[("POST", "/apis/batch/v1")]
        clock.now += 3
        await d.cycle()
        assert created_job(kube, "a") is not None
        assert aw_status(kube, "a")["state"] == "Running"

    run(scenario)


def test_a_dispatched_write_whose_answer_was_lost_still_creates_the_items_soon() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 4)))
        d = await started(kube, clock)
        kube.lost_answer[("PATCH", "/apis/workload.codeflare.dev")] = [no_answer()]
        await d.cycle()  # Dispatched landed, but the answer timed out
        d.on_appwrapper("MODIFIED", get_aw(kube, "a"))  # the watch shows what landed
        clock.now += 1
        await d.cycle()
        assert created_job(kube, "a") is not None  # not left until the requeue timer

    run(scenario)


def test_failed_is_written_before_the_teardown() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 4), schedulingSpec={
            "dispatchDuration": {"limit": 100}}))
        d = await started(kube, clock)
        await d.cycle()
        created_job(kube, "a")
        clock.now += 101
        kube.writes.clear()
        await d.cycle()
        assert aw_status(kube, "a")["state"] == "Failed"
        order = [(m, p.split("/")[-1]) for m, p in kube.writes if m in ("PATCH", "DELETE")]
        assert order.index(("PATCH", "status")) < order.index(("DELETE", "a"))

    run(scenario)


def test_a_hanging_request_holds_up_its_own_appwrapper_not_the_others() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        kube.put(node("n2", gpus=8))
        kube.put(appwrapper("a", job("a", 1, 8), created=1))
        kube.put(appwrapper("b", job("b", 1, 8), created=2))
        d = await started(kube, clock)
        kube.hang.add(("PATCH", "/apis/workload.codeflare.dev/v1beta1/namespaces/team/"
                                "appwrappers/a/status"))
        await d.cycle(wait=False)  # as the loop runs it
        for _ in range(100):
            await asyncio.sleep(0.01)
            if kube.get("batch/v1", "Job", "team", "b") is not None:
                break
        assert types(kube, "b")[-1] == "Dispatched"
        assert kube.get("batch/v1", "Job", "team", "a") is None
        assert ("team", "a") in d.tasks.busy  # its write is still hanging
        # Its capacity was taken at once: nothing else may be promised n1 meanwhile.
        assert sum(p.request.get("nvidia.com/gpu", 0)
                   for p in d.state.reserved_for(("team", "a"))) == 8
        await d.stop(grace=0)

    run(scenario)


# --- 6. gangs that never start or stop running ------------------------------------------

def test_a_gang_with_no_pods_is_requeued_after_the_admission_grace_naming_the_cause() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 4)))  # default requeuing: 300 s
        d = await started(kube, clock)
        await d.cycle()
        clock.now += 61
        await d.cycle()
        status = aw_status(kube, "a")
        requeue = [c for c in status["conditions"] if c["type"] == "PreemptCandidate"][-1]
        assert requeue["reason"] == "PodsNotCreated"
        assert "Job 'a' created, but no pod after 1m: is its operator running" \
            in requeue["message"]

    run(scenario)


def test_a_lagging_watch_does_not_requeue_a_gang_whose_pods_are_there() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 4)))
        d = await started(kube, clock)
        await d.cycle()
        # The Job's pod exists in the API, but its event has not reached the dispatcher.
        kube.put(pod("a", "a-0", "n1", "Running", 4, created_job(kube, "a")))
        clock.now += 61
        await d.cycle()
        assert "PreemptCandidate" not in types(kube, "a")
        assert created_job(kube, "a") is not None

    run(scenario)


def test_the_admission_grace_counts_from_when_the_items_were_created() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 4)))
        d = await started(kube, clock)
        kube.fail[("POST", "/apis/batch/v1")] = unavailable()
        await d.cycle()  # Dispatched, but the API server refuses creates for a while
        clock.now += 50
        del kube.fail[("POST", "/apis/batch/v1")]
        await d.cycle()  # created now, 50 s after the dispatch
        assert created_job(kube, "a") is not None
        clock.now += 15  # 65 s after dispatch, 15 s after creation: its pods may come
        await d.cycle()
        assert "PreemptCandidate" not in types(kube, "a")
        clock.now += 50  # 65 s after creation, still no pod
        await d.cycle()
        assert "PreemptCandidate" in types(kube, "a")

    run(scenario)


def test_time_in_seconds_zero_does_not_loop() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 4), schedulingSpec={
            "requeuing": {"timeInSeconds": 0}}))
        d = await started(kube, clock)
        await d.cycle()
        j = created_job(kube, "a")
        d.on_pod("ADDED", pod("a", "a-0", "n1", "Pending", 4, j))
        for _ in range(5):
            clock.now += 1
            await d.cycle()
        assert aw_status(kube, "a").get("numberOfRequeueings", 0) == 0
        assert created_job(kube, "a") is not None

    run(scenario)


def test_a_running_gang_that_loses_pods_is_requeued_after_the_failure_grace() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(node("n2"))
        kube.put(appwrapper("a", job("a", 2, 8)))
        d = await started(kube, clock)
        await d.cycle()
        j = created_job(kube, "a")
        d.on_pod("ADDED", pod("a", "a-0", "n1", "Running", 8, j))
        d.on_pod("ADDED", pod("a", "a-1", "n2", "Running", 8, j))
        await d.cycle()
        assert types(kube, "a")[-1] == "Running"
        d.on_node("DELETED", node("n2"))  # its pod goes with it
        d.on_pod("DELETED", pod("a", "a-1", "n2", "Running", 8, j))
        await d.cycle()
        clock.now += 30
        await d.cycle()
        assert types(kube, "a")[-1] == "Running"  # within the failure grace
        clock.now += 31
        await d.cycle()
        status = aw_status(kube, "a")
        requeue = [c for c in status["conditions"] if c["type"] == "PreemptCandidate"][-1]
        assert requeue["reason"] == "PodsLost"
        assert kube.get("batch/v1", "Job", "team", "a") is None

    run(scenario)


def test_the_replacement_of_a_lost_pod_keeps_its_capacity_from_a_newer_gang() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        for n in ("n1", "n2", "n3"):
            kube.put(node(n, gpus=1))
        kube.put(appwrapper("a", job("a", 2, 1), created=1))
        d = await started(kube, clock)
        await d.cycle()
        j = created_job(kube, "a")
        d.on_pod("ADDED", pod("a", "a-0", "n1", "Running", 1, j))
        d.on_pod("ADDED", pod("a", "a-1", "n2", "Running", 1, j))
        await d.cycle()
        assert types(kube, "a")[-1] == "Running"
        # n2 goes; its pod is garbage-collected later and the Job makes a replacement,
        # which fits only on n3. A gang of 1 arriving meanwhile must not take n3.
        d.on_node("DELETED", node("n2"))
        d.on_pod("DELETED", pod("a", "a-1", "n2", "Running", 1, j))
        kube.put(appwrapper("b", job("b", 1, 1), created=2))
        d.on_appwrapper("ADDED", get_aw(kube, "b"))
        await d.cycle()
        assert "Dispatched" not in types(kube, "b")
        assert kube.get("batch/v1", "Job", "team", "b") is None
        # The replacement binds: the hold it had is used, nothing more is held.
        d.on_pod("ADDED", pod("a", "a-2", "n3", "Running", 1, j))
        await d.cycle()
        assert d.memory.state.reserved_for(("team", "a")) == []
        # A pod that succeeded is not replaced: when a finishes, b gets its room.
        d.on_pod("MODIFIED", pod("a", "a-0", "n1", "Succeeded", 1, j))
        await d.cycle()
        assert d.memory.state.reserved_for(("team", "a")) == []

    run(scenario)


# --- 7. write storms and indexed reservations ---------------------------------------------

def test_an_unrelated_pod_binding_writes_no_status_of_queued_wrappers() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        kube.put(pod("other", "hog", "n1", "Running", 4))
        for i in range(200):
            kube.put(appwrapper(f"w{i:03d}", job(f"w{i:03d}", 1, 8), created=i % 60))
        # Under backfill every queued wrapper waits with its own shortfall message.
        d = await started(kube, clock, Policy("backfill", order="priority", backfill=True))
        await d.cycle()
        assert "4 nvidia.com/gpu free" in aw_status(kube, "w150")["message"]
        before = sum(1 for m, p in kube.writes if m == "PATCH")
        d.on_pod("ADDED", pod("other", "small", "n1", "Running", 1))
        clock.now += 1
        await d.cycle()
        assert sum(1 for m, p in kube.writes if m == "PATCH") == before
        clock.now += 60  # the new numbers are written, once, a minute later
        await d.cycle()
        assert "3 nvidia.com/gpu free" in aw_status(kube, "w150")["message"]
        assert sum(1 for m, p in kube.writes if m == "PATCH") == before + 200

    run(scenario)


def test_a_gang_s_whole_life_takes_three_status_writes() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        kube.put(appwrapper("a", job("a", 2, 1)))
        d = await started(kube, clock)
        await d.cycle()  # Init, Queueing, HeadOfLine, Dispatched: one write
        j = created_job(kube, "a")
        for phase in ("Pending", "Running"):
            for i in range(2):
                clock.now += 0.5
                d.on_pod("MODIFIED", pod("a", f"a-{i}", "n1", phase, 1, j))
                await d.cycle()
        for i in range(2):
            clock.now += 0.5
            d.on_pod("MODIFIED", pod("a", f"a-{i}", "n1", "Succeeded", 1, j))
            await d.cycle()
        j["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        clock.now += 15  # its outcome is read again
        await d.cycle()
        status = aw_status(kube, "a")
        assert status["state"] == "Completed" and status["Succeeded"] == 2
        assert [c["type"] for c in status["conditions"]] == [
            "Init", "Queueing", "HeadOfLine", "Dispatched", "Running", "Completed"]
        assert kube.status_writes("a") == 3  # Dispatched, Running, Completed

    run(scenario)


def _match_steps(pods: int) -> int:
    """Bytecode instructions run while `pods` pods of one gang bind: a count, not a
    time, so a busy machine cannot change it."""
    state = ClusterState()
    nodes = max(1, pods // 100)
    for i in range(nodes):
        state.upsert_node(Node(f"n{i}", {GPU: 800, "pods": 1000}))
    owner = ("ns", "big")
    state.reserve(owner, [PlannedPod(f"n{i // 100}", {GPU: 1, "pods": 1})
                          for i in range(pods)])
    bound = [BoundPod("ns", f"p{i}", f"n{(i * 7) % nodes}", {GPU: 1, "pods": 1}, "big")
             for i in range(pods)]
    steps = 0

    def count(frame: Any, event: str, arg: Any) -> Any:
        nonlocal steps
        frame.f_trace_opcodes = True
        if event == "opcode":
            steps += 1
        return count

    sys.settrace(count)
    try:
        for p in bound:
            state.upsert_pod(p.key, p)
    finally:
        sys.settrace(None)
    assert not state.reserved_for(owner)
    return steps


def test_matching_bound_pods_to_a_reservation_grows_linearly() -> None:
    small, large = _match_steps(200), _match_steps(800)
    # 4x the pods: linear matching costs ~4x the steps; a scan of the plan, ~16x.
    assert large / small < 6


# --- 8. two replicas --------------------------------------------------------------------

def test_only_one_replica_leads_and_a_standby_takes_over_once_the_lease_expires() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        t = {"now": 0.0}

        def mono() -> float:
            return t["now"]

        a = LeaderElector(kube, "sys", identity="a", clock=mono, wall=clock,  # type: ignore[arg-type]
                          retry_period=0.0, lease_duration=15.0, renew_deadline=10.0)
        b = LeaderElector(kube, "sys", identity="b", clock=mono, wall=clock,  # type: ignore[arg-type]
                          retry_period=0.0, lease_duration=15.0, renew_deadline=10.0)
        assert await a._try() is True
        assert await b._try() is False
        t["now"] += 10
        assert await a._try() is True  # a renews
        assert await b._try() is False
        t["now"] += 14  # a is killed: no renewal; b has seen it unchanged for 14 s
        assert await b._try() is False
        t["now"] += 2
        assert await b._try() is True
        assert await a._try() is False  # a, if it came back, finds b leading

    run(scenario)


def test_a_released_lease_is_taken_over_at_once() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        a = LeaderElector(kube, "sys", identity="a", wall=clock)  # type: ignore[arg-type]
        b = LeaderElector(kube, "sys", identity="b", wall=clock)  # type: ignore[arg-type]
        await a.acquire()
        assert await b._try() is False
        await a.release()
        assert await b._try() is True

    run(scenario)


# --- 9. blind: decide nothing ----------------------------------------------------------

def test_nothing_is_decided_while_a_watch_is_down() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 4)))
        d = await started(kube, clock)
        d.blind = lambda: "pods: not watching for 3s (connection refused)"
        await d.cycle()
        assert "status" not in get_aw(kube, "a")
        d.blind = lambda: None
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"

    run(scenario)


# --- issue 11, the controller's side -----------------------------------------------------

def test_an_object_planted_before_dispatch_with_a_forged_owner_is_not_adopted() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        victim = kube.put(appwrapper("a", job("a", 1, 4)))
        evil = job("a", 1, 4)
        evil["spec"]["template"]["spec"]["containers"][0]["image"] = "attacker/miner"
        evil["metadata"] = {"name": "a", "namespace": "team", "ownerReferences": [
            {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
             "name": "a", "uid": victim["metadata"]["uid"], "controller": True}]}
        clock.now -= 30
        kube.put(evil)
        clock.now += 30
        d = await started(kube, clock)
        await d.cycle()
        status = aw_status(kube, "a")
        assert status["state"] == "Failed"
        assert "already exists and does not belong to this AppWrapper" in status["message"]

    run(scenario)


def test_a_pod_that_only_carries_the_label_does_not_count_for_the_gang() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        kube.put(appwrapper("a", job("a", 1, 4), created=1))
        d = await started(kube, clock)
        await d.cycle()
        forged = pod("a", "forged", "n1", "Running", 0)
        d.on_pod("ADDED", forged)
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"  # not Running
        assert aw_status(kube, "a").get("running", 0) == 0
        assert d.state.reserved_for(("team", "a"))  # its GPUs are still held
        assert forged["metadata"]["labels"][APPWRAPPER_LABEL] == "a"

    run(scenario)


def test_a_pod_of_a_replicaset_of_a_wrapped_deployment_counts() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                      "metadata": {"name": "web"},
                      "spec": {"replicas": 1, "template": {"spec": {"containers": [
                          {"name": "c", "resources": {"limits": {GPU: 1}}}]}}}}
        kube.put(appwrapper("a", deployment))
        d = await started(kube, clock)
        await d.cycle()
        dep = kube.get("apps/v1", "Deployment", "team", "web")
        assert dep is not None
        rs = kube.put({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                       "metadata": {"name": "web-1", "namespace": "team", "ownerReferences": [
                           {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
                            "uid": dep["metadata"]["uid"], "controller": True}]}})
        d.on_pod("ADDED", pod("a", "web-1-x", "n1", "Running", 1, rs))
        await d.cycle()  # the owner chain is looked up, then the pod counts
        await d.cycle()
        assert types(kube, "a")[-1] == "Running"

    run(scenario)


def test_an_item_adopted_while_its_pods_owner_is_looked_up_proves_its_pods() -> None:
    """After a restart the gang's Job is adopted by its step while the loop looks up the
    owner of the Job's pods: the pods count (they were never counted: gangs stayed
    Dispatched with their pods running)."""
    ownership = Ownership()
    gang = ("team", "a")
    owned = {"metadata": {"name": "a-0", "namespace": "team", "uid": "p", "ownerReferences": [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "a", "uid": "job",
         "controller": True}]}}
    assert ownership.owner_of(owned, gang) is False  # looked up by the next cycle

    async def fetch(ref: OwnerRef) -> dict[str, Any] | None:
        if ref.uid == "job":
            ownership.add_item("job", gang)  # the restart's step adopts it meanwhile
            return {"metadata": {"uid": "job", "ownerReferences": [
                {"apiVersion": AW[0], "kind": AW[1], "name": "a", "uid": "aw",
                 "controller": True}]}}
        return {"metadata": {"uid": ref.uid}}

    assert asyncio.run(ownership.resolve(fetch)) == {("team", "a-0"): gang}
    assert ownership.owner_of(owned, gang) == gang
    # What is above the item proves nothing: a pod made to point at the AppWrapper
    # itself does not count (an AppWrapper makes no pod itself: not even looked up).
    forged = {"metadata": {"name": "x", "namespace": "team", "uid": "x", "ownerReferences": [
        {"apiVersion": AW[0], "kind": AW[1], "name": "a", "uid": "aw", "controller": True}]}}
    assert ownership.owner_of(forged, gang) is None


def test_the_admission_grace_does_not_run_out_while_the_dispatcher_is_blind() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 2, 1)))
        d = await started(kube, clock)
        await d.cycle()
        created_job(kube, "a")
        clock.now += 30
        d.blind = lambda: "pods: not watching for 3s (connection refused)"
        await d.cycle()
        clock.now += 40  # 70 s after the Job was created, 40 of them blind
        await d.cycle()
        d.blind = lambda: None
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"  # 30 s seen: within the 60 s grace
        clock.now += 31
        await d.cycle()
        requeue = [c for c in aw_status(kube, "a")["conditions"]
                   if c["type"] == "PreemptCandidate"]
        assert requeue and requeue[-1]["reason"] == "PodsNotCreated"

    run(scenario)


def test_a_gang_planned_on_a_node_that_goes_keeps_its_hold_elsewhere() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        for n in ("n1", "n2", "n3"):
            kube.put(node(n, gpus=1))
        kube.put(appwrapper("a", job("a", 1, 1), created=1))
        d = await started(kube, clock)
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"  # its pod is not bound yet
        [planned] = d.memory.state.reserved_for(("team", "a"))
        d.on_node("DELETED", node(planned.node, gpus=1))
        for i, name in enumerate(("b", "c")):
            kube.put(appwrapper(name, job(name, 1, 1), created=2 + i))
            d.on_appwrapper("ADDED", get_aw(kube, name))
        await d.cycle()
        # a's pod will bind on one of the two nodes left: only one newer gang fits.
        assert types(kube, "b")[-1] == "Dispatched"
        assert "Dispatched" not in types(kube, "c")
        [moved] = d.memory.state.reserved_for(("team", "a"))
        assert moved.node != planned.node

    run(scenario)


def test_a_half_bound_gang_planned_on_a_node_that_goes_still_holds_its_unbound_pod() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        for n in ("n1", "n2", "n3", "n4"):
            kube.put(node(n, gpus=1))
        kube.put(appwrapper("a", job("a", 2, 1), created=1))
        d = await started(kube, clock)
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"
        first, second = sorted(p.node for p in d.memory.state.reserved_for(("team", "a")))
        j = created_job(kube, "a")
        d.on_pod("ADDED", pod("a", "a-0", first, "Running", 1, j))
        await d.cycle()
        # The node planned for its other pod goes before that pod binds: the hold moves
        # to a node left, and it still holds for the one pod not bound — not for none
        # (the bound pod was once taken off the new plan, then off the hold again).
        d.on_node("DELETED", node(second, gpus=1))
        for i, name in enumerate(("b", "c")):
            kube.put(appwrapper(name, job(name, 1, 1), created=2 + i))
            d.on_appwrapper("ADDED", get_aw(kube, name))
        await d.cycle()
        assert len(d.memory.state.reserved_for(("team", "a"))) == 1
        assert types(kube, "b")[-1] == "Dispatched"
        assert "Dispatched" not in types(kube, "c")

    run(scenario)


def test_a_job_that_completes_just_after_its_last_pod_completes_its_wrapper_soon() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, j = await dispatched_job(kube, clock, 1)
        d.on_pod("MODIFIED", pod("a", "a-0", "n1", "Running", 1, j))
        await d.cycle()
        clock.now += 5
        d.on_pod("MODIFIED", pod("a", "a-0", "n1", "Succeeded", 1, j))
        await d.cycle()  # the Job does not say Complete yet
        assert aw_status(kube, "a")["state"] == "Running"
        j["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        clock.now += 2.5  # not the 15 s of the regular refresh
        await d.cycle()
        assert aw_status(kube, "a")["state"] == "Completed"

    run(scenario)


def test_room_freed_anywhere_goes_first_to_a_replacement_that_fitted_nowhere() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        for n in ("n1", "n2", "n3"):
            kube.put(node(n, gpus=1))
        kube.put(appwrapper("a", job("a", 2, 1), created=1))
        kube.put(appwrapper("b", job("b", 1, 1), created=2))
        d = await started(kube, clock)
        await d.cycle()
        ja, jb = created_job(kube, "a"), created_job(kube, "b")
        d.on_pod("ADDED", pod("a", "a-0", "n1", "Running", 1, ja))
        d.on_pod("ADDED", pod("a", "a-1", "n2", "Running", 1, ja))
        d.on_pod("ADDED", pod("b", "b-0", "n3", "Running", 1, jb))
        await d.cycle()
        # n2 goes with a's pod: its replacement fits nowhere while b runs on n3.
        d.on_node("DELETED", node("n2", gpus=1))
        d.on_pod("DELETED", pod("a", "a-1", "n2", "Running", 1, ja))
        await d.cycle()
        # b finishes: n3 is free, and c arrives wanting one GPU. n3 is a's replacement's.
        d.on_pod("MODIFIED", pod("b", "b-0", "n3", "Succeeded", 1, jb))
        kube.put(appwrapper("c", job("c", 1, 1), created=3))
        d.on_appwrapper("ADDED", get_aw(kube, "c"))
        await d.cycle()
        assert "Dispatched" not in types(kube, "c")
        assert [p.node for p in d.memory.state.reserved_for(("team", "a"))] == ["n3"]

    run(scenario)


def test_a_wrapper_applied_again_waits_for_what_its_predecessor_made_to_go() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        kube.put(appwrapper("a", job("a", 1, 1)))
        # The Job of an earlier AppWrapper "a" (deleted; the garbage collector not there yet).
        left = job("a", 1, 1)
        left["metadata"]["namespace"] = "team"
        left["metadata"]["ownerReferences"] = [{
            "apiVersion": AW[0], "kind": AW[1], "name": "a", "uid": "uid-of-the-old-a",
            "controller": True}]
        kube.put(left)
        d = await started(kube, clock)
        await d.cycle()
        assert aw_status(kube, "a")["state"] != "Failed"
        path = next(p for p in kube.objects if p.endswith("/jobs/a"))
        del kube.objects[path]  # collected
        clock.now += 2
        await d.cycle()
        refs = created_job(kube, "a")["metadata"]["ownerReferences"]
        assert [r["uid"] for r in refs] == [get_aw(kube, "a")["metadata"]["uid"]]
        assert aw_status(kube, "a")["state"] == "Running"

    run(scenario)


def test_a_job_slow_to_say_complete_completes_its_wrapper_within_seconds() -> None:
    """A busy Job controller writes Complete seconds after the last pod ended: the
    wrapper's Completed came 15 s late (the refresh), its Job read on every pod start."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, j = await dispatched_job(kube, clock, 2)
        path = "/apis/batch/v1/namespaces/team/jobs/a"
        reads = kube.reads.count(path)
        for i in range(2):
            d.on_pod("MODIFIED", pod("a", f"a-{i}", "n1", "Running", 1, j))
            await d.cycle()
        assert kube.reads.count(path) == reads  # a pod starting says nothing new
        clock.now += 5
        for i in range(2):
            d.on_pod("MODIFIED", pod("a", f"a-{i}", "n1", "Succeeded", 1, j))
        await d.cycle()
        for _ in range(3):  # the Job says nothing for 6 s
            clock.now += 2.0
            await d.cycle()
            assert aw_status(kube, "a")["state"] == "Running"
        j["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        clock.now += 2.0
        await d.cycle()
        assert aw_status(kube, "a")["state"] == "Completed"

    run(scenario)


def test_a_gang_whose_pods_succeed_one_by_one_has_its_job_read_when_the_last_ends() -> None:
    """A Job cannot have finished on a success while others of its pods still run: it
    was read at each pod's success (7.5 reads a job in bench/e2e.py)."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, j = await dispatched_job(kube, clock, 3)
        path = "/apis/batch/v1/namespaces/team/jobs/a"
        for i in range(3):
            d.on_pod("MODIFIED", pod("a", f"a-{i}", "n1", "Running", 1, j))
        await d.cycle()
        reads = kube.reads.count(path)
        for i in range(2):
            clock.now += 1.0
            d.on_pod("MODIFIED", pod("a", f"a-{i}", "n1", "Succeeded", 1, j))
            await d.cycle()
        assert kube.reads.count(path) == reads
        j["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        clock.now += 1.0
        d.on_pod("MODIFIED", pod("a", "a-2", "n1", "Succeeded", 1, j))
        await d.cycle()
        assert kube.reads.count(path) == reads + 1
        assert aw_status(kube, "a")["state"] == "Completed"

    run(scenario)


def test_a_job_just_created_is_not_read_for_an_outcome_until_the_refresh() -> None:
    """An object made a moment ago has no outcome: reading it was one GET per wrapper."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, _ = await dispatched_job(kube, clock, 2)
        path = "/apis/batch/v1/namespaces/team/jobs/a"
        await d.cycle()
        assert kube.reads.count(path) == 0
        clock.now += runtime.OUTCOME_REFRESH_SECONDS
        await d.cycle()
        assert kube.reads.count(path) == 1

    run(scenario)


def test_a_jobs_ended_pods_held_by_its_finalizer_have_it_read_once_they_are_let_go(
        ) -> None:
    """A Job controller counts an ended pod, then removes its tracking finalizer; the Job
    cannot say Complete before. Reading it when the last pod ended found it running, and
    was read again every 2 s (4 to 5 GETs a job in bench/e2e.py)."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, j = await dispatched_job(kube, clock, 2)
        path = "/apis/batch/v1/namespaces/team/jobs/a"

        def ended(i: int, held: bool) -> dict[str, Any]:
            p = pod("a", f"a-{i}", "n1", "Succeeded", 1, j)
            if held:
                p["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"]
            return p

        for i in range(2):
            d.on_pod("MODIFIED", pod("a", f"a-{i}", "n1", "Running", 1, j))
        await d.cycle()
        reads = kube.reads.count(path)
        for i in range(2):
            d.on_pod("MODIFIED", ended(i, held=True))
        clock.now += 1.0
        await d.cycle()
        assert kube.reads.count(path) == reads
        # Not read, and not taken as done from its pods either: a Job may make more.
        assert aw_status(kube, "a")["state"] == "Running"
        j["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        d.on_pod("MODIFIED", ended(0, held=False))
        await d.cycle()
        assert kube.reads.count(path) == reads  # the other is still held
        d.on_pod("MODIFIED", ended(1, held=False))
        await d.cycle()
        assert kube.reads.count(path) == reads + 1
        assert aw_status(kube, "a")["state"] == "Completed"

    run(scenario)


def test_a_job_that_says_complete_just_after_letting_its_pods_go_is_read_again_soon(
        ) -> None:
    """A Job controller removes the finalizers, then writes Complete: the read that the
    release triggers may come first, so it is read again shortly."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, j = await dispatched_job(kube, clock, 2)
        path = "/apis/batch/v1/namespaces/team/jobs/a"

        def ended(i: int, phase: str, held: bool) -> dict[str, Any]:
            p = pod("a", f"a-{i}", "n1", phase, 1, j)
            p["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"] if held else []
            return p

        for i in range(2):
            d.on_pod("MODIFIED", pod("a", f"a-{i}", "n1", "Running", 1, j))
        await d.cycle()
        for i in range(2):
            d.on_pod("MODIFIED", ended(i, "Succeeded", held=True))
            d.on_pod("MODIFIED", ended(i, "Succeeded", held=False))
        await d.cycle()
        reads = kube.reads.count(path)
        assert reads == 1 and aw_status(kube, "a")["state"] == "Running"
        j["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        clock.now += runtime.OUTCOME_SETTLE_SECONDS
        await d.cycle()
        assert kube.reads.count(path) == reads + 1
        assert aw_status(kube, "a")["state"] == "Completed"

    run(scenario)


def test_a_gang_dispatched_again_after_a_requeue_gets_its_quick_reads_again() -> None:
    """Found by a review: the quick re-reads had been spent on the first dispatch (its
    failed pods), so after a requeue the second run's Completed waited for the 15 s
    refresh instead of the quick re-read."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, j = await dispatched_job(kube, clock, 2)
        key = ("team", "a")
        for i in range(2):
            d.on_pod("MODIFIED", pod("a", f"a-{i}", "n1", "Running", 1, j))
        await d.cycle()
        for i in range(2):
            d.on_pod("MODIFIED", pod("a", f"a-{i}", "n1", "Failed", 1, j))
        while d.tracked[key].phase != "queued":  # below its minimum: requeued
            clock.now += 2.0
            await d.cycle()
            assert clock.now < 1e10
        for i in range(2):
            d.on_pod("DELETED", pod("a", f"a-{i}", "n1", "Failed", 1, j))
        t = d.tracked[key]
        while t.phase not in ("dispatched", "running") or t.needs_items:
            clock.now += 2.0
            await d.cycle()
        again = created_job(kube, "a")
        assert again["metadata"]["uid"] != j["metadata"]["uid"]
        for i in range(2):
            d.on_pod("MODIFIED", pod("a", f"b-{i}", "n1", "Running", 1, again))
        await d.cycle()
        for i in range(2):
            p = pod("a", f"b-{i}", "n1", "Succeeded", 1, again)
            p["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"]
            d.on_pod("MODIFIED", p)
        await d.cycle()
        for i in range(2):
            d.on_pod("MODIFIED", pod("a", f"b-{i}", "n1", "Succeeded", 1, again))
        await d.cycle()  # read: the Job has not said Complete yet
        again["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        clock.now += runtime.OUTCOME_SETTLE_SECONDS
        await d.cycle()
        assert aw_status(kube, "a")["state"] == "Completed"

    run(scenario)


def test_a_finalizer_that_is_not_a_jobs_does_not_hold_back_the_read() -> None:
    """Only a Job controller's tracking finalizer means the pod is not counted yet: a
    pod with another finalizer (the user's, another controller's) is read when it ends."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, j = await dispatched_job(kube, clock, 1)
        path = "/apis/batch/v1/namespaces/team/jobs/a"
        d.on_pod("MODIFIED", pod("a", "a-0", "n1", "Running", 1, j))
        await d.cycle()
        j["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        p = pod("a", "a-0", "n1", "Succeeded", 1, j)
        p["metadata"]["finalizers"] = ["example.com/keep"]
        d.on_pod("MODIFIED", p)
        await d.cycle()
        assert kube.reads.count(path) == 1
        assert aw_status(kube, "a")["state"] == "Completed"

    run(scenario)


def test_a_running_gang_with_a_pod_ended_wakes_the_loop_only_for_quick_reads() -> None:
    """The regular refresh of a wrapped object's outcome waits for the loop's tick: a
    wake for each wrapper's own refresh time would run a cycle per running wrapper."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, j = await dispatched_job(kube, clock, 2)
        d.on_pod("MODIFIED", pod("a", "a-0", "n1", "Running", 1, j))
        d.on_pod("MODIFIED", pod("a", "a-1", "n1", "Running", 1, j))
        await d.cycle()
        d.on_pod("MODIFIED", pod("a", "a-0", "n1", "Failed", 1, j))
        await d.cycle()  # read: not failed; read again in 2 s
        assert d._next_timer() == pytest.approx(2.0)
        clock.now += 2.0
        await d.cycle()  # read again: nothing new ended
        clock.now += 12.0  # its regular refresh is 3 s away, within the tick
        await d.cycle()  # the pod counts, written as details
        assert d._next_timer() == pytest.approx(runtime.TICK_SECONDS)

    run(scenario)
