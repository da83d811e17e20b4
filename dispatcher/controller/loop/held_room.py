"""The room dispatched gangs hold for their pods not bound yet, kept true each cycle
before anything new is admitted: rebuilt after a restart (or when its node went away),
held for the replacements of pods a gang lost unfinished, and placed again while it is
charged to a node it does not fit on."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

from dispatcher.cluster import AppWrapperKey, ClusterState
from dispatcher.cluster.state import PlannedPod
from dispatcher.controller.record.memory import Memory
from dispatcher.controller.record.tracked import ACTIVE, Key, RoomState, Tracked
from dispatcher.fit import Capacity
from dispatcher.fit.gang import GangPodSet, Placer, Shortfall, place
from dispatcher.resources import PODS as POD_COUNT

log = logging.getLogger("dispatcher")

Lifted = tuple[tuple[str, str], PlannedPod]  # a pod let onto a node, and where


class HeldRoom:
    def __init__(self, memory: Memory, placer: Placer) -> None:
        self.memory = memory
        self.placer = placer  # how a gang's unbound pods are placed again (its topology)
        # Held pods charged to a node they do not fit on, per wrapper: placed again each
        # cycle until they fit (then they hold real room) or bind.
        self.unfit: dict[Key, list[PlannedPod]] = {}

    def keep(self) -> None:
        """Capacity held again, before anything new is admitted: by every dispatched gang
        after a restart (its pods not bound yet), by a gang whose hold was on a node that
        went away, and for the replacements of pods a gang lost unfinished."""
        self._replace_unfit()
        state = self.memory.state
        owed, self.memory.room_owed = self.memory.room_owed, {}
        due = [t for key in owed if (t := self.memory.tracked.get(key)) is not None
               and (t.room.needs_reservation or t.room.lost)]
        if not due:
            return
        held: dict[Key, list[PlannedPod]] = {}
        for t in due:
            if t.room.needs_reservation:
                # Held again from scratch: what it holds now is not room for its new plan.
                held[t.key] = state.reserved_for(t.key)
                state.release(t.key)
        capacity = Capacity.of(state)
        for t in due:
            before = dataclasses.replace(t.room, lost=list(t.room.lost))
            try:
                self._keep(t, [p.request for p in held.get(t.key, [])], capacity)
            except Exception as e:  # one wrapper's error costs that wrapper, not the cycle
                self._not_kept(t, before, held.get(t.key), e)

    def _keep(self, t: Tracked, held: Sequence[Mapping[str, int]],
              capacity: Capacity) -> None:
        lost, t.room.lost = t.room.lost, []
        if t.room.needs_reservation:
            self._hold_again(t, held, capacity)
        if lost and t.phase in ACTIVE:
            planned = self._hold_roomiest(t.key, lost, capacity)
            log.info("%s/%s: %d pod(s) of its gang went away unfinished; capacity is "
                     "held for their replacements", *t.key, len(planned))

    def _not_kept(self, t: Tracked, before: RoomState, held: Sequence[PlannedPod] | None,
                  error: Exception) -> None:
        """`t`'s room could not be held again: it keeps what it held before (`held`;
        None: its hold was not being made again) and is tried again next cycle."""
        log.error("%s/%s: its room could not be held again (%s: %s); tried again next "
                  "cycle", *t.key, type(error).__name__, str(error)[:300])
        if held is not None:
            self.memory.state.release(t.key)
            self.memory.state.reserve_more(t.key, held)
        t.room = before
        self.memory.room_owed[t.key] = None

    def _hold_again(self, t: Tracked, held: Sequence[Mapping[str, int]],
                    capacity: Capacity) -> None:
        """The hold of a gang whose reservation was lost (a restart, its node gone),
        rebuilt: the pods let onto a node keep their room there, the rest is placed."""
        state = self.memory.state
        t.room.needs_reservation = False
        room_lost, t.room.room_lost = t.room.room_lost, False
        planned: list[PlannedPod] = []
        unfit: list[PlannedPod] = []
        pinned = self._lifted_of(t)
        held_pinned = [p for _, p in pinned]
        if t.phase == "dispatched" and t.queued is not None:
            # Its pods not bound yet, the lost ones among them; those let onto a node
            # before a restart will bind there, so their room is held there.
            take(capacity, held_pinned)
            planned = unbound_plan(t.queued.gang, state, t.key, capacity, unfit,
                                   held_pinned, self.placer)
            if unfit and room_lost:
                # What was promised went with the node, and nothing left can take it:
                # held anyway it would be promised twice.
                t.room.stranded = ("its room went with a deleted node and no other node has "
                              "room for it")
                self.memory.attention.touch(t.key)
            take(capacity, planned)
            planned = [*held_pinned, *planned]
        elif t.phase in ACTIVE:
            # A running gang's pods let onto a node keep their room there; the rest of
            # its hold is placed again.
            rest = list(held)
            for p in held_pinned:
                if p.request in rest:
                    rest.remove(p.request)
            take(capacity, held_pinned)
            planned = roomiest(rest, capacity, unfit)
            take(capacity, planned)
            planned = [*held_pinned, *planned]
        self.unfit[t.key] = unfit
        # reserve() takes the bound members off what it is given, as it does for a
        # dispatch: they are given where they are bound, or they would come off the plan
        # for the unbound ones a second time.
        bound = [PlannedPod(p.node, p.request) for p in state.bound_pods_of(t.key)]
        state.reserve(t.key, [*bound, *planned])
        for key, p in pinned:
            state.pin(t.key, key, p.request, admits=p.node.__eq__)
        log.info("%s/%s: %d unbound pod(s) of its gang hold capacity again", *t.key,
                 len(planned))

    def _replace_unfit(self) -> None:
        """Held pods that fitted nowhere were charged to the roomiest node; room freed on
        another node would then go to a newer gang while the held pod (a replacement, a
        pod of a gang dispatched before a restart) binds there first — leaving the newer
        gang half-bound. Each cycle, before admitting, they are placed again: the first
        room that frees is theirs."""
        if not self.unfit:
            return
        state = self.memory.state
        again: dict[Key, list[PlannedPod]] = {}
        for key, unfit in self.unfit.items():
            t = self.memory.tracked.get(key)
            held = state.reserved_for(key)
            pods = [p for p in unfit if any(p is q for q in held)]
            if t is not None and t.phase in ACTIVE and pods:
                state.unreserve(key, pods)
                again[key] = pods
        self.unfit = {}
        capacity = Capacity.of(state)  # one snapshot, taken from as they are placed
        for key, pods in again.items():
            self._hold_roomiest(key, [p.request for p in pods], capacity)

    def _hold_roomiest(self, key: Key, requests: Sequence[Mapping[str, int]],
                       capacity: Capacity) -> list[PlannedPod]:
        """More room held for `key`'s pods, where it fits now else on the roomiest
        nodes (those are placed again next cycle); taken from `capacity`."""
        planned = roomiest(requests, capacity, self.unfit.setdefault(key, []))
        self.memory.state.reserve_more(key, planned)
        take(capacity, planned)
        return planned

    def _lifted_of(self, t: Tracked) -> list[Lifted]:
        """The gang's pods let onto a node that is still there and not bound yet (intake
        keeps none a label alone claims), and no more of them than the room the gang
        was admitted with — less its bound members — covers: the rest hold nothing."""
        state = self.memory.state
        room: dict[str, int] = {}
        for count, request in t.declared():
            for r, v in request.items():
                room[r] = room.get(r, 0) + count * v
        for p in state.bound_pods_of(t.key):
            for r, v in p.request.items():
                room[r] = room.get(r, 0) - v
        out = []
        for key, (claimed, node, request) in sorted(self.memory.lifted.items()):
            if (claimed != t.key or node not in state.nodes
                    or any(room.get(r, 0) < v for r, v in request.items())):
                continue
            for r, v in request.items():
                room[r] -= v
            out.append((key, PlannedPod(node, request)))
        return out


def unbound_plan(gang: Sequence[GangPodSet], state: ClusterState, owner: AppWrapperKey,
                 capacity: Capacity, unfit: list[PlannedPod] | None = None,
                 pinned: Sequence[PlannedPod] = (), placer: Placer = place
                 ) -> list[PlannedPod]:
    """Where the gang's pods that are not bound yet can go now. Bound members (and
    `pinned` ones, held where they were let go) are taken off by request shape, then by
    amount (declared pods need not match the real ones: custompodresources); the rest
    is placed per node like a dispatch (by `placer`: in its topology domain), or — if
    the cluster has moved on and they no longer fit — charged to the nodes with the most
    room, which errs towards holding too much, never too little."""
    bound = [dict(p.request) for p in state.bound_pods_of(owner)]
    bound += [dict(p.request) for p in pinned]
    counts: list[int] = []
    for g in gang:
        count = g.pod_set.count
        for request in list(bound):
            if count and request == dict(g.pod_set.request):
                bound.remove(request)
                count -= 1
        counts.append(count)
    counts = taken_by_amount(gang, counts, bound)
    remaining = [GangPodSet(g.item, dataclasses.replace(g.pod_set, count=count))
                 for g, count in zip(gang, counts, strict=True) if count]
    if not remaining:
        return []
    placed = placer(remaining, capacity)
    if not isinstance(placed, Shortfall):
        return [PlannedPod(p.node, p.request) for p in placed if p.node is not None]
    return roomiest([dict(g.pod_set.request) for g in remaining
                     for _ in range(g.pod_set.count)], capacity, unfit)


def taken_by_amount(gang: Sequence[GangPodSet], counts: Sequence[int],
                    others: Sequence[Mapping[str, int]]) -> list[int]:
    """The declared pods left once `others` (member pods of no declared shape) have
    taken, by amount, every declared pod their total covers, in the order declared (one
    real pod may stand for several declared ones: the pod count is not compared)."""
    pool: dict[str, int] = {}
    for request in others:
        for r, v in request.items():
            pool[r] = pool.get(r, 0) + v
    left = list(counts)
    for i, g in enumerate(gang):
        request = {r: v for r, v in g.pod_set.request.items() if r != POD_COUNT}
        while left[i] and all(pool.get(r, 0) >= v for r, v in request.items()):
            for r, v in request.items():
                pool[r] = pool.get(r, 0) - v
            left[i] -= 1
    return left


def roomiest(requests: Sequence[Mapping[str, int]], capacity: Capacity,
             unfit: list[PlannedPod] | None = None) -> list[PlannedPod]:
    """Pods charged to nodes where they fit now, else to the nodes with the most room —
    erring towards holding too much, never too little. Those charged without fitting
    are added to `unfit`: they are placed again each cycle (HeldRoom._replace_unfit)."""
    out: list[PlannedPod] = []
    left = capacity.copy()
    nodes = sorted(left.nodes, key=lambda n: -sum(left.free_of(n).values()))
    for i, request in enumerate(requests):
        if not nodes:
            break
        fits = [n for n in nodes
                if all(left.free_of(n).get(r, 0) >= v for r, v in request.items())]
        node = fits[0] if fits else nodes[i % len(nodes)]
        planned = PlannedPod(node, request)
        out.append(planned)
        if fits:
            left.take(node, request)
        elif unfit is not None:
            unfit.append(planned)
    return out


def take(capacity: Capacity, planned: Sequence[PlannedPod]) -> None:
    for p in planned:
        if p.node in capacity.nodes:
            capacity.take(p.node, p.request)
