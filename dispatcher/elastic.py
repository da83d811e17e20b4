"""Elastic gangs in the admission cycle: admitted at their minimum, grown toward their
maximum as capacity frees, shrunk toward their minimum instead of preempted whole.

A wrapper with elastic pod sets (``dispatcher.kinds.elastic``: a Ray worker group's
minReplicas..maxReplicas, a PyTorchJob's elasticPolicy, minAvailable on a kind that
tolerates it) takes part in ``admission.admit`` as three rules:

- Admission at the minimum. In the queue pass it is the gang at its minimum: it
  dispatches when every pod of the minimum has a node (never part of the minimum), and
  otherwise waits, preempts or shrinks others exactly as a gang of that size would.
- Growth, after every queued wrapper has its decision. The elastic wrappers -- admitted
  before, and dispatched in this cycle -- are taken in the queue's order (the policy's:
  priority then arrival, or arrival) and each grows by as many replicas as the capacity
  left holds (per node, by the real placement ``fit.place``; within its quota). A
  wrapper grows only onto nodes that no wrapper ahead of it in that order, still waiting
  for room, could run its pods on: capacity another wrapper ahead could use is never
  taken from it (waits that capacity does not help -- a gang no node could ever hold,
  an unknown quota, a preemptor whose room is held -- do not count). Wrappers behind
  it dispatched first in the queue pass, so growth takes only what is left over. A
  wrapper that requires a topology domain grows only on the nodes of the one it occupies
  (``Candidate.within``).
- Shrink instead of preemption. When a wrapper W does not fit, before whole gangs are
  preempted, elastic wrappers above their minimum give back pods: those of lower
  priority than W (under a policy ordered by priority, or one that preempts by
  priority), and those borrowing quota on W's path when W is within its quota. The
  cheapest first (lowest priority, borrowers, the latest dispatched), as few pods as
  let W fit, never below a wrapper's minimum, whole replicas, and the pods a scale-in
  really removes (the operator's order, ``ElasticNow.removable``). W's room is then
  held for it as for a preemption, until those pods are gone.

Only per-node fit grows or shrinks gangs: the aggregate rule places no pod, so it
admits elastic gangs at their minimum and leaves them there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from dispatcher.cluster.state import PlannedPod
from dispatcher.fit.capacity import Capacity, IndexArray
from dispatcher.fit.elastic import (
    Counts,
    ElasticNow,
    added,
    describe,
    grown,
    lowest,
    room_to_grow,
    room_to_shrink,
    shrunk,
    sized,
)
from dispatcher.fit.gang import GangPodSet, Placement, Placer, Shortfall, demand, place
from dispatcher.kinds.elastic import ElasticSet
from dispatcher.preemption import AdmittedWrapper, named_in, on_path, quota_scope
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import QueuedWrapper, WrapperKey
from dispatcher.quota import QuotaLedger

Labels = tuple[tuple[str, str], ...]
Rank = tuple[float, float]

SCALED_OUT = "ScaledOut"
SCALED_IN = "ScaledIn"


@dataclass(frozen=True)
class Scale:
    """A change of size: `before` and `after` are pods per elastic set. A scale-out
    names where the added pods go (`placements`); a scale-in the pods it gives back."""

    namespace: str
    name: str
    sets: tuple[ElasticSet, ...]
    before: Counts
    after: Counts
    message: str
    placements: tuple[Placement, ...] = ()
    removed: tuple[PlannedPod, ...] = ()
    removed_names: tuple[tuple[str, ...], ...] = ()  # per set, the pods that go, by name

    @property
    def key(self) -> WrapperKey:
        return (self.namespace, self.name)

    @property
    def out(self) -> bool:
        return sum(self.after) > sum(self.before)

    @property
    def reason(self) -> str:
        return SCALED_OUT if self.out else SCALED_IN


@dataclass(frozen=True)
class Shrink:
    """Scale-ins that let a waiting wrapper fit, and its placement once they are done."""

    scales: tuple[Scale, ...]
    placements: tuple[Placement, ...]

    def message(self, placed: str, reader: str | None) -> str:
        """Those scaled in outside `reader`, the preemptor's namespace, are counted, not
        named; None names them all."""
        others = [(s.namespace, s.name) for s in self.scales
                  if reader is not None and s.namespace != reader]
        names = "; ".join([f"{s.namespace}/{s.name} to {describe(s.sets, s.after)}"
                           for s in self.scales if reader is None or s.namespace == reader]
                          + named_in(reader, others))
        return f"dispatch after scaling in {names}; then {placed}"


MAX_SHRINK_SEARCHES = 8  # per cycle, as for preemption: the work of a cycle stays bounded


@dataclass
class ShrinkRound:
    """One cycle's scale-in searches: the gangs scaled in (not grown, nor shrunk again,
    in the same cycle), and a bound on the work -- at most MAX_SHRINK_SEARCHES searches,
    none twice for a shape, labels and priority that found nothing (capacity only shrinks
    during a cycle)."""

    scaled: set[WrapperKey] = field(default_factory=set)
    searches: int = 0
    _failed: set[tuple[object, ...]] = field(default_factory=set)

    def may_search(self, w: QueuedWrapper, priority: float) -> bool:
        if self.searches >= MAX_SHRINK_SEARCHES or \
                (w.gang_key, w.labels, priority) in self._failed:
            return False
        self.searches += 1
        return True

    def failed(self, w: QueuedWrapper, priority: float) -> None:
        self._failed.add((w.gang_key, w.labels, priority))


@dataclass(frozen=True)
class Candidate:
    """An elastic wrapper that may grow: admitted, or dispatched in this cycle."""

    key: WrapperKey
    rank: Rank
    labels: Labels
    now: ElasticNow
    # The nodes its growth may use (rows, ascending): those of the topology domain it
    # requires and occupies. None: any node.
    within: IndexArray | None = field(default=None, compare=False)


def rank(policy: Policy, priority: float, first_seen: float) -> Rank:
    """Its place in the queue's order: lower is further ahead."""
    return (0.0 if policy.order == "arrival" else -priority, first_seen)


