"""Elastic gangs grown by what a cycle leaves: those dispatched in it, and the admitted
ones (dispatcher.elastic)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from dispatcher.cluster.state import PlannedPod
from dispatcher.elastic import Candidate, Scale, at_minimum, grow, newly_admitted, rank
from dispatcher.fit.capacity import Capacity, IndexArray
from dispatcher.fit.elastic import ElasticNow
from dispatcher.fit.gang import NEVER_FITS, Placement
from dispatcher.fit.topology import Topology
from dispatcher.preemption import AdmittedWrapper
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import QueuedWrapper, WrapperKey
from dispatcher.quota import QuotaLedger

from .decision import AWAITING_PREEMPTION, INVALID, UNKNOWN_QUOTA, Decision

# Waits that room on a node would not end: they never keep an elastic gang from growing.
_NOT_FOR_ROOM = frozenset({NEVER_FITS, UNKNOWN_QUOTA, AWAITING_PREEMPTION, INVALID})


def grow_elastic(decisions: list[Decision], seen: Mapping[WrapperKey, QueuedWrapper],
                 pool: Sequence[AdmittedWrapper], gone: set[WrapperKey], capacity: Capacity,
                 policy: Policy, ledger: QuotaLedger | None, scaling: list[Scale] | None,
                 topology: Topology) -> None:
    """Grow the elastic gangs dispatched in this cycle (their decisions are rewritten)
    and, into `scaling`, the admitted ones of `pool` (see dispatcher.elastic). A gang
    that requires a topology domain grows inside the one its pods occupy."""
    new: dict[WrapperKey, int] = {}  # the dispatched ones: where their decision is
    candidates = _candidates(decisions, seen, pool, gone, capacity, policy, topology, new)
    if not candidates:
        return  # the usual cycle: no elastic gang, nothing more to do
    blockers = [(rank(policy, d.effective_priority, w.first_seen), at_minimum(w).gang)
                for d in decisions
                if d.decision == "wait" and d.reason not in _NOT_FOR_ROOM
                and (w := seen.get(d.key)) is not None]
    for s in grow(candidates, blockers, capacity, ledger):
        at = new.get(s.key)
        if at is None:
            if scaling is not None:
                scaling.append(s)
            continue
        d = decisions[at]
        decisions[at] = dataclasses.replace(
            d, elastic=s.after, placements=tuple(sorted(
                (*d.placements, *s.placements), key=lambda p: (p.item, p.pod_set, p.pod))),
            message=f"{d.message}; {s.message}")


def _candidates(decisions: Sequence[Decision], seen: Mapping[WrapperKey, QueuedWrapper],
                pool: Sequence[AdmittedWrapper], gone: set[WrapperKey], capacity: Capacity,
                policy: Policy, topology: Topology, new: dict[WrapperKey, int]
                ) -> list[Candidate]:
    """The gangs that may grow: elastic ones dispatched in this cycle (their decision's
    index put in `new`), then the admitted ones not preempted or scaled in by it."""
    candidates: list[Candidate] = []
    for i, d in enumerate(decisions):
        if not d.elastic:
            continue  # most of them: only an elastic gang's dispatch has sizes
        w = seen.get(d.key)
        if w is not None and d.decision == "dispatch":
            new[d.key] = i
            now = newly_admitted(w)
            sets = [now.gang[s.position] for s in now.sets]
            within = _growth_within(now, capacity, topology, d.placements, [
                [p for p in d.placements if (p.item, p.pod_set) == (g.item, g.pod_set.name)]
                for g in sets])
            candidates.append(Candidate(d.key, rank(policy, d.effective_priority, w.first_seen),
                                        w.labels, now, within))
    for a in pool:
        e = a.elastic
        if e is not None and a.key not in gone and a.key not in seen:
            within = _growth_within(e, capacity, topology, a.holdings, e.removable)
            candidates.append(Candidate(a.key, rank(policy, a.priority, e.first_seen),
                                        a.labels, e, within))
    return candidates


def _growth_within(e: ElasticNow, capacity: Capacity, topology: Topology,
                   pods: Sequence[Placement | PlannedPod],
                   by_set: Sequence[Sequence[Placement | PlannedPod]]) -> IndexArray | None:
    """The nodes an elastic gang's growth may use: for each elastic set that requires a
    domain, the one its pods occupy (the whole gang's, for the wrapper's request; that
    set's own, for the set's); None when none requires one. `pods`: all the gang's pods;
    `by_set`: each elastic set's (a set's unknown pods: it has no domain to grow in)."""
    asks: list[tuple[str, list[str]]] = []
    for j, s in enumerate(e.sets):
        t = e.gang[s.position].pod_set.topology
        if t is not None and t.required:
            mine = pods if t.whole_gang else by_set[j] if j < len(by_set) else ()
            asks.append((t.level, [p.node for p in mine if p.node is not None]))
    return topology.shared_domain(capacity, asks) if asks else None
