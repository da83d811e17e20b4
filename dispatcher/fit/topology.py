"""Topology-aware gang placement: a pod set (or a whole gang) in one rack, block...

The installation names its topology levels as node labels, outermost first (a block
holds racks, a rack holds nodes). A domain of a level is the set of nodes sharing that
label's value and the values of the levels above it (rack r1 of block b1 is not rack r1
of block b2); a node without the label is in no domain of that level.

A pod set asks, with Kueue's annotations, for one domain of a level: required (all its
pods there, or it waits) or preferred (one domain of that level if any fits, else one of
the level above, and so on, else anywhere). Among the domains that fit, the pods go to
the fullest that holds them (least free of the gang's main resource once they are in:
best fit), ties to the smallest (least allocatable): empty domains stay whole for the
large gangs waiting. Inside
the domain, pods are placed as fit.gang places them on the whole cluster.

Work per decision is linear in the nodes (a sum per domain, vectorised) plus one
placement try per domain whose free totals hold the pods: never a step per pair of
domains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dispatcher.fit.capacity import Capacity, IndexArray, IntArray
from dispatcher.fit.gang import (
    GangPodSet,
    Placement,
    Shortfall,
    demand,
    never_fits,
    place,
    total_shortfall,
)
from dispatcher.kinds.podset import PodConstraints, TopologyRequest
from dispatcher.resources import bounded_free, format_amount

NO_DOMAIN = "NoTopologyDomain"  # enough room, but not inside one domain of the level


@dataclass(frozen=True)
class Topology:
    """The installation's topology levels: node labels, outermost first."""

    levels: tuple[str, ...] = ()

    def problem(self, gang: Sequence[GangPodSet]) -> str | None:
        """Why the gang's topology requests cannot be honoured here (a level the
        installation does not have), or None."""
        for g in gang:
            t = g.pod_set.topology
            if t is not None and t.level not in self.levels:
                known = (f"the configured levels are {', '.join(self.levels)}" if self.levels
                         else "the installation configures no topology levels "
                              "(topology.levels in the dispatcher's configuration)")
                kind = "required" if t.required else "preferred"
                return (f"pod set {g.pod_set.name} asks for {kind} topology level {t.level!r}, "
                        f"which is not a topology level here: {known}")
        return None

    def place(self, gang: Sequence[GangPodSet], cap: Capacity) -> list[Placement] | Shortfall:
        """fit.gang.place, with every pod set that asks for a domain kept in one."""
        return place_in_topology(gang, cap, self)

    def never_fits(self, gang: Sequence[GangPodSet], empty: Capacity) -> Shortfall | None:
        """fit.gang.never_fits, with the topology requests honoured."""
        return never_fits(gang, empty, placer=self.place)

    def pinned(self, gang: Sequence[GangPodSet]) -> Pinned | None:
        """The pod sets whose domain is chosen first when the gang is placed (its largest
        group that requires a domain), or None: the gang requires no domain."""
        for request, sets in _steps(gang):
            if request is not None and request.required:
                return Pinned(self.levels.index(request.level), tuple(sets))
        return None

    def domains(self, cap: Capacity, depth: int) -> Domains:
        """The domains of the level `depth` (an index into `levels`) over `cap`'s nodes."""
        return _levels(cap, self)[depth]

    def place_in(self, gang: Sequence[GangPodSet], cap: Capacity,
                 domain: int) -> list[Placement] | Shortfall:
        """`place`, with the pinned pod sets (``pinned``) in `domain` of their level."""
        return place_in_topology(gang, cap, self, domain)

    def landed(self, gang: Sequence[GangPodSet], placements: Sequence[Placement],
               labels: Mapping[str, Mapping[str, str]]) -> list[tuple[str, bool]]:
        """Per group of the gang that asks for a domain (Topology.pinned's groups, and the
        preferred ones): the level it asks for, and whether its placed pods are all in one
        domain of that level. `labels`: the nodes' labels, by node name."""
        out: list[tuple[str, bool]] = []
        for request, sets in _steps(gang):
            if request is None:
                continue
            mine = {(g.item, g.pod_set.name) for g in sets}
            outer = self.levels[:self.levels.index(request.level) + 1]
            paths = {tuple(labels.get(p.node, {}).get(level) for level in outer)
                     for p in placements if p.node is not None and (p.item, p.pod_set) in mine}
            out.append((request.level, len(paths) == 1 and None not in next(iter(paths))))
        return out

    def shared_domain(self, cap: Capacity, asks: Sequence[tuple[str, Sequence[str]]]
                      ) -> IndexArray:
        """The rows (ascending) in the domain of each (level, nodes) of `asks` that holds
        all those nodes, together; none when some nodes are not all in one domain of
        their level (or are not nodes of `cap`)."""
        levels = _levels(cap, self)
        rows: IndexArray = cap.all_rows
        for level, nodes in asks:
            domains = levels[self.levels.index(level)]
            found = {int(domains.ids[cap.row(n)]) if n in cap.nodes else -1 for n in nodes}
            if len(found) != 1 or -1 in found:
                return np.zeros(0, dtype=np.intp)
            inside: IndexArray = np.intersect1d(rows, domains.rows(found.pop()),
                                                assume_unique=True)
            rows = inside
        return rows


