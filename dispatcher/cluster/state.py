"""The cluster as the dispatcher sees it, kept up to date incrementally.

Free capacity of a node = allocatable - requests of bound non-terminal pods
- capacity reserved for dispatched AppWrappers whose pods are not bound yet.
A reservation is the list of pods the dispatcher planned (node, request); each
pod of that AppWrapper that binds takes one planned pod off the list, so capacity
is never counted twice and never released before the pod holds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from dispatcher.cluster.model import BoundPod, Node

AppWrapperKey = tuple[str, str]  # (namespace, name)
Shape = tuple[tuple[str, int], ...]  # a request as a hashable key
FreeMatrix = npt.NDArray[np.int64]


@dataclass(frozen=True)
class PlannedPod:
    node: str
    request: Mapping[str, int]


def _shape(request: Mapping[str, int]) -> Shape:
    return tuple(sorted(request.items()))


def _add_into(total: dict[str, int], amount: Mapping[str, int], sign: int = 1) -> None:
    for name, value in amount.items():
        total[name] = total.get(name, 0) + sign * value


class ClusterState:
    def __init__(self) -> None:
        self._nodes: dict[str, Node] = {}
        self._pods: dict[tuple[str, str], BoundPod] = {}
        self._used: dict[str, dict[str, int]] = {}
        # Planned pods not bound yet, per owner, indexed by request shape then node, so
        # matching a binding pod is O(1) whatever the size of the gang.
        self._reservations: dict[AppWrapperKey, dict[Shape, dict[str, list[PlannedPod]]]] = {}
        self._reserved: dict[str, dict[str, int]] = {}
        self._pods_of: dict[AppWrapperKey, set[tuple[str, str]]] = {}
        # Pods already taken off a reservation, so an update of the same pod does not
        # take a second planned pod.
        self._matched: dict[AppWrapperKey, set[tuple[str, str]]] = {}
        # Free amounts per node as rows over every resource seen, rebuilt only for the
        # nodes that changed: a snapshot per admission cycle then costs no arithmetic.
        self._resources: set[str] = set()
        self._row_resources: tuple[str, ...] = ()
        self._rows: dict[str, tuple[int, ...]] = {}
        # The same as one matrix (nodes in name order, resources in name order), kept for
        # the capacity snapshot of every admission cycle: only the rows of the nodes that
        # changed since the last snapshot are written again. `layout` counts the changes
        # of anything but free amounts: a node joins, leaves or is redefined, or a
        # resource is seen for the first time (the matrix is then built again).
        self.layout = 0
        self._matrix: FreeMatrix | None = None
        self._matrix_names: tuple[str, ...] = ()
        self._matrix_index: dict[str, int] = {}
        self._stale: set[str] = set()

    # --- nodes --------------------------------------------------------------
    def upsert_node(self, node: Node) -> None:
        old = self._nodes.get(node.name)
        # A node's status updates change nothing here; the same object again may have been
        # changed in place.
        if old is node or old != node:
            self._relayout()
        self._nodes[node.name] = node
        self._changed(node.name, node.allocatable)

    def remove_node(self, name: str) -> None:
        if self._nodes.pop(name, None) is not None:
            self._relayout()
        self._rows.pop(name, None)

    @property
    def nodes(self) -> Mapping[str, Node]:
        return self._nodes

    # --- pods ---------------------------------------------------------------
    def upsert_pod(self, key: tuple[str, str], pod: BoundPod | None) -> None:
        """Record a pod's current state; None when it no longer holds capacity."""
        old = self._pods.pop(key, None)
        if old is not None:
            _add_into(self._used.setdefault(old.node, {}), old.request, -1)
            self._changed(old.node)
            if old.appwrapper is not None:
                self._pods_of.get((old.namespace, old.appwrapper), set()).discard(key)
        if pod is None:
            return
        self._pods[key] = pod
        _add_into(self._used.setdefault(pod.node, {}), pod.request)
        self._changed(pod.node, pod.request)
        if pod.appwrapper is not None:
            owner = (pod.namespace, pod.appwrapper)
            self._pods_of.setdefault(owner, set()).add(key)
            self._match(owner, pod)

    def remove_pod(self, key: tuple[str, str]) -> None:
        self.upsert_pod(key, None)

    def pod(self, key: tuple[str, str]) -> BoundPod | None:
        return self._pods.get(key)

    def pods(self) -> Iterator[BoundPod]:
        return iter(self._pods.values())

    def owners(self) -> list[AppWrapperKey]:
        """The AppWrappers that bound pods are labelled for."""
        return [owner for owner, pods in self._pods_of.items() if pods]

    def bound_pods_of(self, owner: AppWrapperKey) -> list[BoundPod]:
        return [self._pods[k] for k in sorted(self._pods_of.get(owner, ()))]

    # --- reservations -------------------------------------------------------
    def reserve(self, owner: AppWrapperKey, planned: Iterable[PlannedPod]) -> None:
        """Hold capacity for a dispatched AppWrapper until its pods are bound."""
        self.release(owner)
        index: dict[Shape, dict[str, list[PlannedPod]]] = {}
        self._reservations[owner] = index
        self._matched[owner] = set()
        for p in planned:
            index.setdefault(_shape(p.request), {}).setdefault(p.node, []).append(p)
            _add_into(self._reserved.setdefault(p.node, {}), p.request)
            self._changed(p.node, p.request)
        for key in sorted(self._pods_of.get(owner, ())):
            self._match(owner, self._pods[key])

    def reserve_more(self, owner: AppWrapperKey, planned: Iterable[PlannedPod]) -> None:
        """Hold capacity for pods an AppWrapper will get on top of what it holds: the
        replacements of pods it lost. Only pods bound from now on take them off."""
        index = self._reservations.setdefault(owner, {})
        if owner not in self._matched:
            self._matched[owner] = set(self._pods_of.get(owner, ()))
        for p in planned:
            index.setdefault(_shape(p.request), {}).setdefault(p.node, []).append(p)
            _add_into(self._reserved.setdefault(p.node, {}), p.request)
            self._changed(p.node, p.request)

    def unreserve(self, owner: AppWrapperKey, pods: Iterable[PlannedPod]) -> None:
        """Take these planned pods (the very objects) off the owner's reservation."""
        index = self._reservations.get(owner, {})
        for p in pods:
            by_node = index.get(_shape(p.request), {})
            held = by_node.get(p.node, [])
            for i, q in enumerate(held):
                if q is p:
                    del held[i]
                    _add_into(self._reserved.setdefault(p.node, {}), p.request, -1)
                    self._changed(p.node)
                    break
            if not held:
                by_node.pop(p.node, None)
            if not by_node:
                index.pop(_shape(p.request), None)

    def release(self, owner: AppWrapperKey) -> None:
        for p in self.reserved_for(owner):
            _add_into(self._reserved.setdefault(p.node, {}), p.request, -1)
            self._changed(p.node)
        self._reservations.pop(owner, None)
        self._matched.pop(owner, None)

    def reserved_for(self, owner: AppWrapperKey) -> list[PlannedPod]:
        index = self._reservations.get(owner, {})
        return [p for by_node in index.values() for pods in by_node.values() for p in pods]

    def reservations(self) -> Mapping[AppWrapperKey, list[PlannedPod]]:
        return {owner: self.reserved_for(owner) for owner in self._reservations}

    def holdings(self, owner: AppWrapperKey) -> list[PlannedPod]:
        """The capacity an AppWrapper holds now, pod by pod: its bound pods where they are
        bound, and the planned pods of its reservation that have not bound yet. This is
        exactly what preempting it gives back."""
        bound = [PlannedPod(p.node, p.request) for p in self.bound_pods_of(owner)]
        return bound + self.reserved_for(owner)

    def _match(self, owner: AppWrapperKey, pod: BoundPod) -> None:
        index = self._reservations.get(owner)
        matched = self._matched.get(owner)
        if not index or matched is None or pod.key in matched:
            return
        # Prefer the planned pod on the node the scheduler chose, then one of the same
        # size anywhere, then any; the scheduler need not follow our plan.
        shape = _shape(pod.request)
        by_node = index.get(shape) or next(iter(index.values()))
        node = pod.node if pod.node in by_node else next(iter(by_node))
        pods = by_node[node]
        taken = pods.pop()
        if not pods:
            del by_node[node]
            if not by_node:
                del index[_shape(taken.request)]
        _add_into(self._reserved.setdefault(taken.node, {}), taken.request, -1)
        self._changed(taken.node)
        matched.add(pod.key)
        if taken.node != pod.node:
            self._make_way(pod.node, taken)

    def _make_way(self, node: str, left: PlannedPod) -> None:
        """A pod bound on `node` although its room was planned on `left.node`. If `node`
        is now promised more than it has, the pod of another gang planned there will be
        bound where this one was planned instead: its hold moves there. Left in place,
        the room this pod left would look free and be promised a second time — to a gang
        admitted next — while the other gang's pod takes it (kube-scheduler spreads pods
        where the dispatcher packs them: it often binds off plan)."""
        if left.node not in self._nodes or node not in self._nodes:
            return
        free = self.free(node)
        if all(free.get(r, 0) >= 0 for r in left.request):
            return
        shape = _shape(left.request)
        for index in self._reservations.values():
            by_node = index.get(shape)
            held = by_node.get(node) if by_node else None
            if not held or by_node is None:
                continue
            moved = held.pop()
            if not held:
                del by_node[node]
            by_node.setdefault(left.node, []).append(PlannedPod(left.node, moved.request))
            _add_into(self._reserved.setdefault(node, {}), moved.request, -1)
            _add_into(self._reserved.setdefault(left.node, {}), moved.request)
            self._changed(node)
            self._changed(left.node)
            return

    # --- capacity -----------------------------------------------------------
    def used(self, node: str) -> Mapping[str, int]:
        return self._used.get(node, {})

    def reserved(self, node: str) -> Mapping[str, int]:
        return self._reserved.get(node, {})

    def free(self, node: str) -> dict[str, int]:
        n = self._nodes[node]
        free = dict(n.allocatable)
        _add_into(free, self.used(node), -1)
        _add_into(free, self.reserved(node), -1)
        return free

    def free_rows(self) -> tuple[tuple[str, ...], dict[str, tuple[int, ...]]]:
        """Every resource seen (sorted), and each node's free amounts in that order."""
        if len(self._resources) != len(self._row_resources):
            self._row_resources = tuple(sorted(self._resources))
            self._rows.clear()
        resources = self._row_resources
        return resources, {name: self._row(name, resources) for name in self._nodes}

    def free_matrix(self) -> tuple[tuple[str, ...], tuple[str, ...], FreeMatrix]:
        """Node names and resources (each sorted), and the free amounts as a matrix of a
        row per node and a column per resource (column-major). The matrix is the state's
        own and changes with it: copy it before use."""
        if self._matrix is None:
            resources, rows = self.free_rows()
            names = tuple(sorted(self._nodes))
            self._matrix = np.asfortranarray(np.array(
                [rows[n] for n in names], dtype=np.int64).reshape(len(names), len(resources)))
            self._matrix_names = names
            self._matrix_index = {n: i for i, n in enumerate(names)}
        else:
            resources = self._row_resources  # a new resource would have cleared the matrix
            for name in self._stale:
                i = self._matrix_index.get(name)
                if i is not None:
                    self._matrix[i] = self._row(name, resources)
        self._stale.clear()
        return self._matrix_names, resources, self._matrix

    def _row(self, name: str, resources: tuple[str, ...]) -> tuple[int, ...]:
        row = self._rows.get(name)
        if row is None:
            free = self.free(name)
            row = self._rows[name] = tuple(free.get(r, 0) for r in resources)
        return row

    def _relayout(self) -> None:
        self.layout += 1
        self._matrix = None

    def _changed(self, node: str, amounts: Mapping[str, int] = MappingProxyType({})) -> None:
        self._rows.pop(node, None)
        self._stale.add(node)
        for r in amounts:
            if r not in self._resources:
                self._resources.add(r)
                self._relayout()
