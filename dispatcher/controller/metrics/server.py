"""/metrics and /healthz of `dispatcher run`, served with aiohttp on the event loop the
dispatcher runs on, so the gauges are read where they are written and nothing needs a
lock. Every handler returns without awaiting anything slow, except that with
``--metrics-auth kubernetes`` a new bearer token is first checked with the API server
(access/bearer.py: a grant is kept a minute, and new tokens are checked at most one a second).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from dispatcher.controller.dashboard.api import DashboardApi
from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.wording import span

from .prometheus import PrometheusObserver
from .visibility_api import VisibilityApi

log = logging.getLogger("dispatcher")

# /healthz fails when the admission loop has not finished a cycle for this long. The
# loop cycles at least every 5 s; a cycle waits for its API writes, which can be slow.
HEALTHY_CYCLE_AGE_SECONDS = 60.0


def exposition(registry: CollectorRegistry, accept: str) -> web.Response:
    """The registry's metrics in the format the scraper accepts."""
    encode, content_type = choose_encoder(accept)
    return web.Response(body=encode(registry), headers={"Content-Type": content_type})


class MetricsAuth(Protocol):
    async def check(self, authorization: str | None, path: str, source: str = ""
                    ) -> tuple[int, str] | None:
        """None if the request may read ``path``, else (HTTP status, reason); `source`:
        the client's address."""

    async def close(self) -> None: ...


class MetricsServer:
    """/metrics and /healthz on the running event loop. With ``auth``, /metrics answers
    only requests it lets through; /healthz stays open (the kubelet's probes carry no
    credentials, and it tells nothing about the cluster)."""

    # `dispatcher run --metrics-auth` sets this before the operator starts the server.
    default_auth: MetricsAuth | None = None

    def __init__(self, observer: PrometheusObserver, port: int, host: str = "0.0.0.0",
                 max_cycle_age: float = HEALTHY_CYCLE_AGE_SECONDS,
                 auth: MetricsAuth | None = None,
                 visibility: VisibilityApi | None = None,
                 dashboard: DashboardApi | None = None,
                 problem: Callable[[], str | None] = lambda: None,
                 dispatcher: Callable[[], Dispatcher | None] = lambda: None,
                 standby: Callable[[], str | None] = lambda: None) -> None:
        """`visibility`: the queue's visibility endpoint, served beside the metrics, and
        `dashboard` the web page (with the same authentication);
        `problem`: why start-up is stuck, if it is (the API server unreachable, a grant
        missing); `dispatcher`: the loop, once made; `standby`: what this replica waits
        for while another leads (a standby is healthy)."""
        self.observer = observer
        self.host = host
        self.port = port
        self.max_cycle_age = max_cycle_age
        self.auth = auth if auth is not None else MetricsServer.default_auth
        self.visibility = visibility
        self.dashboard = dashboard
        self.problem = problem
        self.dispatcher = dispatcher
        self.standby = standby
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        if self.visibility is not None:
            self.visibility.add_routes(app)
        if self.dashboard is not None:
            self.dashboard.add_routes(app)
        return app

    async def start(self) -> None:
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("serving /metrics and /healthz on %s", ", ".join(
            f"http://{h}:{p}" for h, p in self.addresses()))

    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) pairs listened on; the real port when started with port 0."""
        if self._runner is None:
            return []
        out = []
        for addr in self._runner.addresses:
            if isinstance(addr, tuple) and len(addr) >= 2:
                out.append((str(addr[0]), int(addr[1])))
        return out

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.auth is not None:
            await self.auth.close()
        if self.visibility is not None:
            await self.visibility.close()

    async def metrics(self, request: web.Request) -> web.Response:
        if self.auth is not None:
            refused = await self.auth.check(request.headers.get("Authorization"),
                                            request.path, request.remote or "")
            if refused is not None:
                return web.Response(status=refused[0], text=refused[1])
        return exposition(self.observer.registry, request.headers.get("Accept", ""))

    def health(self) -> tuple[bool, str]:
        d = self.dispatcher()
        if d is None or not d.ready:
            problem = self.problem()
            if problem is not None:
                return False, f"starting: {problem}"
            standby = self.standby()
            if d is None and standby is not None:
                return True, f"standby: {standby}"
            return False, "starting: the cluster is not listed yet"
        blind = d.blind()
        if blind is not None:
            return False, f"blind: {blind}; deciding nothing until the watch resumes"
        age = time.monotonic() - d.last_cycle_at
        if age > self.max_cycle_age:
            return False, (f"the admission loop has not finished a cycle for {span(age)} "
                           f"(limit {span(self.max_cycle_age)})")
        return True, f"ok: {d.cycles} admission cycles, the last {age:.1f}s ago"

    async def healthz(self, request: web.Request) -> web.Response:
        ok, text = self.health()
        return web.Response(status=200 if ok else 503, text=text + "\n")