def at_minimum(w: QueuedWrapper) -> QueuedWrapper:
    """The wrapper as the queue pass sees it: its gang at its minimum."""
    if not w.elastic:
        return w
    return replace(w, gang=sized(w.gang, w.elastic, lowest(w.elastic)))


def newly_admitted(w: QueuedWrapper) -> ElasticNow:
    return ElasticNow(w.elastic, lowest(w.elastic), w.gang, w.first_seen)


# --- growth -----------------------------------------------------------------------------


def grow(candidates: Iterable[Candidate], blockers: Sequence[tuple[Rank, Sequence[GangPodSet]]],
         cap: Capacity, ledger: QuotaLedger | None = None) -> list[Scale]:
    """Grow each candidate, in rank order, by what `cap` holds on nodes no blocker ahead
    of it may use; the growth is taken from `cap` (and added to `ledger`)."""
    ahead = sorted(blockers, key=lambda b: b[0])
    masked: set[int] = set()
    used = 0
    # What the candidates see: `cap` with the nodes of the blockers ahead emptied. The
    # blockers ahead only add up along the order, so one view serves them all.
    view = cap
    out: list[Scale] = []
    for c in sorted(candidates, key=lambda c: (c.rank, c.key)):
        e = c.now
        room = room_to_grow(e.sets, e.counts)
        if not room or (c.within is not None and not len(c.within)):
            continue
        new: set[int] = set()
        while used < len(ahead) and ahead[used][0] < c.rank:
            for g in ahead[used][1]:
                new.update(cap.eligible_rows(g.pod_set.constraints).tolist())
            used += 1
        if new - masked:
            view = _masked(cap.copy() if view is cap else view, new - masked)
            masked |= new
        counts, placements = _largest_growth(c, e, room, view, ledger)
        if not placements:
            continue
        for p in placements:
            assert p.node is not None
            cap.take(p.node, p.request)
            if view is not cap:
                view.take(p.node, p.request)
        if ledger is not None:
            _resize_quota(ledger, c.key, sized(e.gang, e.sets, counts))
        out.append(Scale(c.key[0], c.key[1], e.sets, e.counts, counts,
                         f"scaled out to {describe(e.sets, counts)} "
                         f"(from {describe(e.sets, e.counts)}): capacity freed that no "
                         "wrapper ahead of it can use", tuple(placements)))
    return out


def _masked(view: Capacity, rows: set[int]) -> Capacity:
    """`view` (a copy) with nothing free left on `rows`."""
    for row in sorted(rows):
        node = view.names[row]
        free = {r: v for r, v in view.free_of(node).items() if v > 0}
        if free:
            view.take(node, free)
    return view


def _largest_growth(c: Candidate, e: ElasticNow, room: int, view: Capacity,
                    ledger: QuotaLedger | None) -> tuple[Counts, list[Placement]]:
    """The most replicas (up to `room`) whose pods all fit `view` and the quota."""

    def trial(n: int) -> list[Placement] | None:
        after = grown(e.sets, e.counts, n)
        if ledger is not None and not _quota_fits(ledger, c, sized(e.gang, e.sets, after)):
            return None
        result = place(added(e.gang, e.sets, e.counts, after), view, within=c.within)
        if isinstance(result, Shortfall):
            return None
        for p in result:
            assert p.node is not None
            view.give(p.node, p.request)
        return result

    best = trial(1)
    if best is None:
        return e.counts, []
    lo, hi = 1, room  # lo fits; find the largest that does
    found = trial(hi) if hi > 1 else best
    if found is not None:
        return grown(e.sets, e.counts, hi), _numbered(found, e, grown(e.sets, e.counts, hi))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        got = trial(mid)
        if got is None:
            hi = mid
        else:
            lo, best = mid, got
    after = grown(e.sets, e.counts, lo)
    return after, _numbered(best, e, after)


