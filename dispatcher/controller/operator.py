"""`dispatcher run`: wiring. Leader election, then informers feed the Dispatcher.

The process waits for the Lease (when leader election is on), lists nodes, then
AppWrappers, then pods — in that order, so every AppWrapper's recorded items are known
before its pods are checked against them — hands each listing to the dispatcher, and
only then starts the admission loop. The informers keep memory current from there on
(kube/informer.py); the loop decides nothing while any of them is blind.

Why not kopf: the dispatcher needs to know when a listing is complete (to drop what
vanished during a watch gap) and when a watch is down (to stop deciding); kopf's watch
streams hide both.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dispatcher.admission import NO_TOPOLOGY, Fit
from dispatcher.controller.access.grants import QUOTA_SUBTREES
from dispatcher.controller.kube.client import Kube, Resource
from dispatcher.controller.kube.informer import Informer
from dispatcher.controller.kube.leader_pod import own_pod, step_down, take_lead
from dispatcher.controller.kube.lease import LeaderElector
from dispatcher.controller.kube.startup import (
    Late,
    Stopped,
    Trouble,
    reach,
    stop_on_signals,
    within,
)
from dispatcher.controller.loop.estimate_round import EstimateSettings
from dispatcher.controller.loop.runtime import APPWRAPPERS, Dispatcher, Observer
from dispatcher.controller.pods.pod_pinning import Pins
from dispatcher.fit.topology import Topology
from dispatcher.kinds.scope import DEFAULT_ALLOWED_KINDS, GroupKind
from dispatcher.lifecycle import DEFAULT_TIMING, Timing
from dispatcher.queue import Policy
from dispatcher.wording import counted, span

if TYPE_CHECKING:
    from dispatcher.controller.metrics.prometheus import PrometheusObserver
    from dispatcher.controller.metrics.server import MetricsServer

log = logging.getLogger("dispatcher")

NODES = Resource("v1", "Node", "nodes", False)
PODS = Resource("v1", "Pod", "pods", True)

EXIT_LOST_LEADERSHIP = 3
EXIT_NOT_STARTED = 4  # --startup-deadline passed


@dataclass
class Settings:
    policy: Policy
    fit: Fit = "per-node"
    kubeconfig: str | None = None
    metrics_port: int = 0
    metrics_host: str = "0.0.0.0"
    timing: Timing = DEFAULT_TIMING
    qps: float = 1000.0
    burst: int = 1000
    resync_seconds: float = 600.0
    leader_election: bool = False
    lease_namespace: str = "default"
    lease_name: str = "dispatcher"
    watch_seconds: int = 240
    allowed_kinds: Collection[GroupKind] = DEFAULT_ALLOWED_KINDS
    require_creator: bool = False
    estimates: EstimateSettings = field(default_factory=EstimateSettings)
    pin_pods: bool = True
    topology: Topology = NO_TOPOLOGY  # the topology levels (fit.topology)
    # The pod webhook is served beside the controller (`run --webhook-port`): it pins with
    # this process's memory (`Operator.pins`) once the loop runs.
    pod_webhook: bool = False
    leave_kueue_labelled: bool = False  # api/management.py
    # Give up when start-up (the API server reached, the grants there, the first lists)
    # has not finished after this many seconds; 0: retry for as long as it takes.
    startup_deadline: float = 0.0
    # The metrics, when made before the operator (`run --webhook-port`: the webhook's
    # requests are measured in the same registry); else the operator makes them.
    observer: PrometheusObserver | None = None


class Operator:
    """One dispatcher process: metrics, leadership, informers, the loop."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.dispatcher: Dispatcher | None = None
        self.informers: list[Informer] = []
        self.elector: LeaderElector | None = None
        self.metrics_server: MetricsServer | None = None
        # While this replica waits for the Lease: what it waits for (a standby is healthy).
        self.standby: str | None = None
        self._pins: Pins | None = None
        # Without a deadline it retries for as long as it takes, as a controller should:
        # the first warning says so, and how to bound it.
        self.reaching = Trouble(log, "reaching the API server", retrying=(
            "retrying" if settings.startup_deadline else
            "retrying until it answers (--startup-deadline SECONDS gives up)"))
        self._tasks: list[asyncio.Task[None]] = []

    def pins(self) -> Pins | None:
        """What the pod webhook pins with: None until this process leads and its loop
        runs, and once it stops."""
        return self._pins

    def blind(self) -> str | None:
        for informer in self.informers:
            reason = informer.blind_reason()
            if reason is not None:
                return reason
        return None

    def problem(self) -> str | None:
        """Why start-up is stuck, while a step of it fails (for /healthz)."""
        if self.reaching.current is not None:
            return self.reaching.current  # it says "cannot reach the API server" itself
        troubles = [*([self.elector.trouble] if self.elector else []),
                    *(i.trouble for i in self.informers)]
        return next((f"{t.what}: {t.current}" for t in troubles if t.current is not None),
                    None)

    def _metrics(self) -> PrometheusObserver | None:
        """What /metrics will say (None: no metrics port), before anything is served: the
        API client reports its requests to it from the first."""
        s = self.settings
        if not s.metrics_port:
            return None
        from dispatcher.controller.metrics.prometheus import PrometheusObserver

        return s.observer or PrometheusObserver(topology_levels=s.topology.levels)

    async def _serve_metrics(self, metrics: PrometheusObserver | None) -> Observer | None:
        s = self.settings
        if metrics is None:
            return None
        from dispatcher.controller.access.bearer import TokenReviewAuth
        from dispatcher.controller.dashboard.api import DashboardApi
        from dispatcher.controller.metrics.server import MetricsServer
        from dispatcher.controller.metrics.visibility_api import VisibilityApi

        # The queue as this process numbers it, to users RBAC lets list AppWrappers: as
        # data, and as a web page (one token check serves both).
        auth = TokenReviewAuth(lambda: Kube.connect(s.kubeconfig))
        visibility = VisibilityApi(lambda: self.dispatcher, auth)
        server = MetricsServer(metrics, s.metrics_port, s.metrics_host,
                               visibility=visibility,
                               dashboard=DashboardApi(lambda: self.dispatcher, auth),
                               problem=self.problem,
                               dispatcher=lambda: self.dispatcher,
                               standby=lambda: self.standby)
        await server.start()
        self.metrics_server = server
        observer: Observer = server.observer
        return observer

    async def run(self, stop: asyncio.Event) -> int:
        s = self.settings
        metrics = self._metrics()
        requests = None if metrics is None else metrics.requests
        # First, before anything is served: a missing kubeconfig ends the process.
        kube = await Kube.connect(s.kubeconfig, qps=s.qps, burst=s.burst, observer=requests)
        try:
            observer = await self._serve_metrics(metrics)
            try:
                d = await within(self._start(kube, observer), stop, s.startup_deadline,
                                 lambda: self.standby is not None)
            except Stopped:
                log.info("stopped before start-up finished")
                return 0
            except Late:
                log.error("not started after %s (--startup-deadline): %s; giving up",
                          span(s.startup_deadline), self.problem() or "start-up unfinished")
                return EXIT_NOT_STARTED
            waits = [asyncio.ensure_future(stop.wait())]
            if self.elector is not None:
                waits.append(asyncio.ensure_future(self.elector.lost.wait()))
                self._tasks.append(asyncio.create_task(self.elector.keep()))
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            lost = self.elector is not None and self.elector.lost.is_set()
            await self._stop(d)
            if lost:
                log.error("leadership lost: exiting so that a fresh process campaigns")
                return EXIT_LOST_LEADERSHIP
            if self.elector is not None:
                await self.elector.release()
            return 0
        finally:
            for task in self._tasks:
                task.cancel()
            await kube.close()
            if self.elector is not None:
                await self.elector.kube.close()
            if self.metrics_server is not None:
                await self.metrics_server.stop()

    async def _start(self, kube: Kube, observer: Observer | None) -> Dispatcher:
        """Everything before the loop runs: each step waits for the API server and the
        grants it needs, saying what is missing (log, /healthz)."""
        s = self.settings
        await reach(kube, self.reaching)
        pod = own_pod() if s.pod_webhook else None
        if pod is not None:
            await step_down(kube, pod)
        if s.leader_election:
            # Its own connections, not paced: a renewal queued behind a burst of item
            # creations (the client's token bucket, a pool of busy connections) missed
            # its deadline and a new leader stepped down 15 s after taking over.
            requests = None if self.metrics_server is None else \
                self.metrics_server.observer.requests
            self.elector = LeaderElector(await Kube.connect(s.kubeconfig, observer=requests),
                                         s.lease_namespace, s.lease_name)
            self.standby = f"waiting for Lease {s.lease_namespace}/{s.lease_name}"
            await self.elector.acquire()
        d = Dispatcher(kube, s.policy, s.fit, observer=observer, timing=s.timing,
                       allowed_kinds=s.allowed_kinds, require_creator=s.require_creator,
                       estimates=s.estimates, pin_pods=s.pin_pods, topology=s.topology,
                       blind=self.blind, leave_kueue_labelled=s.leave_kueue_labelled)
        self.dispatcher = d
        self.standby = None
        await self._start_informers(d, kube)
        d.start()
        if s.pod_webhook:
            self._pins = pins_of(d)
            if pod is not None:
                await take_lead(kube, pod)
        log.info("dispatcher ready: policy %s, %s fit, %s, %s", s.policy.name, s.fit,
                 counted(len(d.state.nodes), "node"), counted(len(d.tracked), "AppWrapper"))
        return d

    async def _start_informers(self, d: Dispatcher, kube: Kube) -> None:
        s = self.settings
        for resource, on_event in ((NODES, d.on_node), (APPWRAPPERS, d.on_appwrapper),
                                   (PODS, d.on_pod), (QUOTA_SUBTREES, d.on_quota)):
            informer = Informer(kube, resource, on_event,
                                functools.partial(d.relisted, resource.kind),
                                watch_seconds=s.watch_seconds,
                                resync_seconds=s.resync_seconds,
                                optional=resource is QUOTA_SUBTREES)
            self.informers.append(informer)
            self._tasks.append(asyncio.create_task(informer.run(),
                                                   name=f"informer-{resource.plural}"))
            await informer.listed.wait()

    async def _stop(self, d: Dispatcher) -> None:
        self._pins = None
        await d.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()


def pins_of(d: Dispatcher) -> Pins:
    """What the pod webhook pins with while `d` leads."""
    return Pins(d.memory, d.pod_placer, lambda: d.unfit, lambda: d.ready and d.blind() is None)


async def operate(settings: Settings,
                  stop_flag: asyncio.Event | threading.Event | None = None,
                  operator: Operator | None = None) -> int:
    """Run until SIGTERM/SIGINT (or `stop_flag`) `operator` (by default, one made of
    `settings`); the exit status. Raises KubeconfigError, before anything starts, when
    there is no configuration to use."""
    stop = stop_on_signals(stop_flag if isinstance(stop_flag, asyncio.Event) else None)
    watcher: asyncio.Task[None] | None = None
    if isinstance(stop_flag, threading.Event):
        flag = stop_flag

        async def poll() -> None:
            while not flag.is_set():
                await asyncio.sleep(0.2)
            stop.set()

        watcher = asyncio.create_task(poll())
    try:
        return await (operator or Operator(settings)).run(stop)
    finally:
        if watcher is not None:
            watcher.cancel()
