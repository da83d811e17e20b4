"""The API steps under way: one per AppWrapper at a time, and side tasks (Events, pins).

A step is guarded by the one rule for API failures: a transient one (429, 5xx, a
timeout) is tried again shortly and never turned into a verdict; any other is logged. Any
other exception is this wrapper's alone: it is failed, saying so (`crashed`), so that the
same step does not raise at every cycle while the queue behind it waits.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp

from dispatcher.controller.kube.client import NO_ANSWER, ApiError

from .tracked import ACTIVE, Key, Tracked

log = logging.getLogger("dispatcher")

# After a transient API failure, the step for that AppWrapper is tried again this soon.
RETRY_SECONDS = 2.0

Work = Coroutine[Any, Any, None]
# What fails a wrapper whose step raised: (wrapper, message) -> the failing step.
Crashed = Callable[[Tracked, str], Work]


class Tasks:
    def __init__(self, clock: Callable[[], float], wake: asyncio.Event,
                 touch: Callable[[Key], None], crashed: Crashed | None = None) -> None:
        self.clock = clock
        self.crashed = crashed
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
        except (OSError, aiohttp.ClientError) as e:  # the connection, not the wrapper
            log.warning("%s/%s: step cut short (%s); tried again", *t.key, e)
            retry_soon(t, ApiError(NO_ANSWER, "no answer", str(e)), self.clock())
        except Exception as e:
            log.exception("%s/%s: step failed", *t.key)
            if self.crashed is not None and t.phase != "done":
                await self._fail(t, e)

    async def _fail(self, t: Tracked, e: Exception) -> None:
        message = (f"the dispatcher could not handle this AppWrapper ({type(e).__name__}: "
                   f"{str(e)[:300]}): it is failed so that the queue goes on; fix what the "
                   "message points at and apply it again, or report it with the "
                   "dispatcher's log")
        assert self.crashed is not None
        try:
            await self.crashed(t, message)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s/%s: could not be failed after its step failed", *t.key)


def retry_soon(t: Tracked, e: ApiError, now: float) -> None:
    """A transient failure: a dispatched gang is stepped again shortly; a queued one is
    decided again by the next cycle anyway."""
    if t.phase in ACTIVE:
        t.timers.check_at = now + RETRY_SECONDS
    log.info("%s/%s: API unavailable (%s); trying again shortly", *t.key, e)