def _numbered(placements: Sequence[Placement], e: ElasticNow, after: Counts) -> list[Placement]:
    """Placements of added pods numbered after the pods the set had."""
    start = {e.gang[s.position].pod_set.name: c for s, c in zip(e.sets, e.counts, strict=True)}
    return [replace(p, pod=p.pod + start.get(p.pod_set, 0)) for p in placements]


def _quota_fits(ledger: QuotaLedger, c: Candidate, gang: Sequence[GangPodSet]) -> bool:
    return ledger.check(c.labels, demand(gang), without=(c.key,)).fits


def _resize_quota(ledger: QuotaLedger, key: WrapperKey, gang: Sequence[GangPodSet]) -> None:
    old = ledger.remove(key)
    if old is not None:
        ledger.add(replace(old, demand=demand(gang)), force=True)


# --- shrinking instead of preempting ------------------------------------------------------


@dataclass(eq=False)
class _Giver:
    wrapper: AdmittedWrapper
    now: ElasticNow
    reclaim: bool
    most: int  # replicas it can give

    def counts(self, replicas: int) -> Counts:
        return shrunk(self.now.sets, self.now.counts, replicas)

    def pods(self, replicas: int) -> list[PlannedPod]:
        after = self.counts(replicas)
        out: list[PlannedPod] = []
        for j, (b, a) in enumerate(zip(self.now.counts, after, strict=True)):
            if j < len(self.now.removable):
                out.extend(self.now.removable[j][:b - a])
        return out

    def names(self, replicas: int) -> tuple[tuple[str, ...], ...]:
        after = self.counts(replicas)
        known = self.now.names
        return tuple(known[j][:b - a] if j < len(known) else ()
                     for j, (b, a) in enumerate(zip(self.now.counts, after, strict=True)))


def shrink_search(w: QueuedWrapper, priority: float, cap: Capacity,
                  admitted: Sequence[AdmittedWrapper], policy: Policy, now: float,
                  ledger: QuotaLedger | None, gone: Iterable[WrapperKey] = (),
                  placer: Placer = place) -> Shrink | None:
    """The fewest pods of elastic wrappers to remove so that `w` fits (see the module
    docstring), or None when removing every pod above their minimums would not do.
    `placer` places `w`'s pods (topology-aware, say)."""
    givers = _givers(w, priority, admitted, policy, now, ledger, set(gone))
    if not givers:
        return None
    amounts: list[int] = []
    placed: list[Placement] | None = None
    active = ledger if ledger is not None and ledger.active else None
    for g in givers:
        amounts.append(g.most)
        placed = _fits(w, cap, givers[:len(amounts)], amounts, active, placer)
        if placed is not None:
            break
    if placed is None:
        return None
    chosen = givers[:len(amounts)]
    # The dearest first: each gives as little as still lets W fit beside the others.
    for i in reversed(range(len(chosen))):
        lo, hi = -1, amounts[i]  # hi fits
        while hi - lo > 1:
            mid = (lo + hi) // 2
            trial = [*amounts[:i], mid, *amounts[i + 1:]]
            if _fits(w, cap, chosen, trial, active, placer) is not None:
                hi = mid
            else:
                lo = mid
        amounts[i] = hi
    final = _fits(w, cap, chosen, amounts, active, placer)
    assert final is not None
    scales = []
    for g, n in zip(chosen, amounts, strict=True):
        if not n:
            continue
        a = g.wrapper
        why = ("it borrows quota that " + f"{w.namespace}/{w.name} is owed" if g.reclaim
               else f"{w.namespace}/{w.name} has a higher priority")
        after = g.counts(n)
        scales.append(Scale(a.namespace, a.name, g.now.sets, g.now.counts, after,
                            f"scaled in to {describe(g.now.sets, after)} (from "
                            f"{describe(g.now.sets, g.now.counts)}) to make room for "
                            f"{w.namespace}/{w.name}: {why}", removed=tuple(g.pods(n)),
                            removed_names=g.names(n)))
    return Shrink(tuple(scales), tuple(final))


