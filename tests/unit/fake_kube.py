"""An in-memory stand-in for the API server, enough for the controller's runtime.

It stores objects by REST path, answers GET/POST/PATCH(merge)/DELETE with the status
codes the real one uses (404, 409), counts writes, and can be told to fail a request.
Cluster tests check the real thing; this lets the runtime's rules run in milliseconds.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dispatcher.controller.kube.client import ApiError, Resource

SERVED = {
    ("v1", "Pod"): ("pods", True), ("v1", "Node"): ("nodes", False),
    ("v1", "Event"): ("events", True), ("v1", "ConfigMap"): ("configmaps", True),
    ("batch/v1", "Job"): ("jobs", True),
    ("ray.io/v1", "RayCluster"): ("rayclusters", True),
    ("kubeflow.org/v1", "PyTorchJob"): ("pytorchjobs", True),
    ("workload.codeflare.dev/v1beta1", "AppWrapper"): ("appwrappers", True),
    ("coordination.k8s.io/v1", "Lease"): ("leases", True),
    ("apps/v1", "ReplicaSet"): ("replicasets", True),
    ("apps/v1", "Deployment"): ("deployments", True),
    ("v1", "Secret"): ("secrets", True),
    ("workload.codeflare.dev/v1beta1", "WorkerCluster"): ("workerclusters", False),
    ("quota.codeflare.dev/v1alpha1", "QuotaSubtree"): ("quotasubtrees", True),
}


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    """A JSON merge patch (RFC 7386): null removes, objects merge (into an empty one
    where there was none, so nulls inside them remove too), the rest replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping):
            if not isinstance(target.get(key), dict):
                target[key] = {}
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


@dataclass
class _Watch:
    select: tuple[Resource, str | None, str | None]
    queue: asyncio.Queue[dict[str, Any] | ApiError]
    seen: dict[str, dict[str, Any]]


