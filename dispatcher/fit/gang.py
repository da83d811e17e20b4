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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dispatcher.fit.capacity import Capacity, IndexArray
from dispatcher.fit.constraints import describe
from dispatcher.kinds.podset import PodSet
from dispatcher.resources import format_amount, format_resources
from dispatcher.wording import counted, plural

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


NOT_WITHIN = Shortfall(FRAGMENTED, "does not fit on the given nodes")


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


def total_shortfall(gang: Sequence[GangPodSet], cap: Capacity) -> Shortfall | None:
    lacking = [(r, v) for r, v in sorted(demand(gang).items())
               if v > cap.free_total.get(r, 0)]
    if not lacking:
        return None
    short = [f"needs {format_amount(r, v)}, "
             f"{format_amount(r, max(cap.free_total.get(r, 0), 0))} free"
             + (f" and {format_amount(r, cap.held[r])} held" if cap.held.get(r, 0) > 0 else "")
             for r, v in lacking]
    held = all(v <= cap.free_total.get(r, 0) + cap.held.get(r, 0) for r, v in lacking)
    # Room promised to gangs whose pods are not bound yet, or kept for preemptors, is
    # not room the cluster lacks: it frees as they start (or give it up).
    where = ("the room it needs is held for gangs dispatched but not running yet, or for "
             "preemptors: " if held else "the cluster lacks it in total: ")
    return Shortfall(INSUFFICIENT, where + "; ".join(short))


def _pod_set_shortfall(gang: Sequence[GangPodSet], ps: PodSet, cap: Capacity) -> Shortfall:
    """Why the pods shaped like `ps` cannot all be placed on `cap` (nothing taken).

    Pod sets of one shape and rules (a PyTorchJob's Master and Worker, say) are
    explained together: that is how a user counts them.
    """
    alike = [g.pod_set for g in gang
             if dict(g.pod_set.request) == dict(ps.request)
             and g.pod_set.constraints == ps.constraints]
    count = sum(p.count for p in alike)
    # Name the pod sets only when the gang has others: "a pod of Worker", "a pod".
    of = f" of {'/'.join(p.name for p in alike)}" if len(alike) < len(gang) else ""
    rows = cap.eligible_rows(ps.constraints)
    if not len(rows):
        return Shortfall(
            NO_MATCHING_NODE,
            f"no schedulable node accepts the pods{of} ({describe(ps.constraints)})",
        )
    usable = (f"the {counted(len(rows), 'node')} they may use" if len(rows) < cap.schedulable_count
              else "the nodes")
    for r, v in sorted(ps.request.items()):
        if v <= 0:
            continue
        total = int(np.maximum(cap.column(r, rows), 0).sum())
        if total < v * count:
            return Shortfall(
                INSUFFICIENT,
                f"the {counted(count, 'pod')}{of} {plural(count, 'needs', 'need')} "
                f"{format_amount(r, v * count)}, "
                f"{format_amount(r, total)} free on {usable}",
            )
    for r, v in sorted(ps.request.items()):
        if v <= 0:
            continue
        free = cap.column(r, rows)
        best = int(free.max())
        if best < v:
            total = int(np.maximum(free, 0).sum())
            return Shortfall(
                FRAGMENTED,
                f"{format_amount(r, total)} free in total, but at most "
                f"{format_amount(r, max(best, 0))} on any node; a pod{of} needs "
                f"{format_amount(r, v)}",
            )
    alone = int(np.minimum(cap.how_many(rows, ps.request), count).sum())
    if alone < count:
        return Shortfall(
            FRAGMENTED,
            f"enough free in total, but only {alone} of the {counted(count, 'pod')}{of} "
            f"({format_resources(_shown(ps.request))} each) fit on {usable} right now",
        )
    return Shortfall(
        FRAGMENTED,
        f"the {counted(count, 'pod')}{of} {plural(count, 'fits on its', 'fit on their')} own, "
        "but not beside the rest of "
        "the gang on the nodes free right now",
    )


def _shown(request: Mapping[str, int]) -> dict[str, int]:
    return {r: v for r, v in request.items() if r != "pods" and v > 0}


def _order(gang: Sequence[GangPodSet]) -> list[GangPodSet]:
    return sorted(gang, key=lambda g: _size(g.pod_set), reverse=True)


