"""A manager's links to its worker clusters: one API client each, from the kubeconfig in the
WorkerCluster's Secret, and what the manager knows of the worker (worker_view.py: its
nodes, pods, AppWrappers, QuotaSubtrees and the Events about AppWrappers, kept by watches).

A worker whose watches are not all open counts as unreachable (its view is kept as it was
last seen). The manager requeues a worker's wrappers only once it has been unreachable for
its grace period (passes.py).
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

from dispatcher.controller.kube.client import (
    ApiError,
    Kube,
    RequestObserver,
    Resource,
    RetryPolicy,
)

from .worker_kubeconfig import INSTEAD, outside_references
from .worker_view import WorkerView

log = logging.getLogger("dispatcher.manager")

WORKER_CLUSTERS = Resource("workload.codeflare.dev/v1beta1", "WorkerCluster", "workerclusters",
                           False)
SECRETS = Resource("v1", "Secret", "secrets", True)
NAMESPACES = Resource("v1", "Namespace", "namespaces", False)
#: A worker that does not answer must not hold the manager's loop up: a short budget.
WORKER_RETRY = RetryPolicy(first_delay=0.2, max_delay=1.0, budget=2.0, request_timeout=5.0)
#: How long the first pass with a worker waits for its first listings.
FIRST_LISTING_SECONDS = 5.0


#: Makes the link to a worker from its WorkerCluster and kubeconfig (`connect`; tests give
#: their own).
Connect = Callable[[Mapping[str, Any], bytes, Path], Awaitable["WorkerLink"]]


class WorkerConfigError(Exception):
    """A WorkerCluster the manager cannot use as written; the message says what to fix."""


@dataclass
class WorkerLink:
    name: str
    labels: dict[str, str]
    kube: Kube
    secret_digest: str
    #: What the manager knows of the worker, kept by watches; None until first listed.
    look: WorkerView | None = None
    reachable: bool = False
    #: When the worker last answered (monotonic seconds); None: never yet.
    last_answer: float | None = None
    problem: str = ""
    _files: list[Path] = field(default_factory=list)
    _view: WorkerView | None = None

    async def refresh(self, now: float) -> None:
        """Reachable while every watch of the worker is open; a cut one is tried again at
        once (once a pass: as often as the worker used to be listed)."""
        if self._view is None:
            self._view = WorkerView(self.name, self.kube)
            await self._view.start(FIRST_LISTING_SECONDS)
        view = self._view
        blind = view.blind_reason()
        if blind is None and view.listed:
            self.reachable, self.last_answer, self.problem = True, now, ""
            self.look = view
            view.prove()
            return
        if self.reachable:
            log.warning("worker cluster %s stopped answering: %s", self.name, blind)
        self.reachable = False
        self.problem = blind or "not listed yet"
        view.retry_now()

    @property
    def watching(self) -> bool:
        """Every watch of the worker open now (what makes it reachable at a pass)."""
        view = self._view
        return view is not None and view.listed and view.blind_reason() is None

    def retry_now(self) -> None:
        """Open the watches that are down now, without waiting for their back-off."""
        if self._view is not None:
            self._view.retry_now()

    async def close(self) -> None:
        if self._view is not None:
            await self._view.close()
        await self.kube.close()
        for f in self._files:
            f.unlink(missing_ok=True)


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


async def connect(worker: Mapping[str, Any], kubeconfig: bytes, directory: Path,
                  observer: RequestObserver | None = None) -> WorkerLink:
    """A link to the worker; the kubeconfig goes to a file only this process may read."""
    name = str(worker["metadata"]["name"])
    fd, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".kubeconfig", dir=directory)
    with os.fdopen(fd, "wb") as fh:
        fh.write(kubeconfig)
    kube = await Kube.connect(path, retry=WORKER_RETRY, observer=observer)
    return WorkerLink(name, dict(worker["metadata"].get("labels") or {}), kube,
                      digest(kubeconfig), _files=[Path(path)])


def counted(observer_of: Callable[[str], RequestObserver]) -> Connect:
    """`connect`, each worker's requests told to `observer_of(its name)`."""
    async def link(worker: Mapping[str, Any], kubeconfig: bytes, directory: Path
                   ) -> WorkerLink:
        name = str(worker["metadata"]["name"])
        return await connect(worker, kubeconfig, directory, observer_of(name))
    return link


async def ensure_namespace(kube: Kube, namespace: str) -> None:
    """Make the namespace in the worker (one that exists already: nothing to do)."""
    with contextlib.suppress(ApiError):
        await kube.request("POST", NAMESPACES.path(),
                           {"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": namespace}})
