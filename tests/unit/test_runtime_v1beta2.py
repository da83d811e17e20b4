"""v1beta2 AppWrappers in the dispatcher's loop: queued with the others, suspend honoured,
those another controller manages left alone."""

from __future__ import annotations

from typing import Any

from dispatcher.api.conversion import to_v1beta1, to_v1beta2
from dispatcher.controller.loop.runtime import Dispatcher

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

FT = "workload.codeflare.dev.appwrapper/"
STORED = ("workload.codeflare.dev/v1beta1", "AppWrapper", "team")


def codeflare(name: str, *templates: dict[str, Any], created: int = 0,
              labels: dict[str, str] | None = None,
              annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A v1beta2 wrapper as the API server stores it: in v1beta1 terms."""
    v1 = appwrapper(name, *templates, created=created)
    v2 = to_v1beta2(v1)
    # written as v1beta2, not converted from v1beta1
    v2["metadata"]["annotations"] = dict(annotations or {})
    v2["metadata"]["labels"] = labels or {}
    v2["spec"].update(spec)
    return to_v1beta1(v2)


def test_v1beta1_and_v1beta2_wrappers_share_one_queue_in_arrival_order() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("v2-first", job("v2-first", 2, 4), created=1))
        kube.put(appwrapper("v1-second", job("v1-second", 2, 4), created=2))
        d = await started(kube, clock)
        await d.cycle()
        assert aw_status(kube, "v2-first")["state"] == "Running"
        assert kube.get("batch/v1", "Job", "team", "v2-first") is not None
        assert types(kube, "v1-second")[-1] == "Backoff"
        shown = to_v1beta2(kube.get("workload.codeflare.dev/v1beta1", "AppWrapper", "team",
                                    "v2-first") or {})
        assert shown["status"]["phase"] in ("Resuming", "Running")

    run(scenario)


def test_a_v1beta2_wrapper_is_running_once_its_objects_are_created_as_in_codeflare(
) -> None:
    """Codeflare's phases: Resuming while its components are created, Running once they
    all are (PodsReady only once its pods run). Said at once, not with the next news: a
    reader that sees its pods run sees the wrapper Running."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("v2", job("v2", 2, 1)))
        d = await started(kube, clock)
        await d.cycle()
        created_job(kube, "v2")
        status = to_v1beta2(kube.get(*STORED, "v2") or {})["status"]
        assert status["phase"] == "Running"
        ready = {c["type"]: c["status"] for c in status["conditions"]}["PodsReady"]
        assert ready == "False"

    run(scenario)


def test_a_suspended_v1beta2_wrapper_waits_until_suspend_is_false() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("paused", job("paused", 1, 1), suspend=True))
        d = await started(kube, clock)
        await d.cycle()
        assert kube.get("batch/v1", "Job", "team", "paused") is None
        status = aw_status(kube, "paused")
        assert status["conditions"][-1]["reason"] == "Held"
        assert "spec.suspend is true" in status["message"]
        resumed = codeflare("paused", job("paused", 1, 1), suspend=False)
        stored = kube.get("workload.codeflare.dev/v1beta1", "AppWrapper", "team", "paused")
        assert stored is not None
        stored["metadata"]["annotations"] = resumed["metadata"]["annotations"]
        kube.put(stored)
        d.on_appwrapper("MODIFIED", stored)
        await d.cycle()
        assert kube.get("batch/v1", "Job", "team", "paused") is not None

    run(scenario)


