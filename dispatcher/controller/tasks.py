"""The API steps under way: one per AppWrapper at a time, and side tasks (Events, pins).

A step is guarded by the one rule for API failures: a transient one (429, 5xx, a
timeout) is tried again shortly and never turned into a verdict; any other is logged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from .kube import ApiError
from .tracked import ACTIVE, Key, Tracked

log = logging.getLogger("dispatcher")

# After a transient API failure, the step for that AppWrapper is tried again this soon.
RETRY_SECONDS = 2.0

Work = Coroutine[Any, Any, None]


class Tasks:
    def __init__(self, clock: Callable[[], float], wake: asyncio.Event,
                 touch: Callable[[Key], None]) -> None:
        self.clock = clock
        self.wake = wake  # set when a step ends: what it changed may be decided on
        self.touch = touch  # ... and its wrapper looked at (attention.py)
        self.busy: dict[Key, asyncio.Task[None]] = {}
        self.side: set[asyncio.Task[None]] = set()

    def spawn(self, t: Tracked, work: Work) -> bool:
        """Run `work` for `t` as a task, unless a task for it is still under way."""
        if t.key in self.busy:
            work.close()
            return False
        task = asyncio.create_task(self._guarded(t, work), name=f"{t.key[0]}/{t.key[1]}")
        self.busy[t.key] = task

        def done(_: asyncio.Task[None], key: Key = t.key) -> None:
            if self.busy.get(key) is task:
                del self.busy[key]
            self.touch(key)
            self.wake.set()

        task.add_done_callback(done)
        return True

    def spawn_side(self, work: Work) -> None:
        """Run `work` beside the steps (an Event, a pin): nothing waits for it."""
        task = asyncio.create_task(work)
        self.side.add(task)
        task.add_done_callback(self.side.discard)

    def cancel(self, key: Key) -> None:
        task = self.busy.pop(key, None)
        if task is not None:
            task.cancel()

    def under_way(self) -> list[asyncio.Task[None]]:
        return [*self.busy.values(), *self.side]

    async def _guarded(self, t: Tracked, work: Work) -> None:
        try:
            await work
        except ApiError as e:
            if not e.transient:
                log.error("%s/%s: %s", *t.key, e)
                return
            retry_soon(t, e, self.clock())
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s/%s: step failed", *t.key)


def retry_soon(t: Tracked, e: ApiError, now: float) -> None:
    """A transient failure: a dispatched gang is stepped again shortly; a queued one is
    decided again by the next cycle anyway."""
    if t.phase in ACTIVE:
        t.timers.check_at = now + RETRY_SECONDS
    log.info("%s/%s: API unavailable (%s); trying again shortly", *t.key, e)
