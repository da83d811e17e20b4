"""Starting against an API server that may not answer: say why at once, retry with
backoff, keep the reason for /healthz, and stop whenever asked.

A start-up step that fails (the API server unreachable, credentials refused, a grant
missing) is retried, never fatal: in a pod the reason is in the log and in /healthz
instead of a restart loop. SIGTERM and SIGINT stop the process at any step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from dispatcher.wording import span

from .client import ApiError, Kube
from .explain import explain

T = TypeVar("T")

FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 30.0


class Stopped(Exception):
    """A stop signal came before the step finished."""


def stop_on_signals(stop: asyncio.Event | None = None) -> asyncio.Event:
    """`stop` (or a new event), set by SIGTERM or SIGINT (Ctrl-C) on the running loop."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
    return stop


async def until_stopped(step: Awaitable[T], stop: asyncio.Event) -> T:
    """`step`'s result; raises Stopped (the step cancelled) if `stop` is set first."""
    task = asyncio.ensure_future(step)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise Stopped


class Late(Exception):
    """Start-up did not finish within its deadline."""


async def within(step: Awaitable[T], stop: asyncio.Event, deadline: float,
                 excused: Callable[[], bool] = lambda: False) -> T:
    """`until_stopped(step, stop)`; raises Late (the step cancelled) when `deadline`
    seconds pass first (0: no deadline) and `excused()` does not say the wait is fine
    then (a standby replica waiting for the Lease)."""
    if not deadline:
        return await until_stopped(step, stop)
    halt = asyncio.Event()
    late = False

    async def watch() -> None:
        nonlocal late
        await asyncio.sleep(deadline)
        if not excused():
            late = True
            halt.set()

    async def relay() -> None:
        await stop.wait()
        halt.set()

    tasks = [asyncio.create_task(watch()), asyncio.create_task(relay())]
    try:
        return await until_stopped(step, halt)
    except Stopped:
        if late and not stop.is_set():
            raise Late from None
        raise
    finally:
        for task in tasks:
            task.cancel()


class Trouble:
    """A problem that may last, logged at once, then again less and less often while it
    lasts (after 10 s, 20 s, 40 s … then every 5 minutes), and at once when it changes;
    `current` keeps it for /healthz."""

    def __init__(self, log: logging.Logger, what: str,
                 clock: Callable[[], float] = time.monotonic,
                 first_repeat: float = 10.0, max_repeat: float = 300.0,
                 retrying: str = "retrying") -> None:
        self.log = log
        self.what = what
        self.retrying = retrying  # what the first warning says comes next
        self.clock = clock
        self.first_repeat = first_repeat
        self.max_repeat = max_repeat
        self.current: str | None = None
        self._since = 0.0
        self._next_at = 0.0
        self._gap = first_repeat

    def report(self, problem: str) -> None:
        now = self.clock()
        if problem != self.current:
            if self.current is None:
                self._since = now
            self.current = problem
            self._gap = self.first_repeat
            self.log.warning("%s: %s; %s", self.what, problem, self.retrying)
        elif now >= self._next_at:
            self.log.warning("%s: %s; still retrying (for %s)", self.what, problem,
                             span(now - self._since))
            self._gap = min(self._gap * 2, self.max_repeat)
        else:
            return
        self._next_at = now + self._gap

    def clear(self, say: bool = True) -> None:
        """It is over; `say`: log that it is (unless the caller says it its own way)."""
        if self.current is not None and say:
            self.log.info("%s: resolved after %s", self.what, span(self.clock() - self._since))
        self.current = None


async def retry(step: Callable[[], Awaitable[T]], trouble: Trouble) -> T:
    """`step()`'s result, trying again with backoff while it fails with an ApiError."""
    delay = FIRST_RETRY_SECONDS
    while True:
        try:
            result = await step()
        except ApiError as e:
            trouble.report(explain(e))
        else:
            trouble.clear()
            return result
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_RETRY_SECONDS)


async def reach(kube: Kube, trouble: Trouble) -> None:
    """Wait until the API server answers with these credentials (GET /version, which
    every authenticated user may read): a down server or refused credentials is said
    within a second, not after a request's retries."""
    async def version() -> None:
        await kube.request("GET", "/version", retry=False)

    await retry(version, trouble)
