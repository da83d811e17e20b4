"""Preemption as a decision: which whole gangs to tear down so that a waiting one fits.

Who may be preempted (``Policy.preemption``), by a wrapper W that does not fit:

- ``reclaim``: W is within its quota (it would sit at its own leaf in every tree were
  every borrower gone) and the victim borrows quota from a node on W's path to the root,
  in some tree: W takes back what was lent, whatever the borrower's priority.
- ``lowerPriority``: that, and any wrapper of lower priority than W's effective priority
  that sits, in every tree, on W's path (at W's own leaf, or borrowing from one of its
  ancestors). A wrapper running within the quota of another leaf is never preempted by
  W: quota is a guarantee. Without quota trees every wrapper is on W's path, so priority
  preemption spans the cluster.

Never a victim: a wrapper admitted less than ``Policy.min_running_seconds`` ago, and a
wrapper that itself preempted W to be admitted (``AdmittedWrapper.preempted``): a victim
never takes its room back from its preemptor, so two wrappers cannot ping-pong.

Choosing victims, cheapest first: lowest priority, then borrowers, then the least work
lost (running time x GPUs, or x pods for a wrapper without extended resources). The
search finds the shortest prefix of that order whose removal lets W fit -- its quota in
every tree and its pods on nodes, by the real placement (``fit.place``) on the capacity
with the victims' holdings given back -- and takes W's placement there. Every victim of
that prefix is no dearer than the dearest victim any other choice would need, since a
shorter prefix does not let W fit (as far as the placement heuristic can tell). Victims
are then dropped, the most expensive first, while every node of that placement still has
room for W's pods placed on it (and its quota still fits): what is left is chosen per
node, and each victim is needed. Whole gangs only: a victim's every pod, bound or
planned, is given back, and nothing is ever taken from part of a gang. The placement is
then asked of ``place`` again on exactly that capacity; if its heuristic misses, the
checked placement from the search stands.

A gang that requires one topology domain (``fit.topology``) has its victims sought inside
one domain of the level its largest such group requires: per domain, the victims with
pods there, in the same order, and the shortest prefix of them that lets it fit with
that group pinned to the domain. Of the domains tried, the one whose dearest victim is
the cheapest wins, then the one with the fewest victims: a gang that must tear down a
wrapper spread over three racks does so in the rack where nothing else need go. Only the
most promising ``MAX_DOMAINS`` domains are tried (by a lower bound of their dearest
victim from the totals they could free), and none whose bound is dearer than the best
found. When no domain can be freed alone (the quota needs victims elsewhere), the search
spans the cluster as for any gang.

The work is bounded: at most ``MAX_CANDIDATES`` eligible victims are considered (the
cheapest), the prefix is found by doubling then bisection (a handful of placements), and
``admit`` searches for at most ``MAX_SEARCHES`` waiting wrappers per cycle.

Holding the freed room. The controller tears the victims down and keeps a ``Hold`` for
W: W's planned placement. Until W dispatches, ``admit`` takes each hold's room from the
capacity every other wrapper sees -- only the part that is actually free (victims' pods
still bound keep holding theirs), so bound + reserved + held never exceeds a node's
allocatable -- and gives a hold back to its owner alone when the owner is considered.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from dispatcher.cluster.state import PlannedPod
from dispatcher.fit.capacity import Capacity, IndexArray, IntArray
from dispatcher.fit.elastic import ElasticNow
from dispatcher.fit.gang import GangPodSet, Placement, Shortfall, demand
from dispatcher.fit.topology import Domains, Pinned, Topology, main_resource
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import QueuedWrapper, WrapperKey
from dispatcher.quota import QuotaConsumer, QuotaForest, QuotaLedger

Labels = tuple[tuple[str, str], ...]
FitGang = Callable[[Sequence[GangPodSet], Capacity], "list[Placement] | Shortfall"]

MAX_CANDIDATES = 512
_PRIORITY = operator.attrgetter("priority")
MAX_SEARCHES = 8
MAX_DOMAINS = 8  # domains searched for the victims of a gang that requires one


@dataclass(frozen=True)
class AdmittedWrapper:
    """A dispatched or running AppWrapper, as the core needs it to count quota and to
    choose victims. The controller builds one per admitted wrapper and cycle:

    key (namespace, name), uid; priority: its effective priority when admitted
    (status.systempriority); labels: metadata.labels (quota leaves are read from them);
    demand: the whole gang's requests (``demand(queued.gang)``); holdings: what it holds
    now, one entry per pod -- bound pods on their node and reserved pods not bound yet
    (``ClusterState.holdings``); dispatched_at: when it was dispatched (seconds since
    the epoch); preempted: the wrappers it preempted to be admitted (from the Hold it was
    dispatched from), which may never preempt it back; elastic: its size and range, if
    its gang is elastic (then `demand` is the gang at that size).
    """

    namespace: str
    name: str
    uid: str
    priority: float
    demand: Mapping[str, int] = field(hash=False)
    holdings: tuple[PlannedPod, ...] = ()
    dispatched_at: float = 0.0
    labels: Labels = ()
    preempted: tuple[WrapperKey, ...] = ()
    elastic: ElasticNow | None = field(default=None, hash=False)

    @property
    def key(self) -> WrapperKey:
        return (self.namespace, self.name)

    def consumer(self) -> QuotaConsumer:
        return QuotaConsumer(self.key, self.labels, self.demand, self.priority,
                             self.dispatched_at)


@dataclass(frozen=True)
class Hold:
    """Capacity kept for a preemptor until it dispatches: its planned pods.

    Built from the ``preempt`` decision (placements as PlannedPods, the wrapper's labels
    and effective priority, the victims, the wrappers it scales in, when it was decided).
    Release it when the owner dispatches (reserve its placement instead), is deleted, or
    gets any decision other than ``preempt`` or a wait with reason ``AwaitingPreemption``
    (``admit`` gives a hold up after ``Policy.max_hold_seconds``, or once a wrapper it
    waits for to scale in is admitted as not elastic: it will not scale in). A caller
    that keeps one QuotaLedger across cycles (instead of ``quota_ledger`` each cycle)
    removes the owner from it then too: the quota counted for the hold goes back with
    the room.
    """

    planned: tuple[PlannedPod, ...]
    labels: Labels = ()
    priority: float = 0.0
    preempted: tuple[WrapperKey, ...] = ()
    since: float = 0.0
    shrinks: tuple[WrapperKey, ...] = ()  # the elastic wrappers it waits for to scale in

    @property
    def demand(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for p in self.planned:
            for r, v in p.request.items():
                total[r] = total.get(r, 0) + v
        return total

    def consumer(self, key: WrapperKey) -> QuotaConsumer:
        return QuotaConsumer(key, self.labels, self.demand, self.priority, self.since)


def quota_ledger(forest: QuotaForest, admitted: Iterable[AdmittedWrapper] = (),
                 holds: Mapping[WrapperKey, Hold] | None = None) -> QuotaLedger:
    """The quota usage to pass to ``admit``: every admitted wrapper and held preemptor,
    counted in the order they were admitted (a hold from the moment it was decided)."""
    consumers = {a.key: a.consumer() for a in admitted}
    for key, hold in (holds or {}).items():
        consumers.setdefault(key, hold.consumer(key))
    return QuotaLedger.of(forest, consumers.values())


# --- holds ----------------------------------------------------------------------------------

Taken = list[tuple[str, dict[str, int]]]


def _per_node(pods: Iterable[PlannedPod]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for p in pods:
        row = out.setdefault(p.node, {})
        for r, v in p.request.items():
            row[r] = row.get(r, 0) + v
    return out


def take_hold(cap: Capacity, planned: Iterable[PlannedPod]) -> Taken:
    """Take a hold's room from `cap`, but only what is free: never below zero."""
    taken: Taken = []
    for node, need in sorted(_per_node(planned).items()):
        if node not in cap.nodes:
            continue
        free = cap.free_of(node)
        part = {r: min(v, max(free.get(r, 0), 0)) for r, v in need.items()}
        part = {r: v for r, v in part.items() if v > 0}
        if part:
            cap.take(node, part)
            taken.append((node, part))
            for r, v in part.items():
                cap.held[r] = cap.held.get(r, 0) + v
    return taken


