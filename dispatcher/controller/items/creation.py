"""Creating and removing the wrapped objects of an AppWrapper, and reading their outcome.

Never half a job, never a second copy, never someone else's object:
- names are fixed before creation (items.prepared_items), so creating again after a
  crash or a timed-out request finds the first copy (409) instead of making another;
- an object that already exists is adopted only if it is provably ours: its uid is
  recorded in the AppWrapper's status, or it names this AppWrapper as its owner AND was
  created after this dispatch (an object planted before the dispatch, with a forged
  owner reference, is refused);
- a transient API failure (429, 5xx, timeout) is never a verdict: the step is retried
  on a later cycle; only an answer that will not change (403, 422, a kind that is not
  served, a foreign object) fails the AppWrapper.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispatcher.api.models import WrappedItem
from dispatcher.controller.kube.client import ApiError, Kube, Resource
from dispatcher.controller.record.ownership import OwnerRef, Ownership, fetch_owner
from dispatcher.controller.record.tracked import Tracked
from dispatcher.kinds.completion import Outcome, item_outcome, wrapper_outcome

from .scaling import sized_items
from .shaping import gate_pods, owned_by, pod_paths, prepared_items

log = logging.getLogger("dispatcher")

# creationTimestamp has whole seconds and comes from the API server's clock.
CLOCK_SLACK_SECONDS = 2.0


@dataclass(frozen=True)
class Refused:
    """The API server's final answer: the AppWrapper cannot be created as written."""

    message: str


@dataclass(frozen=True)
class Waiting:
    """A copy from an earlier dispatch is still being deleted: try again shortly."""


@dataclass(frozen=True)
class ItemsRead:
    """What the wrapped objects say: their outcome, and those that are gone ("Kind
    'name'" each) although every item was made."""

    outcome: Outcome | None
    missing: tuple[str, ...] = ()


@dataclass(frozen=True)
class Made:
    """Every item exists. `fresh`: this call created them all (none was there before, so
    none can have an outcome yet)."""

    fresh: bool


