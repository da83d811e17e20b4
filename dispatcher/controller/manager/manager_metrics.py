"""The manager's metrics, per worker cluster, and its /metrics and /healthz.

One label set per registered WorkerCluster (label `cluster`); a worker no longer registered
loses its series, so the series stay bounded by the number of WorkerClusters.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dispatcher.controller.dashboard.clusters_api import ClustersApi
from dispatcher.controller.metrics.labels import OTHER, PREFIX, bounded
from dispatcher.controller.metrics.prometheus import CYCLE_BUCKETS
from dispatcher.controller.metrics.requests import VERBS
from dispatcher.controller.metrics.server import MetricsAuth, exposition
from dispatcher.wording import span

log = logging.getLogger("dispatcher.manager")


@dataclass(frozen=True)
class WorkerFigures:
    sent: int  # wrappers the manager has sent there, not finished
    reachable: bool
    free_gpus: int  # free now, less what the wrappers sent there still need


class ManagerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.clock = clock
        self.sent = Gauge(f"{PREFIX}_worker_wrappers_sent", "AppWrappers the manager has "
                          "sent to the worker cluster and that have not finished.",
                          ["cluster"], registry=r)
        self.reachable = Gauge(f"{PREFIX}_worker_reachable", "1 when every watch of the "
                               "worker cluster is open and the manager's heartbeat there was "
                               "renewed in its last pass, else 0.",
                               ["cluster"], registry=r)
        self.free_gpus = Gauge(f"{PREFIX}_worker_free_gpus", "GPUs free in the worker "
                               "cluster, less what the wrappers sent there still need.",
                               ["cluster"], registry=r)
        self.last_pass = Gauge(f"{PREFIX}_manager_last_pass_timestamp_seconds",
                               "When the manager last finished a pass, in seconds since the "
                               "epoch.", registry=r)
        self.pass_duration = Histogram(
            f"{PREFIX}_manager_pass_duration_seconds", "Time one pass over the worker "
            "clusters took, from its start to its last write (the next starts a period "
            "later).", buckets=CYCLE_BUCKETS, registry=r)
        self.worker_requests = Counter(
            f"{PREFIX}_worker_api_requests", "Requests the manager sent to the worker "
            "cluster's API server (each attempt; watches not counted), by verb.",
            ["cluster", "verb"], registry=r)
        self._known: set[str] = set()
        self.passed_at: float | None = None
        self.passes = 0
        self.unreachable: list[str] = []  # the workers not answering at the last pass

    def observe(self, workers: Mapping[str, WorkerFigures]) -> None:
        for gone in self._known - set(workers):
            for gauge in (self.sent, self.reachable, self.free_gpus):
                gauge.remove(gone)
            for verb in (*VERBS, OTHER):
                with contextlib.suppress(KeyError):
                    self.worker_requests.remove(gone, verb)
        self._known = set(workers)
        for name, f in workers.items():
            self.sent.labels(name).set(f.sent)
            self.reachable.labels(name).set(1 if f.reachable else 0)
            self.free_gpus.labels(name).set(f.free_gpus)
        self.last_pass.set(time.time())
        self.passed_at = self.clock()
        self.passes += 1
        self.unreachable = sorted(n for n, f in workers.items() if not f.reachable)

    def passed(self, seconds: float) -> None:
        self.pass_duration.observe(max(0.0, seconds))

    def requests_to(self, cluster: str) -> WorkerRequests:
        """What the link to the worker `cluster` tells of its requests."""
        return WorkerRequests(self.worker_requests, cluster)


@dataclass(frozen=True)
class WorkerRequests:
    """A worker link's request observer (kube.client.RequestObserver): counts them."""

    counter: Counter
    cluster: str

    def api_request(self, verb: str, status: int, seconds: float) -> None:
        self.counter.labels(self.cluster, bounded(verb, VERBS, OTHER)).inc()

    def api_paced(self, priority: int, seconds: float) -> None:
        pass


class ManagerServer:
    """/metrics and /healthz: healthy while passes finish within `max_age` seconds, or
    while standing by for the Lease. With `auth` (`--metrics-auth kubernetes`), /metrics
    answers only the requests it lets through; /healthz stays open (the kubelet's probes
    carry no credentials). With `dashboard`, the Clusters view at /dashboard/ (which
    checks every token itself, whatever `auth` is)."""

    #: What a replica waits for while another leads (None: it leads, or runs alone).
    Standby = Callable[[], str | None]

    def __init__(self, metrics: ManagerMetrics, port: int, host: str = "0.0.0.0",
                 max_age: float = 120.0, auth: MetricsAuth | None = None,
                 standby: Standby = lambda: None,
                 dashboard: ClustersApi | None = None) -> None:
        self.metrics = metrics
        self.port = port
        self.host = host
        self.max_age = max_age
        self.auth = auth
        self.standby = standby
        self.dashboard = dashboard
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        if self.dashboard is not None:
            self.dashboard.add_routes(app)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, self.host, self.port).start()
        self._runner = runner
        log.info("serving /metrics, /healthz%s on port %d",
                 "" if self.dashboard is None else " and /dashboard/", self.port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.auth is not None:
            await self.auth.close()
        if self.dashboard is not None:
            await self.dashboard.close()

    def health(self) -> tuple[bool, str]:
        standby = self.standby()
        if standby is not None:
            return True, f"standby: {standby}"
        m = self.metrics
        at = m.passed_at
        if at is None:
            return False, "starting: no pass over the worker clusters finished yet"
        age = m.clock() - at
        if age > self.max_age:
            return False, (f"the manager has not finished a pass for {span(age)} "
                           f"(limit {span(self.max_age)})")
        # A worker that does not answer is the worker's trouble, not the manager's: the
        # manager stays healthy (a restart would not help) and says which.
        workers = "" if not m.unreachable else \
            f"; not answering: {', '.join(m.unreachable[:10])}"
        return True, f"ok: {m.passes} passes, the last {age:.1f}s ago{workers}"

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.auth is not None:
            refused = await self.auth.check(request.headers.get("Authorization"),
                                            request.path)
            if refused is not None:
                return web.Response(status=refused[0], text=refused[1])
        return exposition(self.metrics.registry, request.headers.get("Accept", ""))

    async def _healthz(self, request: web.Request) -> web.Response:
        ok, text = self.health()
        return web.Response(status=200 if ok else 503, text=text)