def give_hold(cap: Capacity, taken: Taken) -> None:
    for node, part in taken:
        cap.give(node, part)
        for r, v in part.items():
            cap.held[r] = cap.held.get(r, 0) - v


def apply_holds(cap: Capacity, holds: Mapping[WrapperKey, Hold]) -> dict[WrapperKey, Taken]:
    """Take every hold's room from `cap` (in key order); what each took, to give it back
    to its owner."""
    return {key: take_hold(cap, holds[key].planned) for key in sorted(holds)}


# --- the search -----------------------------------------------------------------------------


def quota_scope(ledger: QuotaLedger | None, w: QueuedWrapper, reclaim: bool
                ) -> tuple[dict[str, tuple[int, ...]], bool] | None:
    """A waiting wrapper's path in each quota tree (none without a ledger), and whether
    it is within its quota (asked only when it may `reclaim`); None when its labels name
    no usable quota leaf: it takes room from nobody."""
    if ledger is None:
        return {}, False
    res = ledger.forest.resolve(w.labels)
    if res.problems:
        return None
    paths = {tree: ledger.path(tree, leaf) for tree, leaf in res.leaves}
    return paths, reclaim and ledger.within_quota(w.labels, w.demand)


def on_path(ledger: QuotaLedger | None, paths: Mapping[str, tuple[int, ...]],
            key: WrapperKey) -> tuple[bool, bool]:
    """Whether admitted `key` sits on the quota paths `paths` (tree -> a waiting
    wrapper's path) in every tree it counts in, and whether it borrows from a node on
    them. Without quota trees every wrapper is on every path."""
    spots = ledger.spots(key) if ledger is not None else {}
    if ledger is not None and ledger.over(key):
        # Over a hard limit, it takes quota from every node of its path up to the root:
        # from a waiting wrapper that shares one of them, it takes what is not its own.
        shared = all(set(path) & set(paths[t]) for t, (_, path) in spots.items() if t in paths)
        return shared, shared
    inside = all(at in paths[t] for t, (at, _) in spots.items() if t in paths)
    borrows = any(at != path[0] and at in paths.get(t, ()) for t, (at, path) in spots.items())
    return inside, borrows


