"""The admission loop: lifecycle of dispatched AppWrappers, then one admission cycle.

Watch events only update memory (intake.py) and wake the loop. The loop batches
whatever happened since it last ran:

1. owner chains of new pods are looked up (a pod counts for a gang only if proven);
2. after a restart, the unbound part of every dispatched gang is reserved again —
   before anything new is admitted, so no GPU is promised twice;
3. dispatched AppWrappers are judged (running? completed? requeue?) and their items
   created or removed (creation.py);
4. one admission cycle runs off the event loop, and its decisions are carried out —
   each only if the AppWrapper is still the very object it was made for.

Every transition is durable before it takes effect: the status write comes first
(status.py), memory follows only when it succeeded. Items are created only after
`Dispatched` is written, Failed is written before a teardown, a requeue's
`PreemptCandidate` before its teardown — so a restart at any point finishes what was
started and never makes a second copy. A transient API failure (429, 5xx, timeout) is
retried on a later cycle and never turned into a verdict.

While a watch is down the dispatcher is blind (it might miss a pod binding, or a
deletion): it then decides nothing until the watch has resumed or relisted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from typing import Any

from dispatcher.admission import (
    AWAITING_PREEMPTION,
    BEHIND_HEAD,
    NO_TOPOLOGY,
    Decision,
    Fit,
    admit,
    fit_rules,
)
from dispatcher.api.conditions import ConditionType, Reason
from dispatcher.api.labels import APPWRAPPER_LABEL
from dispatcher.api.messages import cap_problems, problems_message
from dispatcher.api.models import Requeuing, WrappedItem
from dispatcher.cluster import AppWrapperKey, ClusterState
from dispatcher.cluster.state import PlannedPod
from dispatcher.elastic import Scale
from dispatcher.fit import Capacity
from dispatcher.fit.gang import GangPodSet, Placer, Shortfall, place
from dispatcher.fit.topology import Topology
from dispatcher.kinds.scope import DEFAULT_ALLOWED_KINDS, GroupKind
from dispatcher.lifecycle import (
    DEFAULT_TIMING,
    ITEMS_CHANGED,
    PODS_LOST,
    PODS_NOT_CREATED,
    PODS_UNPLACEABLE,
    WRAPPED_OBJECT_FAILED,
    Timing,
    Verdict,
    judge,
    min_available,
    pods_allowed_seconds,
    timing_for,
)
from dispatcher.queue import AdmissionQueue, Policy, QueuedWrapper
from dispatcher.resources import PODS as POD_COUNT

from .access import creator_denials
from .creation import Items, Made, Refused, Waiting
from .estimates import Estimates, EstimateSettings
from .grant_screen import GrantScreen
from .holds import cancelled_message
from .intake import Intake
from .items import prepared_items
from .kube import ApiError, Kube, Resource
from .memory import Memory
from .placement import Placement
from .positions import Positions, clear_position
from .scaling import Scaling
from .status import APPWRAPPERS, Change, StatusWriter, says
from .tracked import Key, Tracked, items_digest, pod_bucket

log = logging.getLogger("dispatcher")

__all__ = ["APPWRAPPERS", "Dispatcher", "Observer"]

# Settle time after an event before a cycle, so a burst of pod events makes one cycle:
# on a busy cluster pods change a hundred times a second, and a cycle every 50 ms took
# half a core deciding the same again (bench/e2e.py); a quarter of a second is nothing
# beside a gang's start.
DEBOUNCE_SECONDS = 0.25
# ... and at least this many times as long as the last cycle took: with a long queue and
# pods changing all the time, cycles back to back would take most of the process's CPU
# from the requests they decide (the loop spends at most a quarter of its time deciding).
CYCLE_SPACING = 3.0
# Look again this often even when nothing happens: dynamic priorities, backfill's age
# guard, wrapped objects' outcomes and requeue deadlines move with the clock.
TICK_SECONDS = 5.0
# How often a running wrapper's objects are read for their outcome without pod news.
OUTCOME_REFRESH_SECONDS = 15.0
OUTCOME_SETTLE_SECONDS = 2.0
OUTCOME_SETTLES = 5  # quick reads after a gang's last pod ended, before the refresh's pace
# A running wrapper with nothing due (no deadline, no pod news) is judged again this often
# all the same. Judging each at every cycle cost a status serialisation per running wrapper
# per cycle: most of the dispatcher's time with a thousand of them.
IDLE_STEP_SECONDS = 30.0
PODS = Resource("v1", "Pod", "pods", True)
# While a watch is down nothing is decided; the loop looks again this often.
BLIND_RETRY_SECONDS = 0.2
# After a transient API failure, the step for that AppWrapper is tried again this soon.
RETRY_SECONDS = 2.0
# The reason of the Warning Events about a spec accepted as it is (kinds.checks).
SPEC_WARNING = "AppWrapperWarning"
# Why a wrapper waits whose creator was not granted its quota node or priority.
NOT_GRANTED = "NotGranted"


class Observer:
    """What the dispatcher reports as it works; metrics subclass it. Every method is
    called on the event loop and must not block."""

    def cycle(self, seconds: float, queued: int, decisions: int) -> None: ...
    def dispatched(self, waited_seconds: float) -> None: ...
    def requeued(self, reason: str) -> None: ...
    def failed(self, reason: str) -> None: ...
    def completed(self) -> None: ...
    def preempted(self, reason: str) -> None:
        """A gang torn down for another: reason "priority" or "reclaim" (quota)."""

    def start_estimate_error(self, estimate: str, seconds: float) -> None:
        """A wrapper started `seconds` away from its estimate ("initial" or "shown")."""

    def placed_in_topology(self, level: str, one_domain: bool) -> None:
        """A dispatched gang's pod sets that asked for a domain of `level` (a configured
        level) landed in one domain of it, or were spread (a preferred level)."""

    def snapshot(self, dispatcher: Dispatcher) -> None:
        """After each cycle: gauges (states, queue, capacity) read from the dispatcher."""


class Dispatcher:
    def __init__(self, kube: Kube, policy: Policy, fit: Fit = "per-node",
                 clock: Callable[[], float] = time.time,
                 observer: Observer | None = None, timing: Timing = DEFAULT_TIMING,
                 message_interval: float | None = None,
                 allowed_kinds: Collection[GroupKind] = DEFAULT_ALLOWED_KINDS,
                 require_creator: bool = False,
                 estimates: EstimateSettings | None = None, pin_pods: bool = False,
                 topology: Topology = NO_TOPOLOGY) -> None:
        self.kube = kube
        self.observer = observer or Observer()
        self.policy = policy
        self.fit: Fit = fit
        self.topology = topology
        self.clock = clock
        self.timing = timing
        self.m = Memory(policy)
        self.intake = Intake(self.m, clock, on_failed=self.observer.failed,
                             allowed_kinds=allowed_kinds)
        self.writer = StatusWriter(kube, clock) if message_interval is None \
            else StatusWriter(kube, clock, message_interval=message_interval)
        self.items = Items(kube, self.m.ownership, pin=pin_pods)
        self.placement = Placement(  # gated pods onto held room (placement.py)
            kube, self.m, lambda pod: self.intake.on_pod("MODIFIED", pod), clock)
        self.scaling = Scaling(kube, self.writer, self.m.state)  # elastic gangs (scaling.py)
        self.require_creator = require_creator
        # Quota nodes and priorities only as granted (grant_screen.py).
        self.grants = GrantScreen(kube, require_creator, clock, self._side_task,
                                  self.m.wake.set)
        self.estimates = Estimates(self, estimates)  # start estimates (estimates.py)
        self.positions = Positions(self.writer, policy.name)  # queue positions (positions.py)
        self._task: asyncio.Task[None] | None = None
        self._busy: dict[Key, asyncio.Task[None]] = {}  # one API step per AppWrapper
        self._side: set[asyncio.Task[None]] = set()  # Events
        self._resolving: asyncio.Task[None] | None = None
        self.cycles = 0
        self.ready = False
        self.last_cycle_at = time.monotonic()
        self.last_cycle_seconds = 0.0  # how long the last cycle took (wall time)
        # Set by the operator: why the dispatcher cannot trust its memory right now
        # (a watch is down), or None.
        self.blind: Callable[[], str | None] = lambda: None
        self._blind_since: float | None = None
        # Held pods charged to a node they do not fit on, per wrapper: placed again each
        # cycle until they fit (then they hold real room) or bind.
        self._unfit: dict[Key, list[PlannedPod]] = {}

    # --- what the rest of the controller reads -----------------------------------------

    @property
    def tracked(self) -> dict[Key, Tracked]:
        return self.m.tracked

    @property
    def state(self) -> ClusterState:
        return self.m.state

    @property
    def queue(self) -> AdmissionQueue:
        return self.m.queue

    @property
    def wake(self) -> asyncio.Event:
        return self.m.wake

    @property
    def unfit(self) -> Mapping[Key, list[PlannedPod]]:
        """Held pods charged to a node they do not fit on, per wrapper (no pod is pinned
        to those)."""
        return self._unfit

    # --- watch events (intake.py does the work) -----------------------------------------

    def on_node(self, event: str, obj: Mapping[str, Any]) -> None:
        self.intake.on_node(event, obj)

    def on_pod(self, event: str, obj: Mapping[str, Any]) -> None:
        self.intake.on_pod(event, obj)

    def on_appwrapper(self, event: str, obj: Mapping[str, Any]) -> None:
        self.intake.on_appwrapper(event, obj)
        self.estimates.seen(obj)

    def on_quota(self, event: str, obj: Mapping[str, Any]) -> None:
        self.intake.on_quota(event, obj)

    def relisted(self, kind: str, objects: Sequence[Mapping[str, Any]]) -> None:
        self.intake.relisted(kind, objects)
        if kind == "AppWrapper":
            for obj in objects:
                self.estimates.seen(obj)

    # --- the loop -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop; the caller has fed a complete listing of nodes, AppWrappers
        and pods first, so nothing is decided on a partial view."""
        self.ready = True
        self._task = asyncio.create_task(self._run(), name="dispatcher-admission-loop")

    async def stop(self, grace: float = 10.0) -> None:
        """Stop the loop; steps under way get `grace` seconds to finish (each is
        durable either way: a restart finishes what one started)."""
        await self.estimates.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.settle(), grace)
        for task in [*self._busy.values(), *self._side, *self.writer.events]:
            task.cancel()

    async def _run(self) -> None:
        while True:
            timeout = self._next_timer()
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=timeout)
                # Never past what is due (a deadline, a grace period, the tick).
                await asyncio.sleep(max(DEBOUNCE_SECONDS, min(
                    CYCLE_SPACING * self.last_cycle_seconds, self._next_timer())))
            except TimeoutError:
                pass
            self.wake.clear()
            try:
                await self.cycle(wait=False)
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad cycle must not stop the dispatcher
                log.exception("admission cycle failed; retrying")
                await asyncio.sleep(1.0)
            if self.blind() is not None:
                # Look again as soon as the watch is back, not at the next event.
                await asyncio.sleep(BLIND_RETRY_SECONDS)
                self.wake.set()

    def _next_timer(self) -> float:
        now = self.clock()
        soonest = now + TICK_SECONDS
        # A minor write that is due waits for the shared rate's next token: waking before
        # it would run a cycle that can write nothing.
        token_at = self.writer.minor_write_at(now)
        for t in self.m.tracked.values():
            if t.check_at is not None and t.check_at < soonest:
                soonest = t.check_at
            if t.outcome_soon and t.phase in ("dispatched", "running"):
                # A quick read of its object after pods ended (the regular refresh waits
                # for the tick); one due already is read by the cycle this wakes for, or
                # waits for a busy step.
                again = t.outcome_read_at + OUTCOME_REFRESH_SECONDS
                if now < again < soonest:
                    soonest = again
            due = t.minor_due_at
            if due is not None and max(due, token_at) < soonest:
                soonest = max(due, token_at)
        return max(0.0, min(soonest - now, TICK_SECONDS))

    async def cycle(self, wait: bool = True) -> None:
        """One pass: everything decided now, the API calls it needs started as one task
        per AppWrapper (never two at once for one; one still busy is skipped until it is
        done). With `wait` (tests, the last pass at shutdown), return once those calls
        are done; the loop does not wait: a slow or hanging request holds up its own
        AppWrapper, never the cycle."""
        blind = self.blind()
        if blind is not None:
            log.debug("not deciding anything while blind: %s", blind)
            if self._blind_since is None:
                self._blind_since = self.clock()
            return
        if self._blind_since is not None:
            self._pause_clocks(self.clock() - self._blind_since)
            self._blind_since = None
        self.cycles += 1
        now = self.clock()
        started = time.perf_counter()
        self._resolve_owners(wait)
        if wait and self._resolving is not None:
            await self._resolving
        self._rebuild_reservations()
        self.placement.cycle(self._unfit, self._side_task)
        self._lifecycle(now)
        queued, decisions = len(self.m.queue), await self._admit(now)
        self.positions.publish(self.m.queue, self.m.tracked, self.m.sharing.forest(), now)
        self.estimates.cycle(now)  # a round of start estimates, off the loop, when due
        self._flush(now)
        self.last_cycle_at = time.monotonic()
        self.last_cycle_seconds = time.perf_counter() - started
        self.observer.cycle(self.last_cycle_seconds, queued, decisions)
        if wait:
            await self.settle()
        self.observer.snapshot(self)

    async def settle(self) -> None:
        """Wait until no API call started by a cycle is still under way."""
        while self._busy or self._side or self.writer.events:
            await asyncio.gather(*self._busy.values(), *self._side, *self.writer.events,
                                 return_exceptions=True)

    def _spawn(self, t: Tracked, work: Coroutine[Any, Any, None]) -> bool:
        """Run `work` for `t` as a task, unless a task for it is still under way."""
        if t.key in self._busy:
            work.close()
            return False
        task = asyncio.create_task(self._guarded(t, work), name=f"{t.key[0]}/{t.key[1]}")
        self._busy[t.key] = task

        def done(_: asyncio.Task[None], key: Key = t.key) -> None:
            if self._busy.get(key) is task:
                del self._busy[key]
            self.wake.set()

        task.add_done_callback(done)
        return True

    def _side_task(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._side.add(task)
        task.add_done_callback(self._side.discard)

    async def _guarded(self, t: Tracked, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except ApiError as e:
            if not e.transient:
                log.error("%s/%s: %s", *t.key, e)
                return
            t.check_at = self.clock() + RETRY_SECONDS
            log.info("%s/%s: API unavailable (%s); trying again shortly", *t.key, e)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s/%s: step failed", *t.key)

    def _resolve_owners(self, wait: bool) -> None:
        if self.m.ownership.unresolved == 0 or (
                self._resolving is not None and not self._resolving.done()):
            return

        async def resolve() -> None:
            decided = await self.m.ownership.resolve(self.items.fetch_owner)
            if decided:
                self.intake.proven(decided)

        self._resolving = asyncio.create_task(resolve())

    def _flush(self, now: float) -> None:
        """Writes owed outside a step: statuses set at intake (invalid specs, a failed
        wrapper queued again) and message-only changes whose rate limit has passed."""
        owed = [t for k in list(self.m.unwritten) if (t := self.m.tracked.get(k)) is not None]
        self.m.unwritten.clear()
        ripe = sorted((t for t in self.m.tracked.values()
                       if t.minor_due_at is not None and t.minor_due_at <= now
                       and t.key not in self.m.unwritten),
                      key=lambda t: t.last_write_at)
        # Only as many as the shared rate lets through: the rest would be started only
        # to find no token, every cycle.
        ripe = ripe[:self.writer.minor_writes_available(now)]
        for t in owed:
            if not self._spawn(t, self._write(t, now)):
                self.m.unwritten.add(t.key)  # busy: next cycle
        for t in ripe:
            self._spawn(t, self._write(t, now, force=False))
        warnings, self.intake.warnings = self.intake.warnings, []
        for t, text in warnings:
            if self.m.current(t):
                self._side_task(self.writer.warn(t, SPEC_WARNING, text, now))

    async def _write(self, t: Tracked, now: float, force: bool = True) -> None:
        try:
            if not await self.writer.write(t, now, force=force):
                self.m.forget(t)
        except ApiError as e:
            if not e.transient:
                raise
            self.m.unwritten.add(t.key)  # tried again next cycle
            log.info("status of %s/%s not written (%s); will retry", *t.key, e)

    def _replace_unfit(self) -> None:
        """Held pods that fitted nowhere were charged to the roomiest node; room freed on
        another node would then go to a newer gang while the held pod (a replacement, a
        pod of a gang dispatched before a restart) binds there first — leaving the newer
        gang half-bound. Each cycle, before admitting, they are placed again: the first
        room that frees is theirs."""
        if not self._unfit:
            return
        again: dict[Key, list[PlannedPod]] = {}
        for key, unfit in self._unfit.items():
            t = self.m.tracked.get(key)
            held = self.m.state.reserved_for(key)
            pods = [p for p in unfit if any(p is q for q in held)]
            if t is not None and t.phase in ("dispatched", "running") and pods:
                self.m.state.unreserve(key, pods)
                again[key] = pods
        self._unfit = {}
        capacity = Capacity.of(self.m.state)  # one snapshot, taken from as they are placed
        for key, pods in again.items():
            unfit = self._unfit[key] = []
            planned = _roomiest([p.request for p in pods], capacity, unfit)
            self.m.state.reserve_more(key, planned)
            _take(capacity, planned)

    def _pause_clocks(self, seconds: float) -> None:
        """What a gang was given time for (pods to appear, to run again) did not run out
        while the dispatcher could not see the cluster — nor, mostly, could the
        controllers that make the pods: grace periods resume where they stopped. (Not
        the dispatch time: deadlines the user set run on the wall clock.)"""
        for t in self.m.tracked.values():
            if t.phase not in ("dispatched", "running"):
                continue
            if t.items_at is not None:
                t.items_at += seconds
            if t.below_min_since is not None:
                t.below_min_since += seconds
            if t.check_at is not None:
                t.check_at += seconds
        log.info("blind for %.0f s: grace periods of dispatched gangs extended by as much",
                 seconds)

    # --- after a restart ----------------------------------------------------------------

    def _rebuild_reservations(self) -> None:
        """Capacity held again, before anything new is admitted: by every dispatched gang
        after a restart (its pods not bound yet), by a gang whose hold was on a node that
        went away, and for the replacements of pods a gang lost unfinished."""
        self._replace_unfit()
        due = [t for t in self.m.tracked.values() if t.needs_reservation or t.lost]
        if not due:
            return
        held = {}
        for t in due:
            if t.needs_reservation:
                # Held again from scratch: what it holds now is not room for its new plan.
                held[t.key] = [p.request for p in self.m.state.reserved_for(t.key)]
                self.m.state.release(t.key)
        capacity = Capacity.of(self.m.state)
        for t in due:
            active = t.phase in ("dispatched", "running")
            lost, t.lost = t.lost, []
            if t.needs_reservation:
                t.needs_reservation = False
                room_lost, t.room_lost = t.room_lost, False
                planned: list[PlannedPod] = []
                unfit: list[PlannedPod] = []
                pinned = self._lifted_of(t)
                held_pinned = [p for _, p in pinned]
                if t.phase == "dispatched" and t.queued is not None:
                    # Its pods not bound yet, the lost ones among them; those let onto a
                    # node before a restart will bind there, so their room is held there.
                    _take(capacity, held_pinned)
                    planned, lost = _unbound_plan(t.queued.gang, self.m.state, t.key,
                                                  capacity, unfit, held_pinned,
                                                  fit_rules("per-node", self.topology)[0]), []
                    if unfit and room_lost:
                        # What was promised went with the node, and nothing left can
                        # take it: held anyway it would be promised twice.
                        t.stranded = ("its room went with a deleted node and no other node "
                                      "has room for it")
                    _take(capacity, planned)
                    planned = [*held_pinned, *planned]
                elif active:
                    # A running gang's pods let onto a node keep their room there; the
                    # rest of its hold is placed again.
                    rest = list(held.get(t.key, []))
                    for p in held_pinned:
                        if p.request in rest:
                            rest.remove(p.request)
                    _take(capacity, held_pinned)
                    planned = _roomiest(rest, capacity, unfit)
                    _take(capacity, planned)
                    planned = [*held_pinned, *planned]
                self._unfit[t.key] = unfit
                # reserve() takes the bound members off what it is given, as it does for
                # a dispatch: they are given where they are bound, or they would come off
                # the plan for the unbound ones a second time.
                bound = [PlannedPod(p.node, p.request) for p in self.m.state.bound_pods_of(t.key)]
                self.m.state.reserve(t.key, [*bound, *planned])
                for key, p in pinned:
                    self.m.state.pin(t.key, key, p.request, admits=p.node.__eq__)
                log.info("%s/%s: %d unbound pod(s) of its gang hold capacity again", *t.key,
                         len(planned))
            if lost and active:
                planned = _roomiest(lost, capacity, self._unfit.setdefault(t.key, []))
                self.m.state.reserve_more(t.key, planned)
                _take(capacity, planned)
                log.info("%s/%s: %d pod(s) of its gang went away unfinished; capacity is "
                         "held for their replacements", *t.key, len(planned))

    def _lifted_of(self, t: Tracked) -> list[tuple[tuple[str, str], PlannedPod]]:
        """The gang's pods let onto a node that is still there and not bound yet (intake
        keeps none a label alone claims), and no more of them than the room the gang
        was admitted with — less its bound members — covers: the rest hold nothing."""
        room: dict[str, int] = {}
        for count, request in t.declared():
            for r, v in request.items():
                room[r] = room.get(r, 0) + count * v
        for p in self.m.state.bound_pods_of(t.key):
            for r, v in p.request.items():
                room[r] = room.get(r, 0) - v
        out = []
        for key, (claimed, node, request) in sorted(self.m.lifted.items()):
            if (claimed != t.key or node not in self.m.state.nodes
                    or any(room.get(r, 0) < v for r, v in request.items())):
                continue
            for r, v in request.items():
                room[r] -= v
            out.append((key, PlannedPod(node, request)))
        return out

    # --- dispatched wrappers ------------------------------------------------------------

    def _lifecycle(self, now: float) -> None:
        active = [t for t in self.m.tracked.values()
                  if t.phase in ("dispatched", "running")
                  or (t.phase == "done" and t.teardown_due and t.aw is not None)]
        active = [t for t in active if self._timer_due(t, now)
                  or t.needs_items or (t.completable and t.outcome_stale)
                  or t.key in self.intake.requeues_due
                  or t.key in self.intake.edited or t.key in self.m.sharing.preempting
                  or t.teardown_due or t.stranded is not None or self._counts_changed(t)
                  or t.cancelled_by is not None
                  or (t.unplaced is not None and t.unplaced[1] != t.unplaced_told)
                  or (t.completable and now - t.outcome_read_at >= OUTCOME_REFRESH_SECONDS)]
        for t in active:
            self._spawn(t, self._step(t, now))

    def _timer_due(self, t: Tracked, now: float) -> bool:
        """Its timer has run out; with none set, an elastic patch is owed or it has not
        been judged for a while."""
        if t.check_at is not None:
            return t.check_at <= now
        return self.scaling.due(t) or now - t.stepped_at >= IDLE_STEP_SECONDS

    def _counts_changed(self, t: Tracked) -> bool:
        counts = t.counts()
        s = t.status
        return (s.pending, s.running, s.Succeeded, s.failed) != (
            counts.pending, counts.running, counts.succeeded, counts.failed)

    async def _step_safely(self, t: Tracked, now: float) -> None:
        try:
            await self._step(t, now)
        except ApiError as e:
            if not e.transient:
                raise
            t.check_at = now + RETRY_SECONDS
            log.info("%s/%s: API unavailable (%s); trying again shortly", *t.key, e)

    async def _step(self, t: Tracked, now: float) -> None:
        assert t.aw is not None
        t.stepped_at = now
        if t.phase == "done":
            await self.items.teardown(t)  # pods of a failed gang (re)appeared
            t.teardown_due = False
            return
        if t.cancelled_by is not None:  # by a user (holds.py): it ends here, whatever it did
            self.intake.requeues_due.discard(t.key)
            self.intake.edited.discard(t.key)
            await self._fail(t, Reason.Cancelled, cancelled_message(t.cancelled_by, True), now)
            return
        if t.key in self.intake.requeues_due:
            await self._finish_requeue(t, now)
            return
        if t.key in self.m.sharing.preempting:
            preemptor, reclaim = self.m.sharing.preempting[t.key]
            why = "to reclaim the quota it borrows" if reclaim else "as it has a lower priority"
            await self._start_requeue(
                t, Reason.Preempted, f"preempted by {preemptor[0]}/{preemptor[1]} {why}: "
                "torn down and queued again", now, self.timing, counted=False)
            self.m.sharing.preempting.pop(t.key, None)
            self.observer.preempted("reclaim" if reclaim else "priority")
            return
        if t.key in self.intake.edited:
            # What runs is not what the spec now says: run the new spec from the queue.
            await self._start_requeue(
                t, ITEMS_CHANGED, "spec.resources.GenericItems changed after dispatch: torn "
                "down and queued again with the new items", now, self.timing, counted=False)
            return
        if t.stranded is not None:
            why, t.stranded = t.stranded, None
            if t.phase == "dispatched":
                await self._start_requeue(t, PODS_LOST, f"{why}: torn down and queued again",
                                          now, self.timing, counted=False)
                return
        await self.scaling.catch_up(t, now)
        if t.needs_items:
            # Pod news during the creation marks the outcome stale again.
            stale, t.outcome_stale = t.outcome_stale, False
            try:
                result = await self.items.create(t)
            except BaseException:
                t.outcome_stale = True
                raise
            if isinstance(result, Made) and result.fresh:
                # Objects made just now have not finished: reading them to learn so was
                # one GET per wrapper. The first read comes with pod news or the refresh.
                t.outcome_read_at = now
                if t.completable and t.outcome is None:
                    t.outcome = "running"
            else:
                t.outcome_stale |= stale
            if isinstance(result, Refused):
                await self._fail(t, Reason.ItemCreationFailure, result.message, now)
                return
            if isinstance(result, Waiting):
                t.check_at = now + 1.0
                return
            t.needs_items = False
            if t.items_at is None:
                t.items_at = self.clock()
        if t.completable and (t.outcome_stale or now - t.outcome_read_at
                              >= OUTCOME_REFRESH_SECONDS):
            t.outcome_stale = False
            t.outcome_read_at = now
            t.outcome = await self.items.outcome(t)
            counts = t.counts()
            done = counts.succeeded + counts.failed
            ended = not counts.active and done > 0
            t.outcome_settles = t.outcome_settles + 1 if ended else 0
            t.outcome_soon = t.outcome not in ("succeeded", "failed") and (
                    done > t.outcome_pods_done
                    or (ended and t.outcome_settles <= OUTCOME_SETTLES))
            if t.outcome_soon:
                # A pod just ended and its object has not said so yet (an operator writes
                # its status after the pod's last change; a busy Job controller seconds
                # later): read it again shortly rather than at the next refresh, once per
                # pod ending, and while every pod has ended, a few times.
                t.outcome_read_at = now - OUTCOME_REFRESH_SECONDS + OUTCOME_SETTLE_SECONDS
            t.outcome_pods_done = done
        counts = t.counts()
        running = t.phase == "running"
        if running and counts.running + counts.succeeded < min_available(
                t.aw, t.expected_pods, t.floor):
            t.below_min_since = t.below_min_since or now
        else:
            t.below_min_since = None
        t.aw.status.numberOfRequeueings = t.status.numberOfRequeueings
        timing, _ = timing_for(t.aw, self.timing)
        await self._tell_unplaced(t, now)
        verdict = judge(t.aw, counts, t.expected_pods, t.outcome, t.dispatched_at, running,
                        now, timing, t.below_min_since, _items_text(t), t.items_at, t.floor,
                        None if running else t.unplaced)
        await self._apply(t, verdict, now, timing)

    async def _tell_unplaced(self, t: Tracked, now: float) -> None:
        """A pod of the gang that cannot be let go is said at once, in status and in a
        Warning Event, once per reason."""
        if t.unplaced is None or t.unplaced[1] == t.unplaced_told:
            return
        why = t.unplaced[1]
        latest = t.status.conditions[-1] if t.status.conditions else None
        if latest is not None:
            change = self.writer.begin(t, now)
            change.condition(latest.type, latest.reason or "", why)
            if not await self._commit(change, force=True):
                return
        t.unplaced_told = why
        self._side_task(self.writer.warn(t, PODS_UNPLACEABLE, why, now))

    async def _apply(self, t: Tracked, v: Verdict, now: float, timing: Timing) -> None:
        change = self.writer.begin(t, now)
        self._set_counts(t)
        t.check_at = v.check_at
        if v.action in ("running", "holding"):
            if v.action == "running":
                change.condition(ConditionType.Running,
                                 *self.scaling.running(t, Reason.PodsRunning, v.message))
                t.status.state = "Running"
            else:
                change.condition(ConditionType.RunningHoldCompletion,
                                 Reason.SomeItemsCompleted, v.message)
                t.status.state = "RunningHoldCompletion"
            if await self._commit(change):
                t.phase = "running"
                # Its pods hold the capacity now; those let onto a node and not bound
                # yet (above its minimum, a Job's next pod) still need theirs.
                self.m.state.release_unpinned(t.key)
        elif v.action == "completed":
            t.status.state = "Completed"
            change.condition(ConditionType.Completed, Reason.PodsCompleted, v.message)
            if await self._commit(change):
                t.phase = "done"
                t.check_at = None
                self.m.state.release(t.key)
                self.observer.completed()
        elif v.action == "failed":
            await self._fail(t, v.reason, v.message, now, change,
                             teardown=v.reason != WRAPPED_OBJECT_FAILED)
        elif v.action == "requeue":
            if v.reason in (PODS_NOT_CREATED, PODS_LOST) and await self._pods_disagree(t, v):
                change.abandon()
                t.check_at = now + RETRY_SECONDS
                return
            await self._start_requeue(t, v.reason, v.message, now, timing, change)
        else:
            await self._commit(change)

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

    def _set_counts(self, t: Tracked) -> None:
        counts = t.counts()
        t.status.pending = counts.pending
        t.status.running = counts.running
        t.status.Succeeded = counts.succeeded
        t.status.failed = counts.failed

    async def _commit(self, change: Change, force: bool = False) -> bool:
        """Write; False (and the AppWrapper forgotten) if it is gone. Transient failures
        raise, with memory restored to what the API has."""
        if await self.writer.commit(change, force=force):
            return True
        self.m.forget(change.t)
        return False

    async def _fail(self, t: Tracked, reason: str, message: str, now: float,
                    change: Change | None = None, teardown: bool = True) -> None:
        """Failed is written first; then the items go (a crash in between leaves a
        Failed wrapper whose pods, when seen, are torn down — never a recreation)."""
        change = change or self.writer.begin(t, now)
        t.status.state = "Failed"
        clear_position(t.status)
        change.condition(ConditionType.Failed, reason, message)
        if not await self._commit(change):
            return
        log.info("%s/%s: failed (%s): %s", *t.key, reason, message)
        t.phase = "done"
        t.check_at = None
        t.needs_items = False
        if self.m.queue.get(t.key) is t.queued:
            self.m.queue.remove(t.key)
        self.m.state.release(t.key)  # what still runs holds its capacity by its pods
        self.observer.failed(reason)
        if teardown:
            t.teardown_due = True
            await self.items.teardown(t)
            t.teardown_due = False

    async def _start_requeue(self, t: Tracked, reason: str, message: str, now: float,
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
        if not await self._commit(change):
            return
        log.info("%s/%s: requeued (%s): %s", *t.key, reason, message)
        self.observer.requeued(reason)
        self.intake.edited.discard(t.key)
        self.intake.requeues_due.add(t.key)
        await self._finish_requeue(t, now)

    async def _finish_requeue(self, t: Tracked, now: float) -> None:
        await self.items.teardown(t)
        change = self.writer.begin(t, now)
        t.status.state = "Pending"
        t.status.admittedDigest = ""
        t.status.preempted = []
        self.scaling.requeued(t)
        t.pods.clear()
        self._set_counts(t)
        change.condition(ConditionType.Queueing, Reason.AwaitingHeadOfLine,
                         "requeued; waiting for capacity again")
        if not await self._commit(change):
            self.intake.requeues_due.discard(t.key)
            return
        self.intake.requeues_due.discard(t.key)
        self.m.state.release(t.key)
        t.phase = "queued"
        t.teardown_due = False
        t.needs_items = False
        t.needs_reservation = False
        t.items_at = None
        t.outcome = None
        t.check_at = None
        t.below_min_since = None
        self.intake.queue_again(t)

    # --- admission ----------------------------------------------------------------------

    async def _admit(self, now: float) -> int:
        ordered = list(self.m.queue.ordered(now))
        # An admitted elastic gang may grow with nothing queued.
        elastic = self.scaling.any_elastic(self.m.tracked, self.m.elastic)
        if not ordered and not elastic:
            return 0
        capacity = Capacity.of(self.m.state)
        sharing = self.m.sharing
        forest = sharing.forest()
        ordered = self._granted(ordered, now)
        admitted = sharing.admitted(self.m.tracked, self.m.state, self.scaling.rigid(now)) \
            if forest is not None or self.policy.preemption != "never" or elastic else []
        ledger = sharing.ledger_for(forest, admitted)
        loop = asyncio.get_running_loop()
        scales: list[Scale] = []
        decisions = await loop.run_in_executor(None, functools.partial(
            admit, ordered, capacity, self.policy, now, self.fit,
            empty_answers=self.m.empty_answers, quota=ledger, admitted=admitted,
            holds=dict(sharing.holds), scaling=scales, topology=self.topology))
        sharing.ledger = ledger
        asked = {w.key: w for w in ordered}
        for d in decisions:
            key = (d.namespace, d.name)
            t = self.m.tracked.get(key)
            # Acted on only for the very object it was made for: an edit, or a delete
            # and re-create of the same name, while the cycle ran voids the decision.
            if t is None or t.phase != "queued" or t.queued is not asked.get(key) \
                    or self.m.queue.get(key) is not t.queued:
                continue
            busy = self._busy.get(t.key)
            if busy is not None:
                if d.decision != "dispatch" or not t.waiting_write or t.sending:
                    continue  # its last step is still under way: decided again next cycle
                # Only a write of why it waited, not sent yet: the Dispatched write says
                # more. (Waiting for it — behind the status writes of every queued
                # wrapper — left the head of a FIFO queue undispatched for seconds while
                # the whole cluster was free.)
                busy.cancel()
                del self._busy[t.key]
            if d.decision == "dispatch":
                self._begin_dispatch(t, d, now)
            elif d.decision == "preempt":
                self._preempt(t, d, now)
            elif d.decision == "invalid":
                sharing.release(key)
                self._spawn(t, self._invalid(t, d.message, now))
            else:
                if d.reason != AWAITING_PREEMPTION:
                    sharing.release(key)  # the room it held is everyone's again
                self._waiting(t, d, now)
        self._scale(scales, now)
        return len(decisions)

    def _granted(self, ordered: Sequence[QueuedWrapper], now: float) -> list[QueuedWrapper]:
        """The wrappers whose creator holds the grants their quota labels and priority
        need (grant_screen.py); the others wait, saying which grant is missing, and give
        back any room held for them."""
        kept, refused = self.grants.screen(ordered, self._annotations, self._trees(), now)
        for key, message in refused.items():
            self.m.sharing.release(key)
            self._waiting(self.m.tracked[key], Decision(*key, "wait", NOT_GRANTED, message),
                          now)
        return kept

    def _annotations(self, key: Key) -> Mapping[str, str]:
        t = self.m.tracked.get(key)
        return t.aw.metadata.annotations if t is not None and t.aw is not None else {}

    def _trees(self) -> Collection[str]:
        forest = self.m.sharing.forest()
        return forest.trees.keys() if forest is not None else ()

    def _scale(self, scales: Sequence[Scale], now: float) -> None:
        """Scale-outs and scale-ins decided for admitted elastic gangs (scaling.py)."""
        for s in scales:
            t = self.m.tracked.get(s.key)
            if t is not None and t.phase in ("dispatched", "running") \
                    and not self._spawn(t, self.scaling.scale(t, s, now)) and not s.out:
                self.scaling.defer(t, s, now)  # a preemptor's room waits for it

    def _preempt(self, t: Tracked, d: Decision, now: float) -> None:
        """Room is held for `t` at once; its victims are torn down (whole gangs) and
        requeued with `Preempted`; it dispatches once their pods are gone."""
        self.m.sharing.hold(t, d, now)
        self._waiting(t, d, now)
        self._scale(d.shrinks, now)
        for k in d.preempts:
            victim = self.m.tracked.get(k)
            if victim is not None:
                self._spawn(victim, self._step(victim, now))

    async def _invalid(self, t: Tracked, message: str, now: float) -> None:
        try:
            await self._fail(t, Reason.InvalidSpec, message, now, teardown=False)
        except ApiError as e:
            if not e.transient:
                raise

    def _waiting(self, t: Tracked, d: Decision, now: float) -> None:
        if d.reason == BEHIND_HEAD:
            # Not the head's name: it changes whenever the head does, and would rewrite
            # every queued wrapper's status (`dispatcher queue` shows the order).
            said = (ConditionType.Queueing, Reason.AwaitingHeadOfLine, self.estimates.message(
                t, f"waiting for the AppWrappers ahead of it ({self.policy.name} policy)"))
        else:
            said = (ConditionType.Backoff, Reason.AppWrapperNotRunnable,
                    self.estimates.message(t, f"{d.reason}: {d.message}"))
        if says(t, *said):
            return  # most of a long queue, most cycles: no copy of its status to make
        change = self.writer.begin(t, now)
        if change.condition(*said):
            self._spawn(t, self._commit_wait(t, change, d.reason))

    async def _commit_wait(self, t: Tracked, change: Change, reason: str) -> None:
        # A new reason to wait is news; the same reason with other numbers can wait.
        t.waiting_write = True
        try:
            if await self._commit(change, force=reason != t.wait_reason):
                t.wait_reason = reason
        finally:
            t.waiting_write = False

    def _begin_dispatch(self, t: Tracked, d: Decision, now: float) -> None:
        """The capacity is taken at once, before anything is written: the next cycle
        must not promise it again while the write is under way. Given back if the
        dispatch does not happen."""
        self.m.queue.remove(t.key)
        planned = [PlannedPod(p.node, p.request) for p in d.placements if p.node is not None]
        self.m.state.reserve(t.key, planned)
        t.phase = "dispatching"
        self._spawn(t, self._dispatch(t, d, now))

    def _undispatch(self, t: Tracked) -> None:
        if not self.m.current(t) or t.phase != "dispatching":
            return
        self.m.state.release(t.key)
        t.phase = "queued"
        self.intake.queue_again(t)

    async def _dispatch(self, t: Tracked, d: Decision, now: float) -> None:
        assert t.aw is not None and t.queued is not None
        try:
            await self._record_dispatch(t, d, now)
        except BaseException:
            self._undispatch(t)
            raise
        if t.phase != "dispatched":
            return
        self.observer.dispatched(now - t.first_seen)
        if self.topology.levels and t.queued is not None:
            nodes = self.m.state.nodes
            for level, one in self.topology.landed(t.queued.gang, d.placements, {
                    p.node: nodes[p.node].labels for p in d.placements
                    if p.node is not None and p.node in nodes}):
                self.observer.placed_in_topology(level, one)
        self.estimates.started(t, now)
        await self._step_safely(t, now)

    async def _record_dispatch(self, t: Tracked, d: Decision, now: float) -> None:
        assert t.aw is not None
        # RBAC may have changed while it queued: its creator must still be allowed to
        # create every item, or nothing is created.
        denials = await creator_denials(self.kube, t.aw, require_creator=self.require_creator)
        if denials:
            await self._fail(t, Reason.ItemCreationFailure,
                             problems_message(cap_problems(denials)), now, teardown=False)
            return
        assert t.queued is not None
        if await self.grants.check(t.queued, t.aw.metadata.annotations, self._trees()):
            # A grant revoked since it was screened: it waits again, saying which.
            self.m.sharing.release(t.key)
            self._undispatch(t)
            return
        change = self.writer.begin(t, now)
        change.condition(ConditionType.HeadOfLine, Reason.FrontOfQueue, "")
        change.condition(ConditionType.Dispatched, Reason.AppWrapperRunnable, d.message)
        t.status.state = "Running"
        t.status.systempriority = d.effective_priority
        t.status.admittedDigest = items_digest(t.aw)
        # Durable with the dispatch: its victims may not preempt it back after a failover.
        hold = self.m.sharing.holds.get(t.key)
        preempted = hold.preempted if hold is not None else ()
        t.status.preempted = [f"{ns}/{name}" for ns, name in preempted]
        # What will be created, by name: removable even if the spec is edited later.
        t.status.wrappedItems = [
            WrappedItem(apiVersion=o["apiVersion"], kind=o["kind"], name=o["metadata"]["name"])
            for o in prepared_items(t.aw)]
        self.estimates.dispatching(t)  # no estimate for a wrapper that starts
        clear_position(t.status)
        self.scaling.dispatching(t, d)  # an elastic gang's size admitted
        if not await self._commit(change):
            return
        # Durable: now memory follows.
        self.m.sharing.release(t.key)
        t.preempted = preempted
        t.phase = "dispatched"
        t.dispatched_at = now
        t.pods = {}
        t.first_attempt = True
        t.needs_items = True
        t.items_at = None
        # What the last dispatch's pods said of its outcome does not count for this one
        # (its quick re-reads were spent: Completed waited for the 15 s refresh).
        t.outcome_stale = True
        t.outcome_pods_done = t.outcome_settles = 0
        t.outcome_soon = False
        t.unsettled.clear()


def _items_text(t: Tracked) -> str:
    assert t.aw is not None
    names = [f"{i.generictemplate.get('kind', 'object')} "
             f"{(i.generictemplate.get('metadata') or {}).get('name', '')!r}"
             for i in t.aw.spec.resources.GenericItems]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _unbound_plan(gang: Sequence[GangPodSet], state: ClusterState, owner: AppWrapperKey,
                  capacity: Capacity, unfit: list[PlannedPod] | None = None,
                  pinned: Sequence[PlannedPod] = (), placer: Placer = place
                  ) -> list[PlannedPod]:
    """Where the gang's pods that are not bound yet can go now. Bound members (and
    `pinned` ones, held where they were let go) are taken off by request shape, then by
    amount (declared pods need not match the real ones: custompodresources); the rest
    is placed per node like a dispatch (by `placer`: in its topology domain), or — if
    the cluster has moved on and they no longer fit — charged to the nodes with the most
    room, which errs towards holding too much, never too little."""
    bound = [dict(p.request) for p in state.bound_pods_of(owner)]
    bound += [dict(p.request) for p in pinned]
    counts: list[int] = []
    for g in gang:
        count = g.pod_set.count
        for request in list(bound):
            if count and request == dict(g.pod_set.request):
                bound.remove(request)
                count -= 1
        counts.append(count)
    counts = _taken_by_amount(gang, counts, bound)
    remaining = [GangPodSet(g.item, dataclasses.replace(g.pod_set, count=count))
                 for g, count in zip(gang, counts, strict=True) if count]
    if not remaining:
        return []
    placed = placer(remaining, capacity)
    if not isinstance(placed, Shortfall):
        return [PlannedPod(p.node, p.request) for p in placed if p.node is not None]
    return _roomiest([dict(g.pod_set.request) for g in remaining
                      for _ in range(g.pod_set.count)], capacity, unfit)


def _taken_by_amount(gang: Sequence[GangPodSet], counts: Sequence[int],
                     others: Sequence[Mapping[str, int]]) -> list[int]:
    """The declared pods left once `others` (member pods of no declared shape) have
    taken, by amount, every declared pod their total covers, in the order declared (one
    real pod may stand for several declared ones: the pod count is not compared)."""
    pool: dict[str, int] = {}
    for request in others:
        for r, v in request.items():
            pool[r] = pool.get(r, 0) + v
    left = list(counts)
    for i, g in enumerate(gang):
        request = {r: v for r, v in g.pod_set.request.items() if r != POD_COUNT}
        while left[i] and all(pool.get(r, 0) >= v for r, v in request.items()):
            for r, v in request.items():
                pool[r] = pool.get(r, 0) - v
            left[i] -= 1
    return left


def _roomiest(requests: Sequence[Mapping[str, int]], capacity: Capacity,
              unfit: list[PlannedPod] | None = None) -> list[PlannedPod]:
    """Pods charged to nodes where they fit now, else to the nodes with the most room —
    erring towards holding too much, never too little. Those charged without fitting
    are added to `unfit`: they are placed again each cycle (see _replace_unfit)."""
    out: list[PlannedPod] = []
    left = capacity.copy()
    nodes = sorted(left.nodes, key=lambda n: -sum(left.free_of(n).values()))
    for i, request in enumerate(requests):
        if not nodes:
            break
        fits = [n for n in nodes
                if all(left.free_of(n).get(r, 0) >= v for r, v in request.items())]
        node = fits[0] if fits else nodes[i % len(nodes)]
        planned = PlannedPod(node, request)
        out.append(planned)
        if fits:
            left.take(node, request)
        elif unfit is not None:
            unfit.append(planned)
    return out


def _take(capacity: Capacity, planned: Sequence[PlannedPod]) -> None:
    for p in planned:
        if p.node in capacity.nodes:
            capacity.take(p.node, p.request)
