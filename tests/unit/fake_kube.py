"""An in-memory stand-in for the API server, enough for the controller's runtime.

It stores objects by REST path, answers GET/POST/PATCH(merge)/DELETE with the status
codes the real one uses (404, 409), counts writes, and can be told to fail a request.
Cluster tests check the real thing; this lets the runtime's rules run in milliseconds.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

from dispatcher.controller.kube import ApiError, Resource

SERVED = {
    ("v1", "Pod"): ("pods", True), ("v1", "Node"): ("nodes", False),
    ("v1", "Event"): ("events", True), ("v1", "ConfigMap"): ("configmaps", True),
    ("batch/v1", "Job"): ("jobs", True),
    ("ray.io/v1", "RayCluster"): ("rayclusters", True),
    ("kubeflow.org/v1", "PyTorchJob"): ("pytorchjobs", True),
    ("workload.codeflare.dev/v1beta1", "AppWrapper"): ("appwrappers", True),
}


def merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}  # path -> object
        self.writes: list[tuple[str, str]] = []
        self.fail: dict[tuple[str, str], ApiError] = {}  # (method, path prefix) -> error
        self._uids = itertools.count(1)

    # --- helpers for tests -------------------------------------------------------
    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        res = self._resource_of(obj)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", f"uid-{next(self._uids)}")
        meta.setdefault("generation", 1)
        path = res.path(meta.get("namespace"), meta["name"])
        self.objects[path] = copy.deepcopy(obj)
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

    def forget(self, api_version: str) -> None:
        pass

    async def close(self) -> None:
        pass

    async def list(self, resource: Resource, label_selector: str | None = None
                   ) -> list[dict[str, Any]]:
        return [copy.deepcopy(o) for o in self.objects.values()
                if o.get("kind") == resource.kind]

    async def request(self, method: str, path: str, body: Any = None,
                      query: Mapping[str, str] | None = None,
                      content_type: str = "application/json") -> Any:
        for (m, prefix), error in self.fail.items():
            if m == method and path.startswith(prefix):
                raise error
        if method == "GET":
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
            meta.setdefault("uid", f"uid-{next(self._uids)}")
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
            patch = {"status": body["status"]} if path.endswith("/status") else body
            merge(target, patch)
            return copy.deepcopy(target)
        if method == "DELETE":
            if path not in self.objects:
                raise ApiError(404, "NotFound", f"{path} not found")
            del self.objects[path]
            return {}
        raise AssertionError(f"unexpected {method} {path}")

    def _resource_of(self, obj: Mapping[str, Any]) -> Resource:
        key = (obj["apiVersion"], obj["kind"])
        plural, namespaced = SERVED[key]
        return Resource(key[0], key[1], plural, namespaced)