@dataclass(frozen=True)
class Preemption:
    victims: tuple[AdmittedWrapper, ...]
    reclaimed: frozenset[WrapperKey]  # victims taken for the quota they borrow
    placements: tuple[Placement, ...]

    @property
    def keys(self) -> tuple[WrapperKey, ...]:
        return tuple(v.key for v in self.victims)

    def message(self, placed: str, reader: str | None) -> str:
        """What the preemptor's status says; victims outside `reader`, the preemptor's
        namespace, are counted, not named (its readers may not read theirs); None names
        them all."""
        names = ", ".join(named_in(reader, self.keys))
        why = []
        if self.reclaimed:
            why.append("reclaiming the quota "
                       + ("it borrows" if len(self.reclaimed) == 1 else "they borrow"))
        if len(self.reclaimed) < len(self.victims):
            why.append("lower priority")
        return f"dispatch after preempting {names} ({'; '.join(why)}); then {placed}"


def named_in(reader: str | None, keys: Sequence[WrapperKey]) -> list[str]:
    """`keys` as the readers of namespace `reader` may see them: those in it by name, the
    others counted; all by name for None (a reader of every namespace)."""
    names = [f"{ns}/{n}" for ns, n in keys if reader is None or ns == reader]
    others = sum(1 for ns, _ in keys if reader is not None and ns != reader)
    if others:
        names.append("an AppWrapper in another namespace" if others == 1
                     else f"{others} AppWrappers in other namespaces")
    return names


