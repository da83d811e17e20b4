"""Free capacity per node during one admission cycle.

A working copy: each dispatch in the cycle takes capacity from it, so the decisions
after it see what is left. Free amounts live in one integer matrix (a row per node,
in name order; a column per resource) so that asking "how many of these pods fit on
each node" is one vectorised step over the cluster instead of a Python loop per
node — that is what keeps a cycle over a thousand nodes fast.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt

from dispatcher.cluster.model import Node
from dispatcher.cluster.state import ClusterState
from dispatcher.fit.constraints import node_admits
from dispatcher.kinds.podset import PodConstraints

IntArray = npt.NDArray[np.int64]
IndexArray = npt.NDArray[np.intp]

#: "As many as you like": the count of pods that fit when a pod requests nothing.
UNBOUNDED = 1 << 30


class Capacity:
    def __init__(self, nodes: Iterable[Node], free: Mapping[str, Mapping[str, int]]) -> None:
        ordered = sorted(nodes, key=lambda n: n.name)
        resources: set[str] = set()
        for n in ordered:
            resources.update(n.allocatable)
            resources.update(free[n.name])
        names = tuple(sorted(resources))
        rows = [[free[n.name].get(r, 0) for r in names] for n in ordered]
        self._setup(ordered, names, rows)

    def _setup(self, ordered: list[Node], resources: tuple[str, ...],
               rows: list[list[int]] | list[tuple[int, ...]]) -> None:
        self.nodes: dict[str, Node] = {n.name: n for n in ordered}
        self.names: tuple[str, ...] = tuple(self.nodes)
        self._row: dict[str, int] = {name: i for i, name in enumerate(self.names)}
        self.resources: tuple[str, ...] = resources
        self._col: dict[str, int] = {r: j for j, r in enumerate(resources)}
        self._free: IntArray = np.array(rows, dtype=np.int64).reshape(
            len(self.names), len(resources))
        self._schedulable = np.array([not n.unschedulable for n in ordered], dtype=bool)
        self.schedulable_count = int(self._schedulable.sum())
        # Nodes with nothing that turns a pod away but its own rules (no taint, no cordon):
        # a pod with no selector and no affinity is admitted by all of them.
        self._plain = np.array([not n.taints and not n.unschedulable for n in ordered],
                               dtype=bool)
        free_total = np.maximum(self._free[self._schedulable], 0).sum(axis=0)
        self.free_total: dict[str, int] = {
            r: int(free_total[j]) for r, j in self._col.items()
        }
        # Best-fit order: least left of the extended resources (in name order), then
        # cpu, then memory, then node name. np.lexsort takes its primary key last.
        extended = [j for r, j in self._col.items() if "/" in r]
        self._sort_cols: list[int] = [
            j for j in (self._col.get("memory"), self._col.get("cpu")) if j is not None
        ] + extended[::-1]
        self.extended: tuple[str, ...] = tuple(self.resources[j] for j in extended)
        self._eligible: dict[PodConstraints, IndexArray] = {}
        self._requests: dict[tuple[tuple[str, int], ...], tuple[IntArray, bool]] = {}

    @classmethod
    def of(cls, state: ClusterState) -> Capacity:
        resources, rows = state.free_rows()
        names = sorted(rows)
        cap = cls.__new__(cls)
        cap._setup([state.nodes[n] for n in names], resources, [rows[n] for n in names])
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
        cap._free = self._free.copy()
        cap.free_total = dict(self.free_total)
        # Request vectors depend on the columns, which a copy may grow on its own.
        cap._requests = dict(self._requests)
        return cap

    # --- reading -------------------------------------------------------------------

    @property
    def free(self) -> dict[str, dict[str, int]]:
        """A snapshot of the free amounts per node (for explanations and tests)."""
        return {name: self.free_of(name) for name in self.names}

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
            rows = np.array(sorted(admitted), dtype=np.intp)
            self._eligible[constraints] = rows
        return rows

    def eligible(self, constraints: PodConstraints) -> list[str]:
        """Names of the nodes that admit pods with these rules, capacity aside."""
        return [self.names[i] for i in self.eligible_rows(constraints)]

    def column(self, resource: str, rows: IndexArray) -> IntArray:
        """Free amounts of `resource` on the given rows (zero where the cluster has none)."""
        j = self._col.get(resource)
        if j is None:
            return np.zeros(len(rows), dtype=np.int64)
        values: IntArray = self._free[rows, j]
        return values

    def max_free(self, resource: str) -> int:
        """Largest free amount of `resource` on one schedulable node."""
        j = self._col.get(resource)
        if j is None or not self.schedulable_count:
            return 0
        return int(self._free[self._schedulable, j].max())

    def request_vector(self, request: Mapping[str, int]) -> tuple[IntArray, bool]:
        """The request as a row, and whether every resource it asks for exists here."""
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
                    vec[j] = v
            cached = (vec, known)
            self._requests[key] = cached
        return cached

    def how_many(self, rows: IndexArray, request: Mapping[str, int]) -> IntArray:
        """How many pods of `request` fit on each of the given rows, on its own."""
        vec, known = self.request_vector(request)
        if not known:
            return np.zeros(len(rows), dtype=np.int64)
        asked = vec > 0
        if not asked.any():
            return np.full(len(rows), UNBOUNDED, dtype=np.int64)
        per_resource = self._free[np.ix_(rows, np.nonzero(asked)[0])] // vec[asked]
        counts: IntArray = np.maximum(per_resource.min(axis=1), 0)
        return counts

    def best_fit_order(self, rows: IndexArray) -> IndexArray:
        """The rows sorted tightest first (see the module docstring of fit.gang)."""
        if not len(rows):
            return rows
        sub = self._free[rows]
        keys = [rows] + [sub[:, j] for j in self._sort_cols]
        order: IndexArray = rows[np.lexsort(keys)]
        return order

    # --- changing --------------------------------------------------------------------

    def take_rows(self, rows: IndexArray, request: Mapping[str, int], counts: IntArray) -> None:
        """Take `counts[i]` pods of `request` on each of `rows` (rows distinct)."""
        vec, _ = self.request_vector(request)
        self._free[rows] -= np.outer(counts, vec)
        pods = int(counts[self._schedulable[rows]].sum())
        for r, j in self._col.items():
            if vec[j]:
                self.free_total[r] -= int(vec[j]) * pods

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
        for r, v in request.items():
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
        self._free = np.hstack([self._free, np.zeros((len(self.names), 1), dtype=np.int64)])
        j = len(self.resources)
        self.resources = (*self.resources, resource)
        self._col[resource] = j
        self._requests.clear()
        return j

    def take_total(self, demand: Mapping[str, int]) -> None:
        """The aggregate rule's bookkeeping: only the cluster totals move."""
        for r, v in demand.items():
            self.free_total[r] = self.free_total.get(r, 0) - v
