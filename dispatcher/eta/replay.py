"""When will each waiting wrapper start? The queue replayed forward through `admit`.

From the cluster as it is now -- the free capacity per node, the wrappers that hold some of
it and when each is expected to give it back, the queue in the policy's order, the quota
trees and the room held for preemptors -- the future is replayed as the simulator replays
a trace: at each moment something finishes, its capacity (and quota) is given back and one
admission cycle of the real core (`dispatcher.admission.admit`) runs; each dispatch takes
its capacity and finishes its expected duration later; a `preempt` decision tears its
victims down at once (they queue again and start over) and holds the room for the
preemptor, which dispatches in another cycle at the same instant. A waiting wrapper's
estimated start is the moment it is dispatched in that replay.

What is assumed (and why an estimate can be wrong):

- nothing arrives: a wrapper submitted later with a higher priority (or, under backfill,
  one that fits a gap) can start first;
- every wrapper runs exactly its expected duration (see dispatcher.eta.durations) and
  starts the moment it is dispatched;
- pods that belong to no admitted wrapper hold their capacity for ever; the nodes do not
  change;
- cycles run when capacity frees, not on a timer: a priority that grows with time
  (``priorityslope``) reorders the queue only at those moments.

Bounded work: the replay stops at ``Limits.horizon_seconds`` of simulated time (7 days by
default), after ``Limits.max_cycles`` cycles, or when ``Limits.budget_seconds`` of
computation have passed, whichever comes first. Wrappers not dispatched by then get
"beyond" (not within the horizon) or "budget" (not before the simulated time reached), so
an estimate is never a guess presented as a result. A wrapper that would not fit even on
the empty cluster gets "never", with the core's reason.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from dispatcher.admission import (
    AWAITING_PREEMPTION,
    NO_TOPOLOGY,
    CycleStats,
    Decision,
    EmptyClusterAnswers,
    Fit,
    admit,
    blocks,
    fit_rules,
)
from dispatcher.cluster.state import PlannedPod
from dispatcher.fit.capacity import Capacity
from dispatcher.fit.gang import GangPodSet, Shortfall
from dispatcher.fit.topology import Topology
from dispatcher.preemption import AdmittedWrapper, Hold, quota_ledger
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import AdmissionQueue, QueuedWrapper, WrapperKey
from dispatcher.queue.reservation import Reservations
from dispatcher.quota import QuotaForest, QuotaLedger

Hopeless = Callable[[Sequence[GangPodSet], Capacity], "Shortfall | None"]
# Under a policy that reserves: a cycle's reservations, from the queue in order, what runs
# (with when it ends), the free capacity, the time and the expected durations.
Planner = Callable[[Sequence[QueuedWrapper], Sequence["RunningWrapper"], Capacity, float,
                    Mapping[WrapperKey, float]], Reservations]
Outcome = Literal["start", "beyond", "budget", "never", "stuck", "invalid"]

DAY = 86400.0
# After a preemption the preemptor dispatches in another cycle at the same instant; as in
# the simulator, a few such rounds per instant at most.
ROUNDS_PER_INSTANT = 4


@dataclass(frozen=True)
class Limits:
    horizon_seconds: float = 7 * DAY
    max_cycles: int = 100_000
    budget_seconds: float = 5.0

    def __post_init__(self) -> None:
        if not self.horizon_seconds > 0 or self.max_cycles < 1 or not self.budget_seconds > 0:
            raise ValueError("an estimate needs a horizon and a budget above 0 and at "
                             "least one cycle")


@dataclass(frozen=True)
class RunningWrapper:
    """Something that holds capacity now and gives it back at `ends_at`.

    `holdings`: what it holds, one entry per pod (``ClusterState.holdings``). An admitted
    wrapper also has its `admitted` record (it counts against its quota and may be
    preempted) and, to queue it again if the replay preempts it, its `gang` and the
    `duration` it would run once started again. Pods still terminating after their
    wrapper left (a teardown) are a RunningWrapper with holdings and an end only.
    """

    key: WrapperKey
    holdings: tuple[PlannedPod, ...]
    ends_at: float
    admitted: AdmittedWrapper | None = None
    gang: QueuedWrapper | None = None
    duration: float = 0.0


@dataclass(frozen=True)
class Estimate:
    """start: dispatched at `at`. beyond / budget: not dispatched by `at` (the horizon, or
    where the computation stopped). never / stuck / invalid: no start foreseen; `reason`
    says why."""

    key: WrapperKey
    outcome: Outcome
    at: float | None = None
    reason: str = ""
    nodes: tuple[str, ...] = ()  # start: where its pods are placed (per-node fit)


@dataclass
class Forecast:
    now: float
    estimates: dict[WrapperKey, Estimate] = field(default_factory=dict)
    cycles: int = 0
    events: int = 0
    reached: float = 0.0  # the simulated time the replay got to
    stopped: str = ""  # "": every wrapper decided; else "horizon", "budget", "cycles", "idle"
    seconds: float = 0.0  # computation time

    def start_of(self, key: WrapperKey) -> float | None:
        e = self.estimates.get(key)
        return e.at if e is not None and e.outcome == "start" else None


def forecast(
    queued: Iterable[QueuedWrapper],
    running: Iterable[RunningWrapper],
    capacity: Capacity,
    policy: Policy,
    now: float,
    durations: Mapping[WrapperKey, float],
    *,
    fit: Fit = "per-node",
    forest: QuotaForest | None = None,
    holds: Mapping[WrapperKey, Hold] | None = None,
    empty_answers: EmptyClusterAnswers | None = None,
    limits: Limits = Limits(),
    clock: Callable[[], float] = time.perf_counter,
    topology: Topology = NO_TOPOLOGY,
    planner: Planner | None = None,
) -> Forecast:
    """Estimate when each wrapper of `queued` starts (see the module docstring).

    `capacity`: the free capacity now (``Capacity.of(state)``); it is used up by the
    replay, so pass one of its own. `durations`: the expected duration of every queued
    wrapper, by key. `forest` and `holds` as the admission loop has them.
    `empty_answers` and `topology` as for `admit` (the nodes must be the same). `planner`: under a
    policy that reserves, each cycle's reservations (dispatcher.eta.reserve); without
    one, such a policy is replayed as backfill without reservations.
    """
    return _Replay(queued, running, capacity, policy, now, durations, fit, forest, holds,
                   empty_answers, limits, clock, topology, planner).run()


@dataclass(eq=False)
class _Live:
    """A wrapper holding capacity in the replay."""

    holdings: tuple[PlannedPod, ...]
    demand: Mapping[str, int] | None  # aggregate fit: what it took from the totals
    admitted: AdmittedWrapper | None
    gang: QueuedWrapper | None
    duration: float


class _Replay:
    def __init__(self, queued: Iterable[QueuedWrapper], running: Iterable[RunningWrapper],
                 capacity: Capacity, policy: Policy, now: float,
                 durations: Mapping[WrapperKey, float], fit: Fit,
                 forest: QuotaForest | None, holds: Mapping[WrapperKey, Hold] | None,
                 answers: EmptyClusterAnswers | None, limits: Limits,
                 clock: Callable[[], float], topology: Topology,
                 planner: Planner | None = None) -> None:
        self.started_at = clock()
        self.planner = planner if policy.reserve else None
        self._ends: dict[WrapperKey, float] = {}
        self.clock = clock
        self.policy = policy
        self.fit: Fit = fit
        self.topology = topology
        self.now = now
        self.limits = limits
        self.cap = capacity
        self.answers = answers if answers is not None else EmptyClusterAnswers()
        self.durations = dict(durations)
        self.holds: dict[WrapperKey, Hold] = dict(holds or {})
        self.preempting = policy.preemption != "never"
        self.result = Forecast(now, reached=now)
        self.queue = AdmissionQueue(policy)
        self.waiting = 0  # wanted wrappers without an estimate yet
        self._events: list[tuple[float, int, WrapperKey, int]] = []
        self._seq = 0
        self._generation: dict[WrapperKey, int] = {}
        self.live: dict[WrapperKey, _Live] = {}
        # The admitted records of `live`, in the same order: what a cycle may preempt.
        self.records: dict[WrapperKey, AdmittedWrapper] = {}
        self._preempted_for: dict[WrapperKey, tuple[WrapperKey, ...]] = {}
        running = list(running)
        for r in running:
            self._live(r.key, _Live(r.holdings, None, r.admitted, r.gang, r.duration))
            self._schedule(r.key, max(r.ends_at, now))
        self.ledger: QuotaLedger | None = None
        if forest:
            self.ledger = quota_ledger(forest, [r.admitted for r in running if r.admitted],
                                       self.holds)
        self._left_ledger = False
        hopeless_of = fit_rules(fit, topology)[1]
        estimates = self.result.estimates
        for w in queued:
            if w.invalid is not None:
                estimates[w.key] = Estimate(w.key, "invalid", reason=w.invalid)
                continue
            if w.key not in self.durations:
                raise ValueError(f"no expected duration given for {w.namespace}/{w.name}")
            hopeless = self._hopeless(w, hopeless_of)
            if hopeless is not None:
                # It waits for nodes to join and never holds the line: leaving it out
                # changes no decision (the simulator does the same at arrival).
                estimates[w.key] = Estimate(w.key, "never", reason=hopeless)
                continue
            self.queue.put(w)
        self.wanted = {w.key for w in self.queue}
        # Each queued wrapper's gang shape as a small number (cheaper to hash than the
        # shape itself), filled in as cycles meet them.
        self._shape_ids: dict[tuple[object, ...], int] = {}
        self._shapes: dict[WrapperKey, tuple[tuple[GangPodSet, ...], int]] = {}
        self.waiting = len(self.wanted)

    def _hopeless(self, w: QueuedWrapper, hopeless_of: Hopeless) -> str | None:
        never = self.answers.never
        key = w.gang_key
        if key not in never:
            if self.answers.empty is None:
                self.answers.empty = Capacity.empty(self.cap.nodes.values())
            never[key] = hopeless_of(w.gang, self.answers.empty)
        shortfall = never[key]
        return shortfall.message if shortfall is not None else None

    # --- the loop -----------------------------------------------------------------------

    def run(self) -> Forecast:
        r = self.result
        horizon = self.now + self.limits.horizon_seconds
        t = self.now
        self._instant(t)
        while self.waiting:
            if not self._events:
                r.stopped = "idle"
                break
            t = self._events[0][0]
            if t > horizon:
                r.stopped = "horizon"
                break
            if r.cycles >= self.limits.max_cycles:
                r.stopped = "cycles"
                break
            if self.clock() - self.started_at > self.limits.budget_seconds:
                r.stopped = "budget"
                break
            while self._events and self._events[0][0] <= t:
                _, _, key, generation = heapq.heappop(self._events)
                if self._generation.get(key) == generation:
                    self._finish(key)
                    r.events += 1
            r.reached = t
            self._instant(t)
        self._close(horizon)
        r.seconds = self.clock() - self.started_at
        return r

    def _close(self, horizon: float) -> None:
        r = self.result
        for key in self.wanted:
            if key in r.estimates:
                continue
            if r.stopped == "horizon":
                days = self.limits.horizon_seconds / DAY
                r.estimates[key] = Estimate(key, "beyond", horizon,
                                            f"not within the {days:g} d the estimate looks "
                                            "ahead")
            elif r.stopped in ("budget", "cycles"):
                r.estimates[key] = Estimate(key, "budget", r.reached,
                                            "the estimate stopped before it started "
                                            "(computation budget)")
            else:
                r.estimates[key] = Estimate(key, "stuck", reason=(
                    "nothing running is expected to free what it waits for"))

    def _instant(self, t: float) -> None:
        for _ in range(ROUNDS_PER_INSTANT):
            if not len(self.queue) or not self.waiting or self._idle(t):
                return
            if not self._cycle(t):
                return

    def _idle(self, t: float) -> bool:
        """Whether a cycle now surely dispatches nothing, so that it need not run: the
        head holds the line (no quota, holds or preemption to let anyone pass it) and
        does not fit the free capacity in total, or the pods of one of its pod sets do
        not fit the nodes even on their own -- necessary conditions `place` would find
        failed, without the words of its answer."""
        if self.preempting or self.holds or self.ledger is not None or self.fit != "per-node":
            return False
        head = next(iter(self.queue.lazily_ordered(t)), None)
        if head is None or not blocks(self.policy, head, t):
            return False
        free = self.cap.free_total
        if any(v > free.get(r, 0) for r, v in head.demand.items()):
            return True
        cap = self.cap
        for g in head.gang:
            ps = g.pod_set
            if not ps.count:
                continue
            if any(v > 0 and v > cap.max_free(r) for r, v in ps.request.items()):
                return True
            if not cap.holds_pods(cap.eligible_rows(ps.constraints), ps.request, ps.count):
                return True
        return False

    def _ordered(self, t: float, view: Capacity, stats: CycleStats,
                 reserved: Collection[WrapperKey] = ()) -> Iterator[QueuedWrapper]:
        # Behind a blocking head every wrapper waits: nothing to learn (as in the
        # simulator), but for a preemptor, which passes any head into its held room. A
        # wrapper that cannot block, holds nothing and could not fit in the cluster's free
        # total would only be told to wait: skipped, without preemption.
        skip_small = not self.preempting
        free = view.free_total
        holds = self.holds
        # blocks(), spelled out: this loop may walk the whole queue in every cycle.
        backfill = self.policy.backfill
        guard = self.policy.max_head_wait_seconds
        # Capacity only shrinks during a cycle: a demand too large once stays too large.
        too_large: set[int] = set()
        shapes = self._shapes
        for w in self.queue.lazily_ordered(t):
            if stats.blocked_by is not None:
                if not holds:
                    return
                if w.key not in holds:
                    continue
            elif skip_small and backfill and (guard is None or t - w.first_seen <= guard) \
                    and not (holds and w.key in holds) and w.key not in reserved:
                # (A reserved head must wait in the cycle for its reservation to hold.)
                known = shapes.get(w.key)
                if known is not None and known[0] is w.gang:
                    shape = known[1]
                else:
                    shape = self._shape_ids.setdefault(w.gang_key, len(self._shape_ids))
                    shapes[w.key] = (w.gang, shape)
                if shape in too_large:
                    continue
                if any(v > free.get(r, 0) for r, v in w.demand.items()):
                    too_large.add(shape)
                    continue
            yield w

    def _cycle(self, t: float) -> int:
        """One admission cycle at `t`; the number of preemptions it decided."""
        r = self.result
        r.cycles += 1
        stats = CycleStats()
        if self.ledger is not None and self._left_ledger:
            self.ledger.rebalance()
            self._left_ledger = False
        # Held room and a new hold are taken for one cycle only: with either, the cycle
        # works on a copy and only its dispatches are taken from the cluster.
        view = self.cap.copy() if self.preempting or self.holds else self.cap
        held = None
        if self.planner is not None:
            running = [RunningWrapper(k, live.holdings, self._ends[k])
                       for k, live in self.live.items()]
            held = self.planner(self.queue.ordered(t), running, self.cap, t, self.durations)
        reserved = {x.key for x in held.held} if held is not None else set()
        decisions = admit(self._ordered(t, view, stats, reserved), view, self.policy, t,
                          self.fit, stats, empty_answers=self.answers, quota=self.ledger,
                          admitted=self._admitted() if self.preempting else (),
                          holds=self.holds, topology=self.topology, reservations=held)
        for d in decisions:
            if d.decision == "dispatch":
                self._dispatch(d, t, taken=view is self.cap)
            elif d.decision == "preempt":
                self._preempt(d, t)
            elif d.key in self.holds and d.reason != AWAITING_PREEMPTION:
                del self.holds[d.key]
                if self.ledger is not None:
                    self.ledger.remove(d.key)
        return stats.preemptions

    # --- events -------------------------------------------------------------------------

    def _schedule(self, key: WrapperKey, at: float) -> None:
        generation = self._generation.get(key, 0) + 1
        self._generation[key] = generation
        self._ends[key] = at
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, key, generation))

    def _give_back(self, live: _Live) -> None:
        if live.holdings:
            rows, amounts = self.cap.amounts((p.node, p.request) for p in live.holdings)
            self.cap.give_back(rows, amounts)
        if live.demand is not None:
            self.cap.take_total({r: -v for r, v in live.demand.items()})

    def _stop(self, key: WrapperKey) -> _Live | None:
        """`key` stops holding anything (it finished, or it is preempted)."""
        live = self.live.pop(key, None)
        self.records.pop(key, None)
        self._generation.pop(key, None)
        self._preempted_for.pop(key, None)
        if live is not None:
            self._give_back(live)
        return live

    def _finish(self, key: WrapperKey) -> None:
        live = self._stop(key)
        if live is None:
            return
        if self.ledger is not None and live.admitted is not None:
            self.ledger.remove(key)
            self._left_ledger = True

    def _dispatch(self, d: Decision, t: float, taken: bool) -> None:
        key = d.key
        w = self.queue.remove(key)
        if w is None:
            return
        if key in self.wanted and key not in self.result.estimates:
            nodes = tuple(sorted({p.node for p in d.placements if p.node is not None}))
            self.result.estimates[key] = Estimate(key, "start", t, nodes=nodes)
            self.waiting -= 1
        hold = self.holds.pop(key, None)
        if hold is not None:
            self._preempted_for[key] = hold.preempted
        planned = tuple(PlannedPod(p.node, p.request) for p in d.placements
                        if p.node is not None)
        aggregate = None if planned or not d.placements else w.demand
        if not taken:
            if planned:
                rows, amounts = self.cap.amounts((p.node, p.request) for p in planned)
                self.cap.give_back(rows, -amounts)
            elif aggregate is not None:
                self.cap.take_total(aggregate)
        duration = self.durations[key]
        record = AdmittedWrapper(w.namespace, w.name, w.uid, d.effective_priority, w.demand,
                                 planned, t, w.labels, self._preempted_for.get(key, ()))
        self._live(key, _Live(planned, aggregate, record, w, duration))
        self._schedule(key, t + duration)

    def _preempt(self, d: Decision, t: float) -> None:
        """The victims go at once (they queue again, to start over); the preemptor's
        room is held for it."""
        for victim in d.preempts:
            live = self._stop(victim)
            if live is not None and live.gang is not None:
                self.durations[victim] = live.duration
                self.queue.put(live.gang)
        w = self.queue.get(d.key)
        self.holds[d.key] = Hold(
            tuple(PlannedPod(p.node, p.request) for p in d.placements if p.node is not None),
            w.labels if w is not None else (), d.effective_priority, d.preempts, t)

    def _live(self, key: WrapperKey, live: _Live) -> None:
        self.live.pop(key, None)
        self.records.pop(key, None)
        self.live[key] = live
        if live.admitted is not None:
            self.records[key] = live.admitted

    def _admitted(self) -> Sequence[AdmittedWrapper]:
        return list(self.records.values())

