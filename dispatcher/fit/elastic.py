"""Sizes of an elastic gang: its pod sets at given counts, and how counts step.

A size is one count of pods per elastic set (``ElasticSet``), each between the set's
`low` and `high`, in whole replicas (`unit` pods each). Growing by n replicas adds
them one at a time to the sets in turn (the first set first), skipping sets at their
maximum; shrinking takes them back in the reverse turn. So every size between the
minimum and the maximum is reached by a number of steps, and more steps is never
smaller in any set: the searches over steps can bisect.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from dispatcher.cluster.state import PlannedPod
from dispatcher.fit.gang import GangPodSet
from dispatcher.kinds.elastic import ElasticSet
from dispatcher.wording import counted, plural

Counts = tuple[int, ...]


@dataclass(frozen=True)
class ElasticNow:
    """An admitted elastic wrapper as the core needs it to grow or shrink it.

    sets: its elastic pod sets; counts: the pods of each it runs with now (its target
    size: what its object's replicas say); gang: its gang at the declared counts (only
    the shapes and the other sets' counts are read); first_seen: when it was first
    queued (its place in the queue's order); removable: per set, its pods in the order
    a scale-in removes them (the operator's order: the highest index first), bound ones
    on their node -- what a scale-in by k pods gives back is the first k; names: theirs,
    for operators told which pods to remove (a Ray group's workersToDelete).
    """

    sets: tuple[ElasticSet, ...]
    counts: Counts
    gang: tuple[GangPodSet, ...]
    first_seen: float = 0.0
    removable: tuple[tuple[PlannedPod, ...], ...] = ()
    names: tuple[tuple[str, ...], ...] = ()  # the pods of `removable`, by name (if known)

    @property
    def at_minimum(self) -> bool:
        return all(c <= s.low for s, c in zip(self.sets, self.counts, strict=True))

    @property
    def at_maximum(self) -> bool:
        return all(c >= s.high for s, c in zip(self.sets, self.counts, strict=True))


def lowest(sets: Sequence[ElasticSet]) -> Counts:
    return tuple(s.low for s in sets)


def highest(sets: Sequence[ElasticSet]) -> Counts:
    return tuple(s.high for s in sets)


def sized(gang: Sequence[GangPodSet], sets: Sequence[ElasticSet],
          counts: Sequence[int]) -> tuple[GangPodSet, ...]:
    """`gang` with each elastic set at its count in `counts`."""
    out = list(gang)
    for s, c in zip(sets, counts, strict=True):
        g = out[s.position]
        out[s.position] = GangPodSet(g.item, replace(g.pod_set, count=c))
    return tuple(out)


def added(gang: Sequence[GangPodSet], sets: Sequence[ElasticSet], before: Sequence[int],
          after: Sequence[int]) -> tuple[GangPodSet, ...]:
    """The pods a growth from `before` to `after` adds, as a gang of its own."""
    out = []
    for s, b, a in zip(sets, before, after, strict=True):
        if a > b:
            g = gang[s.position]
            out.append(GangPodSet(g.item, replace(g.pod_set, count=a - b)))
    return tuple(out)


def room_to_grow(sets: Sequence[ElasticSet], counts: Sequence[int]) -> int:
    """Replicas that can still be added before every set is at its maximum."""
    return sum(max(s.high - c, 0) // s.unit for s, c in zip(sets, counts, strict=True))


def room_to_shrink(sets: Sequence[ElasticSet], counts: Sequence[int]) -> int:
    """Replicas that can still be removed before every set is at its minimum."""
    return sum(max(c - s.low, 0) // s.unit for s, c in zip(sets, counts, strict=True))


def grown(sets: Sequence[ElasticSet], counts: Sequence[int], replicas: int) -> Counts:
    """`counts` grown by `replicas` replicas, in turn over the sets below their maximum."""
    out = list(counts)
    left = min(replicas, room_to_grow(sets, counts))
    while left > 0:
        for i, s in enumerate(sets):
            if left and out[i] + s.unit <= s.high:
                out[i] += s.unit
                left -= 1
    return tuple(out)


def shrunk(sets: Sequence[ElasticSet], counts: Sequence[int], replicas: int) -> Counts:
    """`counts` shrunk by `replicas` replicas, in the reverse turn, never below a
    set's minimum."""
    out = list(counts)
    left = min(replicas, room_to_shrink(sets, counts))
    while left > 0:
        for i in reversed(range(len(sets))):
            if left and out[i] - sets[i].unit >= sets[i].low:
                out[i] -= sets[i].unit
                left -= 1
    return tuple(out)


def describe(sets: Sequence[ElasticSet], counts: Sequence[int]) -> str:
    """"6 workers", "3 workers in group gpu and 2 in group cpu", "4 pods of Deployment"."""
    parts = []
    for s, c in zip(sets, counts, strict=True):
        replicas = c // s.unit
        if s.name.lower() == "worker":
            parts.append(counted(replicas, "worker"))
        elif s.name.startswith("worker/"):
            parts.append(f"{counted(replicas, 'worker')} in group "
                         f"{s.name.removeprefix('worker/')}")
        else:
            parts.append(f"{c} {s.name} {plural(c, 'pod')}")
    return " and ".join(parts)
