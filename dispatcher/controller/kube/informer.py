"""List and watch one resource, and never trust a view with a gap in it.

The informer lists the resource, hands the complete listing to the dispatcher (which
reconciles memory with it: what is not listed any more is dropped), then watches from
the listing's resourceVersion. It keeps the resourceVersion of every event and
bookmark, so a watch the server ends (its timeout) resumes without a gap. It lists
again when the server says the version is too old (410 Gone), and periodically as a
backstop (`resync_seconds`).

A watch that breaks — the API server restarted, a proxy cut the stream, the connection
went silent past the server's own timeout — makes the informer *not live* until a new
watch is open: the dispatcher decides nothing while any informer is not live, and
/healthz says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from dispatcher.wording import span

from .client import ApiError, Kube, Resource
from .explain import explain
from .startup import Trouble

log = logging.getLogger("dispatcher.informer")

NOT_SERVED_RETRY_SECONDS = 60.0
FIRST_RETRY_SECONDS = 0.5

OnEvent = Callable[[str, Mapping[str, Any]], None]
OnListed = Callable[[list[dict[str, Any]]], None]


class Informer:
    def __init__(self, kube: Kube, resource: Resource, on_event: OnEvent,
                 on_listed: OnListed, watch_seconds: int = 240, resync_seconds: float = 600,
                 clock: Callable[[], float] = time.monotonic, optional: bool = False,
                 selectors: Mapping[str, str] | None = None,
                 not_served: Collection[int] = (404,)) -> None:
        self.kube = kube
        self.resource = resource
        self.on_event = on_event
        self.on_listed = on_listed
        self.watch_seconds = watch_seconds
        self.resync_seconds = resync_seconds
        self.clock = clock
        # A resource whose CRD may not be installed (QuotaSubtrees): while the API server
        # does not serve it, it is an empty listing, looked for again every minute.
        self.optional = optional
        self.not_served = not_served  # the answers that mean "not served" (optional only)
        # label_selector / field_selector: the listing and the watch see the same objects.
        self.selectors = dict(selectors or {})
        self._wake = asyncio.Event()
        self.listed = asyncio.Event()  # the first complete listing was handed over
        self.answered = asyncio.Event()  # listed, or the first try failed
        self.live = False
        self.lost_since: float | None = clock()
        self.problem = "not listed yet"
        self.relists = 0
        self.events = 0
        self._version: str | None = None
        self._opened = False  # the current watch request got its stream
        self._listed_at = 0.0
        self.trouble = Trouble(log, f"listing and watching {self.name}", clock)

    @property
    def name(self) -> str:
        return self.resource.plural

    def blind_reason(self) -> str | None:
        if self.live:
            return None
        since = "" if self.lost_since is None else \
            f" for {span(self.clock() - self.lost_since)}"
        return f"{self.name}: not watching{since} ({self.problem})"

    def blind_cause(self) -> str | None:
        """Why the watch is down, without for how long: words that change only when the
        cause does, fit for a status written when it changes."""
        return None if self.live else f"{self.name}: not watching ({self.problem})"

    def _lost(self, problem: str) -> None:
        self.answered.set()
        if self.live:
            log.warning("watch of %s lost: %s", self.name, problem)
            self.lost_since = self.clock()
        self.live = False
        self.problem = problem

    async def _list(self) -> None:
        items, version = await self.kube.list_with_version(self.resource, **self.selectors)
        self.on_listed(items)
        self._version = version
        self._listed_at = self.clock()
        self.relists += 1
        self.listed.set()
        self._resumed()  # a fresh complete view; the watch replays from its version
        log.info("listed %d %s at version %s", len(items), self.name, version)

    async def run(self) -> None:
        delay = FIRST_RETRY_SECONDS
        while True:
            self._opened = False
            try:
                if self._version is None or (
                        self.resync_seconds and
                        self.clock() - self._listed_at >= self.resync_seconds):
                    await self._list()
                await self._watch()
                delay = FIRST_RETRY_SECONDS
            except asyncio.CancelledError:
                raise
            except ApiError as e:
                if e.status == 410:
                    self._version = None  # too old: list again, then watch
                    continue
                if e.status in self.not_served and self.optional:
                    self._not_served(e)
                    await asyncio.sleep(NOT_SERVED_RETRY_SECONDS)
                    continue
                problem = explain(e)
                self._lost(problem)
                if self._opened:
                    # A stream that was open broke (a restart, a cut connection): the
                    # server answered a moment ago, so resume at once; back off only
                    # while it cannot be reached.
                    delay = FIRST_RETRY_SECONDS
                    continue
                self.trouble.report(problem)
                await self._back_off(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, 5.0)
            except Exception as e:  # a bad event must not end the watch for good
                log.exception("watch of %s failed", self.name)
                self._lost(repr(e))
                await self._back_off(delay)
                delay = min(delay * 2, 5.0)

    def retry_now(self) -> None:
        """Cut a back-off short: the caller has a reason to look again now (the manager
        looks at a cut-off worker once a pass, as often as it used to list it)."""
        self._wake.set()

    async def _back_off(self, seconds: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _watch(self) -> None:
        assert self._version is not None
        # Spread the watches' ends so three informers do not all reconnect at once.
        seconds = int(self.watch_seconds * random.uniform(0.8, 1.0))
        stream = self.kube.watch(self.resource, self._version, seconds, opened=self._open,
                                 **self.selectors)
        async for event in stream:
            kind = str(event.get("type", ""))
            obj = event.get("object") or {}
            if kind == "ERROR":
                code = int(obj.get("code") or 0)
                raise ApiError(code, str(obj.get("reason", "")), str(obj.get("message", "")))
            version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
            if version:
                self._version = version
            if kind == "BOOKMARK":
                continue
            obj.setdefault("apiVersion", self.resource.api_version)
            obj.setdefault("kind", self.resource.kind)
            self.events += 1
            self.on_event(kind, obj)

    def _open(self) -> None:
        self._opened = True
        self._resumed()

    def _not_served(self, e: ApiError) -> None:
        if self.listed.is_set() and self._version is None and self.live:
            return  # still not served: nothing new to say
        if e.status == 404:
            log.info("%s are not served by this cluster (no CRD): none", self.name)
        else:
            log.warning("%s cannot be listed here (%s): counted as none", self.name, explain(e))
        self.on_listed([])
        self._version = None
        self.listed.set()
        self._resumed()

    def _resumed(self) -> None:
        if not self.live and self.problem != "not listed yet":
            log.info("watching %s again", self.name)
        self.trouble.clear(say=False)
        self.answered.set()
        self.live = True
        self.lost_since = None
        self.problem = ""
