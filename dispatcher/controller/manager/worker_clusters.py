"""The WorkerClusters registered in the manager cluster, as the manager keeps them: a link to
each (workers.py), made from its Secret's kubeconfig and made again when that changes; since
when each has not answered; and each one's status (reachable, and why not) written back
when it changes.

A WorkerCluster whose kubeconfig is refused keeps the link made from what it said before:
its copies stay reachable, and its status says what to fix.

An error reading or deciding about one worker (whatever it is: a pod asking more than a
count holds, an object the manager cannot read) is that worker's fault, never the pass's:
the pass records it here (`fault`), sends that worker nothing in that pass and goes on
with the others; the WorkerCluster's status says what failed until a pass goes without.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dispatcher.controller.kube.client import ApiError, Kube

from .workers import (
    SECRETS,
    WORKER_CLUSTERS,
    Connect,
    WorkerConfigError,
    WorkerLink,
    digest,
    kubeconfig_of,
    secret_reference,
)

log = logging.getLogger("dispatcher.manager")

#: The most a WorkerCluster's status says of why its kubeconfig is refused.
MAX_REFUSAL = 1000
#: The most a fault says of the error itself.
MAX_ERROR = 200
#: What a fault's status message adds (the words an administrator acts on).
NOTHING_SENT = "nothing is sent there until that is fixed; what was sent there stays"


def fault_message(stage: str, error: Exception) -> str:
    """What failed about a worker, in words: the step, the error, and for an amount no
    count holds, where to look."""
    text = f"{stage} failed ({type(error).__name__}: {str(error)[:MAX_ERROR]})"
    if isinstance(error, ArithmeticError):
        text += ("; an amount there is too large to count: look for a pod asking, or a node "
                 "offering, an enormous quantity of a resource")
    return text


class WorkerClusters:
    def __init__(self, kube: Kube, directory: Path, clock: Callable[[], float],
                 link: Connect) -> None:
        self.kube = kube
        self.directory = directory
        self.clock = clock
        self.connect = link
        self.links: dict[str, WorkerLink] = {}
        #: Per worker: since when it has not answered (its link made counts as a start).
        self.down_since: dict[str, float] = {}
        self._reported: dict[str, tuple[str, str]] = {}
        self._logged: dict[str, str] = {}
        #: Per worker: why what its WorkerCluster says now cannot be used (its status says).
        self.refused: dict[str, str] = {}
        #: Per worker: the versions of its WorkerCluster and Secret, and what they said.
        self._read: dict[str, tuple[tuple[str | None, str | None], bytes]] = {}
        #: Per worker: what failed about it in the last whole pass (its status says).
        self.faults: dict[str, str] = {}
        #: ... and in the pass under way.
        self.faults_now: dict[str, str] = {}

    def begin_pass(self) -> None:
        self.faults_now = {}

    def end_pass(self) -> None:
        """A whole pass: what failed in it is what the statuses say from now on (a worker
        that went a pass without a fault is cleared)."""
        self.faults = self.faults_now
        for name in self.links.keys() - self.faults.keys():
            self._logged.pop(f"fault {name}", None)  # told again if it comes back

    def fault(self, name: str, stage: str, error: Exception) -> None:
        """An error reading or deciding about worker `name`: it costs that worker only.
        Logged with its traceback when it is news."""
        what = fault_message(stage, error)
        self.faults_now.setdefault(name, what)
        if self._logged.get(f"fault {name}") != what:
            self._logged[f"fault {name}"] = what
            log.error("worker cluster %s: %s; %s", name, what, NOTHING_SENT, exc_info=error)

    async def sync(self) -> None:
        """A link for each WorkerCluster registered now; those no longer registered closed."""
        registered = {w["metadata"]["name"]: w for w in await self.kube.list(WORKER_CLUSTERS)}
        for name in set(self.links) - set(registered):
            log.info("worker cluster %s is no longer registered", name)
            await self.links.pop(name).close()
        self._read = {n: r for n, r in self._read.items() if n in registered}
        for name, worker in registered.items():
            try:
                namespace, secret_name, _ = secret_reference(worker)
                secret = await self.kube.request("GET", SECRETS.path(namespace, secret_name))
                kubeconfig = self._kubeconfig(worker, secret)
            except (WorkerConfigError, ApiError) as e:
                if name not in self.links:
                    self._once(name, f"worker cluster {name} cannot be used: {e}")
                if isinstance(e, WorkerConfigError):
                    # A link made from what it said before goes on: its copies stay
                    # reachable; the status says what to fix.
                    self.refused[name] = str(e)[:MAX_REFUSAL]
                continue
            self.refused.pop(name, None)
            link = self.links.get(name)
            labels = dict(worker["metadata"].get("labels") or {})
            if link is not None and link.secret_digest == digest(kubeconfig):
                link.labels = labels
                continue
            if link is not None:
                await link.close()
            self.links[name] = await self.connect(worker, kubeconfig, self.directory)
            self.down_since.setdefault(name, self.clock())
            log.info("worker cluster %s registered (server %s)", name,
                     self.links[name].kube.server)

    def _kubeconfig(self, worker: Mapping[str, Any], secret: Mapping[str, Any]) -> bytes:
        """The worker's kubeconfig, read again only when its WorkerCluster or Secret
        changed (checking it parses it: a cost every pass for nothing new)."""
        versions = (worker["metadata"].get("resourceVersion"),
                    secret["metadata"].get("resourceVersion"))
        name = worker["metadata"]["name"]
        read = self._read.get(name)
        if read is not None and read[0] == versions and versions != (None, None):
            return read[1]
        kubeconfig = kubeconfig_of(worker, secret)
        self._read[name] = (versions, kubeconfig)
        return kubeconfig

    def _once(self, key: str, message: str) -> None:
        if self._logged.get(key) != message:
            self._logged[key] = message
            log.warning("%s", message)

    async def answered(self, now: float, renewed_at: Mapping[str, float], passes: int) -> None:
        """The pass's answers: since when each worker has not answered, and each
        WorkerCluster's status written when it changed."""
        for name, link in self.links.items():
            if link.reachable:
                if self.down_since.pop(name, None) is not None:
                    # Its stale copies go in this same pass (Copying.delete_strays).
                    log.info("pass %d: worker cluster %s answers", passes, name)
            else:
                # The grace runs from the last renewal it acknowledged: the worker's fence
                # runs from when it saw that one, no sooner (heartbeats.py).
                self.down_since.setdefault(name, renewed_at.get(name, now))
            await self._report(link)
        for name in self.refused.keys() - self.links.keys():
            await self._write_report(name, ("False", self.refused[name]))

    async def _report(self, link: WorkerLink) -> None:
        """The WorkerCluster's status: reachable or not, and why; written when it changes."""
        message = link.problem[:300]
        fault = self.faults.get(link.name)
        if link.reachable and fault is not None:
            message = f"the manager cannot use what it holds: {fault}; {NOTHING_SENT}"
        if link.name in self.refused:
            message = (f"{self.refused[link.name]} (the kubeconfig it had before is "
                       f"used meanwhile)")
        await self._write_report(link.name, ("True" if link.reachable else "False", message))

    async def _write_report(self, name: str, status: tuple[str, str]) -> None:
        if self._reported.get(name) == status:
            return
        with contextlib.suppress(ApiError):
            await self.kube.request(
                "PATCH", WORKER_CLUSTERS.path(name=name, subresource="status"),
                {"status": {"reachable": status[0], "message": status[1]}},
                content_type="application/merge-patch+json")
            self._reported[name] = status

    async def close(self) -> None:
        """Every link's watches end, and its client."""
        for link in self.links.values():
            await link.close()
