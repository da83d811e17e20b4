"""The controller against a hostile tenant's wrapper: one being deleted and kept alive by
its own finalizer, one whose step raises, one whose managedBy was flipped while it ran,
one nested hundreds of levels deep (the controller must hold without the webhook)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dispatcher.controller.loop import admitting

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
