"""The controller against a hostile tenant's wrapper: one being deleted and kept alive by
its own finalizer, one whose step raises, one whose managedBy was flipped while it ran,
one nested hundreds of levels deep (the controller must hold without the webhook)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatcher.admission import cycle
from dispatcher.controller.loop import admitting, held_room

from .builders import nested
from .test_runtime import Clock, FakeKube, appwrapper, aw_status, job, node, run, started

STORED = ("workload.codeflare.dev/v1beta1", "AppWrapper", "team")


def _job_of(kube: FakeKube, name: str) -> dict[str, Any] | None:
    return kube.get("batch/v1", "Job", "team", name)


@pytest.mark.parametrize("generation_bumped", [True, False])
def test_a_wrapper_being_deleted_is_never_dispatched(generation_bumped: bool) -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(appwrapper("kept", job("kept", 1, 8)))
        d = await started(kube, clock)
        await d.cycle()  # no node: it waits
        stored = kube.get(*STORED, "kept")
        assert stored is not None and aw_status(kube, "kept")["state"] == "Pending"
        stored["metadata"].update(finalizers=["tenant.example/keep"],
                                  deletionTimestamp="2027-01-15T09:00:00Z")
        if generation_bumped:
            stored["metadata"]["generation"] = int(stored["metadata"].get("generation") or 0) + 1
        d.on_appwrapper("MODIFIED", kube.put(stored))
        d.on_node("ADDED", kube.put(node("n1")))
        clock.now += 5
        await d.cycle()
        await d.cycle()
        assert _job_of(kube, "kept") is None
        assert aw_status(kube, "kept")["state"] != "Running"

    run(scenario)


def test_a_step_that_raises_fails_its_wrapper_and_the_queue_goes_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    real = admitting.items_digest

    def breaks_on_one(aw: Any) -> str:
        if aw.metadata.name == "broken":
            raise ValueError("Maximum serialization depth exceeded")
        return real(aw)

    monkeypatch.setattr(admitting, "items_digest", breaks_on_one)

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("broken", job("broken", 1, 8), created=1))
        kube.put(appwrapper("behind", job("behind", 1, 8), created=2))
        d = await started(kube, clock)
        for _ in range(3):
            await d.cycle()
            clock.now += 1
        broken = aw_status(kube, "broken")
        assert broken["state"] == "Failed"
        last = broken["conditions"][-1]
        assert last["reason"] == "DispatcherError"
        assert "could not handle this AppWrapper (ValueError: Maximum serialization" \
            in last["message"]
        assert _job_of(kube, "behind") is not None

    run(scenario)



def test_a_deep_template_fails_at_intake_and_the_queue_goes_on() -> None:
    depth = 260  # the depth the dispatch step raised at: items_digest's serializer
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        deep = job("deep", 1, 8)
        deep["spec"]["template"]["spec"]["containers"][0]["x"] = nested(depth)
        kube.put(appwrapper("deep", deep, created=1))
        kube.put(appwrapper("behind", job("behind", 1, 8), created=2))
        d = await started(kube, clock)
        await d.cycle()
        await d.cycle()
        failed = aw_status(kube, "deep")
        assert failed["state"] == "Failed"
        assert "nests more than 100 levels deep" in failed["conditions"][-1]["message"]
        assert _job_of(kube, "behind") is not None

    run(scenario)


def test_managed_by_flipped_while_running_is_not_honoured_after_a_restart() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("first", job("first", 1, 8), created=1))
        d = await started(kube, clock)
        await d.cycle()
        assert _job_of(kube, "first") is not None
        stored = kube.get(*STORED, "first")
        assert stored is not None
        stored["metadata"].setdefault("annotations", {})["workload.codeflare.dev/v1beta2"] = \
            json.dumps({"managedBy": "kueue.x-k8s.io/multikueue"})
        kube.put(stored)
        kube.put(appwrapper("second", job("second", 1, 8), created=2))
        again = await started(kube, clock)  # a restart: everything from the listing
        await again.cycle()
        await again.cycle()
        assert ("team", "first") in again.memory.tracked
        assert _job_of(kube, "second") is None  # the 8 GPUs are still first's
        assert aw_status(kube, "second")["state"] == "Pending"

    run(scenario)


def test_escapes_in_a_kind_or_a_resource_name_never_reach_the_status() -> None:
    """Without the webhook, a wrapper whose item's kind and a container's resource name
    carry escape sequences fails at intake; the message quoting them, which kubectl
    prints as it is, holds only their words."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        odd = job("odd", 1, 8)
        odd["kind"] = "Job\x1b[2J\x1b]0;pwned\x07"
        odd["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][
            "example.com/x\x1b[31m\r\n"] = "1\x1b[8m"
        kube.put(appwrapper("odd", odd, created=1))
        d = await started(kube, clock)
        await d.cycle()
        failed = aw_status(kube, "odd")
        assert failed["state"] == "Failed"
        message = failed["conditions"][-1]["message"]
        assert "kind Job (batch/v1)" in message and failed["message"] == message
        assert not any(c in message for c in "\x1b\x07\r\n")

    run(scenario)


def _bound_by_hand(name: str, node_name: str, containers: int, **asked: str) -> dict[str, Any]:
    """A pod another tenant made with spec.nodeName set: no scheduler, no dispatcher."""
    resources = {"requests": asked, "limits": asked}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "mallory"},
            "spec": {"nodeName": node_name, "containers": [
                {"name": f"c{i}", "resources": resources} for i in range(containers)]},
            "status": {"phase": "Running"}}