@dataclass(frozen=True)
class Pinned:
    """A gang's pod sets kept in one domain of the level `depth`, placed first."""

    depth: int
    sets: tuple[GangPodSet, ...]


class Domains:
    """The domains of one level over a node layout (rows in `Capacity.names` order):
    `ids` numbers each row's domain (-1: the node carries no label of the level)."""

    def __init__(self, cap: Capacity, label: str, outer: list[int]) -> None:
        """`outer`: per row, the path of label values above this level (a number); it
        becomes the path down to this level."""
        paths: dict[tuple[int, str | None], int] = {}
        domains: dict[int, int] = {}
        self.names: list[str] = []
        ids = np.full(len(cap.names), -1, dtype=np.intp)
        for row, name in enumerate(cap.names):
            value = cap.nodes[name].labels.get(label)
            path = paths.setdefault((outer[row], value), len(paths))
            outer[row] = path
            if value is None:
                continue
            domain = domains.get(path)
            if domain is None:
                domain = domains[path] = len(self.names)
                self.names.append(value)
            ids[row] = domain
        self.label = label
        self.ids: IndexArray = ids
        labelled = np.flatnonzero(ids >= 0)
        # Rows grouped by domain (each group ascending): a sum per domain is one reduceat.
        self.order: IndexArray = labelled[np.argsort(ids[labelled], kind="stable")]
        # Every node labelled and the domains in row order (nodes named by rack, say):
        # a column is then summed per domain as it is, without gathering it first.
        self._in_order = len(self.order) == len(ids) and bool(
            (self.order == np.arange(len(ids))).all())
        sizes = np.bincount(ids[labelled], minlength=len(self.names))
        ends = np.cumsum(sizes)
        self.starts: IndexArray = (ends - sizes).astype(np.intp)
        self._ends = ends.tolist()
        by_name = sorted(range(len(self.names)), key=self.names.__getitem__)
        self.name_rank: IndexArray = np.empty(len(self.names), dtype=np.intp)
        self.name_rank[by_name] = np.arange(len(self.names), dtype=np.intp)
        self._allocatable: dict[str, IntArray] = {}
        self._nodes = [cap.nodes[n] for n in cap.names]

    def rows(self, domain: int) -> IndexArray:
        """The rows of one domain, ascending."""
        found: IndexArray = self.order[int(self.starts[domain]):self._ends[domain]]
        return found

    def per_domain(self, values: IntArray) -> IntArray:
        """The sum of a per-row column over each domain."""
        if not len(self.order):
            return np.zeros(0, dtype=np.int64)
        summed: IntArray = np.add.reduceat(values if self._in_order else values[self.order],
                                           self.starts)
        return summed

    def allocatable(self, resource: str) -> IntArray:
        known = self._allocatable.get(resource)
        if known is None:
            column = np.array([bounded_free(n.allocatable.get(resource, 0))
                               for n in self._nodes], dtype=np.int64)
            known = self._allocatable[resource] = self.per_domain(column)
        return known


