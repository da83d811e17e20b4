"""v1beta2 AppWrappers in the dispatcher's loop: queued with the others, suspend honoured,
those another controller manages left alone."""

from __future__ import annotations

from typing import Any

from dispatcher.api.conversion import to_v1beta1, to_v1beta2

from .fake_kube import FakeKube
from .test_runtime import Clock, appwrapper, aw_status, job, node, run, started, types


def codeflare(name: str, *templates: dict[str, Any], created: int = 0,
              labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A v1beta2 wrapper as the API server stores it: in v1beta1 terms."""
    v1 = appwrapper(name, *templates, created=created)
    v2 = to_v1beta2(v1)
    del v2["metadata"]["annotations"]  # written as v1beta2, not converted from v1beta1
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
