"""Which AppWrapper a pod belongs to, proven through its owner chain.

A label is not proof: anyone who may create pods in a namespace may put the
AppWrapper label on one. A pod counts for a gang only when its controller owner chain
(pod -> ReplicaSet -> Deployment, pod -> Job -> JobSet, pod -> RayCluster, …) reaches
one of the objects the dispatcher created for that AppWrapper (their uids are known
from the create, or recorded in the AppWrapper's status), or when the pod itself is
such an object. Owners not yet known are looked up by the admission loop (one GET
each, cached by uid); watch handlers never call the API.

The owner references are the pod's creator's to write, kind, name and uid alike, so a
lookup reads only a kind that can stand between a pod and what the dispatcher creates
(`owner_kinds`: a Job, a ReplicaSet, a RayCluster; never a ConfigMap), and a pod refused
is not looked up again until it changes (another resourceVersion) or an item of the
AppWrapper it claims is learned: taken in again every few seconds (pods/placement.py), it
would have the dispatcher read an object of its creator's choice for ever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from dispatcher.controller.kube.client import ApiError, Kube
from dispatcher.kinds.registry import KNOWN_KINDS
from dispatcher.kinds.scope import GroupKind

from .tracked import NamespacedName

log = logging.getLogger("dispatcher")

# Enough for pod -> ReplicaSet -> Deployment and pod -> Job -> JobSet/RayJob.
MAX_DEPTH = 4
# Owner lookups per admission cycle, and at once: a cycle is never held up long.
MAX_LOOKUPS_PER_CYCLE = 256
PARALLEL_LOOKUPS = 16


@dataclass(frozen=True)
class OwnerRef:
    namespace: str
    api_version: str
    kind: str
    name: str
    uid: str

    @property
    def group_kind(self) -> GroupKind:
        return self.api_version.rpartition("/")[0], self.kind


# A pod as it was seen: its uid and resourceVersion.
PodVersion = tuple[str, str]


def _version(pod: Mapping[str, Any]) -> PodVersion:
    meta = pod.get("metadata") or {}
    return str(meta.get("uid", "")), str(meta.get("resourceVersion", ""))


def controller_ref(obj: Mapping[str, Any]) -> OwnerRef | None:
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("uid"):
            return OwnerRef(str(meta.get("namespace") or "default"),
                            str(ref.get("apiVersion", "")), str(ref.get("kind", "")),
                            str(ref.get("name", "")), str(ref["uid"]))
    return None


# Fetches an owner object, or None when it does not exist.
Fetch = Callable[[OwnerRef], Awaitable[Mapping[str, Any] | None]]


async def fetch_owner(kube: Kube, ref: OwnerRef) -> Mapping[str, Any] | None:
    """An object in a pod's owner chain, read from `kube`, or None if it does not exist
    (or its kind is not served there)."""
    resource = await kube.resource(ref.api_version, ref.kind)
    if resource is None:
        return None
    try:
        obj: dict[str, Any] = await kube.request("GET", resource.path(ref.namespace, ref.name))
        return obj
    except ApiError as e:
        if e.status == 404:
            return None
        raise


class Ownership:
    def __init__(self, owner_kinds: Collection[GroupKind] = KNOWN_KINDS) -> None:
        """`owner_kinds`: the kinds a lookup reads (scope.owner_kinds)."""
        self.owner_kinds = frozenset(owner_kinds)
        # uid of an item or of an object below one -> its AppWrapper; None: proven not
        # below any item (a pod under it never counts).
        self._root: dict[str, NamespacedName | None] = {}
        # The uids set to None in _root (a superset: some may have been set since), so
        # learning an item does not go through every uid known.
        self._disproven: set[str] = set()
        self._unknown: dict[str, OwnerRef] = {}  # owners to look up
        # owner uid -> pods claiming an AppWrapper, as they were seen
        self._waiting: dict[str, dict[NamespacedName, tuple[NamespacedName, PodVersion]]] = {}
        # Pods whose chain did not reach their claimed AppWrapper, with their owner and
        # as they were seen: not looked up again as they are, but an item learned later
        # (adopted after a restart) may still prove them.
        self._rejected: dict[NamespacedName,
                             tuple[NamespacedName, OwnerRef, PodVersion]] = {}

    def add_item(self, uid: str, owner: NamespacedName) -> None:
        if self._root.get(uid) == owner:
            return
        self._root[uid] = owner
        for u in self._disproven:
            if u in self._root and self._root[u] is None:
                del self._root[u]
        self._disproven.clear()
        for pod, (claimed, ref, version) in list(self._rejected.items()):
            if claimed == owner:
                del self._rejected[pod]
                self._unknown.setdefault(ref.uid, ref)
                self._waiting.setdefault(ref.uid, {})[pod] = (claimed, version)

    def forget(self, owner: NamespacedName) -> None:
        """The AppWrapper is gone or requeued: its items' uids prove nothing any more."""
        for uid in [u for u, k in self._root.items() if k == owner]:
            del self._root[uid]

    def owner_of(self, pod: Mapping[str, Any],
                 claimed: NamespacedName) -> NamespacedName | bool | None:
        """The AppWrapper the pod is proven to belong to; None if proven foreign;
        False while its owner chain is still being looked up (it is then queued)."""
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or "default"), str(meta.get("name")))
        own_uid = str(meta.get("uid", ""))
        if own_uid in self._root:
            return self._root[own_uid]
        ref = controller_ref(pod)
        if ref is None:
            return None
        version = _version(pod)
        if ref.uid in self._root:
            root = self._root[ref.uid]
            if root != claimed:
                self._rejected[key] = (claimed, ref, version)
            return root
        rejected = self._rejected.get(key)
        if rejected is not None and (rejected[0], rejected[2]) == (claimed, version):
            return None  # refused as it is now
        if ref.group_kind not in self.owner_kinds:
            self._rejected[key] = (claimed, ref, version)
            return None
        self._unknown.setdefault(ref.uid, ref)
        self._waiting.setdefault(ref.uid, {})[key] = (claimed, version)
        return False

    def proves(self, pod: Mapping[str, Any], claimed: NamespacedName) -> bool:
        """Whether what is known already proves the pod belongs to `claimed` (its
        controller owner is an item of it, or below one); looks nothing up."""
        ref = controller_ref(pod)
        return ref is not None and self._root.get(ref.uid) == claimed

    def disproves(self, pod: Mapping[str, Any], claimed: NamespacedName) -> bool:
        """Whether what is known already proves the pod does not belong to `claimed`: it
        has no controller owner, or one known to be foreign or of a kind never read;
        looks nothing up."""
        ref = controller_ref(pod)
        if ref is None:
            return str((pod.get("metadata") or {}).get("uid", "")) not in self._root
        if ref.uid not in self._root:
            return ref.group_kind not in self.owner_kinds  # never read: proves nothing
        return self._root[ref.uid] != claimed

    def drop_pod(self, key: NamespacedName) -> None:
        self._rejected.pop(key, None)
        for uid in list(self._waiting):
            pods = self._waiting[uid]
            pods.pop(key, None)
            if not pods:
                del self._waiting[uid]
                self._unknown.pop(uid, None)

    @property
    def unresolved(self) -> int:
        return len(self._unknown)

    async def resolve(self, fetch: Fetch, limit: int = MAX_LOOKUPS_PER_CYCLE,
                      parallel: int = PARALLEL_LOOKUPS
                      ) -> dict[NamespacedName, NamespacedName | None]:
        """Look up unknown owners (at most `limit`, `parallel` at a time, so one cycle
        is never held up long); return the waiting pods now decided, with the
        AppWrapper each belongs to (None: not proven, never counted)."""
        decided: dict[NamespacedName, NamespacedName | None] = {}
        gate = asyncio.Semaphore(parallel)

        async def one(uid: str, ref: OwnerRef) -> None:
            async with gate:
                try:
                    root = await self._walk(ref, fetch)
                except Exception as e:  # the API did not answer: try again next cycle
                    log.debug("owner %s %s/%s not looked up: %s", ref.kind, ref.namespace,
                              ref.name, e)
                    return
            self._unknown.pop(uid, None)
            for pod, (claimed, version) in self._waiting.pop(uid, {}).items():
                if root == claimed:
                    decided[pod] = root
                else:
                    decided[pod] = None
                    self._rejected[pod] = (claimed, ref, version)

        batch = list(self._unknown.items())[:limit]
        await asyncio.gather(*(one(uid, ref) for uid, ref in batch))
        return decided

    async def _walk(self, ref: OwnerRef, fetch: Fetch) -> NamespacedName | None:
        chain: list[str] = []
        current: OwnerRef | None = ref
        root: NamespacedName | None = None
        for _ in range(MAX_DEPTH):
            if current is None:
                break
            if current.uid in self._root:
                root = self._root[current.uid]
                break
            if current.group_kind not in self.owner_kinds:
                break  # of a kind that makes no pod for what the dispatcher creates
            obj = await fetch(current)
            if obj is None:
                break  # gone: nothing below it can be proven ours
            if str((obj.get("metadata") or {}).get("uid", "")) != current.uid:
                break  # replaced by another object of that name
            chain.append(current.uid)
            current = controller_ref(obj)
        # An item may have been learned while this walk awaited the API (adopted after
        # a restart): what it proves wins over what the walk found before it was known.
        # Overwriting it left the adopted gang's pods uncounted for good (the
        # crash-during-a-burst cluster test: gangs stuck Dispatched).
        # Only what is below that item is proven by it, never what is above it.
        for i, uid in enumerate(chain):
            learned = self._root.get(uid)
            if learned is not None:
                root, chain = learned, chain[:i]
                break
        for uid in chain:
            self._root[uid] = root
        if root is None:
            self._disproven.update(chain)
        return root