def _created_at(obj: Mapping[str, Any]) -> float | None:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _left_by_predecessor(obj: Mapping[str, Any], t: Tracked) -> bool:
    """Owned by an earlier AppWrapper of this name (another uid): one that is gone, since
    names are unique, so the garbage collector removes the object."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(r, Mapping) and r.get("kind") == "AppWrapper"
               and r.get("name") == t.key[1] and r.get("uid") and r.get("uid") != t.uid
               and r.get("controller") for r in refs)


class Items:
    def __init__(self, kube: Kube, ownership: Ownership, pin: bool = False,
                 deleted: Callable[[Tracked], None] = lambda t: None) -> None:
        """`deleted(t)`: told once `t`'s objects were deleted (pods/leftovers.py watches the
        pods that are left)."""
        self.kube = kube
        self.ownership = ownership
        self.pin = pin  # pods made gated, let onto their planned nodes (pods/placement.py)
        self.deleted = deleted

    async def _resource(self, obj: Mapping[str, Any]) -> Resource | None:
        resource = await self.kube.resource(obj["apiVersion"], obj["kind"])
        if resource is None:
            self.kube.forget(obj["apiVersion"])  # its CRD may have been installed since
            resource = await self.kube.resource(obj["apiVersion"], obj["kind"])
        return resource

    def _ours(self, t: Tracked, existing: Mapping[str, Any]) -> bool:
        meta = existing.get("metadata") or {}
        recorded = t.item_uids().get((str(existing.get("kind", "")), str(meta.get("name"))))
        if recorded is not None:
            return recorded == meta.get("uid")
        if not owned_by(existing, t.uid):
            return False
        created = _created_at(existing)
        return created is not None and created >= t.dispatched_at - CLOCK_SLACK_SECONDS

    def _record(self, t: Tracked, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        if not uid:
            return
        self.ownership.add_item(uid, t.key)
        item = WrappedItem(apiVersion=str(obj.get("apiVersion", "")),
                           kind=str(obj.get("kind", "")), name=str(meta.get("name", "")),
                           uid=uid)
        if item not in t.status.wrappedItems:
            t.status.wrappedItems = [
                i for i in t.status.wrappedItems if (i.kind, i.name) != (item.kind, item.name)
            ] + [item]

    async def create(self, t: Tracked) -> Refused | Waiting | Made:
        """Create every item not there yet, adopt our own. Transient API failures raise
        (ApiError with ``transient``)."""
        assert t.aw is not None
        created = found = 0
        waiting = False
        recorded = t.item_uids()
        for index, obj in enumerate(sized_items(t)):
            if (obj["kind"], obj["metadata"]["name"]) in recorded:
                found += 1
                continue  # created by an earlier run: its uid is in the status
            if self.pin:
                gate_pods(obj, pod_paths(t.aw, index, obj))
            where = f"{obj['kind']} {obj['metadata']['name']!r}"
            resource = await self._resource(obj)
            if resource is None:
                return Refused(f"{where}: kind {obj['kind']} ({obj['apiVersion']}) is not "
                               "served by this cluster; install its CRD or operator, then "
                               "apply the AppWrapper again")
            if not resource.namespaced:
                return Refused(f"{where}: {obj['kind']} is cluster-scoped; an AppWrapper "
                               "may only wrap objects of its own namespace")
            try:
                answer = await self.kube.request("POST", resource.path(t.key[0]), obj)
                self._record(t, answer if isinstance(answer, Mapping) else {})
                created += 1
                continue
            except ApiError as e:
                if e.transient:
                    raise
                if e.status != 409:
                    return Refused(f"{where}: {e.message}")
            existing = await self._get(resource, t.key[0], obj["metadata"]["name"])
            if existing is None:
                raise ApiError(409, "Conflict", f"{where} exists and vanished: try again")
            if not self._ours(t, existing):
                if _left_by_predecessor(existing, t):
                    # The AppWrapper was deleted and applied again: what the old one made
                    # goes with it (the garbage collector), so wait for that.
                    waiting = True
                    continue
                return Refused(f"{where} already exists and does not belong to this "
                               "AppWrapper; rename the item or delete that object")
            if (existing.get("metadata") or {}).get("deletionTimestamp"):
                waiting = True  # a copy from a requeue is still being deleted
                continue
            self._record(t, existing)
            found += 1
        if created:
            log.info("%s/%s: created %d object(s)", *t.key, created)
        return Waiting() if waiting else Made(fresh=created > 0 and not found)

    async def _get(self, resource: Resource, namespace: str, name: str
                   ) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self.kube.request("GET", resource.path(namespace, name))
            return obj
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def _created(self, t: Tracked) -> list[tuple[str, str, str]]:
        """(apiVersion, kind, name) of what this AppWrapper may have created: what its
        status records (the items as admitted, even if the spec was edited since) and
        what its spec names now."""
        out = [(i.apiVersion, i.kind, i.name) for i in t.status.wrappedItems if i.apiVersion]
        if t.aw is not None:
            out += [(o["apiVersion"], o["kind"], o["metadata"]["name"])
                    for o in prepared_items(t.aw)]
        return list(dict.fromkeys(out))

    async def teardown(self, t: Tracked) -> None:
        """Delete every wrapped object this AppWrapper owns; pods follow through the
        garbage collector. Asked once per object: a pod stuck terminating never makes
        this loop. Transient failures raise, and the caller asks again later."""
        for api_version, kind, name in self._created(t):
            resource = await self.kube.resource(api_version, kind)
            if resource is None or not resource.namespaced:
                continue
            path = resource.path(t.key[0], name)
            try:
                existing = await self.kube.request("GET", path)
                if not owned_by(existing, t.uid):
                    continue
                if (existing.get("metadata") or {}).get("deletionTimestamp"):
                    continue
                await self.kube.request(
                    "DELETE", path, {"propagationPolicy": "Background",
                                     "preconditions": {"uid": existing["metadata"]["uid"]}})
            except ApiError as e:
                if e.status == 403:
                    # Without delete rights a leftover must not stop the status that
                    # tells the user what went wrong; the log says what is left behind.
                    log.warning("cannot delete %s %s for %s/%s: %s", kind, name, *t.key, e)
                    continue
                if e.status not in (404, 409):
                    raise
        t.status.wrappedItems = []
        self.ownership.forget(t.key)
        self.deleted(t)

    async def read(self, t: Tracked, indexes: Sequence[int]) -> ItemsRead:
        """The items at `indexes` as they are now: the outcome of those among them that
        report one (t.completable), and which of them are gone — not there, being
        deleted, or replaced by an object that is not ours. One not there or not ours
        counts as running for the outcome (not created yet, or being recreated)."""
        assert t.aw is not None
        outcomes: list[Outcome | None] = []
        missing: list[str] = []
        items = prepared_items(t.aw)
        for i in indexes:
            obj = items[i]
            resource = await self.kube.resource(obj["apiVersion"], obj["kind"])
            if resource is None:
                continue
            live = await self._get(resource, t.key[0], obj["metadata"]["name"])
            ours = live is not None and self._ours(t, live)
            if not ours or ((live or {}).get("metadata") or {}).get("deletionTimestamp"):
                missing.append(f"{obj['kind']} {obj['metadata']['name']!r}")
            if i in t.completable:
                completion = t.aw.spec.resources.GenericItems[i].completionstatus
                outcomes.append(item_outcome(live, completion) if live is not None and ours
                                else "running")
        return ItemsRead(wrapper_outcome(outcomes), tuple(missing))

    async def fetch_owner(self, ref: OwnerRef) -> Mapping[str, Any] | None:
        """An object in a pod's owner chain, or None if it does not exist."""
        return await fetch_owner(self.kube, ref)