@dataclass(eq=False)
class _Victim:
    wrapper: AdmittedWrapper
    reclaim: bool
    rows: IndexArray
    amounts: IntArray
    per_node: dict[str, dict[str, int]]


class PreemptionSearch:
    """One cycle's preemption searches over the admitted wrappers (see module docstring)."""

    def __init__(self, policy: Policy, now: float, admitted: Sequence[AdmittedWrapper],
                 ledger: QuotaLedger | None, fit_gang: FitGang,
                 topology: Topology | None = None) -> None:
        """`topology`: the levels `fit_gang` honours, if any: the victims of a gang that
        requires a domain are then sought inside one domain first."""
        self.policy = policy
        self.topology = topology
        self.now = now
        self.ledger = ledger
        self.fit_gang = fit_gang
        self.searches = 0
        self.gone: set[WrapperKey] = set()  # preempted earlier in this cycle
        self._admitted = admitted
        self._pool: list[AdmittedWrapper] | None = None
        self._lowest: float | None = None  # the lowest priority of the admitted
        self._failed: set[tuple[object, ...]] = set()
        self._freed: dict[WrapperKey, tuple[IndexArray, IntArray, dict[str, dict[str, int]]]] = {}

    @property
    def pool(self) -> list[AdmittedWrapper]:
        """Who may be preempted at all (old enough); worked out at the first search that
        may find someone."""
        if self._pool is None:
            guard = self.policy.min_running_seconds
            self._pool = [a for a in self._admitted if self.now - a.dispatched_at >= guard]
        return self._pool

    @property
    def lowest(self) -> float:
        """The lowest priority of the admitted wrappers (of the pool, or below)."""
        if self._lowest is None:
            self._lowest = min(map(_PRIORITY, self._admitted), default=math.inf)
        return self._lowest

    @property
    def exhausted(self) -> bool:
        return self.searches >= MAX_SEARCHES

    def search(self, w: QueuedWrapper, cap: Capacity) -> Preemption | None:
        if self.policy.preemption == "never" or self.exhausted:
            return None
        prio = w.effective_priority(self.now)
        memo = (w.gang_key, w.labels, prio)
        if memo in self._failed:
            return None
        self.searches += 1
        found = self._search(w, prio, cap)
        if found is None:
            self._failed.add(memo)
        return found

    # --- who may go ---------------------------------------------------------------------

    def _eligible(self, w: QueuedWrapper, prio: float, cap: Capacity) -> list[_Victim]:
        ledger = self.ledger if self.ledger is not None and self.ledger.active else None
        scope = quota_scope(ledger, w, self.policy.preemption in ("reclaim", "lowerPriority"))
        if scope is None:
            return []
        paths, within = scope
        by_priority = self.policy.preemption == "lowerPriority"
        if not within and not (by_priority and prio > self.lowest):
            return []  # nothing to reclaim, and no one of lower priority: no one may go
        pool = self.pool
        useful = np.zeros(len(cap.names), dtype=bool)
        for g in w.gang:
            useful[cap.eligible_rows(g.pod_set.constraints)] = True
        out: list[_Victim] = []
        mine = w.key
        for a in pool:
            if not within and a.priority >= prio:
                continue  # (the test below, in short: it could only be taken for priority)
            key = a.key
            if key == mine or key in self.gone or mine in a.preempted:
                continue
            spots = ledger.spots(key) if ledger is not None else {}
            inside, borrows_on_path = on_path(ledger, paths, key)
            reclaim = within and borrows_on_path
            if not (reclaim or (by_priority and a.priority < prio and inside)):
                continue
            freed = self._freed.get(key)
            if freed is None:
                rows, amounts = cap.amounts((p.node, p.request) for p in a.holdings)
                freed = self._freed[key] = (rows, amounts, _per_node(a.holdings))
            rows, amounts, per_node = freed
            if not spots and not useful[rows].any():
                continue  # frees neither quota nor a node W's pods may use
            out.append(_Victim(a, reclaim, rows, amounts, per_node))
        borrows = ledger.borrows if ledger is not None else (lambda _k: False)
        out.sort(key=lambda v: (v.wrapper.priority, not borrows(v.wrapper.key),
                                _work(v.wrapper, self.now), v.wrapper.key))
        return out[:MAX_CANDIDATES]

    # --- does W fit without them? ------------------------------------------------------

    def _fits_quota(self, w: QueuedWrapper, victims: Sequence[_Victim]) -> bool:
        if self.ledger is None or not self.ledger.active:
            return True
        gone = [*self.gone, *(v.wrapper.key for v in victims)]
        return self.ledger.check(w.labels, w.demand, without=gone).fits

    def _trial(self, w: QueuedWrapper, cap: Capacity, victims: Sequence[_Victim],
               placer: FitGang | None = None) -> list[Placement] | None:
        if not self._fits_quota(w, victims):
            return None
        trial = cap.copy()
        if victims:
            trial.give_back(np.concatenate([v.rows for v in victims]),
                            np.concatenate([v.amounts for v in victims]))
        result = (placer or self.fit_gang)(w.gang, trial)
        return None if isinstance(result, Shortfall) else result

    def _search(self, w: QueuedWrapper, prio: float, cap: Capacity) -> Preemption | None:
        pool = self._eligible(w, prio, cap)
        if not pool:
            return None
        pinned = self.topology.pinned(w.gang) if self.topology is not None else None
        if pinned is not None:
            found = self._in_one_domain(w, cap, pool, pinned)
            if found is not None:
                return found
        shortest = self._shortest(w, cap, pool, _enough_in_total(w, cap, pool))
        if shortest is None:
            return None
        hi, planned = shortest
        chosen = self._minimal(w, cap, pool[:hi], planned)
        return self._preemption(w, cap, chosen, planned)

    def _shortest(self, w: QueuedWrapper, cap: Capacity, pool: Sequence[_Victim], start: int,
                  placer: FitGang | None = None) -> tuple[int, list[Placement]] | None:
        """The shortest prefix of `pool` (at least `start` long) whose removal lets W fit,
        and W's placement then: double, then bisect (feasibility grows with the prefix)."""
        hi = max(min(start, len(pool)), 1)
        lo = hi - 1  # the longest prefix known not to be enough
        planned = self._trial(w, cap, pool[:hi], placer)
        while planned is None:
            if hi == len(pool):
                return None  # even every eligible victim gone would not make room
            lo, hi = hi, min(hi * 2, len(pool))
            planned = self._trial(w, cap, pool[:hi], placer)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            found = self._trial(w, cap, pool[:mid], placer)
            if found is None:
                lo = mid
            else:
                hi, planned = mid, found
        return hi, planned

    def _preemption(self, w: QueuedWrapper, cap: Capacity, chosen: Sequence[_Victim],
                    planned: Sequence[Placement], placer: FitGang | None = None) -> Preemption:
        """The decision: W placed again with exactly `chosen` gone (if the placement's
        heuristic misses there, the checked `planned` stands)."""
        final = self._trial(w, cap, chosen, placer)
        return Preemption(tuple(v.wrapper for v in chosen),
                          frozenset(v.wrapper.key for v in chosen if v.reclaim),
                          tuple(final if final is not None else planned))

    def _in_one_domain(self, w: QueuedWrapper, cap: Capacity, pool: Sequence[_Victim],
                       pinned: Pinned) -> Preemption | None:
        """Victims inside one domain of the level W's pinned pod sets require: of the
        domains tried (the most promising MAX_DOMAINS), the one whose dearest victim is
        the cheapest, then the one with the fewest victims. None when none of them can be
        freed alone (the quota may need victims elsewhere): the search then spans them."""
        assert self.topology is not None
        domains = self.topology.domains(cap, pinned.depth)
        best: tuple[tuple[int, int], list[_Victim], list[Placement], FitGang] | None = None
        at = {id(v): i for i, v in enumerate(pool)}
        for bound, start, domain, members in _domain_bounds(pinned, cap, domains, pool):
            if best is not None and bound > best[0][0]:
                break  # every victim set there has a dearer victim than the best found
            placer: FitGang = partial(self.topology.place_in, domain=domain)
            shortest = self._shortest(w, cap, [pool[i] for i in members], start, placer)
            if shortest is None:
                continue
            hi, planned = shortest
            chosen = self._minimal(w, cap, [pool[i] for i in members[:hi]], planned)
            cost = (max(at[id(v)] for v in chosen), len(chosen))
            if best is None or cost < best[0]:
                best = (cost, chosen, planned, placer)
        if best is None:
            return None
        _, chosen, planned, placer = best
        return self._preemption(w, cap, chosen, planned, placer)

    def _minimal(self, w: QueuedWrapper, cap: Capacity, chosen: list[_Victim],
                 planned: Sequence[Placement]) -> list[_Victim]:
        """Drop victims, most expensive first, while `planned` still fits without them.

        Per node under per-node fit: the room each node of the placement needs, against
        what is free there and what the kept victims give back there. Under the aggregate
        rule the same over the cluster's totals (schedulable nodes only).
        """
        aggregate = any(p.node is None for p in planned)
        need = _per_node(PlannedPod("" if aggregate else (p.node or ""), p.request)
                         for p in planned)
        free = {"": dict(cap.free_total)} if aggregate else {n: cap.free_of(n) for n in need}

        def gains(v: _Victim) -> dict[str, dict[str, int]]:
            if not aggregate:
                return {n: row for n, row in v.per_node.items() if n in need}
            total: dict[str, int] = {}
            for n, row in v.per_node.items():
                if n in cap.nodes and not cap.nodes[n].unschedulable:
                    for r, x in row.items():
                        total[r] = total.get(r, 0) + x
            return {"": total}

        given = {v.wrapper.key: gains(v) for v in chosen}
        kept: dict[str, dict[str, int]] = {n: {} for n in need}
        for v in chosen:
            for n, row in given[v.wrapper.key].items():
                for r, x in row.items():
                    kept[n][r] = kept[n].get(r, 0) + x
        ledger = self.ledger if self.ledger is not None and self.ledger.active else None
        less = (ledger.usage_of([*self.gone, *(v.wrapper.key for v in chosen)])
                if ledger is not None else None)
        dropped: set[int] = set()
        for victim in reversed(chosen):
            mine = given[victim.wrapper.key]
            if any(free[n].get(r, 0) + kept[n].get(r, 0) - x < need[n].get(r, 0)
                   for n, row in mine.items() for r, x in row.items()):
                continue  # a node of the placement needs what it gives back
            if ledger is not None and less is not None:
                ledger.shift(less, victim.wrapper.key, -1)
                if not ledger.check(w.labels, w.demand, less=less).fits:
                    ledger.shift(less, victim.wrapper.key, 1)
                    continue
            dropped.add(id(victim))
            for n, row in mine.items():
                for r, x in row.items():
                    kept[n][r] -= x
        return [v for v in chosen if id(v) not in dropped]


