"""The informer: list, watch, resume, relist — and blind whenever the watch is down."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from dispatcher.controller.kube.client import ApiError, Resource
from dispatcher.controller.kube.informer import Informer

PODS = Resource("v1", "Pod", "pods", True)


def obj(name: str, version: int) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "n", "resourceVersion": str(version)}}


class ScriptedKube:
    """Listings and watch streams played from a script; each watch call takes the next
    step: a list of events, or an error raised when the stream is opened."""

    def __init__(self, listings: list[list[dict[str, Any]]], watches: list[Any]) -> None:
        self.listings = listings
        self.watches = watches
        self.watched_from: list[str] = []
        self.done = asyncio.Event()

    async def list_with_version(self, resource: Resource, label_selector: str | None = None
                                ) -> tuple[list[dict[str, Any]], str]:
        items = self.listings.pop(0)
        return items, str(100 * (len(self.watched_from) + 1))

    async def watch(self, resource: Resource, version: str, seconds: int,
                    opened: Callable[[], None] | None = None
                    ) -> AsyncIterator[dict[str, Any]]:
        self.watched_from.append(version)
        if not self.watches:
            self.done.set()
            await asyncio.sleep(3600)
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        if opened is not None:
            opened()
        for event in step:
            yield event


def test_a_cut_watch_makes_it_blind_then_it_resumes_from_the_last_version() -> None:
    async def scenario() -> None:
        seen: list[tuple[str, str]] = []
        listed: list[list[str]] = []
        kube = ScriptedKube(
            listings=[[obj("a", 1)]],
            watches=[[{"type": "ADDED", "object": obj("b", 105)}],  # then the server ends it
                     ApiError(0, "ClientConnectionError", "connection reset"),
                     [{"type": "BOOKMARK", "object": obj("", 130)}],
                     [{"type": "DELETED", "object": obj("a", 140)}]],
        )
        states: list[str | None] = []
        informer = Informer(kube, PODS,  # type: ignore[arg-type]
                            lambda kind, o: seen.append((kind, o["metadata"]["name"])),
                            lambda items: listed.append([i["metadata"]["name"]
                                                         for i in items]))
        real_lost = informer._lost

        def lost(problem: str) -> None:
            real_lost(problem)
            states.append(informer.blind_reason())

        informer._lost = lost  # type: ignore[method-assign]
        task = asyncio.create_task(informer.run())
        await asyncio.wait_for(kube.done.wait(), 10)
        task.cancel()
        assert listed == [["a"]]  # listed once: no gap needed a relisting
        assert seen == [("ADDED", "b"), ("DELETED", "a")]
        assert kube.watched_from == ["100", "105", "105", "130", "140"]
        assert states and states[0] is not None and "connection reset" in states[0]
        assert informer.live and informer.blind_reason() is None

    asyncio.run(scenario())


def test_410_gone_lists_again_and_the_listing_is_handed_over_whole() -> None:
    async def scenario() -> None:
        listed: list[list[str]] = []
        kube = ScriptedKube(
            listings=[[obj("a", 1), obj("b", 2)], [obj("b", 2)]],
            watches=[[{"type": "ERROR", "object": {"code": 410, "reason": "Expired",
                                                   "message": "too old resource version"}}]],
        )
        informer = Informer(kube, PODS, lambda kind, o: None,  # type: ignore[arg-type]
                            lambda items: listed.append([i["metadata"]["name"]
                                                         for i in items]))
        task = asyncio.create_task(informer.run())
        await asyncio.wait_for(kube.done.wait(), 10)
        task.cancel()
        # The second listing no longer has "a": the dispatcher drops it (intake.relisted).
        assert listed == [["a", "b"], ["b"]]

    asyncio.run(scenario())
