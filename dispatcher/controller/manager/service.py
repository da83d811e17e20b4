"""`dispatcher run --manager` as a service: its /metrics, /healthz and Clusters view
(/dashboard/), and, with `--leader-elect`, one of several replicas: only the holder of a
Lease in the manager cluster sends; the others wait for it (kube/lease.py, the
controller's rules).

A leader that cannot renew the Lease stops before another may take over, and its process
exits (its restart campaigns again). Nothing is sent twice across a hand-over: a wrapper
names its worker, fenced on its resourceVersion, before its copy is made, and the next
leader adopts the copies it finds (passes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from pathlib import Path

from dispatcher.controller.access.bearer import TokenReviewAuth
from dispatcher.controller.dashboard.clusters_api import ClustersApi
from dispatcher.controller.kube.client import Kube
from dispatcher.controller.kube.lease import LeaderElector
from dispatcher.controller.metrics.server import MetricsAuth

from . import clusters_facts
from .manager_metrics import ManagerMetrics, ManagerServer
from .passes import Manager, ManagerSettings
from .workers import counted

log = logging.getLogger("dispatcher.manager")

#: The exit status of a leader that lost its Lease: its restart campaigns again.
LOST_LEASE = 1


async def manage(settings: ManagerSettings, stop: asyncio.Event,
                 auth: MetricsAuth | None = None) -> int:
    kube = await Kube.connect(settings.kubeconfig)
    server = None
    elector: LeaderElector | None = None
    try:
        if settings.leader_election:
            # Its own connection: a renewal must not queue behind the pass's writes.
            elector = LeaderElector(await Kube.connect(settings.kubeconfig),
                                    settings.lease_namespace, settings.lease_name)
        with tempfile.TemporaryDirectory(prefix="dispatcher-workers-") as d:
            # Made before it leads, so that the Clusters view is served from the start
            # (a standby says so); it sends nothing until it runs.
            metrics = ManagerMetrics()
            manager = Manager(kube, settings, Path(d), link=counted(metrics.requests_to),
                              metrics=metrics)
            if settings.metrics_port:
                server = _server(manager, settings, auth, _standby(elector, settings))
                await server.start()
            if elector is not None and not await _lead(elector, stop):
                return 0
            return await _run(manager, elector, stop)
    finally:
        if elector is not None:
            await elector.release()
            await elector.kube.close()
        if server is not None:
            await server.stop()
        await kube.close()


def _server(manager: Manager, settings: ManagerSettings, auth: MetricsAuth | None,
            standby: ManagerServer.Standby) -> ManagerServer:
    """/metrics, /healthz and the Clusters view; the view checks every viewer's token
    with the manager cluster, whatever --metrics-auth says (as the controller's dashboard)."""
    viewers = TokenReviewAuth(lambda: Kube.connect(settings.kubeconfig))
    dashboard = ClustersApi(clusters_facts.source(manager, standby), viewers)
    return ManagerServer(manager.metrics, settings.metrics_port, settings.metrics_host,
                         auth=auth, standby=standby, dashboard=dashboard)


def _standby(elector: LeaderElector | None, settings: ManagerSettings
             ) -> ManagerServer.Standby:
    def standby() -> str | None:
        if elector is None or elector.leading:
            return None
        return f"waiting for Lease {settings.lease_namespace}/{settings.lease_name}"
    return standby


async def _lead(elector: LeaderElector, stop: asyncio.Event) -> bool:
    """Wait for the Lease; False when stopped first."""
    acquire = asyncio.create_task(elector.acquire())
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({acquire, stopped}, return_when=asyncio.FIRST_COMPLETED)
    for task in (acquire, stopped):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return elector.leading


async def _run(manager: Manager, elector: LeaderElector | None, stop: asyncio.Event) -> int:
    """Run the passes until stopped, or until the Lease is lost (then exit: a process that
    led keeps nothing a new campaign could trust)."""
    if elector is None:
        return await manager.run(stop)
    halt = asyncio.Event()
    keep = asyncio.create_task(elector.keep())
    stopped = asyncio.create_task(stop.wait())
    lost = asyncio.create_task(elector.lost.wait())
    passes = asyncio.create_task(manager.run(halt))
    await asyncio.wait({stopped, lost, passes}, return_when=asyncio.FIRST_COMPLETED)
    halt.set()
    status = await passes
    for task in (keep, stopped, lost):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    if elector.lost.is_set():
        log.error("the manager lost its Lease: exiting, so that its restart campaigns again")
        return LOST_LEASE
    return status
