"""An in-memory API server for the webhook's tests: discovery, RBAC answers to
SubjectAccessReviews and TokenReviews, and plain objects (Secrets, webhook configurations)
with resourceVersions, JSON patches and conflicts as the real one has them. Cluster tests
(tests/cluster/test_tenancy.py) check the real thing."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping
from typing import Any

from dispatcher.controller.kube.client import ApiError, Resource

SERVED = {
    ("v1", "Pod"): ("pods", True), ("v1", "Service"): ("services", True),
    ("v1", "Namespace"): ("namespaces", False), ("v1", "Secret"): ("secrets", True),
    ("batch/v1", "Job"): ("jobs", True), ("apps/v1", "Deployment"): ("deployments", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): ("clusterroles", False),
    ("kubeflow.org/v1", "PyTorchJob"): ("pytorchjobs", True),
}


def apply_json_patch(obj: Any, patch: list[dict[str, Any]]) -> Any:
    """The subset of RFC 6902 the webhook and the certificate code use."""
    obj = copy.deepcopy(obj)
    for op in patch:
        *parents, last = [p.replace("~1", "/").replace("~0", "~")
                          for p in op["path"].split("/")[1:]]
        target = obj
        for p in parents:
            target = target[int(p)] if isinstance(target, list) else target[p]
        key: Any = int(last) if isinstance(target, list) else last
        if op["op"] == "add":
            target[key] = op["value"]
        elif op["op"] == "remove":
            del target[key]
        elif op["op"] == "test":
            if target[key] != op["value"]:
                raise ApiError(422, "Invalid", f"test of {op['path']} failed")
        else:
            raise AssertionError(f"unexpected op {op}")
    return obj


class FakeApi:
    def __init__(self, rights: Mapping[str, set[str]] | None = None,
                 tokens: Mapping[str, dict[str, Any]] | None = None) -> None:
        # subject (user name, or "group:NAME") -> what it may create ("jobs.batch", "pods",
        # or a non-resource path such as "/metrics" it may get), or another verb on one
        # named resource, as an RBAC rule says it: "use quota.codeflare.dev quotasubtrees
        # quota_gpu:gold", "use workload.codeflare.dev appwrappers/priority 1000"; "*" is
        # everything (a cluster-admin)
        self.rights = {k: set(v) for k, v in (rights or {}).items()}
        self.tokens = dict(tokens or {})
        self.served = dict(SERVED)
        self.reviews: list[dict[str, Any]] = []
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.fail: dict[tuple[str, str], ApiError] = {}
        self.forgotten: list[str] = []
        self.before_write: Any = None  # called before a PUT (to simulate a race)
        self._versions = itertools.count(1)

    # --- discovery ---------------------------------------------------------------
    async def resource(self, api_version: str, kind: str) -> Resource | None:
        served = self.served.get((api_version, kind))
        return None if served is None else Resource(api_version, kind, *served)

    def knows(self, api_version: str) -> bool:
        return True  # what it answers may be out of date, as the real one's

    def forget(self, api_version: str) -> None:
        self.forgotten.append(api_version)

    async def close(self) -> None:
        pass

    # --- requests ----------------------------------------------------------------
    def put(self, path: str, obj: dict[str, Any]) -> None:
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
        self.objects[path] = obj

    def allowed(self, spec: Mapping[str, Any]) -> bool:
        subjects = [spec.get("user"), *(f"group:{g}" for g in spec.get("groups") or [])]
        if "resourceAttributes" in spec:
            attrs = spec["resourceAttributes"]
            want = attrs["resource"] + (f".{attrs['group']}" if attrs["group"] else "")
            wants = {want}
            if attrs["verb"] != "create":
                # A grant by name ("use quota.codeflare.dev quotasubtrees tree:node"), or
                # a verb on a resource in a namespace ("list appwrappers.… in a").
                resource = "/".join(filter(None, (attrs["resource"], attrs.get("subresource"))))
                where = f" in {attrs['namespace']}" if attrs.get("namespace") else ""
                wants = {f"{attrs['verb']} {attrs['group']} {resource} {attrs.get('name', '')}",
                         f"{attrs['verb']} {want}{where}"}
                # A right in every namespace (a ClusterRoleBinding) is a right in each.
                wants.add(f"{attrs['verb']} {want}")
        else:
            wants = {spec["nonResourceAttributes"]["path"]}
        return any(bool(wants & (rights := self.rights.get(str(s), set()))) or "*" in rights
                   for s in subjects)

    async def list(self, resource: Resource, label_selector: str | None = None,
                   namespace: str | None = None) -> list[dict[str, Any]]:
        """Every stored object of the kind (no selectors); 404 when it is not served."""
        if (resource.api_version, resource.kind) not in self.served:
            raise ApiError(404, "NotFound", f"the server could not find {resource.plural}")
        path = resource.path(namespace)
        self.requests.append(("GET", path))
        for (m, prefix), error in self.fail.items():
            if m == "GET" and path.startswith(prefix):
                raise error
        return [copy.deepcopy(o) for o in self.objects.values()
                if o.get("kind") == resource.kind]

    async def request(self, method: str, path: str, body: Any = None,
                      query: Mapping[str, str] | None = None,
                      content_type: str = "application/json") -> Any:
        self.requests.append((method, path))
        for (m, prefix), error in self.fail.items():
            if m == method and path.startswith(prefix):
                raise error
        if method == "POST" and path.endswith("/subjectaccessreviews"):
            self.reviews.append(body)
            return {**body, "status": {"allowed": self.allowed(body["spec"])}}
        if method == "POST" and path.endswith("/tokenreviews"):
            user = self.tokens.get(body["spec"]["token"])
            status = {"authenticated": True, "user": user} if user else \
                {"authenticated": False}
            return {**body, "status": status}
        if method == "GET":
            if path not in self.objects:
                raise ApiError(404, "NotFound", f"{path} not found")
            return copy.deepcopy(self.objects[path])
        if method == "POST":
            full = f"{path}/{body['metadata']['name']}"
            if full in self.objects:
                raise ApiError(409, "AlreadyExists", "already exists")
            self.put(full, body)
            return copy.deepcopy(self.objects[full])
        if method == "PUT":
            if self.before_write is not None:
                self.before_write()
            current = self.objects.get(path)
            if current is None:
                raise ApiError(404, "NotFound", f"{path} not found")
            if body["metadata"].get("resourceVersion") != \
                    current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", "the object has been modified")
            self.put(path, body)
            return copy.deepcopy(self.objects[path])
        if method == "PATCH" and content_type == "application/json-patch+json":
            if path not in self.objects:
                raise ApiError(404, "NotFound", f"{path} not found")
            self.put(path, apply_json_patch(self.objects[path], body))
            return copy.deepcopy(self.objects[path])
        raise AssertionError(f"unexpected {method} {path}")