class FakeKube:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.objects: dict[str, dict[str, Any]] = {}  # path -> object
        self.writes: list[tuple[str, str]] = []
        self.reads: list[str] = []
        self.deletes: list[tuple[str, Any]] = []  # (path, DeleteOptions) of each DELETE
        self.fail: dict[tuple[str, str], ApiError] = {}  # (method, path prefix) -> error
        # (method, path prefix) -> errors raised once each, in order, before answering.
        self.fail_next: dict[tuple[str, str], list[ApiError]] = {}
        # (method, path prefix) -> errors raised once each AFTER the request took effect
        # (a timeout whose request landed anyway).
        self.lost_answer: dict[tuple[str, str], list[ApiError]] = {}
        self.clock = clock
        self.queued_events = 0  # Events "waiting for a token" (the real client's backlog)
        # (method, path prefix) -> one entry per request held before it is sent (waiting
        # for the client's token), in order; later ones go through.
        self.unsent: dict[tuple[str, str], list[bool]] = {}
        # (method, path prefix): requests that never get an answer (a hung connection).
        self.hang: set[tuple[str, str]] = set()
        self.watches: list[_Watch] = []  # open watch streams
        self.listings: dict[str, dict[str, dict[str, Any]]] = {}  # version -> what it listed
        self._uids = itertools.count(1)
        self._versions = itertools.count(1)

    def _stamp(self, obj: dict[str, Any]) -> None:
        obj.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))

    # --- helpers for tests -------------------------------------------------------
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        res = self._resource_of(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{next(self._uids)}")
        meta.setdefault("generation", 1)
        meta.setdefault("creationTimestamp", datetime.fromtimestamp(
            self.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        path = res.path(meta.get("namespace"), meta["name"])
        self.objects[path] = copy.deepcopy(obj)
        self._stamp(self.objects[path])
        return self.objects[path]

    def get(self, api_version: str, kind: str, namespace: str | None, name: str
            ) -> dict[str, Any] | None:
        plural, namespaced = SERVED[(api_version, kind)]
        res = Resource(api_version, kind, plural, namespaced)
        return self.objects.get(res.path(namespace, name))

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects.values() if o.get("kind") == kind]

    def status_writes(self, name: str) -> int:
        return sum(1 for m, p in self.writes if m == "PATCH" and p.endswith(f"/{name}/status"))

    # --- the Kube interface ------------------------------------------------------
    async def resource(self, api_version: str, kind: str) -> Resource | None:
        served = SERVED.get((api_version, kind))
        return None if served is None else Resource(api_version, kind, *served)

    def knows(self, api_version: str) -> bool:
        return True  # what it answers may be out of date, as the real one's

    def forget(self, api_version: str) -> None:
        pass

    async def close(self) -> None:
        pass

    async def list(self, resource: Resource, label_selector: str | None = None,
                   namespace: str | None = None, field_selector: str | None = None
                   ) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for o in self._selected(resource, label_selector, namespace,
                                                         field_selector).values()]

    def _selected(self, resource: Resource, label_selector: str | None = None,
                  namespace: str | None = None, field_selector: str | None = None
                  ) -> dict[str, dict[str, Any]]:
        def field(o: dict[str, Any], dotted: str) -> Any:
            for part in dotted.split("."):
                o = o.get(part) or {} if isinstance(o, dict) else {}
            return o

        def selected(o: dict[str, Any]) -> bool:
            meta = o.get("metadata") or {}
            if namespace is not None and meta.get("namespace") != namespace:
                return False
            if field_selector:
                path, _, value = field_selector.partition("=")
                if field(o, path) != value:
                    return False
            if label_selector:
                key, eq, value = label_selector.partition("=")
                labels = meta.get("labels") or {}
                return (labels.get(key) == value) if eq else key in labels
            return True

        return {path: o for path, o in self.objects.items()
                if o.get("kind") == resource.kind and selected(o)}

    async def watch(self, resource: Resource, resource_version: str, timeout_seconds: int,
                    opened: Callable[[], None] | None = None, label_selector: str | None = None,
                    field_selector: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """A watch from a listing's version: `publish` sends it what changed since that
        listing (objects changed in place by a test included); `cut` ends it with an
        error. From any other version: 410 Gone (as after a compaction), so a watch cut
        short is resumed by listing again."""
        seen = self.listings.get(resource_version)
        if seen is None:
            raise ApiError(410, "Expired", f"too old resource version: {resource_version}")
        queue: asyncio.Queue[dict[str, Any] | ApiError] = asyncio.Queue()
        watch = _Watch((resource, label_selector, field_selector), queue, copy.deepcopy(seen))
        self.watches.append(watch)
        try:
            if opened is not None:
                opened()
            while True:
                item = await queue.get()
                if isinstance(item, ApiError):
                    raise item
                yield item
        finally:
            self.watches.remove(watch)

    def publish(self) -> None:
        """Send every open watch the objects added, changed and deleted since it last saw."""
        for watch in self.watches:
            resource, label_selector, field_selector = watch.select
            now = self._selected(resource, label_selector, None, field_selector)
            for path, obj in now.items():
                old = watch.seen.get(path)
                if old is not None and old != obj and old["metadata"].get(
                        "resourceVersion") == obj["metadata"].get("resourceVersion"):
                    self._stamp(obj)  # changed in place by a test: versioned as a write
                if old != obj:
                    watch.queue.put_nowait({"type": "ADDED" if old is None else "MODIFIED",
                                            "object": copy.deepcopy(obj)})
            for path in set(watch.seen) - set(now):
                watch.queue.put_nowait({"type": "DELETED", "object": watch.seen[path]})
            watch.seen = copy.deepcopy(now)

    def cut(self, error: ApiError) -> None:
        """Every open watch ends with `error` (its server stopped)."""
        for watch in self.watches:
            watch.queue.put_nowait(error)

    async def list_with_version(self, resource: Resource, label_selector: str | None = None,
                                namespace: str | None = None, field_selector: str | None = None
                                ) -> tuple[list[dict[str, Any]], str]:
        items = await self.list(resource, label_selector, namespace, field_selector)
        version = str(next(self._versions))
        # A watch from this version replays what changed since this listing.
        self.listings[version] = copy.deepcopy(self._selected(resource, label_selector,
                                                              namespace, field_selector))
        return items, version

    def queued(self, priority: int) -> int:
        return self.queued_events if priority == 2 else 0

    async def request(self, method: str, path: str, body: Any = None,
                      query: Mapping[str, str] | None = None,
                      content_type: str = "application/json", retry: bool = True,
                      priority: int = 0, on_send: Callable[[], None] | None = None) -> Any:
        for (m, prefix), held in self.unsent.items():
            if m == method and path.startswith(prefix) and held:
                held.pop(0)
                await asyncio.Event().wait()  # waits for a token that never comes
        if on_send is not None:
            on_send()
        for (m, prefix), error in self.fail.items():
            if m == method and path.startswith(prefix):
                raise error
        if any(m == method and path.startswith(prefix) for m, prefix in self.hang):
            await asyncio.Event().wait()
        for (m, prefix), errors in self.fail_next.items():
            if m == method and path.startswith(prefix) and errors:
                raise errors.pop(0)
        answer = self._answer(method, path, body)
        for (m, prefix), errors in self.lost_answer.items():
            if m == method and path.startswith(prefix) and errors:
                raise errors.pop(0)
        return answer

    def _answer(self, method: str, path: str, body: Any) -> Any:
        if method == "GET":
            self.reads.append(path)
            if path in self.objects:
                return copy.deepcopy(self.objects[path])
            raise ApiError(404, "NotFound", f"{path} not found")
        self.writes.append((method, path))
        if method == "POST":
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            if "generateName" in meta and "name" not in meta:
                meta["name"] = meta["generateName"] + f"{next(self._uids):05d}"
            full = f"{path}/{meta['name']}"
            if full in self.objects:
                raise ApiError(409, "AlreadyExists", f"{meta['name']} already exists")
            spec = obj.get("spec") or {}
            if obj.get("kind") == "Pod" and spec.get("nodeName") and spec.get("schedulingGates"):
                raise ApiError(422, "Invalid", f"Pod {meta['name']!r} is invalid: spec.nodeName: "
                               "Forbidden: cannot be set until all schedulingGates have been "
                               "cleared")
            meta["uid"] = f"uid-{next(self._uids)}"
            meta["creationTimestamp"] = datetime.fromtimestamp(
                self.clock(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self._stamp(obj)
            self.objects[full] = obj
            return copy.deepcopy(obj)
        if method == "PATCH":
            target_path = path.removesuffix("/status")
            if target_path not in self.objects:
                raise ApiError(404, "NotFound", f"{path} not found")
            target = self.objects[target_path]
            want_uid = (body.get("metadata") or {}).get("uid")
            if want_uid and want_uid != target["metadata"]["uid"]:
                raise ApiError(409, "Conflict", "uid precondition failed")
            want_version = (body.get("metadata") or {}).get("resourceVersion")
            if want_version and want_version != target["metadata"].get("resourceVersion"):
                raise ApiError(409, "Conflict", "the object has been modified")
            patch = {"status": body["status"]} if path.endswith("/status") else body
            merge(target, patch)
            self._stamp(target)
            return copy.deepcopy(target)
        if method == "PUT":
            if path not in self.objects:
                raise ApiError(404, "NotFound", f"{path} not found")
            current = self.objects[path]
            want = (body.get("metadata") or {}).get("resourceVersion")
            if want and want != current["metadata"].get("resourceVersion"):
                raise ApiError(409, "Conflict", "the object has been modified")
            obj = copy.deepcopy(body)
            obj["metadata"] = {**current["metadata"], **obj.get("metadata", {})}
            self._stamp(obj)
            self.objects[path] = obj
            return copy.deepcopy(obj)
        if method == "DELETE":
            self.deletes.append((path, copy.deepcopy(body)))
            if path not in self.objects:
                raise ApiError(404, "NotFound", f"{path} not found")
            want = ((body or {}).get("preconditions") or {}).get("uid")
            if want and want != self.objects[path]["metadata"]["uid"]:
                raise ApiError(409, "Conflict", "uid precondition failed")
            del self.objects[path]
            return {}
        raise AssertionError(f"unexpected {method} {path}")

    def _resource_of(self, obj: Mapping[str, Any]) -> Resource:
        key = (obj["apiVersion"], obj["kind"])
        plural, namespaced = SERVED[key]
        return Resource(key[0], key[1], plural, namespaced)
