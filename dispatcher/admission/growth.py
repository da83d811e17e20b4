"""Elastic gangs grown by what a cycle leaves: those dispatched in it, and the admitted
ones (dispatcher.elastic)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from dispatcher.elastic import Candidate, Scale, at_minimum, grow, newly_admitted, rank
from dispatcher.fit.capacity import Capacity
from dispatcher.fit.gang import NEVER_FITS, GangPodSet
from dispatcher.preemption import AdmittedWrapper
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import QueuedWrapper, WrapperKey
from dispatcher.quota import QuotaLedger

from .decision import AWAITING_PREEMPTION, INVALID, UNKNOWN_QUOTA, Decision

# Waits that room on a node would not end: they never keep an elastic gang from growing.
_NOT_FOR_ROOM = frozenset({NEVER_FITS, UNKNOWN_QUOTA, AWAITING_PREEMPTION, INVALID})


def grow_elastic(decisions: list[Decision], seen: Mapping[WrapperKey, QueuedWrapper],
                 pool: Sequence[AdmittedWrapper], gone: set[WrapperKey], capacity: Capacity,
                 policy: Policy, ledger: QuotaLedger | None,
                 scaling: list[Scale] | None) -> None:
    """Grow the elastic gangs dispatched in this cycle (their decisions are rewritten)
    and, into `scaling`, the admitted ones of `pool` (see dispatcher.elastic)."""
    candidates: list[Candidate] = []
    new: dict[WrapperKey, int] = {}
    for i, d in enumerate(decisions):
        w = seen.get(d.key)
        if w is not None and d.decision == "dispatch" and d.elastic and not _in_domain(w.gang):
            new[d.key] = i
            candidates.append(Candidate(d.key, rank(policy, d.effective_priority, w.first_seen),
                                        w.labels, newly_admitted(w)))
    for a in pool:
        if (a.elastic is not None and a.key not in gone and a.key not in seen
                and not _in_domain(a.elastic.gang)):
            candidates.append(Candidate(a.key, rank(policy, a.priority, a.elastic.first_seen),
                                        a.labels, a.elastic))
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


def _in_domain(gang: Sequence[GangPodSet]) -> bool:
    """Whether the gang requires one topology domain: its growth, placed anywhere, could
    leave the domain, so it is not grown."""
    return any(g.pod_set.topology is not None and g.pod_set.topology.required for g in gang)
