"""kopf wiring: watches feed the Dispatcher; nothing else happens here.

Only stateless event handlers are used, so kopf writes nothing to the objects it
watches (no finalizers, no progress annotations): the dispatcher's own status is the
only state, and deleting an AppWrapper is never held up by the dispatcher.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

import kopf

from dispatcher.admission import Fit
from dispatcher.queue import Policy

from .kube import Kube
from .runtime import Dispatcher, Observer

log = logging.getLogger("dispatcher")


def make_registry() -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
        settings.peering.standalone = True
        settings.posting.enabled = False  # the dispatcher posts its own Events
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.networking.request_timeout = 60
        # Only three fixed resources are watched, cluster-wide: no need to observe CRDs
        # or namespaces, so the service account needs no permission on them.
        settings.scanning.disabled = True
        observer = await _serve_metrics(memo)
        kube = await Kube.connect(memo.kubeconfig)
        memo.dispatcher = Dispatcher(kube, memo.policy, memo.fit, observer=observer)
        if memo.metrics_server is not None:
            memo.metrics_server.dispatcher = memo.dispatcher
        await memo.dispatcher.start()
        log.info("dispatcher ready: policy %s, %s fit, %d node(s), %d AppWrapper(s)",
                 memo.policy.name, memo.fit, len(memo.dispatcher.state.nodes),
                 len(memo.dispatcher.tracked))

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        d: Dispatcher | None = getattr(memo, "dispatcher", None)
        if d is not None:
            await d.stop()
            await d.kube.close()
        server = getattr(memo, "metrics_server", None)
        if server is not None:
            await server.stop()

    @kopf.on.login(registry=registry)
    def login(memo: kopf.Memo, **kwargs: Any) -> Any:
        if memo.kubeconfig:
            os.environ["KUBECONFIG"] = memo.kubeconfig
            return kopf.login_with_kubeconfig(**kwargs)
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.event("", "v1", "nodes", registry=registry)
    async def node_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        memo.dispatcher.on_node(event["type"] or "ADDED", event["object"])

    @kopf.on.event("", "v1", "pods", registry=registry)
    async def pod_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        memo.dispatcher.on_pod(event["type"] or "ADDED", event["object"])

    @kopf.on.event("workload.codeflare.dev", "v1beta1", "appwrappers", registry=registry)
    async def appwrapper_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
        memo.dispatcher.on_appwrapper(event["type"] or "ADDED", event["object"])

    return registry


async def _serve_metrics(memo: kopf.Memo) -> Observer | None:
    """Start /metrics and /healthz once (the startup handler may be retried)."""
    if not memo.metrics_port:
        return None
    if memo.metrics_server is None:
        from .metrics import MetricsServer, PrometheusObserver

        server = MetricsServer(PrometheusObserver(), memo.metrics_port, memo.metrics_host)
        try:
            await server.start()
        except OSError as e:
            raise kopf.PermanentError(
                f"cannot serve metrics on {memo.metrics_host}:{memo.metrics_port}: {e}; "
                "choose another --metrics-port, or 0 to serve none") from e
        memo.metrics_server = server
    observer: Observer = memo.metrics_server.observer
    return observer


async def operate(policy: Policy, fit: Fit, kubeconfig: str | None,
                  liveness: str | None = None,
                  stop_flag: asyncio.Event | threading.Event | None = None,
                  metrics_port: int = 0, metrics_host: str = "0.0.0.0") -> None:
    """Run until stopped (a signal, or `stop_flag`). With `metrics_port`, serve
    Prometheus metrics on /metrics and the admission loop's health on /healthz."""
    memo = kopf.Memo(policy=policy, fit=fit, kubeconfig=kubeconfig,
                     metrics_port=metrics_port, metrics_host=metrics_host,
                     metrics_server=None)
    await kopf.operator(
        registry=make_registry(), clusterwide=True, memo=memo,
        liveness_endpoint=liveness, stop_flag=stop_flag,
    )
