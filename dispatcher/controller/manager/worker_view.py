"""The manager's view of one worker cluster, kept in memory by watches.

Each worker is listed once, then watched (kube/informer.py: resumed where a watch ended,
listed again on 410 Gone, blind while a watch is down): its nodes and pods (what it runs:
a ClusterState kept up to date pod by pod), its AppWrappers (the copies among them),
its QuotaSubtrees, and the Events about AppWrappers there, indexed by the object they
are about, so a copy's Events are found without reading the others. A pass reads this
memory: what the manager asks of a worker each second is bounded by what changed there,
not by how much it holds.

A pod counts for a gang (as one of its pods bound, whose room the manager no longer holds
for it) only once its owner chain proves it, by the controller's own rule
(record/ownership.py): the chain reaches an object the worker's dispatcher created for that
AppWrapper, whose uid it recorded in the AppWrapper's status. A label is anyone's to write:
an empty pod labelled for a gang holds none of that gang's room. Owners not known yet are
looked up in the background, a bounded number at a time (`prove`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from dispatcher.api.labels import MANAGER_UID_LABEL
from dispatcher.cluster import BoundPod, ClusterState
from dispatcher.cluster.model import bound_pod_from_object, node_from_object
from dispatcher.controller.access.grants import QUOTA_SUBTREES
from dispatcher.controller.kube.client import Kube
from dispatcher.controller.kube.informer import Informer
from dispatcher.controller.operator import NODES, PODS
from dispatcher.controller.record.ownership import OwnerRef, Ownership, fetch_owner
from dispatcher.controller.record.status import APPWRAPPERS, EVENTS

log = logging.getLogger("dispatcher.manager")

Key = tuple[str, str]  # (namespace, name)
Obj = dict[str, Any]
#: Only the Events about AppWrappers: the worker sends no others.
EVENT_SELECTOR = {"field_selector": "involvedObject.kind=AppWrapper"}


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _item_uids(obj: Mapping[str, Any]) -> frozenset[str]:
    """The uids of the objects made for the AppWrapper, from its status (written by the
    worker's dispatcher alone)."""
    status = obj.get("status")
    items = status.get("wrappedItems") if isinstance(status, Mapping) else None
    return frozenset(str(i["uid"]) for i in items or ()
                     if isinstance(i, Mapping) and i.get("uid"))


class WorkerView:
    def __init__(self, name: str, kube: Kube, watch_seconds: int = 240,
                 resync_seconds: float = 600) -> None:
        self.name = name
        self.kube = kube
        self.state = ClusterState()
        #: Which pods are proven to be of which AppWrapper there (the controller's rule).
        self.ownership = Ownership()
        self._items: dict[Key, frozenset[str]] = {}  # per AppWrapper: its items' uids
        self._proving: asyncio.Task[None] | None = None
        self.copies: dict[Key, Obj] = {}  # the AppWrappers a manager made there
        self.everyone: dict[Key, Obj] = {}  # every AppWrapper there
        self.trees: dict[Key, Obj] = {}
        #: Events by the uid of the AppWrapper they are about, then by their own uid.
        self.events_by_object: dict[str, dict[str, Obj]] = {}
        self._event_object: dict[str, str] = {}  # event uid -> the uid it is about
        self.informers = [
            Informer(kube, resource, on_event, on_listed, watch_seconds=watch_seconds,
                     resync_seconds=resync_seconds, optional=resource is QUOTA_SUBTREES,
                     selectors=selectors, not_served=(403, 404))
            for resource, on_event, on_listed, selectors in (
                (NODES, self._on_node, self._nodes_listed, {}),
                (PODS, self._on_pod, self._pods_listed, {}),
                (APPWRAPPERS, self._on_wrapper, self._wrappers_listed, {}),
                (QUOTA_SUBTREES, self._on_tree, self._trees_listed, {}),
                (EVENTS, self._on_event, self._events_listed, EVENT_SELECTOR),
            )]
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ reading
    @property
    def subtrees(self) -> list[Obj]:
        return list(self.trees.values())

    @property
    def wrappers(self) -> list[Obj]:
        return list(self.everyone.values())

    def events_of(self, uid: str) -> list[Obj]:
        """The Events about the object of this uid."""
        return list(self.events_by_object.get(uid, {}).values())

    def bound(self, namespace: str, wrapper: str) -> int:
        """The wrapper's pods bound to a node there and not finished."""
        return len(self.state.bound_pods_of((namespace, wrapper)))

    def blind_reason(self) -> str | None:
        """Why this view may be out of date (a watch down), or None. Without for how long:
        it becomes the WorkerCluster's status message, and the manager counts the time
        itself (since when the worker stopped answering)."""
        for informer in self.informers:
            why = informer.blind_cause()
            if why is not None:
                return why
        return None

    @property
    def listed(self) -> bool:
        return all(i.listed.is_set() for i in self.informers)

    # ------------------------------------------------------------------ running
    async def start(self, wait: float) -> None:
        """Start watching; wait up to `wait` seconds for the first listings (or their
        first failures: a worker that does not answer does not hold the pass up)."""
        if not self._tasks:
            self._tasks = [asyncio.create_task(i.run(), name=f"{self.name}-{i.name}")
                           for i in self.informers]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(i.answered.wait() for i in self.informers)), wait)

    def retry_now(self) -> None:
        for informer in self.informers:
            if not informer.live:
                informer.retry_now()

    def prove(self) -> None:
        """Look up, in the background, the owners of the labelled pods not proven yet (a
        bounded number at a time, as the controller does); each pod proven then counts
        for its gang."""
        if self.ownership.unresolved == 0 or (
                self._proving is not None and not self._proving.done()):
            return
        self._proving = asyncio.create_task(self._prove(), name=f"{self.name}-owners")

    async def _prove(self) -> None:
        decided = await self.ownership.resolve(self._fetch)
        for key, owner in decided.items():
            pod = self.state.pod(key)
            if owner is not None and pod is not None:
                self.state.upsert_pod(key, dataclasses.replace(pod, appwrapper=owner[1]))

    async def _fetch(self, ref: OwnerRef) -> Mapping[str, Any] | None:
        return await fetch_owner(self.kube, ref)

    async def close(self) -> None:
        if self._proving is not None:
            self._tasks.append(self._proving)
            self._proving = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = []

    # ------------------------------------------------------------------ keeping it
    def _on_node(self, kind: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        if kind == "DELETED":
            self.state.remove_node(name)
        else:
            self.state.upsert_node(node_from_object(obj))

    def _nodes_listed(self, items: list[Obj]) -> None:
        listed = {str(n["metadata"]["name"]) for n in items}
        for name in set(self.state.nodes) - listed:
            self.state.remove_node(name)
        for n in items:
            self._on_node("ADDED", n)

    def _on_pod(self, kind: str, obj: Mapping[str, Any]) -> None:
        key = _key(obj)
        if kind == "DELETED":
            self.ownership.drop_pod(key)
            self.state.upsert_pod(key, None)
            return
        self.state.upsert_pod(key, self._proven(obj, bound_pod_from_object(obj)))

    def _proven(self, obj: Mapping[str, Any], pod: BoundPod | None) -> BoundPod | None:
        """The bound pod as it counts: for the AppWrapper its label claims only once its
        owner chain proves it (until then, and for good if it never does, for none)."""
        if pod is None or pod.appwrapper is None:
            return pod
        claimed = (pod.namespace, pod.appwrapper)
        if self.ownership.owner_of(obj, claimed) == claimed:
            return pod
        return dataclasses.replace(pod, appwrapper=None)

    def _pods_listed(self, items: list[Obj]) -> None:
        listed = {_key(p) for p in items}
        for pod in list(self.state.pods()):
            if (pod.namespace, pod.name) not in listed:
                self.ownership.drop_pod((pod.namespace, pod.name))
                self.state.remove_pod((pod.namespace, pod.name))
        for p in items:
            self._on_pod("ADDED", p)

    def _on_wrapper(self, kind: str, obj: Mapping[str, Any]) -> None:
        key = _key(obj)
        if kind == "DELETED":
            self.everyone.pop(key, None)
            self.copies.pop(key, None)
            self._learn_items(key, frozenset())
            return
        self._learn_items(key, _item_uids(obj))
        self.everyone[key] = dict(obj)
        if MANAGER_UID_LABEL in ((obj.get("metadata") or {}).get("labels") or {}):
            self.copies[key] = dict(obj)
        else:
            self.copies.pop(key, None)

    def _wrappers_listed(self, items: list[Obj]) -> None:
        listed = {_key(w) for w in items}
        for key in [k for k in self._items if k not in listed]:
            self._learn_items(key, frozenset())
        self.everyone.clear()
        self.copies.clear()
        for w in items:
            self._on_wrapper("ADDED", w)

    def _learn_items(self, key: Key, uids: frozenset[str]) -> None:
        """The objects the worker's dispatcher created for the AppWrapper `key`, as its
        status records them: what proves a pod to be of its gang."""
        if self._items.get(key, frozenset()) == uids:
            return
        self.ownership.forget(key)
        for uid in sorted(uids):
            self.ownership.add_item(uid, key)
        if uids:
            self._items[key] = uids
        else:
            self._items.pop(key, None)

    def _on_tree(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self.trees.pop(_key(obj), None)
        else:
            self.trees[_key(obj)] = dict(obj)

    def _trees_listed(self, items: list[Obj]) -> None:
        self.trees = {_key(t): t for t in items}

    def _on_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        about = self._event_object.pop(uid, None)
        if about is not None:
            held = self.events_by_object.get(about, {})
            held.pop(uid, None)
            if not held:
                self.events_by_object.pop(about, None)
        if kind == "DELETED" or not uid:
            return
        about = str((obj.get("involvedObject") or {}).get("uid") or "")
        self._event_object[uid] = about
        self.events_by_object.setdefault(about, {})[uid] = dict(obj)

    def _events_listed(self, items: list[Obj]) -> None:
        self.events_by_object.clear()
        self._event_object.clear()
        for e in items:
            self._on_event("ADDED", e)

