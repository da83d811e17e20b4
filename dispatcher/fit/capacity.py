"""Free capacity per node during one admission cycle.

A working copy: each dispatch in the cycle takes capacity from it, so the decisions
after it see what is left. Within a cycle capacity only shrinks, which is what makes
the caches here (eligible nodes, largest free amount) safe.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dispatcher.cluster.model import Node
from dispatcher.cluster.state import ClusterState
from dispatcher.fit.constraints import node_admits
from dispatcher.kinds.podset import PodConstraints


class Capacity:
    def __init__(self, nodes: Iterable[Node], free: Mapping[str, Mapping[str, int]]) -> None:
        self.nodes: dict[str, Node] = {n.name: n for n in sorted(nodes, key=lambda n: n.name)}
        self.free: dict[str, dict[str, int]] = {name: dict(free[name]) for name in self.nodes}
        self.free_total: dict[str, int] = {}
        self.allocatable_total: dict[str, int] = {}
        for node in self.nodes.values():
            if node.unschedulable:
                continue
            for r, v in self.free[node.name].items():
                self.free_total[r] = self.free_total.get(r, 0) + max(v, 0)
            for r, v in node.allocatable.items():
                self.allocatable_total[r] = self.allocatable_total.get(r, 0) + v
        # Extended resources in the cluster, in a fixed order, for best-fit scoring.
        self.extended: tuple[str, ...] = tuple(sorted(
            {r for n in self.nodes.values() for r in n.allocatable if "/" in r}
        ))
        self._eligible: dict[PodConstraints, list[str]] = {}
        self._max_free: dict[str, int] = {}

    @classmethod
    def of(cls, state: ClusterState) -> Capacity:
        return cls(state.nodes.values(), {name: state.free(name) for name in state.nodes})

    @classmethod
    def empty(cls, nodes: Iterable[Node]) -> Capacity:
        """The same nodes with nothing running: can a gang ever fit here?"""
        nodes = list(nodes)
        return cls(nodes, {n.name: n.allocatable for n in nodes})

    def eligible(self, constraints: PodConstraints) -> list[str]:
        """Names of the nodes that admit pods with these rules, capacity aside."""
        names = self._eligible.get(constraints)
        if names is None:
            names = [n.name for n in self.nodes.values() if node_admits(n, constraints)]
            self._eligible[constraints] = names
        return names

    def max_free(self, resource: str) -> int:
        """Largest free amount of `resource` on one schedulable node."""
        value = self._max_free.get(resource)
        if value is None:
            value = max(
                (self.free[name].get(resource, 0)
                 for name, n in self.nodes.items() if not n.unschedulable),
                default=0,
            )
            self._max_free[resource] = value
        return value

    def take(self, node: str, request: Mapping[str, int], count: int = 1) -> None:
        free = self.free[node]
        schedulable = not self.nodes[node].unschedulable
        for r, v in request.items():
            before = free.get(r, 0)
            free[r] = before - v * count
            if schedulable:
                self.free_total[r] = self.free_total.get(r, 0) - v * count
            if self._max_free.get(r) == before:
                del self._max_free[r]

    def give(self, node: str, request: Mapping[str, int], count: int = 1) -> None:
        """Undo a `take` (a gang that did not fit in full gives back what it tried)."""
        free = self.free[node]
        schedulable = not self.nodes[node].unschedulable
        for r, v in request.items():
            free[r] = free.get(r, 0) + v * count
            if schedulable:
                self.free_total[r] = self.free_total.get(r, 0) + v * count
            self._max_free.pop(r, None)

    def take_total(self, demand: Mapping[str, int]) -> None:
        """The aggregate rule's bookkeeping: only the cluster totals move."""
        for r, v in demand.items():
            self.free_total[r] = self.free_total.get(r, 0) - v
