"""Spec edits of an AppWrapper the dispatcher has admitted, on an in-memory API: where the
webhook does not refuse them (an install without it), what is created after the requeue
is what the spec now says, admitted anew."""

from __future__ import annotations

import copy
from typing import Any

from dispatcher.controller.kube.client import ApiError
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

AW = ("workload.codeflare.dev/v1beta1", "AppWrapper")


def edit(kube: FakeKube, d: Dispatcher, name: str, *items: dict[str, Any]) -> None:
    """The user replaces the wrapper's items (kubectl edit): the API server bumps its
    generation, and the watch brings the new object."""
    obj = copy.deepcopy(kube.get(*AW, "team", name))
    assert obj is not None
    obj["spec"]["resources"]["GenericItems"] = [{"generictemplate": i} for i in items]
    obj["metadata"]["generation"] = int(obj["metadata"].get("generation") or 1) + 1
    d.on_appwrapper("MODIFIED", copy.deepcopy(kube.put(obj)))


def gpus_asked(j: dict[str, Any]) -> tuple[int, int]:
    """(pods, GPUs per pod) of a created Job."""
    limits = j["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    return j["spec"]["parallelism"], int(limits["nvidia.com/gpu"])


def test_a_running_wrapper_grown_by_an_edit_is_admitted_and_created_as_edited() -> None:
    """Issue 31 item 10: a running 1-pod 1-GPU Job grown to 4 pods x 8 GPUs was requeued
    with "the new items", then its OLD Job was created again at once while the status
    said 4 x 8. It must wait while 32 GPUs are not free, then create the 4 x 8 Job."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(node("n2"))
        kube.put(appwrapper("a", job("a", 1, 1)))
        d = await started(kube, clock)
        await d.cycle()
        j = created_job(kube, "a")
        d.on_pod("ADDED", pod("a", "a-0", "n1", "Running", 1, j))
        await d.cycle()
        assert types(kube, "a")[-1] == "Running"
        edit(kube, d, "a", job("a", 4, 8))
        await d.cycle()
        requeue = [c for c in aw_status(kube, "a")["conditions"]
                   if c["type"] == "PreemptCandidate"][-1]
        assert requeue["reason"] == "ItemsChanged"
        assert kube.get("batch/v1", "Job", "team", "a") is None  # the old Job torn down
        d.on_pod("DELETED", pod("a", "a-0", "n1", "Running", 1))  # garbage-collected
        await d.cycle()
        await d.cycle()
        # 4 x 8 GPUs do not fit on 2 x 8: nothing is created, and it says why.
        assert kube.get("batch/v1", "Job", "team", "a") is None
        status = aw_status(kube, "a")
        assert types(kube, "a")[-1] == "Backoff"
        assert "needs 32 nvidia.com/gpu" in status["message"]
        assert status["requestedGPUs"] == 32
        for n in ("n3", "n4"):
            d.on_node("ADDED", kube.put(node(n)))
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"
        assert gpus_asked(created_job(kube, "a")) == (4, 8)

    run(scenario)


def test_an_edit_during_the_requeue_of_a_running_wrapper_is_what_comes_back() -> None:
    """Edited twice: the requeue that the first edit started queues the latest spec."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 1)))
        d = await started(kube, clock)
        await d.cycle()
        edit(kube, d, "a", job("a", 1, 2))
        edit(kube, d, "a", job("a", 2, 4))
        await d.cycle()
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"
        assert gpus_asked(created_job(kube, "a")) == (2, 4)

    run(scenario)


def test_an_edit_that_makes_a_running_wrapper_invalid_fails_it_saying_why() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 1)))
        d = await started(kube, clock)
        await d.cycle()
        bad = job("a", 1, 1)
        bad["spec"]["parallelism"] = -2
        edit(kube, d, "a", bad)
        await d.cycle()
        await d.cycle()
        status = aw_status(kube, "a")
        assert status["state"] == "Failed"
        assert status["conditions"][-1]["reason"] == "InvalidSpec"
        assert "parallelism" in status["message"]
        assert kube.get("batch/v1", "Job", "team", "a") is None

    run(scenario)


def test_an_edit_while_the_dispatch_is_written_is_what_is_created() -> None:
    """The edit lands while the Dispatched write is on the wire, and that write fails
    (503): the dispatch is undone, and the next one is of the spec as edited — the old
    items are never created."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 1)))
        d = await started(kube, clock)
        real = kube.request
        posted: list[tuple[int, int]] = []

        async def edited_meanwhile(method: str, path: str, body: Any = None,
                                   **kw: Any) -> Any:
            if method == "PATCH" and path.endswith("/a/status") and not posted \
                    and "Dispatched" in str(body):
                posted.append((0, 0))
                edit(kube, d, "a", job("a", 2, 4))
                raise ApiError(503, "ServiceUnavailable", "try again")
            if method == "POST" and path.endswith("/jobs"):
                posted.append(gpus_asked(body))
            return await real(method, path, body, **kw)

        kube.request = edited_meanwhile  # type: ignore[method-assign]
        await d.cycle()
        assert kube.get("batch/v1", "Job", "team", "a") is None
        clock.now += 5
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"
        assert posted[1:] == [(2, 4)]  # only the edited Job was ever created

    run(scenario)


def test_an_edit_undone_before_the_requeue_leaves_the_running_wrapper_alone() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 1)))
        d = await started(kube, clock)
        await d.cycle()
        j = created_job(kube, "a")
        d.on_pod("ADDED", pod("a", "a-0", "n1", "Running", 1, j))
        await d.cycle()
        edit(kube, d, "a", job("a", 4, 8))
        edit(kube, d, "a", job("a", 1, 1))  # the user thinks better of it at once
        await d.cycle()
        assert types(kube, "a")[-1] == "Running"
        assert "PreemptCandidate" not in types(kube, "a")
        assert created_job(kube, "a")["metadata"]["uid"] == j["metadata"]["uid"]

    run(scenario)
