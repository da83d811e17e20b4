"""The lifecycle step of a dispatched AppWrapper (due.py says which are due): its items
created, its objects' outcome read, its pods judged (lifecycle.judge) and the verdict
carried out through the durable transitions."""

from __future__ import annotations

import logging
from collections.abc import Callable

from dispatcher.api.conditions import ConditionType, Reason
from dispatcher.api.fault_tolerance import FaultTolerance
from dispatcher.api.labels import APPWRAPPER_LABEL
from dispatcher.api.management import SUSPENDED_BY
from dispatcher.cluster.model import evicting_nodes
from dispatcher.controller.intake.router import Intake
from dispatcher.controller.items.creation import Items, Made, Refused, Waiting
from dispatcher.controller.items.scaling import Scaling
from dispatcher.controller.kube.client import ApiError, Kube, Resource
from dispatcher.controller.pods.leftovers import Leftovers
from dispatcher.controller.record.holds import cancelled_message
from dispatcher.controller.record.memory import Memory
from dispatcher.controller.record.observer import Observer
from dispatcher.controller.record.status import APPWRAPPERS, Change, StatusWriter
from dispatcher.controller.record.tasks import RETRY_SECONDS, Tasks
from dispatcher.controller.record.tracked import Key, Tracked, pod_bucket
from dispatcher.fleet.fence import LOST_MESSAGE, MANAGER_LOST
from dispatcher.lifecycle import (
    AUTOPILOT_NO_EXECUTE,
    ITEMS_CHANGED,
    PODS_LOST,
    PODS_NOT_CREATED,
    PODS_UNPLACEABLE,
    WRAPPED_OBJECT_FAILED,
    Timing,
    Verdict,
    fault_tolerance_for,
    judge,
    judge_v1beta2,
    min_available,
    timing_for,
)

from .due import OUTCOME_REFRESH_SECONDS, DueSteps
from .transitions import Transitions, set_counts

log = logging.getLogger("dispatcher")

OUTCOME_SETTLE_SECONDS = 2.0
OUTCOME_SETTLES = 5  # quick reads after a gang's last pod ended, before the refresh's pace
PODS = Resource("v1", "Pod", "pods", True)
# How often a reset waiting for the pods of its old objects to go looks again.
LEFTOVERS_LOOK_SECONDS = 1.0
# Why a dispatched v1beta2 wrapper whose spec.suspend became true is torn down and queued.
SUSPENDED = "Suspended"


