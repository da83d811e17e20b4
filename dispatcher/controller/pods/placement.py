"""Pinning: each pod of a dispatched gang binds where the dispatcher holds room for it.

Wrapped objects are created with a scheduling gate on every pod template (items/shaping.py), so
kube-scheduler leaves their pods alone. For each gated pod of a dispatched or running
gang, the loop picks room its gang holds that no other waiting member has been given
(ClusterState.pin) and lifts the gate in one PATCH that adds a required node affinity to
that node. Left to itself, kube-scheduler binds a pod into any room free in its view —
room promised to a gang whose pods are not created yet — and that gang is left partial:
the node-deletion fault test showed it with the replacements of pods lost with a node.

A pod its gang holds no room for (a Job's next pod after one completed, a replacement the
hold was not made for) gets free room it may run on, held for it; with none, it waits at
the gate until some is free. A pod of a gang the dispatcher does not track as dispatched
or running is left as it is (its items are being torn down, or it is not a member).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from typing import Any

import numpy as np

from dispatcher.admission import extended_allowance
from dispatcher.api.labels import APPWRAPPER_LABEL
from dispatcher.cluster.state import FreeMatrix, PlannedPod
from dispatcher.controller.items.shaping import ours
from dispatcher.controller.kube.client import ApiError, Kube, Resource
from dispatcher.controller.record.memory import GatedPod, Memory
from dispatcher.controller.record.tracked import ACTIVE, NamespacedName, Tracked
from dispatcher.fit.constraints import node_takes
from dispatcher.kinds import PodConstraints
from dispatcher.resources import bounded_request, format_resources

log = logging.getLogger(__name__)

POD_RESOURCE = Resource("v1", "Pod", "pods", True)
RECOUNT_SECONDS = 5.0
# Annotation of a pod pinned by the pod webhook as it was created (pod_pinning.py): the
# token its pin is held under until the pod, then named, is seen.
PIN_TOKEN_ANNOTATION = "dispatcher.codeflare.dev/pin-token"
TOKEN_PREFIX = "pin-token:"


def token_key(namespace: str, token: str) -> NamespacedName:
    """The key a pin made at admission is held under (the pod has no name yet: the API
    server generates it after the webhooks)."""
    return namespace, TOKEN_PREFIX + token


def token_of(obj: Mapping[str, Any]) -> str | None:
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    token = annotations.get(PIN_TOKEN_ANNOTATION)
    return str(token) if token else None


def unplaced_message(pod: str, request: Mapping[str, int],
                     held: Mapping[str, Mapping[str, int]],
                     declared: Sequence[tuple[int, Mapping[str, int]]]) -> str:
    """Why a gang's pod cannot be let go: what it asks, what its gang holds where, and
    what the AppWrapper declared."""
    where = "; ".join(f"{format_resources(amount)} on {node}"
                      for node, amount in sorted(held.items())) or "nothing"
    shapes = ", ".join(f"{n} x ({format_resources(r)})" for n, r in declared)
    return (f"pod {pod} asks {format_resources(request)} on one node, which neither the "
            f"room its gang holds ({where}) nor any node's free room can give; the "
            f"AppWrapper declared {shapes or 'no pods'}: correct custompodresources (or "
            "remove it to let the dispatcher count the pods)")


def over_declared(request: Mapping[str, int], allowance: Mapping[str, int]) -> dict[str, int]:
    """What of a GPU or another extended resource a pod asks beyond what its gang may give
    it (`allowance`, extended_allowance). Empty: the pod is within what was declared (it
    may still find no one node with room enough)."""
    return {r: request.get(r, 0) - most for r, most in allowance.items()
            if request.get(r, 0) > most}


def over_declared_message(pod: str, request: Mapping[str, int], short: Mapping[str, int],
                          declared: Sequence[tuple[int, Mapping[str, int]]]) -> str:
    """Why a gang's pod stays at its scheduling gate: it asks more than the gang declared."""
    shapes = ", ".join(f"{n} x ({format_resources(r)})" for n, r in declared)
    return (f"pod {pod} asks {format_resources(request)}: {format_resources(short)} more "
            "than its gang was admitted with, less what its other pods take (the AppWrapper "
            f"declared {shapes or 'no pods'}); it stays at its scheduling gate, as that room and "
            "quota are someone else's: correct custompodresources or podSets to what the "
            "pods ask, or remove them to let the dispatcher count the pods")


