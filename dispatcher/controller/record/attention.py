"""Which tracked AppWrappers a cycle looks at to find the dispatched ones with a step due.

A cycle runs for the few wrappers something happened to, not for the thousands running
quietly: looking at every one of them every cycle made the loop's cost grow with all of
them while a burst of events wakes it four times a second. So a cycle looks at the
wrappers touched since the last one (a watch event about them or their pods, a step of
theirs that ended, a node change: all of them), those whose alarm rang (a timer of theirs
ran out), and, every `SWEEP_SECONDS`, at all of them: whatever changed without a touch is
looked at within that time, as the idle pace of a running gang would anyway.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

from .tracked import Key

# As long as the idle pace of a running gang (due.IDLE_STEP_SECONDS): nothing is
# looked at less often than it is stepped when nothing happens.
SWEEP_SECONDS = 30.0


class Alarms:
    """At most one alarm per wrapper, the last one set; earlier ones are dropped as they
    come up."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, Key]] = []
        self._at: dict[Key, float] = {}

    def set(self, key: Key, at: float | None) -> None:
        if at is None:
            self._at.pop(key, None)
            return
        if self._at.get(key) == at:
            return
        self._at[key] = at
        heapq.heappush(self._heap, (at, key))

    def next_at(self) -> float | None:
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def rung(self, now: float) -> list[Key]:
        """The wrappers whose alarm is at or before `now`; their alarms are spent."""
        rung = []
        while self._heap and self._heap[0][0] <= now:
            at, key = heapq.heappop(self._heap)
            if self._at.get(key) == at:
                del self._at[key]
                rung.append(key)
        return rung

    def _drop_stale(self) -> None:
        while self._heap and self._at.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)


class Attention:
    def __init__(self, sweep_seconds: float = SWEEP_SECONDS) -> None:
        self.sweep_seconds = sweep_seconds
        self._touched: dict[Key, None] = {}  # in the order they were touched
        self._everyone = True
        self._swept_at: float | None = None
        # The loop wakes for these (a step owed at a given moment) ...
        self.waking = Alarms()
        # ... and looks at these at its next cycle after them (a refresh, the idle pace).
        self.quiet = Alarms()

    def touch(self, key: Key) -> None:
        self._touched[key] = None

    def touch_all(self) -> None:
        self._everyone = True

    def take(self, now: float, everyone: Iterable[Key]) -> Iterable[Key]:
        """The wrappers to look at now; what was touched or rang is taken out."""
        if self._swept_at is None or now - self._swept_at >= self.sweep_seconds:
            self._everyone = True
        if self._everyone:
            self._everyone = False
            self._swept_at = now
            self._touched.clear()
            self.waking.rung(now)
            self.quiet.rung(now)
            return everyone
        taken = self._touched
        self._touched = {}
        for key in (*self.waking.rung(now), *self.quiet.rung(now)):
            taken[key] = None
        return taken
