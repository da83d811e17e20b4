"""Free capacity per node during one admission cycle.

A working copy: each dispatch in the cycle takes capacity from it, so the decisions
after it see what is left. Free amounts live in one integer matrix (a row per node,
in name order; a column per resource) so that asking "how many of these pods fit on
each node" is one vectorised step over the cluster instead of a Python loop per
node — that is what keeps a cycle over a thousand nodes fast.

The matrix is kept column-major (one contiguous column per resource): a fit check reads a
few columns of every node and divides each by a single number, which numpy does several
times faster on contiguous columns than on a gathered block divided row by row.

Every amount enters the matrix bounded (resources.AMOUNT_BOUND): a free amount or a
request Python holds exactly may be far outside 64 bits (a pod asking 8E twice), and a
sum in the matrix would wrap round without a word.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from dispatcher.cluster.model import Node
from dispatcher.cluster.state import ClusterState
from dispatcher.fit.constraints import node_admits
from dispatcher.kinds.podset import PodConstraints
from dispatcher.resources import bounded_free, bounded_request

IntArray = npt.NDArray[np.int64]
IndexArray = npt.NDArray[np.intp]

#: "As many as you like": the count of pods that fit when a pod requests nothing.
UNBOUNDED = 1 << 30
# Up to this many rows, pods are counted on a gathered block rather than column by column:
# fewer numpy calls, each on a handful of numbers.
FEW_ROWS = 32


class _Ask:
    """A pod's request as the matrix sees it: a row, whether every resource it asks for
    exists here, and the columns it asks for with the amounts (above zero)."""

    __slots__ = ("amounts", "changes", "cols", "columns", "known", "vector")

    def __init__(self, vector: IntArray, known: bool) -> None:
        self.vector = vector
        self.known = known
        self.columns: list[tuple[int, int]] = [
            (j, int(vector[j])) for j in np.flatnonzero(vector > 0).tolist()]
        self.cols: IndexArray = np.array([j for j, _ in self.columns], dtype=np.intp)
        self.amounts: IntArray = np.array([v for _, v in self.columns], dtype=np.int64)
        self.changes = [(j, int(vector[j])) for j in np.flatnonzero(vector).tolist()]


class Capacity:
    def __init__(self, nodes: Iterable[Node], free: Mapping[str, Mapping[str, int]]) -> None:
        ordered = sorted(nodes, key=lambda n: n.name)
        resources: set[str] = set()
        for n in ordered:
            resources.update(n.allocatable)
            resources.update(free[n.name])
        names = tuple(sorted(resources))
        rows = [[bounded_free(free[n.name].get(r, 0)) for r in names] for n in ordered]
        self._setup(ordered, names, np.array(rows, dtype=np.int64).reshape(
            len(ordered), len(names)))

    def _setup(self, ordered: list[Node], resources: tuple[str, ...], free: IntArray) -> None:
        self.nodes: dict[str, Node] = {n.name: n for n in ordered}
        self.names: tuple[str, ...] = tuple(self.nodes)
        self._row: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        self.resources: tuple[str, ...] = resources
        self._col: dict[str, int] = {r: j for j, r in enumerate(resources)}
        self._free: IntArray = np.asfortranarray(free)
        self._schedulable = np.array([not n.unschedulable for n in ordered], dtype=bool)
        self.schedulable_count = int(self._schedulable.sum())
        # Every row, in order: what eligible_rows answers for pods every node admits, so
        # that reading a column for them needs no gather.
        self._all_rows: IndexArray = np.arange(len(self.names), dtype=np.intp)
        # Largest free amount per column over the schedulable nodes, until the next change.
        self._max: dict[int, int] = {}
        # Nodes with nothing that turns a pod away but its own rules (no taint, no cordon):
        # a pod with no selector and no affinity is admitted by all of them.
        self._plain = np.array([not n.taints and not n.unschedulable for n in ordered],
                               dtype=bool)
        self._total()
        # Best-fit order: least left of the extended resources (in name order), then
        # cpu, then memory, then node name. np.lexsort takes its primary key last.
        extended = [j for r, j in self._col.items() if "/" in r]
        self._sort_cols: list[int] = [
            j for j in (self._col.get("memory"), self._col.get("cpu")) if j is not None
        ] + extended[::-1]
        self.extended: tuple[str, ...] = tuple(self.resources[j] for j in extended)
        self._eligible: dict[PodConstraints, IndexArray] = {}
        self._eligible_masks: dict[PodConstraints, npt.NDArray[np.bool_]] = {}
        # What other modules work out from the node layout alone (topology domains),
        # shared like the eligibility answers by the snapshots of one layout.
        self.derived: dict[object, object] = {}
        self._requests: dict[tuple[tuple[str, int], ...], _Ask] = {}
        # Room not free because it is promised: to gangs dispatched whose pods are not
        # bound yet, to preemptors. Only what a waiting wrapper is told: "held", not
        # "the cluster lacks it".
        self.held: dict[str, int] = {}

    def _total(self) -> None:
        every = self.schedulable_count == len(self.names)
        self.free_total: dict[str, int] = {}
        for r, j in self._col.items():
            column = self._free[:, j] if every else self._free[self._schedulable, j]
            self.free_total[r] = int(np.maximum(column, 0).sum())

    @classmethod
    def of(cls, state: ClusterState) -> Capacity:
        """A snapshot of the free capacity of `state`'s nodes now.

        What depends on the nodes alone (their order, which nodes admit which pods) is
        worked out once per layout of the state (``ClusterState.layout``) and shared by
        the snapshots; each takes a copy of the state's free matrix.
        """
        names, resources, matrix = state.free_matrix()
        known = _LAYOUTS.get(state)
        if known is None or known[0] != state.layout:
            template = cls.__new__(cls)
            template._setup([state.nodes[n] for n in names], resources, matrix)
            known = _LAYOUTS[state] = (state.layout, template)
        cap = known[1]._with_free(matrix.copy(order="F"))
        cap.held = state.held_total()
        return cap

    def _with_free(self, free: IntArray) -> Capacity:
        cap = Capacity.__new__(Capacity)
        cap.__dict__.update(self.__dict__)
        cap._free = free
        cap._max = {}
        cap._requests = dict(self._requests)
        cap._total()
        return cap

    @classmethod
    def empty(cls, nodes: Iterable[Node]) -> Capacity:
        """The same nodes with nothing running: can a gang ever fit here?"""
        nodes = list(nodes)
        return cls(nodes, {n.name: n.allocatable for n in nodes})

    def copy(self) -> Capacity:
        """An independent working copy (a what-if: "were these pods gone...")."""
        cap = Capacity.__new__(Capacity)
        cap.__dict__.update(self.__dict__)
        cap._free = self._free.copy(order="F")
        cap.free_total = dict(self.free_total)
        cap.held = dict(self.held)
        cap._max = dict(self._max)
        # Request vectors depend on the columns, which a copy may grow on its own.
        cap._requests = dict(self._requests)
        return cap

    # --- reading -------------------------------------------------------------------

    @property
    def free(self) -> dict[str, dict[str, int]]:
        """A snapshot of the free amounts per node (for explanations and tests)."""
        return {name: self.free_of(name) for name in self.names}

    def row(self, node: str) -> int:
        """The node's row in the free matrix (`names` order)."""
        return self._row[node]

    def free_of(self, node: str) -> dict[str, int]:
        row = self._free[self._row[node]]
        return {r: int(row[j]) for r, j in self._col.items()}

    def eligible_rows(self, constraints: PodConstraints) -> IndexArray:
        """Rows of the nodes that admit pods with these rules, capacity aside."""
        rows = self._eligible.get(constraints)
        if rows is None:
            if constraints.node_selector or constraints.affinity_terms:
                check: list[int] = list(range(len(self.names)))
                admitted: list[int] = []
            else:
                # Only tainted or cordoned nodes can turn such a pod away.
                check = np.nonzero(~self._plain)[0].tolist()
                admitted = np.nonzero(self._plain)[0].tolist()
            nodes = list(self.nodes.values())
            admitted += [i for i in check if node_admits(nodes[i], constraints)]
            rows = (self._all_rows if len(admitted) == len(self.names)
                    else np.array(sorted(admitted), dtype=np.intp))
            self._eligible[constraints] = rows
        return rows

    @property
    def all_rows(self) -> IndexArray:
        """Every row, in order (reading a column for them needs no gather)."""
        return self._all_rows

    def eligible_in(self, constraints: PodConstraints, within: IndexArray) -> IndexArray:
        """Those of `within` (rows) that admit pods with these rules, in the same order."""
        rows = self.eligible_rows(constraints)
        if rows is self._all_rows:
            return within
        mask = self._eligible_masks.get(constraints)
        if mask is None:
            mask = self._eligible_masks[constraints] = np.zeros(len(self.names), dtype=bool)
            mask[rows] = True
        found: IndexArray = within[mask[within]]
        return found

    def eligible(self, constraints: PodConstraints) -> list[str]:
        """Names of the nodes that admit pods with these rules, capacity aside."""
        return [self.names[i] for i in self.eligible_rows(constraints)]

    def column(self, resource: str, rows: IndexArray) -> IntArray:
        """Free amounts of `resource` on the given rows (zero where the cluster has none)."""
        j = self._col.get(resource)
        if j is None:
            return np.zeros(len(rows), dtype=np.int64)
        values: IntArray = self._free[:, j] if rows is self._all_rows else self._free[rows, j]
        return values

    def max_free(self, resource: str) -> int:
        """Largest free amount of `resource` on one schedulable node."""
        j = self._col.get(resource)
        if j is None or not self.schedulable_count:
            return 0
        best = self._max.get(j)
        if best is None:
            column = self._free[:, j]
            if self.schedulable_count < len(self.names):
                column = column[self._schedulable]
            best = self._max[j] = int(column.max())
        return best

    def request_vector(self, request: Mapping[str, int]) -> tuple[IntArray, bool]:
        """The request as a row, and whether every resource it asks for exists here."""
        ask = self._ask(request)
        return ask.vector, ask.known

    def _ask(self, request: Mapping[str, int]) -> _Ask:
        key = tuple(sorted(request.items()))
        cached = self._requests.get(key)
        if cached is None:
            vec = np.zeros(len(self.resources), dtype=np.int64)
            known = True
            for r, v in request.items():
                j = self._col.get(r)
                if j is None:
                    known = known and v <= 0
                else:
                    vec[j] = bounded_request(v)
            cached = self._requests[key] = _Ask(vec, known)
        return cached

    def how_many(self, rows: IndexArray, request: Mapping[str, int]) -> IntArray:
        """How many pods of `request` fit on each of the given rows, on its own."""
        ask = self._ask(request)
        if not ask.known:
            return np.zeros(len(rows), dtype=np.int64)
        if not ask.columns:
            return np.full(len(rows), UNBOUNDED, dtype=np.int64)
        if len(rows) <= FEW_ROWS and rows is not self._all_rows:
            few: IntArray = (self._free[rows][:, ask.cols] // ask.amounts).min(axis=1)
            return np.maximum(few, 0, out=few)
        counts: IntArray | None = None
        # Column by column, each divided by one number: see the module docstring.
        for j, v in ask.columns:
            per = self._free[:, j] if rows is self._all_rows else self._free[:, j].take(rows)
            if v > 1 or counts is None:
                per = per // v
            counts = per if counts is None else np.minimum(counts, per, out=counts)
        assert counts is not None
        return np.maximum(counts, 0, out=counts)

    def with_room(self, rows: IndexArray, request: Mapping[str, int]) -> IndexArray:
        """Those of `rows` with room for one pod of `request` (in the same order): one
        comparison per column, where counting the pods each node holds takes a division."""
        ask = self._ask(request)
        if not ask.known:
            return rows[:0]
        mask: npt.NDArray[np.bool_] | None = None
        for j, v in ask.columns:
            column = self._free[:, j] if rows is self._all_rows else self._free[:, j].take(rows)
            room = column >= v
            mask = room if mask is None else np.logical_and(mask, room, out=mask)
        if mask is None or mask.all():
            return rows  # as it was: the rows of every node stay known as such
        found: IndexArray = rows[mask]
        return found

    def holds_pods(self, rows: IndexArray, request: Mapping[str, int], count: int) -> bool:
        """Whether `count` pods of `request` fit, each on its own, on the given rows: as
        many nodes with room for one are enough, and only when there are fewer are the
        pods they hold counted."""
        room = self.with_room(rows, request)
        if len(room) >= count:
            return True
        return int(np.minimum(self.how_many(room, request), count).sum()) >= count

    def best_fit_order(self, rows: IndexArray, first: int | None = None) -> IndexArray:
        """The rows sorted tightest first (see the module docstring of fit.gang); only the
        `first` tightest of them, in that order, if given."""
        return rows[self.best_fit_positions(rows, first)]

    def best_fit_positions(self, rows: IndexArray, first: int | None = None) -> IndexArray:
        """Positions in `rows` (distinct and ascending, as `eligible_rows` gives them) of
        the rows in best-fit order: all, or the `first` ones.

        A fill needs only the first few nodes of the order: instead of sorting every
        candidate, each sort key in turn (the tightest resource first) keeps what is
        below the `first`-th smallest value and narrows the tie at that value down by
        the next key, the row itself last (the first rows still tied, as they are
        ascending); only what is kept is sorted.
        """
        if first is None or first >= len(rows):
            keys = [rows] + [self.column(self.resources[j], rows) for j in self._sort_cols]
            positions: IndexArray = np.lexsort(keys)
            return positions
        if first <= 0:
            return np.zeros(0, dtype=np.intp)
        kept: list[IndexArray] = []
        tied: IndexArray | None = None  # positions still tied; None: all of them
        sub = rows  # their rows
        need = first
        for j in self._sort_cols[::-1]:  # the primary key first
            values = self._free[:, j] if sub is self._all_rows else self._free[:, j].take(sub)
            low = values.min()
            if low == values.max():
                continue  # all tied: the next key decides
            cut = low if need == 1 else np.partition(values, need - 1)[need - 1]
            if low < cut:
                below = values < cut
                kept.append(np.flatnonzero(below) if tied is None else tied[below])
                need -= len(kept[-1])
            same = values == cut
            tied = np.flatnonzero(same) if tied is None else tied[same]
            sub = sub[same]
            if len(tied) <= need:
                break
        tied = np.arange(len(rows), dtype=np.intp) if tied is None else tied
        chosen = np.concatenate([*kept, tied[:need]])
        picked = rows[chosen]
        order: IndexArray = chosen[np.lexsort(
            [picked] + [self._free[:, j].take(picked) for j in self._sort_cols])]
        return order

    # --- changing --------------------------------------------------------------------

    def take_rows(self, rows: IndexArray, request: Mapping[str, int], counts: IntArray) -> None:
        """Take `counts[i]` pods of `request` on each of `rows` (rows distinct)."""
        ask = self._ask(request)
        self._free[rows] -= np.outer(counts, ask.vector)
        self._max.clear()
        pods = int(counts[self._schedulable[rows]].sum())
        for j, v in ask.changes:
            self.free_total[self.resources[j]] -= v * pods

    def amounts(self, pods: Iterable[tuple[str, Mapping[str, int]]]) -> tuple[IndexArray, IntArray]:
        """Pods as (rows, amounts) for `give_back`; pods on unknown nodes, and amounts of
        resources no node has, are left out (they free nothing a pod here could use)."""
        rows: list[int] = []
        vectors: list[IntArray] = []
        for node, request in pods:
            row = self._row.get(node)
            if row is not None:
                rows.append(row)
                vectors.append(self.request_vector(request)[0])
        if not rows:
            return (np.zeros(0, dtype=np.intp),
                    np.zeros((0, len(self.resources)), dtype=np.int64))
        return np.array(rows, dtype=np.intp), np.vstack(vectors)

    def give_back(self, rows: IndexArray, amounts: IntArray) -> None:
        """Add `amounts[i]` to the free row `rows[i]` (rows may repeat): pods gone."""
        if not len(rows):
            return
        if amounts.shape[1] < len(self.resources):  # this copy has seen new resources since
            amounts = np.pad(amounts, ((0, 0), (0, len(self.resources) - amounts.shape[1])))
        np.add.at(self._free, rows, amounts)
        self._max.clear()
        total = amounts[self._schedulable[rows]].sum(axis=0)
        for r, j in self._col.items():
            if total[j]:
                self.free_total[r] = self.free_total.get(r, 0) + int(total[j])

    def take(self, node: str, request: Mapping[str, int], count: int = 1) -> None:
        self._move(node, request, -count)

    def give(self, node: str, request: Mapping[str, int], count: int = 1) -> None:
        """Undo a `take` (a gang that did not fit in full gives back what it tried)."""
        self._move(node, request, count)

    def _move(self, node: str, request: Mapping[str, int], count: int) -> None:
        i = self._row[node]
        schedulable = bool(self._schedulable[i])
        self._max.clear()
        for r, amount in request.items():
            v = bounded_request(amount)
            j = self._col.get(r)
            if j is None:
                if v:
                    # A resource no node has: remember it so the books still balance.
                    j = self._add_resource(r)
                else:
                    continue
            self._free[i, j] += v * count
            if schedulable:
                self.free_total[r] = self.free_total.get(r, 0) + v * count

    def _add_resource(self, resource: str) -> int:
        self._free = np.asfortranarray(
            np.hstack([self._free, np.zeros((len(self.names), 1), dtype=np.int64)]))
        j = len(self.resources)
        self.resources = (*self.resources, resource)
        self._col[resource] = j
        self._requests.clear()
        return j

    def take_total(self, demand: Mapping[str, int]) -> None:
        """The aggregate rule's bookkeeping: only the cluster totals move."""
        for r, v in demand.items():
            self.free_total[r] = self.free_total.get(r, 0) - v


# Per cluster state, its layout and the snapshot made for it, whose node order and
# eligibility answers the next snapshots of the same layout share.
_LAYOUTS: weakref.WeakKeyDictionary[ClusterState, tuple[int, Capacity]] = (
    weakref.WeakKeyDictionary())
