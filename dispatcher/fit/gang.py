"""Can a whole gang be placed? Per node (the default) or by MCAD's aggregate rule.

Per node: pod sets largest first; each pod goes to the node it fits most tightly
(least free left of the extended resources, then cpu, then memory, then name). For
identical pods that is the same as filling the tightest node before the next. It is
a heuristic: with several pod sets of different shapes or rules it can miss a
placement that exists (a smaller pod may take the only node a later, larger-in-one-
dimension pod needed). It never claims a placement that does not exist: every pod it
places fits the node it names, with the capacity the earlier pods left.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dispatcher.fit.capacity import Capacity
from dispatcher.fit.constraints import describe
from dispatcher.kinds.podset import PodSet
from dispatcher.resources import format_amount, format_resources

# Why a gang does not fit, from the most to the least actionable for a user.
INSUFFICIENT = "InsufficientResources"  # the cluster lacks it in total
FRAGMENTED = "Fragmented"  # enough in total, but not on single nodes
NO_MATCHING_NODE = "NoMatchingNode"  # no node accepts the pods' rules at all
NEVER_FITS = "NeverFits"  # would not fit even on the empty cluster


@dataclass(frozen=True)
class GangPodSet:
    """A pod set and the index of the GenericItem it comes from."""

    item: int
    pod_set: PodSet


@dataclass(frozen=True)
class Placement:
    item: int
    pod_set: str
    pod: int
    node: str | None  # None under the aggregate rule, which places no pod
    request: Mapping[str, int]


@dataclass(frozen=True)
class Shortfall:
    reason: str
    message: str


def demand(gang: Sequence[GangPodSet]) -> dict[str, int]:
    total: dict[str, int] = {}
    for g in gang:
        for r, v in g.pod_set.request.items():
            total[r] = total.get(r, 0) + v * g.pod_set.count
    return total


def _size(ps: PodSet) -> tuple[int, int, int]:
    req = ps.request
    extended = sum(v for r, v in req.items() if "/" in r)
    return (extended, req.get("cpu", 0), req.get("memory", 0))


def _how_many(free: Mapping[str, int], request: Mapping[str, int]) -> int:
    n: int | None = None
    for r, v in request.items():
        if v <= 0:
            continue
        k = free.get(r, 0) // v
        if k <= 0:
            return 0
        n = k if n is None else min(n, k)
    return 1 << 30 if n is None else n


def _total_shortfall(gang: Sequence[GangPodSet], cap: Capacity) -> Shortfall | None:
    short = [
        f"needs {format_amount(r, v)}, {format_amount(r, max(cap.free_total.get(r, 0), 0))} free"
        for r, v in sorted(demand(gang).items())
        if v > cap.free_total.get(r, 0)
    ]
    if short:
        return Shortfall(INSUFFICIENT, "the cluster lacks it in total: " + "; ".join(short))
    return None


def _pod_set_shortfall(ps: PodSet, cap: Capacity) -> Shortfall:
    """Why the pods of `ps` cannot all be placed on `cap` (as it is, nothing taken)."""
    names = cap.eligible(ps.constraints)
    if not names:
        return Shortfall(
            NO_MATCHING_NODE,
            f"no schedulable node accepts the pods of {ps.name} ({describe(ps.constraints)})",
        )
    for r, v in sorted(ps.request.items()):
        if v <= 0:
            continue
        best = max((cap.free[n].get(r, 0) for n in names), default=0)
        if best < v:
            total = sum(max(cap.free[n].get(r, 0), 0) for n in names)
            return Shortfall(
                FRAGMENTED,
                f"{format_amount(r, total)} free in total, but at most "
                f"{format_amount(r, max(best, 0))} on any node; a pod of {ps.name} needs "
                f"{format_amount(r, v)}",
            )
    alone = sum(_how_many(cap.free[n], ps.request) for n in names)
    if alone < ps.count:
        return Shortfall(
            FRAGMENTED,
            f"enough free in total, but only {alone} of the {ps.count} pods of {ps.name} "
            f"({format_resources(_shown(ps.request))} each) fit on the nodes right now",
        )
    return Shortfall(
        FRAGMENTED,
        f"the {ps.count} pods of {ps.name} fit on their own, but not beside the rest of "
        "the gang on the nodes free right now",
    )


def _shown(request: Mapping[str, int]) -> dict[str, int]:
    return {r: v for r, v in request.items() if r != "pods" and v > 0}


def _order(gang: Sequence[GangPodSet]) -> list[GangPodSet]:
    return sorted(gang, key=lambda g: _size(g.pod_set), reverse=True)


def _score(free: Mapping[str, int], request: Mapping[str, int],
           extended: tuple[str, ...], name: str) -> tuple[object, ...]:
    left = tuple(free.get(r, 0) - request.get(r, 0) for r in extended)
    return (*left, free.get("cpu", 0) - request.get("cpu", 0),
            free.get("memory", 0) - request.get("memory", 0), name)


def place(gang: Sequence[GangPodSet], cap: Capacity) -> list[Placement] | Shortfall:
    """Place every pod of the gang on a node, taking the capacity; or take nothing.

    On success the capacity is taken from `cap`; on failure `cap` is left as it was
    and the Shortfall says what blocks the gang.
    """
    total = _total_shortfall(gang, cap)
    if total is not None:
        return total
    ordered = _order(gang)
    for g in ordered:  # cheap early answer: some pod larger than any node's free amount
        for r, v in g.pod_set.request.items():
            if g.pod_set.count and v > cap.max_free(r):
                return _pod_set_shortfall(g.pod_set, cap)
    placements: list[Placement] = []
    for g in ordered:
        ps = g.pod_set
        if ps.count == 0:
            continue
        candidates = []
        for name in cap.eligible(ps.constraints):
            free = cap.free[name]
            k = _how_many(free, ps.request)
            if k:
                candidates.append((_score(free, ps.request, cap.extended, name), name, k))
        candidates.sort()
        placed = 0
        for _, name, k in candidates:
            n = min(k, ps.count - placed)
            cap.take(name, ps.request, n)
            placements.extend(
                Placement(g.item, ps.name, placed + i, name, ps.request) for i in range(n)
            )
            placed += n
            if placed == ps.count:
                break
        if placed < ps.count:
            for p in placements:
                assert p.node is not None
                cap.give(p.node, p.request)
            return _pod_set_shortfall(ps, cap)
    return sorted(placements, key=lambda p: (p.item, p.pod_set, p.pod))


def place_aggregate(gang: Sequence[GangPodSet], cap: Capacity) -> list[Placement] | Shortfall:
    """MCAD's rule: the gang's total against the cluster's total free capacity."""
    total = _total_shortfall(gang, cap)
    if total is not None:
        return total
    cap.take_total(demand(gang))
    return [
        Placement(g.item, g.pod_set.name, i, None, g.pod_set.request)
        for g in gang for i in range(g.pod_set.count)
    ]


def never_fits(gang: Sequence[GangPodSet], empty: Capacity) -> Shortfall | None:
    """Why the gang would not fit even with every pod gone, or None if it would.

    `empty` is a `Capacity.empty` of the cluster's nodes; it is left as it was.
    """
    result = place(gang, empty)
    if isinstance(result, Shortfall):
        return Shortfall(NEVER_FITS, "would not fit even on an empty cluster: " + result.message)
    for p in result:
        assert p.node is not None
        empty.give(p.node, p.request)
    return None


def never_fits_aggregate(gang: Sequence[GangPodSet], empty: Capacity) -> Shortfall | None:
    """The aggregate rule's version: the gang's total against all allocatable."""
    short = _total_shortfall(gang, empty)
    if short is None:
        return None
    return Shortfall(NEVER_FITS, "would not fit even on an empty cluster: " + short.message)
