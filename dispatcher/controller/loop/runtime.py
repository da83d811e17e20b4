"""The admission loop: lifecycle of dispatched AppWrappers, then one admission cycle.

Watch events only update memory (intake/router.py) and wake the loop. The loop batches
whatever happened since it last ran:

1. owner chains of new pods are looked up (a pod counts for a gang only if proven);
2. after a restart, the unbound part of every dispatched gang is reserved again —
   before anything new is admitted, so no GPU is promised twice;
3. dispatched AppWrappers are judged (running? completed? requeue?) and their items
   created or removed (items/creation.py);
4. one admission cycle runs off the event loop, and its decisions are carried out —
   each only if the AppWrapper is still the very object it was made for.

Every transition is durable before it takes effect: the status write comes first
(record/status.py), memory follows only when it succeeded. Items are created only after
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
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from dispatcher.admission import NO_TOPOLOGY, Fit, fit_rules
from dispatcher.cluster import ClusterState
from dispatcher.cluster.state import PlannedPod
from dispatcher.controller.access.grant_screen import GrantScreen
from dispatcher.controller.intake.router import Intake
from dispatcher.controller.items.creation import Items
from dispatcher.controller.items.scaling import Scaling
from dispatcher.controller.kube.client import ApiError, Kube
from dispatcher.controller.pods.leftovers import Leftovers
from dispatcher.controller.pods.placement import PodPlacer
from dispatcher.controller.record.memory import Memory
from dispatcher.controller.record.observer import Observer
from dispatcher.controller.record.positions import Positions
from dispatcher.controller.record.status import APPWRAPPERS, StatusWriter
from dispatcher.controller.record.tasks import Tasks
from dispatcher.controller.record.tracked import ACTIVE, Key, Tracked
from dispatcher.fit.topology import Topology
from dispatcher.kinds.scope import DEFAULT_ALLOWED_KINDS, GroupKind, owner_kinds
from dispatcher.lifecycle import DEFAULT_TIMING, Timing, with_backfill_limit
from dispatcher.queue import AdmissionQueue, Policy

from .admitting import Admitting
from .due import IDLE_STEP_SECONDS, OUTCOME_REFRESH_SECONDS, DueSteps
from .estimate_round import EstimateSettings
from .estimates import Estimates
from .held_room import HeldRoom
from .manager_fence import ManagerFence
from .stepping import OUTCOME_SETTLE_SECONDS, Stepping
from .transitions import Transitions

log = logging.getLogger("dispatcher")

__all__ = ["APPWRAPPERS", "IDLE_STEP_SECONDS", "OUTCOME_REFRESH_SECONDS",
           "OUTCOME_SETTLE_SECONDS", "Dispatcher", "Observer"]

# Settle time after an event before a cycle, so that a burst of pod events makes one
# cycle: on a busy cluster pods change a hundred times a second, and a quarter of a
# second is nothing beside a gang's start.
DEBOUNCE_SECONDS = 0.25
# ... and at least this many times as long as the last cycle took: with a long queue and
# pods changing all the time, cycles back to back would take most of the process's CPU
# from the requests they decide (the loop spends at most a quarter of its time deciding).
CYCLE_SPACING = 3.0
# Look again this often even when nothing happens: dynamic priorities, backfill's age
# guard, wrapped objects' outcomes and requeue deadlines move with the clock.
TICK_SECONDS = 5.0
# While a watch is down nothing is decided; the loop looks again this often.
BLIND_RETRY_SECONDS = 0.2
# The reason of the Warning Events about a spec accepted as it is (kinds.checks).
SPEC_WARNING = "AppWrapperWarning"


class Dispatcher:
    """The conductor: the loop and its timers, holding the collaborators that do the
    work — intake (watch events into memory), held room, stepping (dispatched wrappers),
    admitting (the admission cycle), transitions (durable moves), tasks (API steps)."""

    def __init__(self, kube: Kube, policy: Policy, fit: Fit = "per-node",
                 clock: Callable[[], float] = time.time,
                 observer: Observer | None = None, timing: Timing = DEFAULT_TIMING,
                 message_interval: float | None = None,
                 allowed_kinds: Collection[GroupKind] = DEFAULT_ALLOWED_KINDS,
                 require_creator: bool = False,
                 estimates: EstimateSettings | None = None, pin_pods: bool = False,
                 topology: Topology = NO_TOPOLOGY,
                 blind: Callable[[], str | None] = lambda: None,
                 leave_kueue_labelled: bool = False) -> None:
        """`blind()`: why memory cannot be trusted right now (a watch is down), or None."""
        self.kube = kube
        self.observer = observer or Observer()
        self.policy = policy
        self.fit: Fit = fit
        self.topology = topology
        self.clock = clock
        self.timing = with_backfill_limit(timing, policy)
        self.memory = Memory(policy, owner_kinds(allowed_kinds))
        self.intake = Intake(self.memory, clock, on_failed=self.observer.failed,
                             allowed_kinds=allowed_kinds,
                             leave_kueue_labelled=leave_kueue_labelled,
                             timing=self.timing)
        # A manager's copies here stop when its heartbeat goes stale (manager_fence.py).
        self.fence = ManagerFence(kube, self.memory, self.intake.rehold)
        self.writer = StatusWriter(kube, clock) if message_interval is None \
            else StatusWriter(kube, clock, message_interval=message_interval)
        self.leftovers = Leftovers(  # pods left after their objects went (pods/leftovers.py)
            self.memory, kube, self.writer, self.timing, clock)
        self.items = Items(kube, self.memory.ownership, pin_pods, self.leftovers.objects_deleted)
        self.pod_placer = PodPlacer(  # gated pods onto held room (pods/placement.py)
            kube, self.memory, lambda pod: self.intake.on_pod("MODIFIED", pod), clock)
        self.scaling = Scaling(kube, self.writer, self.memory.state)  # items/scaling.py
        self.transitions = Transitions(self.memory, self.writer, self.items, self.scaling,
                                       self.intake, self.observer)
        self.tasks = Tasks(clock, self.memory.wake, self.memory.attention.touch,
                           self.transitions.crashed)
        self.grants = GrantScreen(  # quota nodes and priorities only as granted
            kube, require_creator, clock, self.tasks.spawn_side, self.memory.wake.set)
        self.estimates = Estimates(  # start estimates (estimates.py)
            self.memory, self.writer, clock, policy, self.observer, fit, topology, estimates)
        self.positions = Positions(self.writer, policy.name)  # record/positions.py
        self.held_room = HeldRoom(self.memory, fit_rules("per-node", topology)[0])
        self.due_steps = DueSteps(self.memory, self.intake, self.scaling)  # due.py
        self.stepping = Stepping(self.memory, self.intake, self.items, self.scaling, self.writer,
                                 self.transitions, self.tasks, self.observer, self.timing,
                                 kube, self.leftovers, clock, self.due_steps)
        self.admitting = Admitting(self.memory, self.tasks, self.transitions, self.stepping,
                                   self.estimates, self.grants, self.scaling, self.writer,
                                   self.intake, self.observer, kube, policy, fit, topology,
                                   require_creator)
        self._task: asyncio.Task[None] | None = None
        self._resolving: asyncio.Task[None] | None = None
        self.cycles = 0
        self.ready = False
        self.last_cycle_at = time.monotonic()
        self.last_cycle_seconds = 0.0  # how long the last cycle took (wall time)
        self.blind = blind
        self._blind_since: float | None = None
        self._minor_held: set[Key] = set()  # minor writes owed that cannot go yet

    # --- what the rest of the controller reads -----------------------------------------

    @property
    def tracked(self) -> dict[Key, Tracked]:
        return self.memory.tracked

    @property
    def state(self) -> ClusterState:
        return self.memory.state

    @property
    def queue(self) -> AdmissionQueue:
        return self.memory.queue

    @property
    def wake(self) -> asyncio.Event:
        return self.memory.wake

    @property
    def unfit(self) -> Mapping[Key, list[PlannedPod]]:
        """Held pods charged to a node they do not fit on, per wrapper (no pod is pinned
        to those)."""
        return self.held_room.unfit

    # --- watch events (intake/router.py does the work) -----------------------------------------

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
        self.fence.start()

    async def stop(self, grace: float = 10.0) -> None:
        """Stop the loop; steps under way get `grace` seconds to finish (each is
        durable either way: a restart finishes what one started)."""
        await self.estimates.stop()
        await self.fence.stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.settle(), grace)
        for task in [*self.tasks.under_way(), *self.writer.events]:
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
        forceful = self.leftovers.next_due()  # pods to delete at once (pods/leftovers.py)
        if forceful is not None and forceful < soonest:
            soonest = forceful
        step = self.memory.attention.waking.next_at()  # a step owed at a given moment
        if step is not None and step < soonest:
            soonest = step
        minor = self.writer.minor_owed.next_at()
        if minor is not None:
            # A minor write that is due waits for the shared rate's next token: waking
            # before it would run a cycle that can write nothing.
            soonest = min(soonest, max(minor, self.writer.minor_write_at(now)))
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
        self.held_room.keep()
        self.pod_placer.cycle(self.held_room.unfit, self.tasks.spawn_side)
        self.leftovers.cycle(now, self.tasks.spawn_side)
        for t in self.due_steps.take(now):
            self.tasks.spawn(t, self.stepping.step(t, now))
        queued, decisions = len(self.memory.queue), await self.admitting.cycle(now)
        memory = self.memory
        self.positions.publish(memory.queue, memory.tracked, memory.sharing.forest(), now)
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
        while self.tasks.under_way() or self.writer.events:
            await asyncio.gather(*self.tasks.under_way(), *self.writer.events,
                                 return_exceptions=True)

    def _resolve_owners(self, wait: bool) -> None:
        if self.memory.ownership.unresolved == 0 or (
                self._resolving is not None and not self._resolving.done()):
            return

        async def resolve() -> None:
            decided = await self.memory.ownership.resolve(self.items.fetch_owner)
            if decided:
                self.intake.proven(decided)

        self._resolving = asyncio.create_task(resolve())

    def _flush(self, now: float) -> None:
        """Writes owed outside a step: statuses set at intake (invalid specs, a failed
        wrapper queued again) and message-only changes whose rate limit has passed."""
        owed = [t for k in list(self.memory.unwritten)
                if (t := self.memory.tracked.get(k)) is not None]
        self.memory.unwritten.clear()
        for t in owed:
            if not self.tasks.spawn(t, self._write(t, now)):
                self.memory.unwritten.add(t.key)  # busy: next cycle
        for t in self._ripe_minor_writes(now):
            if not self.tasks.spawn(t, self._write(t, now, force=False)):
                # Busy: looked at again next cycle (its step's end wakes the loop); an
                # alarm already rung would make the loop spin until then.
                self._minor_held.add(t.key)
        warnings = self.intake.take_warnings()
        for t, text in warnings:
            if self.memory.current(t):
                self.tasks.spawn_side(self.writer.warn(t, SPEC_WARNING, text, now))

    def _ripe_minor_writes(self, now: float) -> list[Tracked]:
        """The wrappers whose minor write is due, as many as the shared rate lets
        through, the longest unwritten first; the others stay owed."""
        minor_owed, tracked = self.writer.minor_owed, self.memory.tracked
        ripe = [t for key in dict.fromkeys((*minor_owed.rung(now), *self._minor_held))
                if (t := tracked.get(key)) is not None and t.writes.minor_due_at is not None
                and t.writes.minor_due_at <= now]
        # A newly arrived wrapper may not say it waits before a cycle decided so: kept
        # aside (the loop must not wake for it) until it may.
        self._minor_held = {t.key for t in ripe if not _may_write(t)}
        ripe = sorted((t for t in ripe if _may_write(t) and t.key not in self.memory.unwritten),
                      key=lambda t: t.writes.last_write_at)
        # Only as many as the shared rate lets through: the rest would be started only
        # to find no token, every cycle.
        taken = self.writer.minor_writes_available(now)
        for t in ripe[taken:]:
            minor_owed.set(t.key, t.writes.minor_due_at)
        return ripe[:taken]

    async def _write(self, t: Tracked, now: float, force: bool = True) -> None:
        try:
            if not await self.writer.write(t, now, force=force):
                self.memory.forget(t)
        except ApiError as e:
            if not e.transient:
                raise
            self.memory.unwritten.add(t.key)  # tried again next cycle
            log.info("status of %s/%s not written (%s); will retry", *t.key, e)

    def _pause_clocks(self, seconds: float) -> None:
        """What a gang was given time for (pods to appear, to run again) did not run out
        while the dispatcher could not see the cluster — nor, mostly, could the
        controllers that make the pods: grace periods resume where they stopped. (Not
        the dispatch time: deadlines the user set run on the wall clock.)"""
        for t in self.memory.tracked.values():
            if t.phase not in ACTIVE:
                continue
            if t.timers.items_at is not None:
                t.timers.items_at += seconds
            if t.timers.below_min_since is not None:
                t.timers.below_min_since += seconds
            if t.timers.check_at is not None:
                t.timers.check_at += seconds
        self.memory.attention.touch_all()
        log.info("blind for %.0f s: grace periods of dispatched gangs extended by as much",
                 seconds)



def _may_write(t: Tracked) -> bool:
    """Whether a minor write of `t` (its queue position, say) may go: not that of a newly
    arrived wrapper before it may say why it waits (admitting.py)."""
    return t.phase != "queued" or t.may_say_it_waits()
