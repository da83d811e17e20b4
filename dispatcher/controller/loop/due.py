"""Which dispatched AppWrappers have a lifecycle step due (stepping.py takes the step).

Only the wrappers the attention points at are looked at (touched since the last cycle,
an alarm rung; record/attention.py); each one that is not due sets its alarms for when the clock
alone will make it due.
"""

from __future__ import annotations

from collections.abc import Collection

from dispatcher.api.management import SUSPENDED_BY
from dispatcher.controller.intake.router import Intake
from dispatcher.controller.items.scaling import Scaling
from dispatcher.controller.record.memory import Memory
from dispatcher.controller.record.tracked import ACTIVE, Key, Tracked
from dispatcher.fleet.fence import MANAGER_LOST

# How often a running wrapper's objects are read for their outcome without pod news.
OUTCOME_REFRESH_SECONDS = 15.0
# A running wrapper with nothing due (no deadline, no pod news) is judged again this often
# all the same: judging each at every cycle would serialise every running wrapper's status
# every cycle.
IDLE_STEP_SECONDS = 30.0


class DueSteps:
    def __init__(self, memory: Memory, intake: Intake, scaling: Scaling) -> None:
        self.memory = memory
        self.intake = intake
        self.scaling = scaling
        self.looked_at = 0  # wrappers looked at, for benchmarks and tests

    def take(self, now: float) -> list[Tracked]:
        """The dispatched wrappers (and failed ones with a teardown owed) that something
        happened to, or whose timer ran out."""
        owed = {*self.intake.requeues_due, *self.intake.edited, *self.memory.sharing.preempting,
                *self.scaling.deferred, *self.scaling.owed}
        tracked = self.memory.tracked
        looked = self.memory.attention.take(now, tracked.keys())
        due = []
        for key in (*looked, *(k for k in owed if k not in looked)):
            t = tracked.get(key)
            if t is None:
                continue
            self.looked_at += 1
            if self._is_due(t, now, owed):
                due.append(t)
            else:
                self.set_alarms(t, now)
        return due

    def _is_due(self, t: Tracked, now: float, owed: Collection[Key]) -> bool:
        """Cheap flags first, the timers and pod counts last."""
        if t.phase == "done":
            return (t.teardown_due and t.aw is not None
                    and (t.timers.teardown_at or 0) <= now) \
                or (t.timers.delete_at is not None and t.timers.delete_at <= now)
        return t.phase in ACTIVE and (
            t.needs_items or t.teardown_due or t.held_by in (SUSPENDED_BY, MANAGER_LOST)
            or t.cancelled_by is not None or t.room.stranded is not None
            or (_reads(t) and (t.reading.stale or now - t.reading.read_at
                                >= OUTCOME_REFRESH_SECONDS))
            or (t.room.unplaced is not None and t.room.unplaced[1] != t.room.unplaced_told)
            or t.key in owed or self._timer_due(t, now) or _counts_changed(t))

    def set_alarms(self, t: Tracked, now: float) -> None:
        """When a wrapper that is not due now will be, by the clock alone: the loop wakes
        for a timer of its own and a quick read; a refresh, the idle pace and a grace
        period are looked at by the next cycle after them."""
        waking, quiet = self.memory.attention.waking, self.memory.attention.quiet
        check_at = t.timers.check_at
        waking.set(t.key, check_at if check_at is not None and check_at > now else None)
        if t.phase in ACTIVE:
            refresh = t.reading.read_at + OUTCOME_REFRESH_SECONDS if _reads(t) else None
            if t.reading.soon and refresh is not None and refresh > now \
                    and (check_at is None or refresh < check_at):
                waking.set(t.key, refresh)
            idle = t.timers.stepped_at + IDLE_STEP_SECONDS if check_at is None else None
            quiet.set(t.key, min((at for at in (refresh, idle) if at is not None),
                                 default=None))
        elif t.phase == "done":
            at = [a for a in (t.timers.teardown_at if t.teardown_due else None,
                              t.timers.delete_at) if a is not None]
            quiet.set(t.key, min(at, default=None))
        else:
            quiet.set(t.key, None)

    def _timer_due(self, t: Tracked, now: float) -> bool:
        """Its timer has run out; with none set, an elastic patch is owed or it has not
        been judged for a while."""
        if t.timers.check_at is not None:
            return t.timers.check_at <= now
        return self.scaling.due(t) or now - t.timers.stepped_at >= IDLE_STEP_SECONDS


def _counts_changed(t: Tracked) -> bool:
    s = t.status
    if not t.pods:  # most wrappers, every cycle: nothing to count
        return (s.pending, s.running, s.Succeeded, s.failed) != (0, 0, 0, 0)
    counts = t.counts()
    return (s.pending, s.running, s.Succeeded, s.failed) != (
        counts.pending, counts.running, counts.succeeded, counts.failed)


def _reads(t: Tracked) -> bool:
    """Whether its objects' outcome is read: not during a reset, whose objects are gone
    (its step ends before any read until they are made again: a refresh due would step it
    at every cycle of the pause)."""
    return bool(t.watched) and t.timers.reset_at is None