def _levels(cap: Capacity, topology: Topology) -> list[Domains]:
    key = ("topology", topology.levels)
    known = cap.derived.get(key)
    if not isinstance(known, list):
        outer = [0] * len(cap.names)
        known = [Domains(cap, label, outer) for label in topology.levels]
        cap.derived[key] = known
    return known


def noun(level: str) -> str:
    """What a user calls a domain of `level`: cloud.provider.com/topology-rack -> rack."""
    short = level.rsplit("/", 1)[-1]
    return short.removeprefix("topology-") or level


def main_resource(need: dict[str, int]) -> str:
    """The resource a user counts a gang in: its largest extended resource, else cpu."""
    extended = [(v, r) for r, v in need.items() if "/" in r and v > 0]
    if extended:
        return max(extended)[1]
    return "cpu" if need.get("cpu", 0) > 0 else max(
        ((v, r) for r, v in need.items()), default=(0, "cpu"))[1]


@dataclass(frozen=True)
class _Missed:
    """No domain of the level held the pods: what the best one had, for the message."""

    level: str
    resource: str
    need: int
    best: str | None  # the domain with the most free of `resource`, None: no domain
    best_free: int
    total_free: int
    roomy: str | None  # a domain with room for each pod set on its own, if any


def _in_one_domain(sets: Sequence[GangPodSet], cap: Capacity,
                   level: Domains) -> list[Placement] | _Missed:
    need = demand(sets)
    main = main_resource(need)
    ruled = [cap.eligible_rows(c) for c in {g.pod_set.constraints for g in sets}]
    eligible: npt.NDArray[np.bool_] | None = None  # None: every node
    if not any(rows is cap.all_rows for rows in ruled):
        eligible = np.zeros(len(cap.names), dtype=bool)
        for rows in ruled:
            eligible[rows] = True
    column = np.maximum(cap.column(main, cap.all_rows), 0)
    if eligible is not None:
        column[~eligible] = 0
    main_free = level.per_domain(column)
    total_free = int(column.sum())
    fits = main_free >= need.get(main, 0)
    # Each shape's pods must fit the domain's nodes one by one (pod sets of one shape and
    # rules together): the check that rules out most domains, short of placing.
    shapes: dict[tuple[tuple[tuple[str, int], ...], PodConstraints], int] = {}
    for g in sets:
        key = (tuple(sorted(g.pod_set.request.items())), g.pod_set.constraints)
        shapes[key] = shapes.get(key, 0) + g.pod_set.count
    for (request, constraints), count in shapes.items():
        counts = cap.how_many(cap.all_rows, dict(request))
        allowed = cap.eligible_rows(constraints)
        if allowed is not cap.all_rows:
            kept = np.zeros(len(cap.names), dtype=bool)
            kept[allowed] = True
            counts = np.where(kept, counts, 0)
        fits &= level.per_domain(np.minimum(counts, count)) >= count
    candidates = np.flatnonzero(fits)
    if len(candidates):
        order = best_fit(main_free[candidates] - need.get(main, 0),
                         level.allocatable(main)[candidates], level.name_rank[candidates])
        for domain in candidates[order].tolist():
            placed = place(sets, cap, within=level.rows(domain))
            if not isinstance(placed, Shortfall):
                return placed
    best = int(np.argmax(main_free)) if len(level.names) else None
    return _Missed(level.label, main, need.get(main, 0),
                   None if best is None else level.names[best],
                   0 if best is None else int(main_free[best]), total_free,
                   level.names[int(candidates[0])] if len(candidates) else None)


def best_fit(free_after: IntArray, size: IntArray, name_rank: IndexArray) -> IndexArray:
    """The order to try candidate domains in (Kueue TAS's BestFit): the least free of the
    main resource left once the pods are in first, so empty domains stay whole for the
    large gangs that need them; then the smallest domain, then by name (stable answers)."""
    order: IndexArray = np.lexsort((name_rank, size, free_after))
    return order