def lift_gate(pod: GatedPod, node: str | None) -> dict[str, Any]:
    """A merge patch that lifts the placement gate and requires `node` (if given):
    appended to each of the pod's own required terms (they stay in force), the only term
    if it had none.
    Both are changes the API server allows on a gated pod; resourceVersion makes it
    apply to the pod as seen, or fail with 409."""
    spec = pod.spec
    if node is None:
        return {"metadata": {"resourceVersion": pod.version},
                "spec": {"schedulingGates": _other_gates(spec) or None}}
    return {"metadata": {"resourceVersion": pod.version}, "spec": let_onto_patch(spec, node)}


def let_onto_patch(spec: Mapping[str, Any], node: str) -> dict[str, Any]:
    """What of the pod's spec changes when it is let onto `node`: its other scheduling
    gates (None: none left), and the node affinity with `node` required (a merge patch of
    ``spec.affinity``)."""
    rule = {"key": "metadata.name", "operator": "In", "values": [node]}
    terms = [{**t, "matchFields": [*(t.get("matchFields") or []), rule]}
             for t in _required_terms(spec)] or [{"matchFields": [rule]}]
    return {
        "schedulingGates": _other_gates(spec) or None,
        "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms},
        }},
    }


def _other_gates(spec: Mapping[str, Any]) -> list[Any]:
    return [g for g in spec.get("schedulingGates") or [] if not ours(g)]


def let_onto(spec: Mapping[str, Any]) -> str | None:
    """The node a pod was let onto (the rule `lift_gate` adds), if any."""
    for term in _required_terms(spec):
        for f in term.get("matchFields") or []:
            values = f.get("values") if isinstance(f, Mapping) else None
            if (f.get("key") == "metadata.name" and f.get("operator") == "In"
                    and isinstance(values, list) and len(values) == 1):
                return str(values[0])
    return None