def _work(a: AdmittedWrapper, now: float) -> float:
    """The work a victim loses: how long it has run x its size -- its extended resources
    (GPUs) if it has any, else its pods."""
    size = sum(v for r, v in a.demand.items() if "/" in r) or a.demand.get("pods", 0) or 1
    return max(now - a.dispatched_at, 0.0) * size


def _domain_bounds(pinned: Pinned, cap: Capacity, domains: Domains,
                   pool: Sequence[_Victim]) -> list[tuple[int, int, int, list[int]]]:
    """The domains worth a search, the most promising first, at most MAX_DOMAINS: per
    domain, a lower bound of its dearest victim (an index into `pool`; -1: none needed),
    the fewest victims that give it, with its free room, enough of the pinned sets' main
    resource in total (at least 1), the domain, and the victims with pods there (indices
    into `pool`, in order). Linear in the victims' pods and the nodes."""
    need = demand(pinned.sets)
    main = main_resource(need)
    wanted = need.get(main, 0)
    j = cap.resources.index(main) if main in cap.resources else -1
    victim: list[IntArray] = []
    amount: list[IntArray] = []
    for i, v in enumerate(pool):
        victim.append(np.full(len(v.rows), i, dtype=np.int64))
        amount.append(v.amounts[:, j] if 0 <= j < v.amounts.shape[1]
                      else np.zeros(len(v.rows), dtype=np.int64))
    ids = domains.ids[np.concatenate([v.rows for v in pool])]
    inside = ids >= 0
    if not inside.any():
        return []
    # One entry per (domain, victim) with what the victim frees there, grouped by domain
    # and in the pool's order inside each group.
    keys, where = np.unique(ids[inside] * len(pool) + np.concatenate(victim)[inside],
                            return_inverse=True)
    freed = np.bincount(where, weights=np.concatenate(amount)[inside],
                        minlength=len(keys)).astype(np.int64)
    domain_of, victim_of = np.divmod(keys, len(pool))
    starts = np.flatnonzero(np.r_[True, domain_of[1:] != domain_of[:-1]])
    sizes = np.diff(np.r_[starts, len(keys)])
    group = np.repeat(np.arange(len(starts)), sizes)
    column = np.maximum(cap.column(main, cap.all_rows), 0) if j >= 0 else np.zeros(
        len(cap.names), dtype=np.int64)
    room = domains.per_domain(column)[domain_of] + np.cumsum(freed) - np.repeat(
        np.cumsum(freed)[starts] - freed[starts], sizes)
    enough = np.flatnonzero(room >= wanted)
    groups, first = np.unique(group[enough], return_index=True)
    at = enough[first]
    counts = at - starts[groups] + 1
    zero = domains.per_domain(column)[domain_of[at]] >= wanted  # no victim needed in total
    bounds = np.where(zero, -1, victim_of[at])
    order = np.lexsort((domain_of[at], counts, bounds))[:MAX_DOMAINS]
    return [(int(bounds[k]), 1 if zero[k] else int(counts[k]), int(domain_of[at[k]]),
             victim_of[starts[groups[k]]:starts[groups[k]] + sizes[groups[k]]].tolist())
            for k in order.tolist()]


def _enough_in_total(w: QueuedWrapper, cap: Capacity, pool: Sequence[_Victim]) -> int:
    """The shortest prefix of `pool` that gives back, in total, what W lacks in total: no
    shorter one can let W fit (at least 1)."""
    lacking = [(cap.resources.index(r), v - cap.free_total.get(r, 0))
               for r, v in w.demand.items() if r in cap.resources and v > cap.free_total.get(r, 0)]
    if not lacking:
        return 1
    schedulable = np.array([not cap.nodes[n].unschedulable for n in cap.names], dtype=bool)
    freed = np.array([v.amounts[schedulable[v.rows]].sum(axis=0) if len(v.rows)
                      else np.zeros(len(cap.resources), dtype=np.int64) for v in pool])
    if freed.shape[1] < len(cap.resources):
        freed = np.pad(freed, ((0, 0), (0, len(cap.resources) - freed.shape[1])))
    total = np.cumsum(freed, axis=0)
    enough = np.ones(len(pool), dtype=bool)
    for j, short in lacking:
        enough &= total[:, j] >= short
    hits = np.nonzero(enough)[0]
    return int(hits[0]) + 1 if len(hits) else len(pool)
