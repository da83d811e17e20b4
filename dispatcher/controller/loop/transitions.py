"""The durable moves of an AppWrapper: fail, requeue, and the commit every move goes
through. Each writes its status first; memory follows only once the write succeeded,
and the teardown comes after — so a restart in between finishes the move, never undoes
or repeats it."""

from __future__ import annotations

import logging

from dispatcher.api.conditions import ConditionType, Reason
from dispatcher.api.models import Requeuing
from dispatcher.controller.intake.router import Intake
from dispatcher.controller.items.creation import Items
from dispatcher.controller.items.scaling import Scaling
from dispatcher.controller.record.memory import Memory
from dispatcher.controller.record.observer import Observer
from dispatcher.controller.record.positions import clear_position
from dispatcher.controller.record.status import Change, StatusWriter
from dispatcher.controller.record.tracked import Tracked
from dispatcher.lifecycle import RESETTING, Timing, pods_allowed_seconds

log = logging.getLogger("dispatcher")


class Transitions:
    def __init__(self, memory: Memory, writer: StatusWriter, items: Items, scaling: Scaling,
                 intake: Intake, observer: Observer) -> None:
        self.memory = memory
        self.writer = writer
        self.items = items
        self.scaling = scaling
        self.intake = intake
        self.observer = observer

    async def commit(self, change: Change, force: bool = False) -> bool:
        """Write; False (and the AppWrapper forgotten) if it is gone. Transient failures
        raise, with memory restored to what the API has."""
        if await self.writer.commit(change, force=force):
            return True
        self.memory.forget(change.t)
        return False

    async def fail(self, t: Tracked, reason: str, message: str, now: float,
                   change: Change | None = None, teardown: bool = True,
                   teardown_after: float = 0.0) -> None:
        """Failed is written first; then the items go (a crash in between leaves a
        Failed wrapper whose pods, when seen, are torn down — never a recreation);
        `teardown_after` seconds later when given (a v1beta2 wrapper's
        deletion-on-failure grace, to look at what failed)."""
        change = change or self.writer.begin(t, now)
        t.status.state = "Failed"
        clear_position(t.status)
        change.condition(ConditionType.Failed, reason, message)
        if not await self.commit(change):
            return
        log.info("%s/%s: failed (%s): %s", *t.key, reason, message)
        t.phase = "done"
        t.timers.check_at = None
        t.needs_items = False
        if self.memory.queue.get(t.key) is t.queued:
            self.memory.queue.remove(t.key)
        self.memory.state.release(t.key)  # what still runs holds its capacity by its pods
        self.observer.failed(reason)
        t.timers.reset_at = None
        if teardown and teardown_after > 0:
            t.teardown_due = True
            t.timers.teardown_at = now + teardown_after
        elif teardown:
            t.teardown_due = True
            await self.items.teardown(t)
            t.teardown_due = False

    async def crashed(self, t: Tracked, message: str) -> None:
        """Its step raised (record/tasks.py): failed, its objects torn down."""
        await self.fail(t, Reason.DispatcherError, message, self.writer.clock())

    async def start_requeue(self, t: Tracked, reason: str, message: str, now: float,
                            timing: Timing, change: Change | None = None,
                            counted: bool = True) -> None:
        """PreemptCandidate is written before the teardown: a restart in between finds
        it and finishes the requeue instead of re-creating the items."""
        change = change or self.writer.begin(t, now)
        change.condition(ConditionType.PreemptCandidate, reason, message)
        if counted:
            t.status.numberOfRequeueings += 1
            requeuing = t.aw.spec.schedulingSpec.requeuing if t.aw else Requeuing()
            t.status.requeueingTimeInSeconds = int(pods_allowed_seconds(
                requeuing, t.status.numberOfRequeueings, timing))
        if not await self.commit(change):
            return
        log.info("%s/%s: requeued (%s): %s", *t.key, reason, message)
        self.observer.requeued(reason)
        self.intake.edited.discard(t.key)
        self.intake.requeues_due.add(t.key)
        await self.finish_requeue(t, now)

    async def start_reset(self, t: Tracked, reason: str, message: str, now: float,
                          change: Change, pause: float, tallied: bool = True) -> None:
        """A v1beta2 gang reset (codeflare's Resetting): the reset is written first and
        counted (unless not `tallied`), then its objects go; they are created again
        `pause` seconds later. It stays dispatched meanwhile, holding its quota and room."""
        change.condition(ConditionType.Dispatched, RESETTING, message)
        t.status.state = "Pending"
        t.status.numberOfRequeueings += 1 if tallied else 0
        if not await self.commit(change):
            return
        log.info("%s/%s: reset (%s): %s", *t.key, reason, message)
        self.observer.reset(reason)
        t.timers.reset_at = now
        await self._tear_down_held(t)
        t.timers.check_at = now + pause
        # What a v1beta2 reader sees as ResourcesDeployed: its objects are gone.
        await self.commit(self.writer.begin(t, now), force=True)

    async def _tear_down_held(self, t: Tracked) -> None:
        """Its objects gone; what its pods held is held again for the gang as a whole
        (held_room.py, before anything new is admitted)."""
        t.phase = "dispatched"
        t.needs_items = False
        await self.items.teardown(t)
        self.scaling.requeued(t)
        t.pods.clear()
        set_counts(t)
        t.timers.items_at = None
        t.reading.outcome = None
        t.timers.below_min_since = t.timers.failed_since = None
        self.memory.state.release(t.key)
        self.memory.hold_again(t)

    async def resume(self, t: Tracked, message: str, now: float) -> bool:
        """After a reset's pause: its objects are to be created again (False: it is gone)."""
        change = self.writer.begin(t, now)
        change.condition(ConditionType.Dispatched, Reason.AppWrapperRunnable, message)
        if not await self.commit(change):
            return False
        t.timers.reset_at = None
        t.mark_dispatched(now, t.preempted)
        t.timers.check_at = None
        return True

    async def finish_requeue(self, t: Tracked, now: float) -> None:
        await self.items.teardown(t)
        change = self.writer.begin(t, now)
        t.status.state = "Pending"
        t.status.admittedDigest = ""
        t.status.preempted = []
        self.scaling.requeued(t)
        t.pods.clear()
        set_counts(t)
        change.condition(ConditionType.Queueing, Reason.AwaitingHeadOfLine,
                         "requeued; waiting for capacity again")
        if not await self.commit(change):
            self.intake.requeues_due.discard(t.key)
            return
        self.intake.requeues_due.discard(t.key)
        self.memory.state.release(t.key)
        t.phase = "queued"
        t.teardown_due = False
        t.needs_items = False
        t.room.needs_reservation = False
        t.timers.items_at = None
        t.reading.outcome = None
        t.timers.check_at = None
        t.timers.below_min_since = t.timers.failed_since = t.timers.reset_at = None
        self.intake.queue_again(t)


def set_counts(t: Tracked) -> None:
    """The status's pod counts, as its pods are now."""
    counts = t.counts()
    t.status.pending = counts.pending
    t.status.running = counts.running
    t.status.Succeeded = counts.succeeded
    t.status.failed = counts.failed
