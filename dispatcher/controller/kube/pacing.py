"""Client-side pacing of API requests: a token bucket whose waiting requests go most
urgent first."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Any

# Priorities of the paced requests, most urgent first: what admits work (a Dispatched
# write, creating items, reading the cluster), then status writes, then Events. A wave of
# dispatches must not queue behind the status writes and Events of the wave before it.
URGENT, STATUS, EVENT = 0, 1, 2


class TokenBucket:
    """Client-side pacing: `qps` requests a second on average, `burst` at once; when
    requests wait, the most urgent go first (FIFO within a priority)."""

    def __init__(self, qps: float, burst: int, clock: Any = time.monotonic) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._clock = clock
        self._at = clock()
        self._busy = False  # one taker at a time waits for the next token
        self._queues: tuple[deque[asyncio.Future[None]], ...] = (deque(), deque(), deque())

    async def take(self, priority: int = URGENT) -> None:
        if self.qps <= 0:
            return
        if self._busy:
            turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._queues[priority].append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn.done() and not turn.cancelled():
                    self._next()  # handed the turn just as it was cancelled: pass it on
                raise
        self._busy = True
        try:
            self._refill()
            if self._tokens < 1:
                await asyncio.sleep((1 - self._tokens) / self.qps)
                self._at = self._clock()
                self._tokens = 1.0
            self._tokens -= 1
        finally:
            self._next()

    def try_take(self) -> bool:
        """Take a token if one is there now; False, without waiting, if none is."""
        if self.qps <= 0:
            return True
        if self._busy:
            return False  # the token coming next is promised to a waiting request
        self._refill()
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
        self._at = now

    def _next(self) -> None:
        for queue in self._queues:
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)  # still busy: the turn is handed over
                    return
        self._busy = False

    def waiting(self) -> tuple[int, ...]:
        return tuple(len(q) for q in self._queues)