def _required_terms(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    return [t for t in required.get("nodeSelectorTerms") or [] if isinstance(t, Mapping)]


class PodPlacer:
    def __init__(self, kube: Kube, memory: Memory,
                 recount: Callable[[Mapping[str, Any]], None],
                 clock: Callable[[], float]) -> None:
        self.kube = kube
        self.memory = memory
        self.clock = clock
        # Intake again, now and then, for a gated pod its gang does not count yet: seen
        # before the dispatch was recorded (a wrapped Pod is created by the dispatch
        # itself), or before the item that proves it was (its owner then looked foreign).
        # Held at the gate, it sends no further event that would have done it.
        self.recount = recount
        self._recounted: dict[NamespacedName, float] = {}
        self._lifting: set[NamespacedName] = set()
        self.waiting = 0  # gated members with no room to go to, at the last pass
        self._unplaced: set[NamespacedName] = set()  # gangs with such a member
        self._looking: set[NamespacedName] = set()  # lapsed pins whose pod is being looked for

    def cycle(self, unfit: Mapping[NamespacedName, list[PlannedPod]],
              start: Callable[[Coroutine[Any, Any, None]], None]) -> None:
        """Pin every gated member pod that can be, and `start` the PATCHes that let them
        go. Runs in the loop after holds are rebuilt and before anything is admitted, so
        room a pod is pinned to is never offered to a new gang."""
        state = self.memory.state
        if self.lapsing_tokens(time.monotonic()):
            start(self.lapse_tokens(time.monotonic()))
        waiting = 0
        unplaced: dict[NamespacedName, str] = {}
        for key in sorted(self.memory.gated):
            pod = self.memory.gated[key]
            if key in self._lifting:
                continue
            t = self.memory.tracked.get(pod.claimed)
            if t is not None and t.phase == "done" and not t.teardown_due:
                # A finished wrapper whose items stay (a Deployment after Completed, a
                # failed one kept for inspection): nothing is held for it; let it go.
                self._lifting.add(key)
                start(self._lift(key, pod, None))
                continue
            if (t is None or t.phase not in ACTIVE or t.teardown_due
                    or pod.constraints is None):
                continue  # not of a gang that runs
            if key[1] not in t.pods:
                now = time.monotonic()
                if now - self._recounted.get(key, -RECOUNT_SECONDS) >= RECOUNT_SECONDS:
                    self._recounted[key] = now
                    self.recount(pod.obj)
                continue  # not proven a member (yet)

            request = pod.request

            def admits(node: str, c: PodConstraints = pod.constraints,
                       r: Mapping[str, int] = request) -> bool:
                return node_takes(state.nodes[node], c, r)

            # A pod asking more of a GPU or another extended resource than its gang was
            # admitted (and charged to its quota) with, less what its other pods take,
            # gets no free room: that is room and quota that are someone else's.
            allowance = extended_allowance(t.declared(), self._taken(t.key), request)
            within = not over_declared(request, allowance)
            node = self.held_room(t.key, key, request, pod.constraints,
                                  unfit.get(t.key, ()), top_up=within)
            if node is None and within and self._made_as_admitted(t):
                node = self._free_room(t.key, key, request, admits)
            if node is None:
                waiting += 1
                if t.key not in unplaced:  # the first such pod of its gang is the one said
                    unplaced[t.key] = self._why_unplaced(t, key[1], request, allowance)
                continue
            self._lifting.add(key)
            start(self._lift(key, pod, node))
        self.waiting = waiting
        self._report(unplaced)
        self._recounted = {k: v for k, v in self._recounted.items() if k in self.memory.gated}

    @staticmethod
    def _made_as_admitted(t: Tracked) -> bool:
        """Whether a pod beyond the room its gang holds may be one its objects make as
        admitted, and so get free room. One more than they make (a Job's parallelism
        raised after dispatch) was admitted by nobody. Of a kind the dispatcher cannot
        count (a LeaderWorkerSet), the declaration is a guess, as Kueue takes it: codeflare's
        own sample declares 3 of its 4 workers; what such a pod may not have beyond the
        declaration is a GPU or another extended resource (`within`)."""
        return (not t.pods_countable
                or t.counts().active <= max(t.expected_pods, t.made_pods))

    def held_room(self, owner: NamespacedName, key: NamespacedName, request: Mapping[str, int],
                  constraints: PodConstraints, unfit: Collection[PlannedPod] = (),
                  top_up: bool = False) -> str | None:
        """The node a member pod is pinned to within the room its gang holds (kept for
        `key` until it binds or is unpinned), or None: no room of the gang for it.
        `top_up`: free room on that node may make up what the hold there lacks."""
        state = self.memory.state

        def admits(node: str) -> bool:
            return node_takes(state.nodes[node], constraints, request)

        return state.pin(owner, key, request, unfit, admits, top_up)

    def _taken(self, owner: NamespacedName) -> dict[str, int]:
        """What a gang's members take: bound, or pinned to room not bound yet (all it
        holds but the room no waiting member is pinned to)."""
        state = self.memory.state
        taken: dict[str, int] = {}
        for p in state.holdings(owner):
            for r, v in p.request.items():
                taken[r] = taken.get(r, 0) + v
        for amounts in state.held_on(owner).values():
            for r, v in amounts.items():
                taken[r] = taken.get(r, 0) - v
        return taken

    def _why_unplaced(self, t: Tracked, pod: str, request: Mapping[str, int],
                      allowance: Mapping[str, int]) -> str:
        short = over_declared(request, allowance)
        if short:
            return over_declared_message(pod, request, short, t.declared())
        return unplaced_message(pod, request, self.memory.state.held_on(t.key), t.declared())

    def _report(self, unplaced: Mapping[NamespacedName, str]) -> None:
        """Say of each dispatched gang whether a member pod of it fits neither the room it
        holds nor free room (the lifecycle reports it, and requeues it after the
        admission grace), from when."""
        now = self.clock()
        for key in self._unplaced - unplaced.keys():
            if (t := self.memory.tracked.get(key)) is not None:
                t.room.unplaced = None
                self.memory.attention.touch(key)
        for key, message in unplaced.items():
            t = self.memory.tracked[key]
            if t.room.unplaced is None or t.room.unplaced[1] != message:
                since = now if t.room.unplaced is None else t.room.unplaced[0]
                t.room.unplaced = (since, message)
                self.memory.attention.touch(key)
        self._unplaced = set(unplaced)

    def lapsing_tokens(self, now: float) -> list[NamespacedName]:
        """Pins made as pods were created whose pod has not been seen in time, not being
        looked for already."""
        return [k for k, due in self.memory.pin_tokens.items()
                if due <= now and k not in self._looking]

    async def lapse_tokens(self, now: float) -> None:
        """Drop the pins made as pods were created whose pod does not exist. Its watch
        event may only be late (a loaded API server): the pod is looked for first, and
        one found takes its pin (intake) — dropped, its room would go to the next pod
        of the gang while the late one binds there too."""
        for key in self.lapsing_tokens(now):
            self._looking.add(key)
            try:
                await self._look_for(key)
            finally:
                self._looking.discard(key)

    async def _look_for(self, key: NamespacedName) -> None:
        held = self.memory.lifted.get(key)
        token = key[1].removeprefix(TOKEN_PREFIX)
        if held is not None:
            try:
                pods = await self.kube.list(POD_RESOURCE, f"{APPWRAPPER_LABEL}={held[0][1]}",
                                            key[0])
            except ApiError as e:
                log.info("pin %s of %s/%s: could not look for its pod (%s); kept",
                         token, *held[0], e)
                return
            for pod in pods:
                if token_of(pod) == token:
                    self.recount(pod)  # late: its watch event will say the same
                    if key not in self.memory.pin_tokens:
                        return
        if key in self.memory.pin_tokens:
            del self.memory.pin_tokens[key]
            self.memory.lifted.pop(key, None)
            self.memory.state.unpin(key)

    def _free_room(self, owner: NamespacedName, key: NamespacedName, request: Mapping[str, int],
                   admits: Callable[[str], bool]) -> str | None:
        state = self.memory.state
        names, resources, free = state.free_matrix()
        if any(r not in resources for r, v in request.items() if v > 0):
            return None  # no node has any of something it asks
        free = self._less_held_for_preemptors(owner, names, resources, free)
        fits = np.ones(len(names), dtype=bool)
        for r, v in request.items():
            if v > 0:
                fits &= free[:, resources.index(r)] >= bounded_request(v)
        for i in np.flatnonzero(fits).tolist():
            name = names[i]
            if admits(name):
                held = PlannedPod(name, dict(request))
                state.reserve_more(owner, [held])
                node = state.pin(owner, key, request, admits=name.__eq__)
                if node is None:
                    state.unreserve(owner, [held])
                return node
        return None

    def _less_held_for_preemptors(self, owner: NamespacedName, names: Sequence[str],
                                  resources: Sequence[str], free: FreeMatrix) -> FreeMatrix:
        """Free room less what is kept for preemptors (sharing.Hold: the room their
        victims give back as they go), which is nobody else's."""
        holds = [h for key, h in self.memory.sharing.holds.items() if key != owner]
        if not holds:
            return free
        free = free.copy()
        row = {name: i for i, name in enumerate(names)}
        column = {r: j for j, r in enumerate(resources)}
        for hold in holds:
            for p in hold.planned:
                for r, v in p.request.items():
                    if p.node in row and r in column:
                        free[row[p.node], column[r]] -= bounded_request(v)
        return free

    async def _lift(self, key: NamespacedName, pod: GatedPod, node: str | None) -> None:
        path = f"/api/v1/namespaces/{key[0]}/pods/{key[1]}"
        try:
            try:
                await self.kube.request("PATCH", path, lift_gate(pod, node),
                                        content_type="application/merge-patch+json")
            except ApiError as e:
                if e.status != 422 or node is None:
                    raise
                # The API server would not take the node rule (a pod whose own rules it
                # cannot extend): let it go unpinned, as pods go without the gate.
                log.warning("%s/%s: could not pin it to %s (%s); its gate is lifted "
                            "without a node", *key, node, e)
                await self.kube.request("PATCH", path, lift_gate(pod, None),
                                        content_type="application/merge-patch+json")
            if node is not None:
                self.memory.pods_pinned["gate"] += 1
            if self.memory.gated.get(key) is pod:
                del self.memory.gated[key]  # the watch will say so too; do not lift it twice
        except ApiError as e:
            # Still gated (or gone): the next pass tries again from the pod as then seen,
            # with the same room (a pin lasts until the pod binds or goes).
            if e.status not in (404, 409) and not e.transient:
                log.error("%s/%s: could not lift its scheduling gate: %s", *key, e)
        finally:
            self._lifting.discard(key)
            self.memory.wake.set()
