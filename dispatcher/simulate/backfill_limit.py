"""The policy's backfill limit in the simulator: a job dispatched past a reservation
(a backfill) under ``backfillLimitSeconds`` is ended, or queued again, at the limit, by the
controller's own rule (dispatcher.lifecycle: backfill_limit, is_backfill)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

from dispatcher.lifecycle import DEFAULT_TIMING, backfill_limit, is_backfill, with_backfill_limit
from dispatcher.queue.policy import BackfillLimitAction, Policy

# The number a limit event carries in the engine's heap of completions: above every run
# number, so a job that completes at the very moment of its limit completes.
AT_LIMIT = sys.maxsize


@dataclass(frozen=True)
class Deadline:
    """A running backfill's limit: when it falls, and the GPU-seconds the job had run
    before this run began (what is lost is what this run adds)."""

    at: float
    gpu_seconds_before: float


class BackfillLimits:
    """The running backfills' deadlines, by job index."""

    def __init__(self, policy: Policy) -> None:
        self.timing = with_backfill_limit(DEFAULT_TIMING, policy)
        self._deadlines: dict[int, Deadline] = {}

    @property
    def action(self) -> BackfillLimitAction:
        return self.timing.backfill_limit_action

    def dispatched(self, i: int, message: str, t: float, gpu_seconds: float) -> float | None:
        """Job i was dispatched at `t` with these words: its deadline, when the limit
        applies to it (the time a limit event is due), else None."""
        self._deadlines.pop(i, None)
        limit = backfill_limit(self.timing, is_backfill(message))
        if limit is None:
            return None
        self._deadlines[i] = Deadline(t + limit, gpu_seconds)
        return t + limit

    def due(self, i: int, t: float) -> Deadline | None:
        """The deadline of job i's current run when it falls at `t` (and is forgotten);
        None for a limit event of an earlier run (it completed, or was preempted)."""
        d = self._deadlines.get(i)
        if d is None or d.at != t:
            return None
        del self._deadlines[i]
        return d

    def ended(self, i: int) -> None:
        """Job i's run ended before its deadline."""
        self._deadlines.pop(i, None)