class Stepping:
    def __init__(self, memory: Memory, intake: Intake, items: Items, scaling: Scaling,
                 writer: StatusWriter, transitions: Transitions, tasks: Tasks,
                 observer: Observer, timing: Timing, kube: Kube, leftovers: Leftovers,
                 clock: Callable[[], float], due: DueSteps) -> None:
        self.memory = memory
        self.due = due  # its alarms are set after each step
        self.intake = intake
        self.items = items
        self.scaling = scaling
        self.writer = writer
        self.transitions = transitions
        self.tasks = tasks
        self.observer = observer
        self.timing = timing
        self.kube = kube
        self.leftovers = leftovers
        self.clock = clock

    # --- one step -----------------------------------------------------------------------

    async def step(self, t: Tracked, now: float) -> None:
        """Judge a dispatched wrapper and act on the verdict; then its alarms are set for
        the timers the step left (the loop wakes for them)."""
        try:
            await self._step(t, now)
        finally:
            self.due.set_alarms(t, self.clock())

    async def _step(self, t: Tracked, now: float) -> None:
        assert t.aw is not None
        t.timers.stepped_at = now
        if await self._ended_otherwise(t, now) or await self._resetting(t, now):
            return
        await self.scaling.catch_up(t, now)
        if t.needs_items and not await self._make_items(t, now):
            return
        if t.watched and (t.reading.stale or now - t.reading.read_at
                              >= OUTCOME_REFRESH_SECONDS):
            await self._read_outcome(t, now)
        counts = t.counts()
        running = t.phase == "running"
        if running and counts.running + counts.succeeded < min_available(
                t.aw, t.expected_pods, t.floor):
            t.timers.below_min_since = t.timers.below_min_since or now
        else:
            t.timers.below_min_since = None
        t.aw.status.numberOfRequeueings = t.status.numberOfRequeueings
        timing, _ = timing_for(t.aw, self.timing)
        await self._tell_unplaced(t, now)
        ft = fault_tolerance_for(t.aw.metadata.annotations, self.timing)
        if ft is None:
            verdict = judge(t.aw, counts, t.expected_pods, t.reading.outcome, t.dispatched_at,
                            running, now, timing, t.timers.below_min_since, _items_text(t),
                            t.timers.items_at, t.floor,
                            None if running else t.room.unplaced, t.status)
        else:
            t.timers.failed_since = (t.timers.failed_since or now) if counts.failed else None
            verdict = judge_v1beta2(t.aw, counts, t.expected_pods, t.reading.outcome,
                                    t.dispatched_at, running, now, ft, t.timers.items_at,
                                    t.timers.failed_since, t.timers.below_min_since, _items_text(t),
                                    t.floor, self._missing(t), self._evicted(t),
                                    None if running else t.room.unplaced)
        await self._apply(t, verdict, now, timing, ft)

    @staticmethod
    def _missing(t: Tracked) -> tuple[str, ...]:
        """Its items deleted by someone else; not while the wrapper itself is being
        deleted (a foreground deletion removes its objects first)."""
        assert t.aw is not None
        return () if t.aw.metadata.deletionTimestamp else t.reading.missing

    def _evicted(self, t: Tracked) -> list[str]:
        """The nodes where a pod of the gang uses a resource Autopilot flagged NoExecute
        (none when the installation does not migrate gangs)."""
        if not self.timing.autopilot.migrate:
            return []
        state = self.memory.state
        return evicting_nodes(state.bound_pods_of(t.key), state.nodes)

    async def _ended_otherwise(self, t: Tracked, now: float) -> bool:
        """What ends or restarts the gang whatever its pods say: a teardown owed, a
        user's cancel, a requeue under way, a preemption, an edit, lost room."""
        requeue = self.transitions.start_requeue
        if t.phase == "done":
            if t.timers.delete_at is not None and t.timers.delete_at <= now:
                await self._delete_succeeded(t)
            if t.teardown_due and (t.timers.teardown_at or 0) <= now:
                # pods of a failed gang (re)appeared, or its deletion grace is over
                await self.items.teardown(t)
                t.teardown_due = False
                t.timers.teardown_at = None
        elif t.cancelled_by is not None:  # by a user (record/holds.py): it ends here
            self.intake.requeues_due.discard(t.key)
            self.intake.edited.discard(t.key)
            await self.transitions.fail(t, Reason.Cancelled,
                                        cancelled_message(t.cancelled_by, True), now)
        elif t.key in self.intake.requeues_due:
            await self.transitions.finish_requeue(t, now)
        elif t.key in self.memory.sharing.preempting:
            preemptor, reclaim = self.memory.sharing.preempting[t.key]
            await requeue(t, Reason.Preempted, preempted_message(t.key[0], preemptor, reclaim),
                          now, self.timing, counted=False)
            self.memory.sharing.preempting.pop(t.key, None)
            self.observer.preempted("reclaim" if reclaim else "priority")
        elif t.held_by == MANAGER_LOST:  # a manager's copy cut off from it (fence.py)
            await requeue(t, MANAGER_LOST, LOST_MESSAGE, now, self.timing, counted=False)
        elif t.held_by == SUSPENDED_BY:  # a v1beta2 wrapper suspended while it ran
            await requeue(t, SUSPENDED, "spec.suspend is true: what it created is deleted "
                          "and it waits in its place until spec.suspend is false", now,
                          self.timing, counted=False)
        elif t.key in self.intake.edited:
            # What runs is not what the spec now says: run the new spec from the queue.
            await requeue(t, ITEMS_CHANGED, "spec.resources.GenericItems changed after "
                          "dispatch: torn down and queued again with the new items", now,
                          self.timing, counted=False)
        elif t.room.stranded is not None:
            why, t.room.stranded = t.room.stranded, None
            if t.phase != "dispatched":
                return False
            await requeue(t, PODS_LOST, f"{why}: torn down and queued again", now,
                          self.timing, counted=False)
        else:
            return False
        return True

    async def _resetting(self, t: Tracked, now: float) -> bool:
        """A v1beta2 gang in its retry pause waits for it to pass (holding its room),
        then has its objects created again; True when the step ends here."""
        if t.timers.reset_at is None:
            return False
        assert t.aw is not None
        ft = fault_tolerance_for(t.aw.metadata.annotations, self.timing)
        due = t.timers.reset_at + (ft.retry_pause if ft is not None else 0.0)
        if now < due:
            t.timers.check_at = due
            return True
        if self.leftovers.remaining(t.key):
            # Codeflare's reset waits until every pod of its old objects is gone (deleted
            # at once past the forceful-deletion grace): the new ones find the room free.
            t.timers.check_at = now + LEFTOVERS_LOOK_SECONDS
            return True
        resets = t.status.numberOfRequeueings
        # Resumed, the step goes on: its objects are created now.
        return not await self.transitions.resume(
            t, f"reset {resets} done: its objects are created again", now)

    async def _delete_succeeded(self, t: Tracked) -> None:
        """A v1beta2 wrapper past its success TTL is deleted (its objects with it)."""
        t.timers.delete_at = None
        path = APPWRAPPERS.path(*t.key)
        log.info("%s/%s: succeeded longer than its success TTL: deleted", *t.key)
        try:
            await self.kube.request("DELETE", path, {"preconditions": {"uid": t.uid}})
        except ApiError as e:
            if e.status not in (404, 409):
                raise

    async def _make_items(self, t: Tracked, now: float) -> bool:
        """Its items created (or some still to come); False when the step ends here."""
        # Pod news during the creation marks the outcome stale again.
        stale, t.reading.stale = t.reading.stale, False
        try:
            result = await self.items.create(t)
        except BaseException:
            t.reading.stale = True
            raise
        if isinstance(result, Made) and result.fresh:
            # Objects made just now have not finished: the first read of their outcome
            # comes with pod news or the refresh.
            t.reading.read_at = now
            if t.completable and t.reading.outcome is None:
                t.reading.outcome = "running"
        else:
            t.reading.stale |= stale
        if isinstance(result, Refused):
            await self.transitions.fail(t, Reason.ItemCreationFailure, result.message, now)
            return False
        if isinstance(result, Waiting):
            t.timers.check_at = now + 1.0
            return False
        t.needs_items = False
        if t.timers.items_at is None:
            t.timers.items_at = self.clock()
        return True

    async def _read_outcome(self, t: Tracked, now: float) -> None:
        t.reading.stale = False
        t.reading.read_at = now
        read = await self.items.read(t, t.watched)
        t.reading.outcome, t.reading.missing = read.outcome, read.missing
        counts = t.counts()
        done = counts.succeeded + counts.failed
        ended = not counts.active and done > 0
        t.reading.settles = t.reading.settles + 1 if ended else 0
        t.reading.soon = t.reading.outcome not in ("succeeded", "failed") and (
                done > t.reading.pods_done
                or (ended and t.reading.settles <= OUTCOME_SETTLES))
        if t.reading.soon:
            # A pod just ended and its object has not said so yet (an operator writes its
            # status after the pod's last change; a busy Job controller seconds later):
            # read it again shortly rather than at the next refresh, once per pod ending,
            # and while every pod has ended, a few times.
            t.reading.read_at = now - OUTCOME_REFRESH_SECONDS + OUTCOME_SETTLE_SECONDS
        t.reading.pods_done = done

    async def _tell_unplaced(self, t: Tracked, now: float) -> None:
        """A pod of the gang that cannot be let go is said at once, in status and in a
        Warning Event, once per reason."""
        if t.room.unplaced is None or t.room.unplaced[1] == t.room.unplaced_told:
            return
        why = t.room.unplaced[1]
        latest = t.status.conditions[-1] if t.status.conditions else None
        if latest is not None:
            change = self.writer.begin(t, now)
            change.condition(latest.type, latest.reason or "", why)
            if not await self.transitions.commit(change, force=True):
                return
        t.room.unplaced_told = why
        self.tasks.spawn_side(self.writer.warn(t, PODS_UNPLACEABLE, why, now))

    async def _apply(self, t: Tracked, v: Verdict, now: float, timing: Timing,
                     ft: FaultTolerance | None = None) -> None:
        change = self.writer.begin(t, now)
        set_counts(t)
        t.timers.check_at = v.check_at
        if v.action in ("running", "holding"):
            if v.action == "running":
                self.say_running(t, v.message, change)
            else:
                change.condition(ConditionType.RunningHoldCompletion,
                                 Reason.SomeItemsCompleted, v.message)
                t.status.state = "RunningHoldCompletion"
            if await self.transitions.commit(change):
                t.phase = "running"
                # Its pods hold the capacity now; those let onto a node and not bound
                # yet (above its minimum, a Job's next pod) still need theirs.
                self.memory.state.release_unpinned(t.key)
        elif v.action == "completed":
            t.status.state = "Completed"
            change.condition(ConditionType.Completed, Reason.PodsCompleted, v.message)
            if await self.transitions.commit(change):
                t.phase = "done"
                t.timers.check_at = None
                self.memory.state.release(t.key)
                self.observer.completed()
                if ft is not None:
                    t.timers.delete_at = now + ft.success_ttl
        elif v.action == "failed":
            await self.transitions.fail(
                t, v.reason, v.message, now, change,
                teardown=ft is not None or v.reason != WRAPPED_OBJECT_FAILED,
                teardown_after=ft.deletion_on_failure_grace if ft is not None else 0.0)
        elif v.action == "reset":
            assert ft is not None
            await self.transitions.start_reset(t, v.reason, v.message, now, change,
                                               ft.retry_pause,
                                               tallied=v.reason != AUTOPILOT_NO_EXECUTE)
        elif v.action == "requeue":
            if v.reason in (PODS_NOT_CREATED, PODS_LOST) and await self._pods_disagree(t, v):
                change.abandon()
                t.timers.check_at = now + RETRY_SECONDS
                return
            await self.transitions.start_requeue(t, v.reason, v.message, now, timing, change)
        else:
            await self.transitions.commit(change)

    def say_running(self, t: Tracked, message: str, change: Change) -> None:
        change.condition(ConditionType.Running,
                         *self.scaling.running(t, Reason.PodsRunning, message))
        t.status.state = "Running"

    async def _pods_disagree(self, t: Tracked, v: Verdict) -> bool:
        """Before tearing a gang down for its pods after a short grace, ask the API
        server itself: a watch that lags (a busy or restarted API server) must not make
        the dispatcher requeue — and run twice — a gang whose pods are there."""
        assert t.aw is not None
        pods = [p for p in await self.kube.list(PODS, f"{APPWRAPPER_LABEL}={t.key[1]}",
                                                 namespace=t.key[0])
                if not (p.get("metadata") or {}).get("deletionTimestamp")]
        if v.reason == PODS_NOT_CREATED:
            disagree = bool(pods)
        else:
            up = sum(1 for p in pods if pod_bucket(p) in ("running", "succeeded"))
            disagree = up >= min_available(t.aw, t.expected_pods, t.floor)
        if disagree:
            log.info("%s/%s: the API server lists pods the watch has not shown yet; "
                     "not requeued (%s)", *t.key, v.reason)
        return disagree


def _items_text(t: Tracked) -> str:
    assert t.aw is not None
    names = [f"{i.generictemplate.get('kind', 'object')} "
             f"{(i.generictemplate.get('metadata') or {}).get('name', '')!r}"
             for i in t.aw.spec.resources.GenericItems]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def preempted_message(reader: str, preemptor: Key, reclaim: bool) -> str:
    """Why a victim was torn down, for the readers of its namespace `reader`: a preemptor
    in another namespace is not named."""
    why = "to reclaim the quota it borrows" if reclaim else "as it has a lower priority"
    by = f"{preemptor[0]}/{preemptor[1]}" if preemptor[0] == reader else \
        ("an AppWrapper in another namespace" if reclaim
         else "a higher-priority AppWrapper in another namespace")
    return f"preempted by {by} {why}: torn down and queued again"