def _suspended(kube: FakeKube, value: bool,
               annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """The stored wrapper "train" with spec.suspend set to `value` (an annotation in v1beta1
    terms), as `kubectl patch` would leave it."""
    wanted = codeflare("train", job("train", 1, 1), suspend=value, annotations=annotations)
    stored = kube.get(*STORED, "train")
    assert stored is not None
    stored["metadata"]["annotations"] = wanted["metadata"]["annotations"]
    return kube.put(stored)


def test_a_running_v1beta2_wrapper_suspended_is_torn_down_and_waits_until_resumed(
) -> None:
    """codeflare's suspend of a running AppWrapper: its objects go, it is Suspended, and it
    runs again once spec.suspend is false."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("train", job("train", 1, 1)))
        d = await started(kube, clock)
        await d.cycle()
        created_job(kube, "train")
        assert kube.get("batch/v1", "Job", "team", "train") is not None
        d.on_appwrapper("MODIFIED", _suspended(kube, True))
        await d.cycle()
        await d.cycle()
        assert kube.get("batch/v1", "Job", "team", "train") is None
        shown = to_v1beta2(kube.get(*STORED, "train") or {})["status"]
        assert shown["phase"] == "Suspended"
        assert "spec.suspend is true" in aw_status(kube, "train")["message"]
        d.on_appwrapper("MODIFIED", _suspended(kube, False))
        await d.cycle()
        assert kube.get("batch/v1", "Job", "team", "train") is not None

    run(scenario)


def test_a_wrapper_managed_by_another_controller_is_left_alone() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("theirs", job("theirs", 1, 1),
                           managedBy="kueue.x-k8s.io/multikueue"))
        kube.put(codeflare("ours", job("ours", 1, 1), created=1,
                           managedBy="workload.codeflare.dev/appwrapper-controller"))
        d = await started(kube, clock)
        await d.cycle()
        assert kube.get("batch/v1", "Job", "team", "theirs") is None
        assert aw_status(kube, "theirs") == {}
        assert kube.get("batch/v1", "Job", "team", "ours") is not None

    run(scenario)


def test_kueue_labelled_wrappers_are_kueues_only_when_the_installation_says_so() -> None:
    queue = {"kueue.x-k8s.io/queue-name": "default-queue"}

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("labelled", job("labelled", 1, 1), labels=queue))
        d = await started(kube, clock)
        await d.cycle()
        assert kube.get("batch/v1", "Job", "team", "labelled") is not None  # by default

    async def leave_to_kueue(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("labelled", job("labelled", 1, 1), labels=queue))
        d = await started(kube, clock, leave_kueue_labelled=True)
        await d.cycle()
        assert kube.get("batch/v1", "Job", "team", "labelled") is None
        assert aw_status(kube, "labelled") == {}

    run(scenario)
    run(leave_to_kueue)


def _phase(kube: FakeKube, name: str) -> tuple[str, int]:
    """What a v1beta2 reader sees: the phase and resettingCount."""
    status = to_v1beta2(kube.get(*STORED, name) or {})["status"]
    return status["phase"], status["resettingCount"]


def test_a_failing_v1beta2_gang_is_reset_keeping_its_room_then_fails_at_its_retry_limit(
) -> None:
    """codeflare's rules: a failed pod makes the gang unhealthy; after the failure grace
    it is reset (torn down, created again after the retry pause) without giving up its
    room — a waiting wrapper that would fit in it stays queued — and, reset retryLimit
    times, it fails and its objects go."""
    annotations = {FT + "failureGracePeriodDuration": "10s",
                   FT + "retryPausePeriodDuration": "20s", FT + "retryLimit": "2"}

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("flaky", job("flaky", 1, 4), annotations=annotations))
        kube.put(appwrapper("big", job("big", 1, 8), created=1))
        d = await started(kube, clock)
        await d.cycle()
        for attempt in (1, 2, 3):
            j = created_job(kube, "flaky")
            d.on_pod("ADDED", pod("flaky", f"p{attempt}", "n1", "Running", 4, j))
            await d.cycle()
            assert _phase(kube, "flaky") == ("Running", attempt - 1)
            d.on_pod("MODIFIED", pod("flaky", f"p{attempt}", "n1", "Failed", 4, j))
            await d.cycle()
            clock.now += 9
            await d.cycle()
            assert _phase(kube, "flaky")[0] == "Running"  # within its failure grace
            clock.now += 1
            await d.cycle()
            if attempt == 3:
                break
            assert _phase(kube, "flaky") == ("Resetting", attempt)
            assert kube.get("batch/v1", "Job", "team", "flaky") is None
            d.on_pod("DELETED", pod("flaky", f"p{attempt}", "n1", "Failed", 4, j))
            await d.cycle()
            assert types(kube, "big")[-1] == "Backoff"  # the reset gang keeps its room
            clock.now += 19
            await d.cycle()
            assert kube.get("batch/v1", "Job", "team", "flaky") is None  # still pausing
            clock.now += 1
            await d.cycle()
            assert _phase(kube, "flaky") == ("Running", attempt)  # created again
        status = aw_status(kube, "flaky")
        assert status["state"] == "Failed"
        assert status["conditions"][-1]["reason"] == "RetryLimitReached"
        assert "already reset 2 times" in status["conditions"][-1]["message"]
        assert _phase(kube, "flaky") == ("Failed", 2)
        assert kube.get("batch/v1", "Job", "team", "flaky") is None

    run(scenario)


def test_a_v1beta1_wrapper_is_still_requeued_not_reset() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("mcad", job("mcad", 1, 4)))
        d = await started(kube, clock)
        await d.cycle()
        j = created_job(kube, "mcad")
        d.on_pod("ADDED", pod("mcad", "p", "n1", "Running", 4, j))
        await d.cycle()
        j["status"] = {"conditions": [{"type": "Failed", "status": "True"}]}
        d.on_pod("MODIFIED", pod("mcad", "p", "n1", "Failed", 4, j))
        clock.now += 60
        await d.cycle()
        assert aw_status(kube, "mcad")["state"] == "Failed"  # MCAD: the Job failed

    run(scenario)


def test_a_succeeded_v1beta2_wrapper_is_deleted_after_its_success_ttl() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("done", job("done", 1, 1),
                           annotations={FT + "successTTLDuration": "1m"}))
        kube.put(appwrapper("kept", job("kept", 1, 1), created=1))
        d = await started(kube, clock)
        await d.cycle()
        for name in ("done", "kept"):
            j = created_job(kube, name)
            j["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
            d.on_pod("ADDED", pod(name, f"{name}-0", "n1", "Succeeded", 1, j))
        clock.now += 60
        await d.cycle()
        assert _phase(kube, "done")[0] == "Succeeded"
        clock.now += 59
        await d.cycle()
        assert kube.get(*STORED, "done") is not None
        clock.now += 1
        await d.cycle()
        assert kube.get(*STORED, "done") is None
        assert aw_status(kube, "kept")["state"] == "Completed"  # v1beta1: no TTL

    run(scenario)


def _delete_job(kube: FakeKube, name: str) -> dict[str, Any]:
    """The wrapped Job deleted by someone else (kubectl delete job)."""
    j = created_job(kube, name)
    path = next(p for p, o in kube.objects.items() if o is j)
    del kube.objects[path]
    return j


def test_a_v1beta2_wrapper_whose_object_is_deleted_by_someone_else_fails_at_once() -> None:
    """codeflare's rule: a wrapped object deleted while the wrapper runs fails it, with
    no failure grace and no reset; a v1beta1 wrapper keeps MCAD's rules (its gang is
    short of pods: requeued after the failure grace, not failed at once)."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("v2", job("v2", 1, 1)))
        kube.put(appwrapper("v1", job("v1", 1, 1), created=1))
        d = await started(kube, clock)
        await d.cycle()
        for name in ("v2", "v1"):
            d.on_pod("ADDED", pod(name, f"{name}-0", "n1", "Running", 1, created_job(kube, name)))
        await d.cycle()
        assert _phase(kube, "v2") == ("Running", 0)
        for name in ("v2", "v1"):
            j = _delete_job(kube, name)
            d.on_pod("DELETED", pod(name, f"{name}-0", "n1", "Running", 1, j))
        clock.now += 1
        await d.cycle()
        assert _phase(kube, "v2") == ("Failed", 0)
        last = aw_status(kube, "v2")["conditions"][-1]
        assert last["reason"] == "MissingComponent"
        assert "Job 'v2'" in last["message"] and "without retry" in last["message"]
        assert aw_status(kube, "v1")["state"] == "Running"

    run(scenario)


