"""The Events of one AppWrapper, as its page on the dashboard shows them: listed by the
controller with a bound, at the lowest of its client's priorities (after what admits work,
status writes and its own Events), kept a few seconds per AppWrapper, and never more than
a few lists under way at once, so that viewers, however many and however fast they click,
cost the API server and the controller's client little. api.py shows them only to a
viewer RBAC lets list Events in the namespace (viewer.py).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from dispatcher.controller.kube.client import ApiError, Kube
from dispatcher.controller.kube.pacing import EVENT
from dispatcher.controller.record.status import EVENTS
from dispatcher.controller.record.tracked import Key

#: Events read of one AppWrapper (the API server's limit), and of each message, characters.
LIMIT = 100
MAX_MESSAGE = 1024
#: How long a read is kept: the page asks every 5 s.
KEPT_SECONDS = 5.0
#: AppWrappers whose Events are kept, the least recently asked dropped first.
MAX_KEPT = 200
#: Lists under way at once; past it, the page is told to wait for its next refresh.
MAX_READING = 4
BUSY = "not read now (many asked at once): they show at the next refresh"

Read = list[dict[str, Any]] | str  # the Events, oldest first; or why there are none


class RecentEvents:
    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.monotonic = monotonic
        self._kept: OrderedDict[Key, tuple[float, asyncio.Future[Read]]] = OrderedDict()
        self._reading = 0

    async def of(self, kube: Kube, key: Key) -> Read:
        """The Events of the AppWrapper `key`: one list at a time per AppWrapper, shared
        by everyone who asks while it is under way or kept."""
        now = self.monotonic()
        kept = self._kept.get(key)
        if kept is None or now - kept[0] >= KEPT_SECONDS:
            if self._reading >= MAX_READING:
                return BUSY
            read = asyncio.ensure_future(_read(kube, key))
            self._reading += 1
            read.add_done_callback(self._done)
            kept = self._kept[key] = (now, read)
            while len(self._kept) > MAX_KEPT:
                self._kept.popitem(last=False)
        self._kept.move_to_end(key)
        # Shielded: a viewer who leaves does not cancel the read others wait for.
        return await asyncio.shield(kept[1])

    def _done(self, read: asyncio.Future[Read]) -> None:
        self._reading -= 1


async def _read(kube: Kube, key: Key) -> Read:
    try:
        listed = await kube.request("GET", EVENTS.path(key[0]), query={
            "fieldSelector": f"involvedObject.kind=AppWrapper,involvedObject.name={key[1]}",
            "limit": str(LIMIT)}, retry=False, priority=EVENT)
    except ApiError as e:
        return f"the Events cannot be read now: {e}"
    return shown(listed)


def shown(listed: Any) -> list[dict[str, Any]]:
    """The listed Events as the page shows them, oldest first."""
    items = (listed or {}).get("items") or ()
    events = [{"type": e.get("type", ""), "reason": e.get("reason", ""),
               "message": str(e.get("message", ""))[:MAX_MESSAGE],
               "count": e.get("count") or 1,
               "at": e.get("lastTimestamp") or e.get("eventTime") or ""}
              for e in list(items)[:LIMIT]]
    return sorted(events, key=lambda e: str(e["at"]))
