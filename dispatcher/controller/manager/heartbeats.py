"""The manager's heartbeat in each worker: a Lease it renews in every pass in which the
worker answers, and between passes while one runs long, naming the fence's grace
(dispatcher.fleet.fence says what the worker's dispatcher does with it).

The manager measures its own requeue grace from the last renewal the worker acknowledged,
on its own clock: the worker saw that renewal no sooner than it landed, so it stops the
copies (after the fence's grace, half the requeue grace) before the manager sends them
elsewhere (after the whole grace).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime

from dispatcher.controller.kube.client import ApiError
from dispatcher.controller.kube.lease import LEASES
from dispatcher.fleet.fence import LEASE_NAME, LEASE_NAMESPACE, fence_grace

from .workers import WorkerLink, ensure_namespace

log = logging.getLogger("dispatcher.manager")

HOLDER = "dispatcher-manager"


class Heartbeats:
    def __init__(self, grace: float, clock: Callable[[], float],
                 wall: Callable[[], float]) -> None:
        #: What the Lease says (whole seconds, rounded down: never longer than the share).
        self.seconds = max(1, math.floor(fence_grace(grace)))
        self.clock = clock
        self.wall = wall
        #: Per worker: when it last acknowledged a renewal (the manager's monotonic clock).
        self.renewed_at: dict[str, float] = {}

    async def renew(self, link: WorkerLink) -> None:
        """Renew the heartbeat in the worker; one that cannot be renewed makes the worker
        count as not answering (its copies are not touched, its grace runs)."""
        body = {"spec": {"holderIdentity": HOLDER, "leaseDurationSeconds": self.seconds,
                         "renewTime": datetime.fromtimestamp(self.wall(), UTC).strftime(
                             "%Y-%m-%dT%H:%M:%S.%fZ")}}
        try:
            try:
                await link.kube.request("PATCH", LEASES.path(LEASE_NAMESPACE, LEASE_NAME), body,
                                        content_type="application/merge-patch+json")
            except ApiError as e:
                if e.status != 404:
                    raise
                await self._create(link, body)
        except ApiError as e:
            if link.reachable:
                log.warning("worker cluster %s: its heartbeat (Lease %s/%s) cannot be "
                            "renewed: %s", link.name, LEASE_NAMESPACE, LEASE_NAME, e)
            link.reachable = False
            link.problem = f"its heartbeat (Lease {LEASE_NAMESPACE}/{LEASE_NAME}) cannot " \
                           f"be renewed: {e}"
            return
        self.renewed_at[link.name] = self.clock()

    async def keep(self, links: Callable[[], Iterable[WorkerLink]], interval: float,
                   stop: asyncio.Event) -> None:
        """Until `stop`: every `interval`, renew where the pass has not for that long, in
        every worker the manager sees (its watches open), as a pass would. A pass may
        outlast the fence's grace (a thousand copies to make, on a loaded machine); the
        workers must not take the manager for gone while it works, nor for one slow
        answer to a renewal."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)
            now = self.clock()
            due = [link for link in links() if link.watching
                   and now - self.renewed_at.get(link.name, -math.inf) >= interval]
            # A link closed under it (its WorkerCluster changed) fails its renewal only.
            for link, result in zip(due, await asyncio.gather(
                    *(self.renew(link) for link in due), return_exceptions=True), strict=True):
                if isinstance(result, Exception):
                    log.debug("worker cluster %s: heartbeat between passes: %s", link.name,
                              result)

    async def _create(self, link: WorkerLink, body: Mapping[str, object]) -> None:
        lease = {"apiVersion": LEASES.api_version, "kind": "Lease",
                 "metadata": {"name": LEASE_NAME, "namespace": LEASE_NAMESPACE}, **body}
        try:
            await link.kube.request("POST", LEASES.path(LEASE_NAMESPACE), lease)
        except ApiError as e:
            if e.status != 404:
                raise
            await ensure_namespace(link.kube, LEASE_NAMESPACE)
            await link.kube.request("POST", LEASES.path(LEASE_NAMESPACE), lease)