def _gpu_job(name: str, gpus: int, memory: str | None = None) -> dict[str, Any]:
    made = job(name, 1, gpus)
    if memory is not None:
        made["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"] = {
            "memory": memory}
    return made


def _held_on(kube: FakeKube, d: Any, name: str) -> set[str]:
    return {p.node for p in d.state.holdings(("team", name))}


@pytest.mark.parametrize("absurd", [
    [_bound_by_hand("foo", "n1", 2, **{"example.com/foo": "8E"})],
    [_bound_by_hand(f"mem-{i}", "n1", 1, memory="8Ei") for i in range(3)],
], ids=["8E of an extended resource in two containers", "8Ei of memory on three pods"])
def test_a_pod_asking_more_than_64_bits_hold_stops_no_cycle(absurd: list[dict[str, Any]]
                                                           ) -> None:
    """Pods bound by someone else whose requests add up beyond 64 bits on n1: the queue
    goes on, n1 has none of what they ask free, and the rest of n1 is still used."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(node("n2"))
        for p in absurd:
            kube.put(p)
        kube.put(appwrapper("memory", _gpu_job("memory", 4, "1Gi"), created=1))
        kube.put(appwrapper("gpus", _gpu_job("gpus", 8), created=2))
        d = await started(kube, clock)
        await d.cycle()
        for name in ("memory", "gpus"):
            assert aw_status(kube, name)["state"] == "Running", name
            assert _job_of(kube, name) is not None
        if "memory" in str(absurd):
            # n1 has no memory free: the wrapper asking memory went to n2, the one
            # asking only GPUs took n1's.
            assert _held_on(kube, d, "memory") == {"n2"}
            assert _held_on(kube, d, "gpus") == {"n1"}

    run(scenario)


@pytest.mark.parametrize("gone", ["deleted", "missing from a listing"])
def test_a_pod_that_cannot_be_read_costs_its_node_and_not_the_watch(gone: str) -> None:
    """A bound pod whose requests the dispatcher cannot read (an API server newer than
    it, say): the watch event is taken, nothing is promised on its node while it is
    there, and the queue goes on elsewhere."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(node("n2"))
        d = await started(kube, clock)
        odd = _bound_by_hand("odd", "n1", 1, cpu="plenty")
        d.on_pod("ADDED", kube.put(odd))
        kube.put(appwrapper("first", job("first", 1, 8), created=1))
        kube.put(appwrapper("second", job("second", 1, 8), created=2))
        for name in ("first", "second"):
            d.on_appwrapper("ADDED", kube.get(*STORED, name) or {})
        await d.cycle()
        assert _held_on(kube, d, "first") == {"n2"}
        assert aw_status(kube, "second")["state"] == "Pending"
        if gone == "deleted":
            d.on_pod("DELETED", odd)
        else:  # deleted while the watch was down
            d.relisted("Pod", [])
        await d.cycle()
        assert _held_on(kube, d, "second") == {"n1"}

    run(scenario)


def test_a_node_that_cannot_be_read_is_left_out_and_the_others_used() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n2"))
        kube.put(appwrapper("first", job("first", 1, 8), created=1))
        d = await started(kube, clock)
        odd = node("n1")
        odd["status"]["allocatable"]["cpu"] = "plenty"
        d.on_node("ADDED", kube.put(odd))
        await d.cycle()
        assert _held_on(kube, d, "first") == {"n2"}
        assert "n1" not in d.state.nodes

    run(scenario)


def test_a_wrapper_the_rules_cannot_decide_waits_alone(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    real = cycle.Cycle._in_quota

    def breaks_on_one(self: cycle.Cycle, w: Any, *args: Any) -> Any:
        if w.key[1] == "broken":
            raise OverflowError("Python int too large to convert to C long")
        return real(self, w, *args)

    monkeypatch.setattr(cycle.Cycle, "_in_quota", breaks_on_one)

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("broken", job("broken", 1, 8), created=1))
        kube.put(appwrapper("behind", job("behind", 1, 8), created=2))
        d = await started(kube, clock)
        await d.cycle()
        assert _job_of(kube, "behind") is not None
        broken = aw_status(kube, "broken")
        assert broken["state"] == "Pending"
        last = broken["conditions"][-1]
        assert last["reason"] == "AppWrapperNotRunnable"
        assert last["message"].startswith(
            "NotDecided: the dispatcher could not decide about it (OverflowError: Python int")

    run(scenario)


def test_a_gang_whose_room_cannot_be_held_again_costs_only_itself(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """After a restart, holding one dispatched gang's room again raises: the cycle goes
    on for the others, and that gang's room is held once it can be."""
    real = held_room.unbound_plan
    broken = {"on": True}

    def breaks_on_one(gang: Any, state: Any, owner: Any, *args: Any, **kw: Any) -> Any:
        if owner == ("team", "first") and broken["on"]:
            raise ValueError("a defect")
        return real(gang, state, owner, *args, **kw)

    monkeypatch.setattr(held_room, "unbound_plan", breaks_on_one)

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(node("n2"))
        kube.put(appwrapper("first", job("first", 1, 8), created=1))
        d = await started(kube, clock)
        await d.cycle()
        assert _job_of(kube, "first") is not None
        kube.put(appwrapper("second", job("second", 1, 8), created=2))
        d = await started(kube, clock)  # a restart: first's room is to be held again
        await d.cycle()
        assert _job_of(kube, "second") is not None
        assert _held_on(kube, d, "first") == set()
        broken["on"] = False
        await d.cycle()
        assert len(_held_on(kube, d, "first")) == 1
        assert _held_on(kube, d, "first") != _held_on(kube, d, "second")

    run(scenario)