EVICT = {"autopilot.ibm.com/gpuhealth": "EVICT"}


def test_a_v1beta2_gang_on_a_node_autopilot_flags_evict_is_reset_and_placed_elsewhere(
) -> None:
    """codeflare's Autopilot migration: a node labelled gpuhealth=EVICT resets the v1beta2
    gangs whose pods use its GPUs, at once and without counting the reset; the gang's
    room is held again on a healthy node, and no new GPU pod is placed on the flagged
    one. A v1beta1 gang there keeps running (MCAD has no such rule)."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        d = await started(kube, clock)
        kube.put(codeflare("v2", job("v2", 1, 4)))
        kube.put(appwrapper("v1", job("v1", 1, 4), created=1))
        d.on_appwrapper("ADDED", kube.get(*STORED, "v2") or {})
        d.on_appwrapper("ADDED", kube.get(*STORED, "v1") or {})
        await d.cycle()
        for name in ("v2", "v1"):
            d.on_pod("ADDED", pod(name, f"{name}-0", "n1", "Running", 4, created_job(kube, name)))
        await d.cycle()
        assert _phase(kube, "v2") == ("Running", 0)
        d.on_node("ADDED", node("n2"))
        flagged = node("n1")
        flagged["metadata"]["labels"] = EVICT
        d.on_node("MODIFIED", flagged)
        await d.cycle()
        assert _phase(kube, "v2") == ("Resetting", 0)  # not counted against retryLimit
        last = aw_status(kube, "v2")["conditions"][-1]
        assert last["reason"] == "Resetting" and "NoExecute on n1" in last["message"]
        assert aw_status(kube, "v1")["state"] == "Running"
        d.on_pod("DELETED", pod("v2", "v2-0", "n1", "Running", 4, None))
        await d.cycle()
        assert {p.node for p in d.memory.state.reserved_for(("team", "v2"))} == {"n2"}
        assert d.memory.state.free("n1")["nvidia.com/gpu"] < 0  # none offered there

    run(scenario)


def test_a_v1beta2_wrapper_being_deleted_is_not_failed_for_the_objects_it_takes_along(
) -> None:
    """A foreground deletion of the wrapper removes its objects first (and bumps its
    generation): that is neither a missing component nor an edit to queue again."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("gone", job("gone", 1, 1)))
        d = await started(kube, clock)
        await d.cycle()
        d.on_pod("ADDED", pod("gone", "gone-0", "n1", "Running", 1, created_job(kube, "gone")))
        await d.cycle()
        stored = kube.get(*STORED, "gone")
        assert stored is not None
        stored["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        stored["metadata"]["generation"] += 1
        d.on_appwrapper("MODIFIED", stored)
        j = _delete_job(kube, "gone")
        d.on_pod("DELETED", pod("gone", "gone-0", "n1", "Running", 1, j))
        clock.now += 1
        await d.cycle()
        assert aw_status(kube, "gone")["state"] != "Failed"

    run(scenario)


async def _running_pod(kube: FakeKube, d: Dispatcher, name: str) -> dict[str, Any]:
    """`name` dispatched, the pod of its Job Running on n1 (in the API and in memory)."""
    await d.cycle()
    live = kube.put(pod(name, "p1", "n1", "Running", 4, created_job(kube, name)))
    d.on_pod("ADDED", live)
    await d.cycle()
    return live


def test_pods_still_there_after_the_forceful_deletion_grace_are_deleted_at_once_and_the_reset_goes_on(  # noqa: E501
) -> None:
    """codeflare's progress guarantee: a reset waits until the pods of its old objects
    are gone; one still there forcefulDeletionGracePeriod after their deletion (a node that
    never confirms) is deleted with gracePeriodSeconds 0, an Event says so, and the reset
    goes on. Only pods its objects made: one that merely wears its label is left alone."""
    annotations = {FT + "failureGracePeriodDuration": "10s",
                   FT + "retryPausePeriodDuration": "5s",
                   FT + "forcefulDeletionGracePeriodDuration": "30s"}

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("stuck", job("stuck", 1, 4), annotations=annotations))
        d = await started(kube, clock)
        live = await _running_pod(kube, d, "stuck")
        # Someone's pod wearing the gang's label, made by none of its objects: not its.
        stray = kube.put(pod("stuck", "stray", "n1", "Running", 0))
        d.on_pod("ADDED", stray)
        d.on_pod("MODIFIED", {**live, "status": {"phase": "Failed"}})
        await d.cycle()
        clock.now += 10
        await d.cycle()
        assert _phase(kube, "stuck") == ("Resetting", 1)
        assert kube.get("batch/v1", "Job", "team", "stuck") is None
        pod_path = "/api/v1/namespaces/team/pods/p1"
        clock.now += 20  # past the retry pause, not past the forceful-deletion grace
        await d.cycle()
        assert _phase(kube, "stuck") == ("Resetting", 1)
        assert kube.get("batch/v1", "Job", "team", "stuck") is None  # waits for p1
        assert kube.get("v1", "Pod", "team", "p1") is not None
        clock.now += 10
        await d.cycle()
        assert (pod_path, {"gracePeriodSeconds": 0,
                           "preconditions": {"uid": live["metadata"]["uid"]}}) in kube.deletes
        assert kube.get("v1", "Pod", "team", "p1") is None
        assert kube.get("v1", "Pod", "team", "stray") is not None  # left alone
        assert not [p for p, _ in kube.deletes if p.endswith("/stray")]
        told = [e for e in kube.of_kind("Event") if e["reason"] == "ForcefulDeletion"]
        assert len(told) == 1 and "p1" in told[0]["message"]
        assert "forceful deletion grace 30s" in told[0]["message"]
        d.on_pod("DELETED", live)
        await d.cycle()
        assert _phase(kube, "stuck") == ("Running", 1)  # created again
        assert kube.get("batch/v1", "Job", "team", "stuck") is not None

    run(scenario)