def _givers(w: QueuedWrapper, priority: float, admitted: Sequence[AdmittedWrapper],
            policy: Policy, now: float, ledger: QuotaLedger | None,
            gone: set[WrapperKey]) -> list[_Giver]:
    active = ledger if ledger is not None and ledger.active else None
    scope = quota_scope(active, w, reclaim=True)
    if scope is None:
        return []
    paths, within = scope
    by_priority = policy.order == "priority" or policy.preemption == "lowerPriority"
    out: list[_Giver] = []
    for a in admitted:
        e = a.elastic
        if e is None or a.key == w.key or a.key in gone or w.key in a.preempted:
            continue
        if now - a.dispatched_at < policy.min_running_seconds:
            continue
        most = room_to_shrink(e.sets, e.counts)
        if not most:
            continue
        inside, borrows = on_path(active, paths, a.key)
        reclaim = within and borrows
        if reclaim or (by_priority and a.priority < priority and inside):
            out.append(_Giver(a, e, reclaim, most))
    lends = active.borrows if active is not None else (lambda _k: False)
    out.sort(key=lambda g: (g.wrapper.priority, not lends(g.wrapper.key),
                            -g.wrapper.dispatched_at, g.wrapper.key))
    return out


def _fits(w: QueuedWrapper, cap: Capacity, givers: Sequence[_Giver], amounts: Sequence[int],
          ledger: QuotaLedger | None, placer: Placer) -> list[Placement] | None:
    """W's placement once `givers` gave back `amounts` replicas: its quota (with what
    they stop counting) and its pods on nodes."""
    if ledger is not None:
        less: dict[str, dict[int, list[int]]] = {}
        for g, n in zip(givers, amounts, strict=True):
            if n:  # it counts against its quota at its declared requests
                gone = added(g.now.gang, g.now.sets, g.counts(n), g.now.counts)
                ledger.shift_part(less, g.wrapper.key, demand(gone))
        if not ledger.check(w.labels, w.demand, less=less).fits:
            return None
    trial = cap.copy()
    for g, n in zip(givers, amounts, strict=True):
        for p in g.pods(n):
            if p.node in trial.nodes:
                trial.give(p.node, p.request)
    result = placer(w.gang, trial)
    return None if isinstance(result, Shortfall) else result


def recorded_counts(w: QueuedWrapper, recorded: Sequence[int]) -> Counts:
    """The size an admitted wrapper runs with: `recorded` (its status.elasticPods) when
    it fits its sets, else its declared counts kept in range (an object created before
    the size was recorded has them)."""
    sets = w.elastic
    if len(recorded) == len(sets) and all(s.low <= c <= s.high
                                          for s, c in zip(sets, recorded, strict=True)):
        return tuple(recorded)
    return tuple(min(max(w.gang[s.position].pod_set.count, s.low), s.high) for s in sets)


_INDEX = re.compile(r"-(\d+)$")


def removal_order(w: QueuedWrapper, pods: Iterable[tuple[str, PlannedPod]]
                  ) -> tuple[tuple[tuple[str, PlannedPod], ...], ...]:
    """Per elastic set of `w`, its bound pods (name, pod) in the order a scale-in removes
    them: the highest replica index first (the Kubeflow operators name pods
    ``<job>-<type>-<index>`` and delete those at or above the new count). A pod is of the
    set whose name (a replica type, a Ray group: ``<cluster>-<group>-worker-…``) its own
    name contains; where that names none or several, of the one whose request it has (an
    operator may add to a pod's requests: names come first)."""
    out: list[list[tuple[int, str, PlannedPod]]] = [[] for _ in w.elastic]
    shapes = [dict(w.gang[s.position].pod_set.request) for s in w.elastic]
    hints = [f"-{s.name.rsplit('/', 1)[-1].lower()}-" for s in w.elastic]
    for name, pod in pods:
        fits = [j for j, hint in enumerate(hints) if hint in f"-{name.lower()}-"]
        if len(fits) != 1:
            fits = [j for j in (fits or range(len(shapes))) if shapes[j] == dict(pod.request)]
        if fits:
            m = _INDEX.search(name)
            out[fits[0]].append((int(m.group(1)) if m else -1, name, pod))
    return tuple(tuple((name, p) for _, name, p in sorted(row, key=lambda x: (x[0], x[1]),
                                                          reverse=True))
                 for row in out)


def admitted_now(w: QueuedWrapper, recorded: Sequence[int], first_seen: float,
                 pods: Iterable[tuple[str, PlannedPod]]) -> ElasticNow:
    """An admitted elastic wrapper's record for the core (see ElasticNow)."""
    order = removal_order(w, pods)
    return ElasticNow(w.elastic, recorded_counts(w, recorded), w.gang, first_seen,
                      tuple(tuple(p for _, p in row) for row in order),
                      tuple(tuple(name for name, _ in row) for row in order))


def demand_at(gang: Sequence[GangPodSet], sets: Sequence[ElasticSet],
              counts: Sequence[int]) -> Mapping[str, int]:
    """The requests of the gang at a size: what it counts against its quota."""
    return demand(sized(gang, sets, counts))