def place(gang: Sequence[GangPodSet], cap: Capacity,
          within: IndexArray | None = None) -> list[Placement] | Shortfall:
    """Place every pod of the gang on a node, taking the capacity; or take nothing.

    On success the capacity is taken from `cap`; on failure `cap` is left as it was
    and the Shortfall says what blocks the gang. `within` (rows, ascending) keeps the
    pods on those nodes: one topology domain, whose caller explains a failure itself
    (the Shortfall is then NOT_WITHIN, not worked out).
    """
    ordered = _order(gang)
    # Cheap early answers over the whole cluster: too little free in total, some pod
    # larger than any node's free amount. Inside a domain the caller has screened it,
    # and the fill below finds a miss on its few nodes.
    if within is None:
        total = total_shortfall(gang, cap)
        if total is not None:
            return total
        for g in ordered:
            for r, v in g.pod_set.request.items():
                if g.pod_set.count and v > cap.max_free(r):
                    return _pod_set_shortfall(gang, g.pod_set, cap)
    placements: list[Placement] = []
    for g in ordered:
        ps = g.pod_set
        if ps.count == 0:
            continue
        rows = (cap.eligible_rows(ps.constraints) if within is None
                else cap.eligible_in(ps.constraints, within))
        candidates = cap.with_room(rows, ps.request)
        # Each candidate takes at least one pod: the fill uses at most `count` of them,
        # and as many are room enough. Only they are counted.
        order = candidates[cap.best_fit_positions(candidates, ps.count)]
        counts = cap.how_many(order, ps.request)
        if int(np.minimum(counts, ps.count).sum()) >= ps.count:
            # Fill the tightest nodes first; the last one takes only what is left.
            chosen: list[int] = []
            taken: list[int] = []
            left = ps.count
            for row, n in zip(order.tolist(), counts.tolist(), strict=True):
                if left <= 0:
                    break
                chosen.append(row)
                taken.append(min(n, left))
                left -= taken[-1]
            cap.take_rows(np.array(chosen, dtype=np.intp), ps.request,
                          np.array(taken, dtype=np.int64))
            pod = 0
            for row, n in zip(chosen, taken, strict=True):
                name = cap.names[row]
                placements.extend(
                    Placement(g.item, ps.name, pod + i, name, ps.request) for i in range(n)
                )
                pod += n
            continue
        for p in placements:
            assert p.node is not None
            cap.give(p.node, p.request)
        return NOT_WITHIN if within is not None else _pod_set_shortfall(gang, ps, cap)
    return sorted(placements, key=lambda p: (p.item, p.pod_set, p.pod))


def place_aggregate(gang: Sequence[GangPodSet], cap: Capacity) -> list[Placement] | Shortfall:
    """MCAD's rule: the gang's total against the cluster's total free capacity."""
    total = total_shortfall(gang, cap)
    if total is not None:
        return total
    cap.take_total(demand(gang))
    return [
        Placement(g.item, g.pod_set.name, i, None, g.pod_set.request)
        for g in gang for i in range(g.pod_set.count)
    ]


Placer = Callable[[Sequence[GangPodSet], Capacity], "list[Placement] | Shortfall"]
Hopeless = Callable[[Sequence[GangPodSet], Capacity], "Shortfall | None"]


def never_fits(gang: Sequence[GangPodSet], empty: Capacity,
               placer: Placer | None = None) -> Shortfall | None:
    """Why the gang would not fit even with every pod gone, or None if it would.

    `empty` is a `Capacity.empty` of the cluster's nodes; it is left as it was.
    `placer`: how pods are placed (default `place`; topology-aware, say).
    """
    result = (placer or place)(gang, empty)
    if isinstance(result, Shortfall):
        return Shortfall(NEVER_FITS, "would not fit even on an empty cluster: " + result.message)
    for p in result:
        assert p.node is not None
        empty.give(p.node, p.request)
    return None


def never_fits_aggregate(gang: Sequence[GangPodSet], empty: Capacity) -> Shortfall | None:
    """The aggregate rule's version: the gang's total against all allocatable."""
    short = total_shortfall(gang, empty)
    if short is None:
        return None
    return Shortfall(NEVER_FITS, "would not fit even on an empty cluster: " + short.message)