def test_a_v1beta1_wrapper_leaves_the_pods_of_its_deleted_objects_to_the_garbage_collector(
) -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("mcad", job("mcad", 1, 4)))
        d = await started(kube, clock)
        live = await _running_pod(kube, d, "mcad")
        created_job(kube, "mcad")["status"] = {
            "conditions": [{"type": "Failed", "status": "True"}]}
        d.on_pod("MODIFIED", {**live, "status": {"phase": "Failed"}})
        clock.now += 60
        await d.cycle()
        assert aw_status(kube, "mcad")["state"] == "Failed"
        clock.now += 3600
        await d.cycle()
        assert kube.get("v1", "Pod", "team", "p1") is not None
        assert not [p for p, _ in kube.deletes if "/pods/" in p]

    run(scenario)


def test_pods_left_by_a_deleted_v1beta2_wrapper_are_deleted_at_once_after_the_grace(
) -> None:
    """The garbage collector deletes a deleted wrapper's objects; a pod of them still
    there forcefulDeletionGracePeriod later is deleted with gracePeriodSeconds 0."""
    annotations = {FT + "forcefulDeletionGracePeriodDuration": "30s"}

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("gone", job("gone", 1, 4), annotations=annotations))
        d = await started(kube, clock)
        live = await _running_pod(kube, d, "gone")
        stored = kube.get(*STORED, "gone")
        assert stored is not None
        d.on_appwrapper("DELETED", stored)
        clock.now += 29
        await d.cycle()
        assert kube.get("v1", "Pod", "team", "p1") is not None  # within its grace
        clock.now += 1
        await d.cycle()
        assert ("/api/v1/namespaces/team/pods/p1", {
            "gracePeriodSeconds": 0, "preconditions": {"uid": live["metadata"]["uid"]}}
                ) in kube.deletes
        assert kube.get("v1", "Pod", "team", "p1") is None

    run(scenario)


