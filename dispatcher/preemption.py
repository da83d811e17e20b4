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

Choosing victims, cheapest first: lowest priority, then borrowers, then the most recently
admitted (least progress lost). The search finds the shortest prefix of that order whose
removal lets W fit -- its quota in every tree and its pods on nodes, by the real
placement (``fit.place``) on the capacity with the victims' holdings given back -- and
takes W's placement there. Victims are then dropped, the most expensive first, while
every node of that placement still has room for W's pods placed on it (and its quota
still fits): what is left is chosen per node, and each victim is needed. Whole gangs
only: a victim's every pod, bound or planned, is given back, and nothing is ever taken
from part of a gang. The placement is then asked of ``place`` again on exactly that
capacity; if its heuristic misses, the checked placement from the search stands.

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

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dispatcher.cluster.state import PlannedPod
from dispatcher.fit.capacity import Capacity, IndexArray, IntArray
from dispatcher.fit.gang import GangPodSet, Placement, Shortfall
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import QueuedWrapper, WrapperKey
from dispatcher.quota import QuotaConsumer, QuotaForest, QuotaLedger

Labels = tuple[tuple[str, str], ...]
FitGang = Callable[[Sequence[GangPodSet], Capacity], "list[Placement] | Shortfall"]

MAX_CANDIDATES = 512
MAX_SEARCHES = 8


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
    dispatched from), which may never preempt it back.
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
    and effective priority, the victims). Release it when the owner dispatches (reserve
    its placement instead), is deleted, or gets any decision other than ``preempt`` or a
    wait with reason ``AwaitingPreemption``.
    """

    planned: tuple[PlannedPod, ...]
    labels: Labels = ()
    priority: float = 0.0
    preempted: tuple[WrapperKey, ...] = ()
    since: float = 0.0

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
    """The quota usage to pass to ``admit``: held preemptors first (their room was
    promised), then every admitted wrapper, higher priority and earlier admitted first."""
    ledger = QuotaLedger(forest)
    for key in sorted(holds or {}):
        ledger.add((holds or {})[key].consumer(key), force=True)
    for c in sorted((a.consumer() for a in admitted), key=lambda c: (-c.priority, c.since, c.key)):
        if c.key not in ledger:
            ledger.add(c, force=True)
    return ledger


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
    return taken


def give_hold(cap: Capacity, taken: Taken) -> None:
    for node, part in taken:
        cap.give(node, part)


def apply_holds(cap: Capacity, holds: Mapping[WrapperKey, Hold]) -> dict[WrapperKey, Taken]:
    """Take every hold's room from `cap` (in key order); what each took, to give it back
    to its owner."""
    return {key: take_hold(cap, holds[key].planned) for key in sorted(holds)}


# --- the search -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Preemption:
    victims: tuple[AdmittedWrapper, ...]
    reclaimed: frozenset[WrapperKey]  # victims taken for the quota they borrow
    placements: tuple[Placement, ...]

    @property
    def keys(self) -> tuple[WrapperKey, ...]:
        return tuple(v.key for v in self.victims)

    def message(self, placed: str) -> str:
        names = ", ".join(f"{ns}/{n}" for ns, n in self.keys)
        why = []
        if self.reclaimed:
            why.append("reclaiming the quota "
                       + ("it borrows" if len(self.reclaimed) == 1 else "they borrow"))
        if len(self.reclaimed) < len(self.victims):
            why.append("lower priority")
        return f"dispatch after preempting {names} ({'; '.join(why)}); then {placed}"


@dataclass
class _Victim:
    wrapper: AdmittedWrapper
    reclaim: bool
    rows: IndexArray
    amounts: IntArray
    per_node: dict[str, dict[str, int]]


class PreemptionSearch:
    """One cycle's preemption searches over the admitted wrappers (see module docstring)."""

    def __init__(self, policy: Policy, now: float, admitted: Sequence[AdmittedWrapper],
                 ledger: QuotaLedger | None, fit_gang: FitGang) -> None:
        self.policy = policy
        self.now = now
        self.ledger = ledger
        self.fit_gang = fit_gang
        self.searches = 0
        self.gone: set[WrapperKey] = set()  # preempted earlier in this cycle
        guard = policy.min_running_seconds
        self.pool = [a for a in admitted if now - a.dispatched_at >= guard]
        self._failed: set[tuple[object, ...]] = set()

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
        paths: dict[str, tuple[int, ...]] = {}
        within = False
        if ledger is not None:
            res = ledger.forest.resolve(w.labels)
            if res.problems:
                return []
            paths = {tree: ledger.path(tree, leaf) for tree, leaf in res.leaves}
            if self.policy.preemption in ("reclaim", "lowerPriority"):
                within = ledger.within_quota(w.labels, w.demand)
        by_priority = self.policy.preemption == "lowerPriority"
        useful_rows: set[int] = set()
        for g in w.gang:
            useful_rows.update(cap.eligible_rows(g.pod_set.constraints).tolist())
        out: list[_Victim] = []
        for a in self.pool:
            if a.key == w.key or a.key in self.gone or w.key in a.preempted:
                continue
            spots = ledger.spots(a.key) if ledger is not None else {}
            on_path = all(at in paths[t] for t, (at, _) in spots.items() if t in paths)
            borrows_on_path = any(at != path[0] and at in paths.get(t, ())
                                  for t, (at, path) in spots.items())
            reclaim = within and borrows_on_path
            if not (reclaim or (by_priority and a.priority < prio and on_path)):
                continue
            rows, amounts = cap.amounts((p.node, p.request) for p in a.holdings)
            quota_help = bool(spots) and any(at in paths.get(t, ()) for t, (at, _) in
                                             spots.items())
            if not quota_help and not useful_rows.intersection(rows.tolist()):
                continue  # frees neither quota W needs nor a node W's pods may use
            out.append(_Victim(a, reclaim, rows, amounts, _per_node(a.holdings)))
        borrows = ledger.borrows if ledger is not None else (lambda _k: False)
        out.sort(key=lambda v: (v.wrapper.priority, not borrows(v.wrapper.key),
                                -v.wrapper.dispatched_at, v.wrapper.key))
        return out[:MAX_CANDIDATES]

    # --- does W fit without them? ------------------------------------------------------

    def _fits_quota(self, w: QueuedWrapper, victims: Sequence[_Victim]) -> bool:
        if self.ledger is None or not self.ledger.active:
            return True
        gone = [*self.gone, *(v.wrapper.key for v in victims)]
        return self.ledger.check(w.labels, w.demand, without=gone).fits

    def _trial(self, w: QueuedWrapper, cap: Capacity,
               victims: Sequence[_Victim]) -> list[Placement] | None:
        if not self._fits_quota(w, victims):
            return None
        trial = cap.copy()
        if victims:
            trial.give_back(np.concatenate([v.rows for v in victims]),
                            np.concatenate([v.amounts for v in victims]))
        result = self.fit_gang(w.gang, trial)
        return None if isinstance(result, Shortfall) else result

    def _search(self, w: QueuedWrapper, prio: float, cap: Capacity) -> Preemption | None:
        pool = self._eligible(w, prio, cap)
        if not pool or self._trial(w, cap, pool) is None:
            return None
        # Shortest feasible prefix: double, then bisect. Feasibility grows with the prefix.
        hi = 1
        while hi < len(pool) and self._trial(w, cap, pool[:hi]) is None:
            hi *= 2
        hi = min(hi, len(pool))
        lo = hi // 2 + 1 if hi > 1 else 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self._trial(w, cap, pool[:mid]) is None:
                lo = mid + 1
            else:
                hi = mid
        chosen = pool[:hi]
        planned = self._trial(w, cap, chosen)
        assert planned is not None
        chosen = self._minimal(w, cap, chosen, planned)
        final = self._trial(w, cap, chosen)
        placements = final if final is not None else planned
        return Preemption(tuple(v.wrapper for v in chosen),
                          frozenset(v.wrapper.key for v in chosen if v.reclaim),
                          tuple(placements))

    def _minimal(self, w: QueuedWrapper, cap: Capacity, chosen: list[_Victim],
                 planned: Sequence[Placement]) -> list[_Victim]:
        """Drop victims, most expensive first, while `planned` still fits without them."""
        need = _per_node(PlannedPod(p.node or "", p.request) for p in planned)
        aggregate = any(p.node is None for p in planned)
        if aggregate:
            total: dict[str, int] = {}
            for row in need.values():
                for r, v in row.items():
                    total[r] = total.get(r, 0) + v
            free_rows = {"": dict(cap.free_total)}
            need = {"": total}
        else:
            free_rows = {n: cap.free_of(n) for n in need}

        def gain(v: _Victim, node: str) -> Mapping[str, int]:
            if not aggregate:
                return v.per_node.get(node, {})
            out: dict[str, int] = {}
            for n, row in v.per_node.items():
                if n in cap.nodes and not cap.nodes[n].unschedulable:
                    for r, x in row.items():
                        out[r] = out.get(r, 0) + x
            return out

        def enough(keep: Sequence[_Victim]) -> bool:
            for node, row in need.items():
                free = free_rows[node]
                for r, v in row.items():
                    if free.get(r, 0) + sum(gain(k, node).get(r, 0) for k in keep) < v:
                        return False
            return self._fits_quota(w, keep)

        keep = list(chosen)
        for victim in reversed(chosen):
            trial = [k for k in keep if k is not victim]
            if enough(trial):
                keep = trial
        return keep
