"""What the dispatcher holds in memory: a cache of the API, rebuilt from listings.

Watch handlers (intake/router.py) write it; the admission loop (loop/runtime.py) reads it and acts.
It never calls the API.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatcher.admission import EmptyClusterAnswers
from dispatcher.cluster import ClusterState
from dispatcher.kinds import PodConstraints
from dispatcher.kinds.registry import KNOWN_KINDS
from dispatcher.kinds.scope import GroupKind
from dispatcher.queue import AdmissionQueue, Policy

from .attention import Attention
from .ownership import Ownership
from .sharing import Sharing
from .tracked import Key, Leftover, Tracked


@dataclass(frozen=True)
class GatedPod:
    """A pod waiting at the placement gate, and the AppWrapper its label claims."""

    claimed: Key
    obj: Mapping[str, Any]  # as last seen
    request: Mapping[str, int] = field(default_factory=dict)
    constraints: PodConstraints | None = None  # None: node rules it cannot be placed by

    @property
    def spec(self) -> Mapping[str, Any]:
        return self.obj.get("spec") or {}

    @property
    def version(self) -> str:
        """resourceVersion: the gate is lifted from exactly this pod."""
        return str((self.obj.get("metadata") or {}).get("resourceVersion", ""))


class Memory:
    def __init__(self, policy: Policy, owner_kinds: Collection[GroupKind] = KNOWN_KINDS
                 ) -> None:
        """`owner_kinds`: the kinds an owner lookup reads (ownership.py)."""
        self.tracked: dict[Key, Tracked] = {}
        self.state = ClusterState()
        self.queue = AdmissionQueue(policy)
        self.ownership = Ownership(owner_kinds)
        self.sharing = Sharing()
        # Every pod seen and the AppWrapper its label claims (None: no claim), so a
        # relisting can tell which pods vanished while the watch was down.
        self.pods: dict[tuple[str, str], Key | None] = {}
        self.gated: dict[tuple[str, str], GatedPod] = {}  # pods/placement.py lifts their gate
        # Pods let past the gate onto a node and not bound yet, with their claim, node and
        # request: after a restart their gang's hold is rebuilt on those nodes.
        self.lifted: dict[tuple[str, str], tuple[Key, str, dict[str, int]]] = {}
        # Pins made by the pod webhook as a pod was created (pods/pod_pinning.py), held under a
        # token until the pod is seen: when they lapse (monotonic). Their claim, node and
        # request are in `lifted`, under the same token key.
        self.pin_tokens: dict[tuple[str, str], float] = {}
        # Pods let onto their node, by how: "created" (the pod webhook), "gate" (a PATCH).
        self.pods_pinned: dict[str, int] = {"created": 0, "gate": 0}
        self.wake = asyncio.Event()
        # Replaced, not cleared, on a node change: a cycle in the executor keeps its own.
        self.empty_answers = EmptyClusterAnswers()
        self.unwritten: set[Key] = set()  # status changed outside the loop's own steps
        # Wrappers whose spec is elastic: what the admission loop looks through each cycle
        # for one that may grow, rather than every wrapper.
        self.elastic: set[Key] = set()
        # Which wrappers a cycle looks at for a step due (attention.py).
        self.attention = Attention()
        # Gangs whose room is to be held again (loop/held_room.py): their hold was lost, or
        # pods of theirs went away unfinished.
        self.room_owed: dict[Key, None] = {}
        # The manager of the copies held here has not renewed its heartbeat within its
        # grace (loop/manager_fence.py): those copies stop and stay held.
        self.manager_stale = False
        # Pods of deleted objects, per wrapper, until they are gone (pods/leftovers.py).
        self.leftovers: dict[Key, Leftover] = {}

    def hold_again(self, t: Tracked) -> None:
        """`t`'s room is to be held again from scratch (a restart, its node gone)."""
        t.room.needs_reservation = True
        self.room_owed[t.key] = None

    def lost_pod(self, t: Tracked, request: Mapping[str, int]) -> None:
        """A member pod of `t` went away unfinished: its replacement is owed its room."""
        t.room.lost.append(dict(request))
        self.room_owed[t.key] = None

    def objects_deleted(self, key: Key, pods: set[tuple[str, str]], grace: float,
                        now: float) -> None:
        """The objects of wrapper `key` were deleted: its `pods` are watched until they are
        gone, deleted at once if still there `grace` seconds on. A new deletion adds its
        pods and starts the grace again for all: a pod is never deleted at once sooner than
        its own grace."""
        if not pods:
            return
        left = self.leftovers.get(key)
        if left is None:
            self.leftovers[key] = Leftover(now, grace, pods)
        else:
            left.pods |= pods
            left.deleted_at, left.grace, left.again_at = now, grace, None

    def pod_gone(self, pod: tuple[str, str]) -> None:
        """A pod was deleted: a new one of the same name (a StatefulSet's, a Job's
        indexed pod) is not a leftover of the old objects."""
        for left in self.leftovers.values():
            left.pods.discard(pod)

    def forget(self, t: Tracked) -> None:
        """Drop `t` — only if it is still the object held under its key (a late answer
        about an old object must not drop its successor of the same name)."""
        if self.tracked.get(t.key) is not t:
            return
        del self.tracked[t.key]
        self.elastic.discard(t.key)
        if t.queued is not None and self.queue.get(t.key) is t.queued:
            self.queue.remove(t.key)
        self.state.release(t.key)
        self.ownership.forget(t.key)
        self.sharing.release(t.key)
        self.sharing.preempting.pop(t.key, None)

    def current(self, t: Tracked) -> bool:
        return self.tracked.get(t.key) is t
