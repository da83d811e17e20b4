"""A manager's links to its worker clusters: one API client each, from the kubeconfig in the
WorkerCluster's Secret, and the last look at the worker (nodes, pods, the copies it holds).

A look is a listing of the three, of the Events about AppWrappers there (mirrored to
the manager's wrappers), and of the worker's QuotaSubtrees and AppWrappers (its quota and
what its dispatcher counts against it: worker_quota.py); one that fails leaves the last
good look in place and counts the worker as unreachable from then on. The manager requeues
a worker's wrappers only once it has been unreachable for its grace period (manager.py).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatcher.api.labels import MANAGER_UID_LABEL
from dispatcher.cluster import ClusterState
from dispatcher.cluster.model import bound_pod_from_object, node_from_object

from .grants import QUOTA_SUBTREES
from .kube import ApiError, Kube, Resource, RetryPolicy
from .operator import NODES, PODS
from .status import APPWRAPPERS, EVENTS
from .worker_kubeconfig import INSTEAD, outside_references

log = logging.getLogger("dispatcher.manager")

WORKER_CLUSTERS = Resource("workload.codeflare.dev/v1beta1", "WorkerCluster", "workerclusters",
                           False)
SECRETS = Resource("v1", "Secret", "secrets", True)
NAMESPACES = Resource("v1", "Namespace", "namespaces", False)
#: A worker that does not answer must not hold the manager's loop up: a short budget.
WORKER_RETRY = RetryPolicy(first_delay=0.2, max_delay=1.0, budget=2.0, request_timeout=5.0)


#: Makes the link to a worker from its WorkerCluster and kubeconfig (`connect`; tests give
#: their own).
Connect = Callable[[Mapping[str, Any], bytes, Path], Awaitable["WorkerLink"]]


class WorkerConfigError(Exception):
    """A WorkerCluster the manager cannot use as written; the message says what to fix."""


@dataclass
class Look:
    """One consistent-enough look at a worker: what it runs and the copies it holds."""

    state: ClusterState
    pods: list[dict[str, Any]]
    copies: dict[tuple[str, str], dict[str, Any]]  # (namespace, name) -> AppWrapper
    events: list[dict[str, Any]] = field(default_factory=list)  # about AppWrappers
    subtrees: list[dict[str, Any]] = field(default_factory=list)  # its QuotaSubtrees
    wrappers: list[dict[str, Any]] = field(default_factory=list)  # every AppWrapper there


@dataclass
class WorkerLink:
    name: str
    labels: dict[str, str]
    kube: Kube
    secret_digest: str
    look: Look | None = None
    reachable: bool = False
    #: When the worker last answered (monotonic seconds); None: never yet.
    last_answer: float | None = None
    problem: str = ""
    _files: list[Path] = field(default_factory=list)
    _quota_unread: bool = False  # its QuotaSubtrees could not be listed (said once)

    async def refresh(self, now: float) -> None:
        try:
            nodes = await self.kube.list(NODES)
            pods = await self.kube.list(PODS)
            wrappers = await self.kube.list(APPWRAPPERS)
            events = await self.kube.list(EVENTS, field_selector="involvedObject.kind=AppWrapper")
            subtrees = await self._subtrees()
        except ApiError as e:
            if self.reachable:
                log.warning("worker cluster %s stopped answering: %s", self.name, e)
            self.reachable = False
            self.problem = str(e)
            return
        self.reachable, self.last_answer, self.problem = True, now, ""
        copies = {(c["metadata"]["namespace"], c["metadata"]["name"]): c for c in wrappers
                  if MANAGER_UID_LABEL in (c["metadata"].get("labels") or {})}
        self.look = Look(_state(nodes, pods), pods, copies, events, subtrees, wrappers)

    async def _subtrees(self) -> list[dict[str, Any]]:
        """The worker's QuotaSubtrees; none where their CRD is not installed, or where the
        kubeconfig's user may not list them (said once: the worker's own dispatcher still
        holds its gangs to its quota, but the manager may send it gangs that wait there)."""
        try:
            return await self.kube.list(QUOTA_SUBTREES)
        except ApiError as e:
            if e.status not in (403, 404):
                raise
            if e.status == 403 and not self._quota_unread:
                log.warning("worker cluster %s: its QuotaSubtrees cannot be listed (%s): its "
                            "quota is not counted; grant list on quotasubtrees "
                            "(deploy/examples/worker-access.yaml)", self.name, e)
            self._quota_unread = e.status == 403
            return []

    async def close(self) -> None:
        await self.kube.close()
        for f in self._files:
            f.unlink(missing_ok=True)


def _state(nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> ClusterState:
    state = ClusterState()
    for n in nodes:
        state.upsert_node(node_from_object(n))
    for p in pods:
        meta = p.get("metadata") or {}
        state.upsert_pod((meta.get("namespace", ""), meta.get("name", "")),
                         bound_pod_from_object(p))
    return state


def secret_reference(worker: Mapping[str, Any]) -> tuple[str, str, str]:
    """(namespace, name, key) of the WorkerCluster's kubeconfig Secret."""
    ref = (worker.get("spec") or {}).get("kubeconfigSecret") or {}
    name, namespace = ref.get("name"), ref.get("namespace")
    if not name or not namespace:
        raise WorkerConfigError(
            f"WorkerCluster {worker['metadata']['name']}: spec.kubeconfigSecret needs a name "
            "and a namespace (the Secret holding the worker's kubeconfig)")
    return str(namespace), str(name), str(ref.get("key") or "kubeconfig")


def kubeconfig_of(worker: Mapping[str, Any], secret: Mapping[str, Any]) -> bytes:
    namespace, name, key = secret_reference(worker)
    data = (secret.get("data") or {}).get(key)
    if not data:
        raise WorkerConfigError(
            f"WorkerCluster {worker['metadata']['name']}: Secret {namespace}/{name} has no "
            f"key {key!r}; put the worker's kubeconfig there")
    kubeconfig = base64.b64decode(data)
    refused = outside_references(kubeconfig)
    if refused:
        raise WorkerConfigError(
            f"WorkerCluster {worker['metadata']['name']}: the kubeconfig in Secret "
            f"{namespace}/{name} uses {', '.join(refused)}; {INSTEAD}")
    return kubeconfig


def digest(kubeconfig: bytes) -> str:
    return hashlib.sha256(kubeconfig).hexdigest()


async def connect(worker: Mapping[str, Any], kubeconfig: bytes, directory: Path) -> WorkerLink:
    """A link to the worker; the kubeconfig goes to a file only this process may read."""
    name = str(worker["metadata"]["name"])
    fd, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".kubeconfig", dir=directory)
    with os.fdopen(fd, "wb") as fh:
        fh.write(kubeconfig)
    kube = await Kube.connect(path, retry=WORKER_RETRY)
    return WorkerLink(name, dict(worker["metadata"].get("labels") or {}), kube,
                      digest(kubeconfig), _files=[Path(path)])


async def ensure_namespace(kube: Kube, namespace: str) -> None:
    """Make the namespace in the worker (one that exists already: nothing to do)."""
    with contextlib.suppress(ApiError):
        await kube.request("POST", NAMESPACES.path(),
                           {"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": namespace}})