def _missed_message(m: _Missed) -> str:
    what = f"needs {format_amount(m.resource, m.need)} in one {m.level}"
    if m.best is None:
        return f"{what}: no schedulable node it may use carries the label {m.level}"
    kind = noun(m.level)
    total = f"{format_amount(m.resource, m.total_free)} free in total"
    if m.roomy is not None:
        return (f"{what}: {kind} {m.roomy} has room for each pod set, but not for them all "
                f"at once; {total}")
    return (f"{what}: best {kind} {m.best} has {format_amount(m.resource, m.best_free)} free; "
            f"{total}")


def _place_group(sets: Sequence[GangPodSet], request: TopologyRequest, cap: Capacity,
                 topology: Topology, domain: int | None = None) -> list[Placement] | Shortfall:
    levels = _levels(cap, topology)
    depth = topology.levels.index(request.level)
    if domain is not None:  # chosen by the caller (a preemption's): that one or none
        placed = place(sets, cap, within=levels[depth].rows(domain))
        return placed if not isinstance(placed, Shortfall) else Shortfall(
            NO_DOMAIN, f"{noun(request.level)} {levels[depth].names[domain]} cannot hold "
                       f"pod sets {', '.join(g.pod_set.name for g in sets)}")
    missed: _Missed | None = None
    for d in ([depth] if request.required else range(depth, -1, -1)):
        found = _in_one_domain(sets, cap, levels[d])
        if not isinstance(found, _Missed):
            return found
        missed = missed or found
    if not request.required:
        return place(sets, cap)  # preferred only: anywhere, as without topology
    assert missed is not None
    return Shortfall(NO_DOMAIN, _missed_message(missed))


def _groups(gang: Sequence[GangPodSet]
            ) -> tuple[list[tuple[TopologyRequest, list[GangPodSet]]], list[GangPodSet]]:
    """The pod sets kept together, each with its request (the AppWrapper's request makes
    one group of all the sets it covers), and the free ones."""
    groups: dict[TopologyRequest, list[GangPodSet]] = {}
    own: list[tuple[TopologyRequest, list[GangPodSet]]] = []
    free: list[GangPodSet] = []
    for g in gang:
        t = g.pod_set.topology
        if t is None:
            free.append(g)
        elif t.whole_gang:
            groups.setdefault(t, []).append(g)
        else:
            own.append((t, [g]))
    return [*groups.items(), *own], free


def _steps(gang: Sequence[GangPodSet]
           ) -> list[tuple[TopologyRequest | None, list[GangPodSet]]]:
    """The gang's pod sets in the order they are placed: the groups kept together, the
    largest first (they have the fewest domains to choose from), then the free ones."""
    together, free = _groups(gang)
    together.sort(key=lambda tg: sum(g.pod_set.count for g in tg[1]), reverse=True)
    steps: list[tuple[TopologyRequest | None, list[GangPodSet]]] = [*together]
    if free:
        steps.append((None, free))
    return steps


def place_in_topology(gang: Sequence[GangPodSet], cap: Capacity, topology: Topology,
                      pinned_domain: int | None = None) -> list[Placement] | Shortfall:
    """Place the gang with its topology requests honoured, taking the capacity; or take
    nothing and say why. The levels must be the topology's (Topology.problem).
    `pinned_domain`: the domain of the pinned pod sets (Topology.pinned), if chosen."""
    steps = _steps(gang)
    if steps[0][0] is None:
        return place(gang, cap)
    short = total_shortfall(gang, cap)
    if short is not None:
        return short
    placed: list[Placement] = []
    pin = next((i for i, (r, _) in enumerate(steps) if r is not None and r.required), None)
    for i, (request, sets) in enumerate(steps):
        result = (place(sets, cap) if request is None
                  else _place_group(sets, request, cap, topology,
                                    pinned_domain if i == pin else None))
        if isinstance(result, Shortfall):
            for p in placed:
                assert p.node is not None
                cap.give(p.node, p.request)
            return result
        placed.extend(result)
    return sorted(placed, key=lambda p: (p.item, p.pod_set, p.pod))
