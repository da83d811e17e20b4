"""Pinning a gang's pod as it is created: ``POST /pin-pods``, a mutating webhook on pods.

Without it every member pod is created at the placement gate and the loop lifts the gate
with a PATCH that requires its node (placement.py): one more pod write per pod, which the
API server sends to every pod watcher, and a loop pass before the pod can be scheduled.
On CREATE of a pod that carries the gate and the AppWrapper label, this webhook does the
same at once: it picks the room the pod's gang holds (``ClusterState.pin``, the rule the
loop uses), and answers with a patch that drops the gate, requires that node, and marks
the pod with the token its pin is kept under until the pod's watch event names it.

It only ever narrows what the gate path would do. The pod keeps its gate (the loop then
lets it go as before) when the webhook is not called at all (``failurePolicy: Ignore``,
a webhook that is down), when this process is not the leader or not ready, when the
pod's controller owner is not an object the dispatcher created for that AppWrapper (a
label is not proof, record/ownership.py), when its gang holds no room for it, and on dry runs.
It never takes free room: a pin stays within what the gang holds, so an admission cycle
running meanwhile on its capacity snapshot is not affected.

A pin whose pod was never seen (its creation refused after this webhook, by quota or
another admission plugin, or the API server gave up waiting for the answer) is dropped
after ``TOKEN_SECONDS``; meanwhile the gang's pods that come gated take free room, or wait.
A mutating webhook called after this one may add to the pod (a sidecar's resources): the
API server then calls this one again (``reinvocationPolicy: IfNeeded``), and a pod that no
longer asks what it was pinned for is put back at its gate, its node rule and pin undone,
for the loop to place as it is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dispatcher.api.labels import APPWRAPPER_LABEL
from dispatcher.cluster import PlannedPod
from dispatcher.controller.items.shaping import PLACEMENT_GATE, ours
from dispatcher.controller.record.memory import Memory
from dispatcher.controller.record.ownership import controller_ref
from dispatcher.controller.record.tracked import ACTIVE, Key, NamespacedName, Tracked
from dispatcher.resources import pod_request

from .placement import (
    PIN_TOKEN_ANNOTATION,
    PodPlacer,
    let_onto,
    let_onto_patch,
    token_key,
    token_of,
)
from .pod_intake import gated_pod

log = logging.getLogger("dispatcher.pinning")

# Long enough for a created pod's watch event to arrive on a loaded API server; short, as
# a pin whose pod never came keeps a member of its gang waiting until it lapses.
TOKEN_SECONDS = 10.0
# A Job's first pods can be created before the Job's create answer reached the dispatcher
# (its uid, the proof of the pods' owner, is recorded then): wait that long for it.
PROOF_WAIT_SECONDS = 1.0
PROOF_POLL_SECONDS = 0.05

JsonPatch = list[dict[str, Any]]


@dataclass(frozen=True)
class Pins:
    """What a pin is made with: the loop's memory and pod placer, the held pods charged to
    a node they do not fit on, and whether memory can be trusted now (the loop is ready
    and no watch is down)."""

    memory: Memory
    pod_placer: PodPlacer
    unfit: Callable[[], Mapping[Key, list[PlannedPod]]]
    trusted: Callable[[], bool]


class PodPinning:
    """The webhook's decision. `pins()` says what to pin with: None until this process
    leads and has listed everything, and again once it stops (pods then keep their
    gate)."""

    def __init__(self, pins: Callable[[], Pins | None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.source = pins
        self.clock = clock

    async def review(self, request: Mapping[str, Any],
                     gone: Callable[[], bool] = lambda: False) -> JsonPatch | None:
        """The patch for a pod CREATE (None: the pod is created as it is). `gone`: the API
        server stopped waiting for this answer (it then creates the pod as asked)."""
        obj = request.get("object")
        if (not isinstance(obj, Mapping) or request.get("operation") != "CREATE"
                or (request.get("kind") or {}).get("kind") != "Pod"):
            return None
        pins = self.source()
        usable = pins is not None and pins.trusted() and not request.get("dryRun")
        spec = obj.get("spec") or {}
        if not any(ours(g) for g in spec.get("schedulingGates") or []):
            return self._recheck(pins, request, obj) if usable and pins is not None else None
        if not usable or pins is None:
            return None
        claimed = _claimed(request, obj)
        if claimed is None:
            return None
        deadline = self.clock() + PROOF_WAIT_SECONDS
        while not pins.memory.ownership.proves(obj, claimed):
            t = pins.memory.tracked.get(claimed)
            if t is None or not _item_being_recorded(t, obj) or self.clock() >= deadline:
                return None  # the loop proves it from its owner chain, then lets it go
            await asyncio.sleep(PROOF_POLL_SECONDS)
        if gone() or self.source() is not pins:
            return None
        return self._pin(pins, request, obj, claimed)

    def _pin(self, pins: Pins, request: Mapping[str, Any], obj: Mapping[str, Any],
             claimed: NamespacedName) -> JsonPatch | None:
        t = pins.memory.tracked.get(claimed)
        if t is None or t.phase not in ACTIVE or t.teardown_due:
            return None
        token = str(request.get("uid") or "")
        pod = gated_pod(obj, claimed)
        if not token or pod is None or pod.constraints is None:
            return None
        key = token_key(claimed[0], token)
        choice = pins.pod_placer.held_room(t.key, key, pod.request, pod.constraints,
                                       pins.unfit().get(t.key, ()))
        if choice is None:
            return None
        try:
            patch = _pin_patch(obj, choice, token)
        except Exception:
            pins.memory.state.unpin(key)
            raise
        pins.memory.pin_tokens[key] = self.clock() + TOKEN_SECONDS
        # Where it will bind, should its gang's hold be placed again before it is seen.
        pins.memory.lifted[key] = (claimed, choice, dict(pod.request))
        log.debug("%s/%s: a pod of it pinned to %s as it was created", *t.key, choice)
        return patch

    def _recheck(self, pins: Pins, request: Mapping[str, Any],
                 obj: Mapping[str, Any]) -> JsonPatch | None:
        """Called again after later webhooks changed the pod: if it no longer asks what
        it was pinned for, its pin is undone and it goes back to its gate."""
        token = token_of(obj)
        namespace = str(request.get("namespace") or "")
        if token is None or not namespace:
            return None
        key = token_key(namespace, token)
        node = let_onto(obj.get("spec") or {})
        held = pins.memory.lifted.get(key) if key in pins.memory.pin_tokens else None
        if (node is None or held is None
                or held[0] != _claimed(request, obj)  # a token copied onto another's pod
                or dict(pod_request(obj.get("spec") or {})) == held[2]):
            return None
        del pins.memory.pin_tokens[key]
        pins.memory.lifted.pop(key, None)
        pins.memory.state.unpin(key)
        log.info("a pod of %s/%s asks more than it was pinned to %s for (changed by a "
                 "later webhook): back to its gate", namespace,
                 ((obj.get("metadata") or {}).get("labels") or {}).get(APPWRAPPER_LABEL),
                 node)
        return _unpin_patch(obj, node)


def _item_being_recorded(t: Tracked, pod: Mapping[str, Any]) -> bool:
    """Whether the pod's controller may be an item of the dispatched gang whose uid is not
    known yet (the create's answer not in): only then is its proof worth waiting for.
    A pod two owners below an item (JobSet -> Job -> pod) is proven by the loop, which
    looks the chain up."""
    ref = controller_ref(pod)
    return ref is not None and t.phase == "dispatched" and any(
        w.kind == ref.kind and w.name == ref.name and w.uid in ("", ref.uid)
        for w in t.status.wrappedItems)


def _claimed(request: Mapping[str, Any], obj: Mapping[str, Any]) -> NamespacedName | None:
    namespace = str(request.get("namespace") or "")
    claim = ((obj.get("metadata") or {}).get("labels") or {}).get(APPWRAPPER_LABEL)
    return (namespace, str(claim)) if namespace and claim else None


def _pin_patch(obj: Mapping[str, Any], node: str, token: str) -> JsonPatch:
    """JSON patch: the merge patch the gate path would send, as it applies to a pod not
    created yet, and the token annotation."""
    spec = obj.get("spec") or {}
    lift = let_onto_patch(spec, node)
    gates = lift["schedulingGates"]
    affinity = dict(spec.get("affinity") or {})
    affinity["nodeAffinity"] = {**(affinity.get("nodeAffinity") or {}),
                                **lift["affinity"]["nodeAffinity"]}
    annotations = dict((obj.get("metadata") or {}).get("annotations") or {})
    annotations[PIN_TOKEN_ANNOTATION] = token
    return [
        {"op": "add", "path": "/spec/affinity", "value": affinity},
        {"op": "add", "path": "/spec/schedulingGates", "value": gates} if gates
        else {"op": "remove", "path": "/spec/schedulingGates"},
        {"op": "add", "path": "/metadata/annotations", "value": annotations},
    ]


def _unpin_patch(obj: Mapping[str, Any], node: str) -> JsonPatch:
    """JSON patch undoing `_pin_patch`: the gate back, the node rule and the token gone."""
    spec = obj.get("spec") or {}
    rule = {"key": "metadata.name", "operator": "In", "values": [node]}
    affinity = dict(spec.get("affinity") or {})
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    required = dict(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = []
    for term in required.get("nodeSelectorTerms") or []:
        fields = list(term.get("matchFields") or [])
        if rule in fields:
            fields.reverse()
            fields.remove(rule)  # the last one: the one added
            fields.reverse()
        rest = {**term, "matchFields": fields} if fields else \
            {k: v for k, v in term.items() if k != "matchFields"}
        if rest:
            terms.append(rest)  # a term that held only the rule was the pin's own
    if terms:
        required["nodeSelectorTerms"] = terms
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    else:
        node_affinity.pop("requiredDuringSchedulingIgnoredDuringExecution", None)
    if node_affinity:
        affinity["nodeAffinity"] = node_affinity
    else:
        affinity.pop("nodeAffinity", None)
    annotations = {k: v for k, v in ((obj.get("metadata") or {}).get("annotations") or {})
                   .items() if k != PIN_TOKEN_ANNOTATION}
    gates = [*(spec.get("schedulingGates") or []), {"name": PLACEMENT_GATE}]
    return [
        {"op": "add", "path": "/spec/affinity", "value": affinity} if affinity
        else {"op": "remove", "path": "/spec/affinity"},
        {"op": "add", "path": "/spec/schedulingGates", "value": gates},
        {"op": "add", "path": "/metadata/annotations", "value": annotations},
    ]
