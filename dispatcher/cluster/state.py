"""The cluster as the dispatcher sees it, kept up to date incrementally.

Free capacity of a node = allocatable - requests of bound non-terminal pods
- capacity reserved for dispatched AppWrappers whose pods are not bound yet.
A reservation is the list of pods the dispatcher planned (node, request); each
pod of that AppWrapper that binds takes one planned pod off the list, so capacity
is never counted twice and never released before the pod holds it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from dispatcher.cluster.model import BoundPod, Node
from dispatcher.resources import AMOUNT_BOUND, FREE_FLOOR, bounded_free

AppWrapperKey = tuple[str, str]  # (namespace, name)
Shape = tuple[tuple[str, int], ...]  # a request as a hashable key
FreeMatrix = npt.NDArray[np.int64]


@dataclass(frozen=True)
class PlannedPod:
    node: str
    request: Mapping[str, int]


def _shape(request: Mapping[str, int]) -> Shape:
    return tuple(sorted(request.items()))


# Resources every pod asks some of: a held pod differing from a pod only in these is the
# same pod as far as the scarce resources (GPUs) go.
_COMMON = frozenset({"cpu", "memory", "pods", "ephemeral-storage"})


def _likeness(held: Shape, shape: Shape, request: Mapping[str, int]) -> int | None:
    """How well room held for a planned pod of shape `held` suits a pod asking `request`:
    0 exactly its shape, 1 the same scarce resources (GPUs) and at least its cpu and
    memory, 2 the same scarce resources but less cpu or memory than it asks, None not at
    all (it asks a GPU the room lacks, or the room holds one it does not ask)."""
    if held == shape:
        return 0
    amounts = dict(held)
    scarce = {r for r in (*amounts, *request) if r not in _COMMON}
    if any(amounts.get(r, 0) != request.get(r, 0) for r in scarce):
        return None
    return 1 if all(amounts.get(r, 0) >= v for r, v in request.items()) else 2


_SHARES_SCARCE = 3  # _closeness of held pods a pod takes from before free room


def _closeness(held: Shape, shape: Shape, request: Mapping[str, int]) -> tuple[int, Shape]:
    """Which held pods a pod uses first when it takes room by amount: those most like it
    (_likeness), then those holding a scarce resource it asks, then those holding none,
    last those holding one it does not ask (their GPUs are left held, not taken)."""
    rank = _likeness(held, shape, request)
    if rank is None:
        scarce = {r for r, v in held if v > 0 and r not in _COMMON}
        asked = {r for r, v in request.items() if v > 0 and r not in _COMMON}
        rank = _SHARES_SCARCE if scarce & asked else 4 if not scarce else 5
    return rank, held


def _take_until_covered(held: Sequence[PlannedPod], short: Mapping[str, int]
                        ) -> tuple[list[PlannedPod], dict[str, int]]:
    """The held pods, in order, that give something still lacking, until nothing is;
    and what is still lacking then."""
    used: list[PlannedPod] = []
    lacking = dict(short)
    for p in held:
        if not lacking:
            break
        if any(p.request.get(r, 0) > 0 for r in lacking):
            used.append(p)
            lacking = {r: v - p.request.get(r, 0) for r, v in lacking.items()
                       if v > p.request.get(r, 0)}
    return used, lacking


def _within(amount: Mapping[str, int], room: Mapping[str, int]) -> bool:
    return all(room.get(r, 0) >= v for r, v in amount.items())


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
        # Member pods let past their scheduling gate onto a node of their gang's hold and
        # not bound yet: that room is theirs, no other waiting member is pinned to it.
        self._pins: dict[tuple[str, str], tuple[AppWrapperKey, str, Shape]] = {}
        self._pinned: dict[AppWrapperKey, Counter[tuple[str, Shape]]] = {}
        # Pods bound to a node whose request could not be read, and their node: what is
        # free there is not known, so nothing there is free until each is read or gone.
        self._unreadable: dict[tuple[str, str], str] = {}
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
        unread = self._unreadable.pop(key, None)
        if unread is not None:
            self._changed(unread)
        old = self._pods.pop(key, None)
        if old is not None:
            _add_into(self._used.setdefault(old.node, {}), old.request, -1)
            self._changed(old.node)
            if old.appwrapper is not None:
                self._pods_of.get((old.namespace, old.appwrapper), set()).discard(key)
        if pod is None:
            return
        pin = self._pins.get(key)
        self.unpin(key)
        self._pods[key] = pod
        _add_into(self._used.setdefault(pod.node, {}), pod.request)
        self._changed(pod.node, pod.request)
        if pod.appwrapper is not None:
            owner = (pod.namespace, pod.appwrapper)
            self._pods_of.setdefault(owner, set()).add(key)
            self._match(owner, pod, pin)

    def remove_pod(self, key: tuple[str, str]) -> None:
        self.upsert_pod(key, None)

    def unreadable_pod(self, key: tuple[str, str], node: str) -> None:
        """A pod bound to `node` whose request cannot be read: nothing on `node` is free
        until the pod is read (`upsert_pod`) or gone."""
        self.upsert_pod(key, None)
        self._unreadable[key] = node
        self._changed(node)

    def unreadable(self, key: tuple[str, str]) -> bool:
        """Whether the pod `key` is bound to a node and could not be read."""
        return key in self._unreadable

    def unusable(self, node: str) -> bool:
        """Whether `node` counts as having nothing free: a pod bound there could not be
        read."""
        return bool(self._unreadable) and node in self._unreadable.values()

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

    def release_unpinned(self, owner: AppWrapperKey) -> None:
        """Release what an AppWrapper holds but the room its pods already let onto a node
        (pinned, not bound yet) will take: those bind there."""
        pinned = self._pinned.get(owner)
        index = self._reservations.get(owner, {})
        keep = [p for (node, s), n in (pinned or {}).items()
                for p in index.get(s, {}).get(node, [])[:n]]
        self.release(owner)
        if keep:
            self.reserve_more(owner, keep)

    def reserved_for(self, owner: AppWrapperKey) -> list[PlannedPod]:
        index = self._reservations.get(owner, {})
        return [p for by_node in index.values() for pods in by_node.values() for p in pods]

    def held_on(self, owner: AppWrapperKey) -> dict[str, dict[str, int]]:
        """What an AppWrapper holds and no waiting member of it is pinned to, per node."""
        out: dict[str, dict[str, int]] = {}
        for s, by_node in self._reservations.get(owner, {}).items():
            for node in by_node:
                for p in self._spare(owner, node, s, ()):
                    _add_into(out.setdefault(node, {}), p.request)
        return out

    def reservations(self) -> Mapping[AppWrapperKey, list[PlannedPod]]:
        return {owner: self.reserved_for(owner) for owner in self._reservations}

    def holdings(self, owner: AppWrapperKey) -> list[PlannedPod]:
        """The capacity an AppWrapper holds now, pod by pod: its bound pods where they are
        bound, and the planned pods of its reservation that have not bound yet. This is
        exactly what preempting it gives back."""
        bound = [PlannedPod(p.node, p.request) for p in self.bound_pods_of(owner)]
        return bound + self.reserved_for(owner)

    def _match(self, owner: AppWrapperKey, pod: BoundPod,
               pin: tuple[AppWrapperKey, str, Shape] | None = None) -> None:
        index = self._reservations.get(owner)
        matched = self._matched.get(owner)
        if not index or matched is None or pod.key in matched:
            return
        # The planned pod it was pinned to; else prefer the planned pod on the node the
        # scheduler chose, then one of the same size anywhere, then any (the scheduler
        # need not follow our plan) — one no other waiting pod is pinned to, if any.
        if pin is not None and pin[0] == owner and pod.node in index.get(pin[2], {}):
            shape = pin[2]
            node = pod.node
        else:
            shape = _shape(pod.request)
            shape = shape if shape in index else next(iter(index))
            pinned = self._pinned.get(owner, Counter())
            spare = [n for n in index[shape] if len(index[shape][n]) > pinned[(n, shape)]]
            node = pod.node if pod.node in spare else (spare or [pod.node])[0]
            if node not in index[shape]:
                node = next(iter(index[shape]))
        by_node = index[shape]
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

    # --- pinning --------------------------------------------------------------
    def pin(self, owner: AppWrapperKey, key: tuple[str, str], request: Mapping[str, int],
            unfit: Collection[PlannedPod] = (),
            admits: Callable[[str], bool] = lambda node: True,
            top_up: bool = True) -> str | None:
        """The node a member pod waiting at its scheduling gate is to bind on, in room its
        gang holds that no other waiting member is pinned to: a held pod of its very shape
        first; else what it asks out of what the gang holds on one node, as an amount,
        with free room there beyond it if `top_up` (declared pod shapes need not match the
        real pods: custompodresources). Never a
        hold that does not fit (`unfit`) nor a node the pod may not run on (`admits`, its
        own node rules). None: its gang holds no such room.
        Held by the pod until it binds or `unpin`."""
        index = self._reservations.get(owner)
        if key in self._pins:
            _, node, s = self._pins[key]
            if node in self._nodes and node in (index or {}).get(s, {}):
                return node
            self.unpin(key)  # its room went (released, or its node)
        if not index:
            return None
        exact = self._pin_exact(owner, key, request, unfit, admits)
        if exact is not None:
            return exact
        return self._pin_amount(owner, key, request, unfit, admits, top_up)

    def _pin_exact(self, owner: AppWrapperKey, key: tuple[str, str],
                   request: Mapping[str, int], unfit: Collection[PlannedPod],
                   admits: Callable[[str], bool]) -> str | None:
        """A held pod of the pod's very shape."""
        s = _shape(request)
        for node in sorted(self._reservations[owner].get(s, {})):
            if node in self._nodes and admits(node) and self._spare(owner, node, s, unfit):
                self._hold_pin(owner, key, node, s)
                return node
        return None

    def _pin_amount(self, owner: AppWrapperKey, key: tuple[str, str],
                    request: Mapping[str, int], unfit: Collection[PlannedPod],
                    admits: Callable[[str], bool], top_up: bool) -> str | None:
        """Room for the pod carved out of what its gang holds on one node: the held pods
        it uses are replaced by one of its own shape, pinned, and one holding what is left
        of them; what they lack comes out of the node's free room (`top_up`). The node
        whose hold covers it alone comes first, then the one that needs the least free
        room; among those, the one it leaves the least of the scarce resources on."""
        index = self._reservations[owner]
        best: tuple[tuple[int, int, int, str], list[PlannedPod], dict[str, int]] | None = None
        for node in sorted({n for by_node in index.values() for n in by_node}):
            if node not in self._nodes or not admits(node):
                continue
            room = self.free(node) if top_up else {}
            used, short = self._cover(owner, node, request, unfit, room)
            if not used or (short and not _within(short, room)):
                continue
            pool: dict[str, int] = {}
            for p in used:
                _add_into(pool, p.request)
            scarce_left = sum(v - request.get(r, 0) for r, v in pool.items()
                              if r not in _COMMON)
            rank = (1 if short else 0, sum(short.values()), scarce_left, node)
            if best is None or rank < best[0]:
                best = (rank, used, short)
        if best is None:
            return None
        (_, _, _, node), used, _ = best
        rest: dict[str, int] = {}
        for p in used:
            _add_into(rest, p.request)
        _add_into(rest, request, -1)
        left = {r: v for r, v in rest.items() if v > 0}
        self.unreserve(owner, used)
        self.reserve_more(owner, [PlannedPod(node, dict(request)),
                                  *([PlannedPod(node, left)] if left else [])])
        self._hold_pin(owner, key, node, _shape(request))
        return node

    def _cover(self, owner: AppWrapperKey, node: str, request: Mapping[str, int],
               unfit: Collection[PlannedPod], room: Mapping[str, int]
               ) -> tuple[list[PlannedPod], dict[str, int]]:
        """The held pods on `node` no waiting member is pinned to that the pod would use,
        and what they leave uncovered: those like it first (its GPUs, a scarce resource
        it asks); the others — room held for pods of another kind, a GPU it does not
        ask — only for what `room` (free room there) cannot make up."""
        index = self._reservations[owner]
        shape = _shape(request)
        ranked = sorted((_closeness(s, shape, request), s) for s in index if node in index[s])
        like = [p for (rank, _), s in ranked if rank <= _SHARES_SCARCE
                for p in self._spare(owner, node, s, unfit)]
        unlike = [p for (rank, _), s in ranked if rank > _SHARES_SCARCE
                  for p in self._spare(owner, node, s, unfit)]
        used, short = _take_until_covered(like, {r: v for r, v in request.items() if v > 0})
        if short and not _within(short, room):
            more, short = _take_until_covered(unlike, short)
            used += more
        return used, short

    def _spare(self, owner: AppWrapperKey, node: str, s: Shape,
               unfit: Collection[PlannedPod]) -> list[PlannedPod]:
        """Held pods of shape `s` on `node` that no waiting member is pinned to and that
        fit (pins count held pods, not particular ones: any that fit will do)."""
        held = self._reservations[owner].get(s, {}).get(node, [])
        fitting = [p for p in held if not any(p is u for u in unfit)]
        pinned = self._pinned.get(owner, Counter())[(node, s)]
        return fitting[:max(0, len(fitting) - pinned)]

    def _hold_pin(self, owner: AppWrapperKey, key: tuple[str, str], node: str,
                  s: Shape) -> None:
        self._pinned.setdefault(owner, Counter())[(node, s)] += 1
        self._pins[key] = (owner, node, s)

    def unpin(self, key: tuple[str, str]) -> None:
        pin = self._pins.pop(key, None)
        if pin is None:
            return
        owner, node, s = pin
        pinned = self._pinned.get(owner)
        if pinned is not None:
            pinned[(node, s)] -= 1
            if pinned[(node, s)] <= 0:
                del pinned[(node, s)]
            if not pinned:
                del self._pinned[owner]

    def repin(self, old: tuple[str, str], new: tuple[str, str], owner: AppWrapperKey
              ) -> bool:
        """The pin held under `old` for a pod of `owner` is `new`'s from now on (a pod
        pinned before it had a name); False, and nothing changes, if `old` holds no pin
        of `owner`'s."""
        pin = self._pins.get(old)
        if pin is None or pin[0] != owner:
            return False
        if new in self._pins:
            self.unpin(old)  # it has one already (cannot happen: a pod is pinned once)
            return True
        del self._pins[old]
        self._pins[new] = pin
        return True

    def pinned(self, key: tuple[str, str]) -> str | None:
        pin = self._pins.get(key)
        return None if pin is None else pin[1]

    # --- capacity -----------------------------------------------------------
    def used(self, node: str) -> Mapping[str, int]:
        return self._used.get(node, {})

    def reserved(self, node: str) -> Mapping[str, int]:
        return self._reserved.get(node, {})

    def held_total(self) -> dict[str, int]:
        """Everything held for gangs dispatched whose pods are not bound yet."""
        total: dict[str, int] = {}
        for amounts in self._reserved.values():
            _add_into(total, amounts)
        return {r: v for r, v in total.items() if v > 0}

    def free(self, node: str) -> dict[str, int]:
        n = self._nodes[node]
        if self.unusable(node):
            return dict.fromkeys({*self._resources, *n.allocatable}, FREE_FLOOR)
        free = dict(n.allocatable)
        _add_into(free, self.used(node), -1)
        _add_into(free, self.reserved(node), -1)
        for r in n.withheld:
            # Flagged by Autopilot: as if the node had none (what runs there still
            # holds its share, and freeing it frees nothing for others).
            free[r] = free.get(r, 0) - n.allocatable.get(r, 0)
        return free

    def free_rows(self) -> tuple[tuple[str, ...], dict[str, tuple[int, ...]]]:
        """Every resource seen (sorted), and each node's free amounts in that order, each
        within the bounds of the 64-bit fit (resources.bounded_free)."""
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
            row = tuple(free.get(r, 0) for r in resources)
            if row and (max(row) > AMOUNT_BOUND or min(row) < FREE_FLOOR):
                row = tuple(map(bounded_free, row))
            self._rows[name] = row
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
