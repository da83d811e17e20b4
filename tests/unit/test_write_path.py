"""What a wrapper costs the API server: the requests a user would miss, and no other."""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher.controller.kube.client import ApiError

from .fake_kube import FakeKube
from .test_runtime import Clock, appwrapper, aw_status, node, run, started, types


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
            "data": {"k": "v"}}


def events(kube: FakeKube, name: str) -> list[dict[str, Any]]:
    return [o for o in kube.objects.values() if o.get("kind") == "Event"
            and o["involvedObject"]["name"] == name]


def test_a_wrapper_with_no_pod_is_dispatched_and_running_in_one_status_write() -> None:
    """The floor of any AppWrapper controller: one status write before the item, the
    item; no Event, which would say what the conditions of that write say, at the same
    time, about a wrapper to which nothing happens afterwards."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", configmap("a")))
        d = await started(kube, clock)
        for _ in range(5):  # nothing more is written later, details included
            await d.cycle()
            await asyncio.sleep(0)
            clock.now += 30
        assert types(kube, "a") == ["Init", "Queueing", "HeadOfLine", "Dispatched", "Running"]
        assert aw_status(kube, "a")["state"] == "Running"
        assert kube.get("v1", "ConfigMap", "team", "a") is not None
        assert kube.status_writes("a") == 1
        assert events(kube, "a") == []
        assert [m for m, _ in kube.writes] == ["PATCH", "POST"]  # status, item

    run(scenario)


def test_a_wrapper_with_no_pod_whose_item_is_refused_fails() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", configmap("a")))
        kube.fail[("POST", "/api/v1/namespaces/team/configmaps")] = ApiError(
            422, "Invalid", "ConfigMap \"a\" is invalid")
        d = await started(kube, clock)
        await d.cycle()
        await asyncio.sleep(0)
        assert types(kube, "a")[-3:] == ["Dispatched", "Running", "Failed"]
        status = aw_status(kube, "a")
        assert status["state"] == "Failed"
        assert "is invalid" in status["conditions"][-1]["message"]

    run(scenario)


def test_a_wrapper_arriving_while_a_cycle_decides_is_written_once_when_dispatched() -> None:
    """One that arrives while a cycle runs has a place in the queue before any cycle has
    looked at it: its place alone is not written (the next cycle dispatches it)."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", configmap("a")))
        d = await started(kube, clock)
        decide = d.admitting.cycle

        async def b_arrives_meanwhile(now: float) -> int:
            decided = await decide(now)
            d.on_appwrapper("ADDED", kube.put(appwrapper("b", configmap("b"))))
            return decided

        d.admitting.cycle = b_arrives_meanwhile  # type: ignore[method-assign]
        await d.cycle()
        assert kube.status_writes("b") == 0
        d.admitting.cycle = decide  # type: ignore[method-assign]
        for _ in range(3):
            await d.cycle()
            clock.now += 30
        assert aw_status(kube, "b")["state"] == "Running"
        assert kube.status_writes("b") == 1
        assert events(kube, "b") == []

    run(scenario)