def test_a_gang_in_its_retry_pause_is_not_stepped_at_every_cycle() -> None:
    """During a reset's pause its objects are gone and nothing is read: it is stepped when
    its pause ends (and when something happens to it), not at every cycle."""
    annotations = {FT + "failureGracePeriodDuration": "10s",
                   FT + "retryPausePeriodDuration": "90s"}

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("flaky", job("flaky", 1, 4), annotations=annotations))
        d = await started(kube, clock)
        await d.cycle()
        j = created_job(kube, "flaky")
        p = pod("flaky", "p1", "n1", "Running", 4, j)
        d.on_pod("ADDED", p)
        await d.cycle()
        d.on_pod("MODIFIED", pod("flaky", "p1", "n1", "Failed", 4, j))
        await d.cycle()
        clock.now += 10
        await d.cycle()
        assert _phase(kube, "flaky") == ("Resetting", 1)
        d.on_pod("DELETED", p)
        await d.cycle()
        steps: list[float] = []
        step = d.stepping.step

        def counted(t: Any, now: float) -> Any:
            steps.append(now)
            return step(t, now)

        d.stepping.step = counted  # type: ignore[method-assign]
        for _ in range(60):
            clock.now += 1
            await d.cycle()
        assert len(steps) <= 2, steps
        clock.now += 40
        await d.cycle()
        assert _phase(kube, "flaky") == ("Running", 1)  # the pause is over: made again

    run(scenario)


def test_a_new_pod_of_the_same_name_is_not_deleted_as_a_leftover_of_the_old_objects() -> None:
    """A suspended gang's pod `a` went, `b` hangs; resumed, its new Job makes a new `a`
    (fixed names: StatefulSet, indexed Job, LeaderWorkerSet): past the grace only the old
    `b` is deleted at once, never the new `a`."""
    annotations = {FT + "forcefulDeletionGracePeriodDuration": "30s"}

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("train", job("train", 2, 1), annotations=annotations))
        d = await started(kube, clock)
        await d.cycle()
        j = created_job(kube, "train")
        a = kube.put(pod("train", "a", "n1", "Running", 1, j))
        b = kube.put(pod("train", "b", "n1", "Running", 1, j))
        d.on_pod("ADDED", a)
        d.on_pod("ADDED", b)
        await d.cycle()
        d.on_appwrapper("MODIFIED", _suspended(kube, True, annotations))
        await d.cycle()
        await d.cycle()
        d.on_appwrapper("MODIFIED", _suspended(kube, False, annotations))
        await d.cycle()
        d.on_pod("DELETED", a)
        kube.objects.pop("/api/v1/namespaces/team/pods/a", None)
        again = kube.put(pod("train", "a", "n1", "Running", 1, created_job(kube, "train")))
        d.on_pod("ADDED", again)
        await d.cycle()
        clock.now += 31
        await d.cycle()
        await d.cycle()
        forced = [path for path, body in kube.deletes
                  if body and body.get("gracePeriodSeconds") == 0]
        assert "/api/v1/namespaces/team/pods/b" in forced
        assert "/api/v1/namespaces/team/pods/a" not in forced
        assert kube.get("v1", "Pod", "team", "a") is not None

    run(scenario)


def test_pods_of_a_later_deletion_of_the_same_wrapper_get_their_whole_grace() -> None:
    """A later teardown of the same wrapper (another reset) while an old pod lingers: its
    pods are not deleted at once on the old deadline; the grace starts again."""
    from dispatcher.controller.record.memory import Memory
    from dispatcher.queue import Policy

    memory = Memory(Policy(name="fifo"))
    memory.objects_deleted(("team", "w"), {("team", "old")}, 30.0, 1000.0)
    memory.objects_deleted(("team", "w"), {("team", "new")}, 30.0, 1100.0)
    left = memory.leftovers[("team", "w")]
    assert left.pods == {("team", "old"), ("team", "new")}
    assert left.deleted_at + left.grace == 1130.0
