"""The admission webhook's HTTPS server: ``dispatcher webhook``, or inside ``dispatcher run
--webhook-port``.

kube-apiserver POSTs an AdmissionReview to ``/mutate-appwrappers`` (creator annotations)
and ``/validate-appwrappers`` (spec, creator, RBAC per item, immutability); what is decided
is in admission_review.py. It POSTs a ConversionReview to ``/convert-appwrappers`` to have
AppWrappers converted between v1beta1 and v1beta2 (dispatcher.api.conversion).
``/healthz`` answers once a certificate is loaded. Inside ``dispatcher run`` it also serves
``/pin-pods``, the pod webhook that pins a gang's pod as it is created (pods/pod_pinning.py).

Certificates come from a Secret the webhook keeps itself (certs.py: made, rotated, and
the CA patched into its webhook configurations), or, with ``cert_dir``, from files that
something else keeps (cert-manager mounting its Secret there; nothing is patched then).
Either way they are looked at again every minute and reloaded when they changed, without
a restart: new connections get the new certificate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from dispatcher.api.fault_tolerance import DEFAULT_FAULT_TOLERANCE, FaultTolerance
from dispatcher.controller.access.creator import Access
from dispatcher.controller.kube.client import Kube
from dispatcher.controller.kube.startup import (
    Stopped,
    Trouble,
    reach,
    retry,
    stop_on_signals,
    until_stopped,
)
from dispatcher.controller.metrics.requests import RequestMetrics
from dispatcher.controller.metrics.server import exposition
from dispatcher.controller.pods.pod_pinning import PodPinning
from dispatcher.fit.topology import Topology
from dispatcher.kinds.scope import DEFAULT_ALLOWED_KINDS, GroupKind

from .admission_review import AppWrapperReview, ReviewAnswer
from .certs import SecretCertificates, service_hosts
from .conversions import MAX_REQUEST_BYTES, Conversions
from .manager_labels import default_managers

log = logging.getLogger("dispatcher.webhook")

MUTATE_PATH = "/mutate-appwrappers"
VALIDATE_PATH = "/validate-appwrappers"
# The CRD's conversion webhook: AppWrappers between v1beta1 and v1beta2.
CONVERT_PATH = "/convert-appwrappers"
PIN_PODS_PATH = "/pin-pods"  # served by `dispatcher run` only (pods/pod_pinning.py)
PODS_CONFIGURATION = "dispatcher-pods"
RECHECK_SECONDS = 60.0
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_NAMESPACE = "dispatcher-system"
# How an AdmissionReview was answered (metrics.WEBHOOK_RESULTS).
ALLOWED, DENIED, ERROR, BAD_REQUEST = "allowed", "denied", "error", "bad_request"


def own_namespace() -> str:
    """The namespace the dispatcher runs in: $POD_NAMESPACE, the pod's service account
    namespace, else dispatcher-system (deploy/'s)."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    with contextlib.suppress(OSError):
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or DEFAULT_NAMESPACE
    return DEFAULT_NAMESPACE


@dataclass
class WebhookOptions:
    port: int = 9443
    host: str = "0.0.0.0"
    namespace: str = field(default_factory=own_namespace)
    service: str = "dispatcher-webhook"
    secret: str = "dispatcher-webhook-cert"
    configuration: str | None = "dispatcher-appwrappers"
    cert_dir: Path | None = None
    cert_hosts: tuple[str, ...] = ()
    allowed_kinds: Collection[GroupKind] = DEFAULT_ALLOWED_KINDS
    # The installation's topology levels: a level an AppWrapper asks for must be one.
    topology: Topology | None = None
    # The installation's fault-tolerance defaults and maximum: v1beta2 annotations that
    # are ignored or capped get a warning.
    faults: FaultTolerance = DEFAULT_FAULT_TOLERANCE
    # With `dispatcher run`: the pod webhook's configuration, its CA patched as well.
    pods_configuration: str | None = None
    # Who may write the manager's labels (manager_labels.py); none given: the manager's
    # service accounts of deploy/, in `namespace`.
    manager_users: tuple[str, ...] = ()


class TlsContext:
    """A server SSLContext whose certificate can be replaced while it serves."""

    def __init__(self) -> None:
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.loaded: tuple[bytes, bytes] | None = None

    def load(self, cert: bytes, key: bytes) -> bool:
        """Serve ``cert`` (PEM, chain) with ``key`` from the next handshake on; False if
        they are what is served already."""
        if self.loaded == (cert, key):
            return False
        # ssl loads certificates from files only; they live just long enough to be read.
        with tempfile.TemporaryDirectory(prefix="dispatcher-webhook-") as tmp:
            cert_file, key_file = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
            cert_file.write_bytes(cert)
            key_file.touch(mode=0o600)
            key_file.write_bytes(key)
            self.context.load_cert_chain(cert_file, key_file)
        self.loaded = (cert, key)
        return True


CertSource = Callable[[], Awaitable[tuple[bytes, bytes]]]


def secret_source(store: SecretCertificates) -> CertSource:
    async def fetch() -> tuple[bytes, bytes]:
        certs = await store.current()
        await store.publish(certs)
        return certs.tls_cert, certs.tls_key

    return fetch


def directory_source(directory: Path) -> CertSource:
    async def fetch() -> tuple[bytes, bytes]:
        try:
            return (directory / "tls.crt").read_bytes(), (directory / "tls.key").read_bytes()
        except OSError as e:
            raise RuntimeError(f"cannot read the webhook certificate in {directory} "
                               f"(tls.crt and tls.key): {e}") from e

    return fetch


Handler = Callable[[web.Request], Awaitable[tuple[web.Response, str]]]


class WebhookServer:
    """The HTTPS endpoints; ``refresh()`` (re)loads the certificate from its source. With
    ``metrics``, each AdmissionReview's answer is timed; with ``serve_metrics`` too, they
    are served on ``/metrics`` (`dispatcher webhook`, which has no metrics port)."""

    def __init__(self, review: AppWrapperReview, source: CertSource,
                 host: str = "0.0.0.0", port: int = 9443,
                 pods: PodPinning | None = None, metrics: RequestMetrics | None = None,
                 serve_metrics: bool = False) -> None:
        self.review = review
        self.pods = pods
        self.source = source
        self.host = host
        self.port = port
        self.metrics = metrics
        self.serve_metrics = serve_metrics and metrics is not None
        self.tls = TlsContext()
        self.conversions = Conversions()
        self._runner: web.AppRunner | None = None
        self._refresher: asyncio.Task[None] | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_REQUEST_BYTES)
        app.router.add_post(MUTATE_PATH, self._timed("mutate", self._mutate))
        app.router.add_post(VALIDATE_PATH, self._timed("validate", self._validate))
        app.router.add_post(CONVERT_PATH, self._timed("convert", self._convert))
        if self.pods is not None:
            app.router.add_post(PIN_PODS_PATH, self._timed("pin-pods", self._pin_pod))
        app.router.add_get("/healthz", self._healthz)
        if self.serve_metrics:
            app.router.add_get("/metrics", self._metrics)
        return app

    async def refresh(self) -> None:
        cert, key = await self.source()
        if self.tls.load(cert, key):
            log.info("webhook serving certificate loaded")

    async def start(self) -> None:
        """Load the certificate (fails if there is none to be had), then serve."""
        await self.refresh()
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port, ssl_context=self.tls.context
                              ).start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        self._refresher = asyncio.create_task(self._keep_fresh(), name="webhook-certificates")
        log.info("serving the AppWrapper admission webhook on %s", ", ".join(
            f"https://{h}:{p}" for h, p in self.addresses()))

    def addresses(self) -> list[tuple[str, int]]:
        if self._runner is None:
            return []
        return [(str(a[0]), int(a[1])) for a in self._runner.addresses
                if isinstance(a, tuple) and len(a) >= 2]

    async def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _keep_fresh(self) -> None:
        while True:
            await asyncio.sleep(RECHECK_SECONDS)
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the current certificate still serves; try again
                log.warning("webhook certificate not refreshed: %s", e)

    async def _healthz(self, request: web.Request) -> web.Response:
        ok = self.tls.loaded is not None
        return web.Response(status=200 if ok else 503,
                            text="ok\n" if ok else "no certificate loaded\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        assert self.metrics is not None
        return exposition(self.metrics.registry, request.headers.get("Accept", ""))

    def _timed(self, endpoint: str, handler: Handler
               ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def timed(request: web.Request) -> web.Response:
            started = time.monotonic()
            response, result = await handler(request)
            if self.metrics is not None:
                self.metrics.webhook_review(endpoint, result, time.monotonic() - started)
            return response

        return timed

    async def _mutate(self, request: web.Request) -> tuple[web.Response, str]:
        return await self._answer(request, mutate=True)

    async def _validate(self, request: web.Request) -> tuple[web.Response, str]:
        return await self._answer(request, mutate=False)

    async def _convert(self, request: web.Request) -> tuple[web.Response, str]:
        """A ConversionReview: pure work on what was posted, no lookup."""
        response, converted = await self.conversions.answer(request)
        result = BAD_REQUEST if converted is None else ALLOWED if converted else DENIED
        return response, result

    async def _pin_pod(self, request: web.Request) -> tuple[web.Response, str]:
        """Always allowed: at worst the pod keeps its gate and the loop lets it go."""
        assert self.pods is not None
        body, review, uid = await _review_of(request)
        if review is None:
            return _bad_review(), BAD_REQUEST
        transport = request.transport
        result = ALLOWED
        try:
            patch = await self.pods.review(
                review, lambda: transport is None or transport.is_closing())
        except Exception:
            log.exception("pod AdmissionReview %s failed; the pod keeps its gate", uid)
            patch, result = None, ERROR
        return _answer(body, uid, ReviewAnswer(True, patch=patch)), result

    async def _answer(self, request: web.Request, mutate: bool) -> tuple[web.Response, str]:
        body, review, uid = await _review_of(request)
        if review is None:
            return _bad_review(), BAD_REQUEST
        try:
            verdict = self.review.mutate(review) if mutate else \
                await self.review.validate(review)
            result = ALLOWED if verdict.allowed else DENIED
        except Exception:
            log.exception("AdmissionReview %s failed", uid)
            verdict = ReviewAnswer(False, code=500, message="the dispatcher's webhook failed "
                              "on this AppWrapper; its log says why")
            result = ERROR
        return _answer(body, uid, verdict), result


async def _review_of(request: web.Request
                     ) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """The AdmissionReview posted, its request and uid; a None request if it is none."""
    try:
        body = await request.json()
        review = body["request"]
        return body, review, str(review["uid"])
    except (ValueError, KeyError, TypeError, RecursionError):
        return {}, None, ""


def _bad_review() -> web.Response:
    return web.Response(status=400, text="expected an AdmissionReview with a request "
                        "(admission.k8s.io/v1)\n")


def _answer(body: Mapping[str, Any], uid: str, verdict: ReviewAnswer) -> web.Response:
    return web.json_response({"apiVersion": body.get("apiVersion") or "admission.k8s.io/v1",
                              "kind": "AdmissionReview", "response": verdict.response(uid)})


def make_server(kube: Kube, options: WebhookOptions, pods: PodPinning | None = None,
                metrics: RequestMetrics | None = None,
                serve_metrics: bool = False) -> WebhookServer:
    source: CertSource
    if options.cert_dir is not None:
        source = directory_source(options.cert_dir)
    else:
        hosts = service_hosts(options.service, options.namespace, options.cert_hosts)
        source = secret_source(SecretCertificates(kube, options.namespace, options.secret,
                                                  hosts, options.configuration,
                                                  options.pods_configuration))
    managers = (frozenset(options.manager_users) if options.manager_users
                else default_managers(options.namespace))
    return WebhookServer(AppWrapperReview(Access(kube), options.allowed_kinds,
                                          options.topology, options.faults, managers), source,
                         options.host, options.port, pods, metrics, serve_metrics)


async def start_serving(kube: Kube, server: WebhookServer) -> None:
    """Start `server` once the API server answers and its certificates can be had, saying
    what fails meanwhile and retrying with backoff."""
    trouble = Trouble(log, "starting the webhook")
    await reach(kube, trouble)
    await retry(server.start, trouble)


async def serve(options: WebhookOptions, kubeconfig: str | None,
                stop: asyncio.Event | None = None) -> None:
    """`dispatcher webhook`: serve until SIGTERM/SIGINT (or ``stop``). Raises
    KubeconfigError when there is no configuration to use."""
    stop = stop_on_signals(stop)
    metrics = RequestMetrics()
    kube = await Kube.connect(kubeconfig, observer=metrics)
    server = make_server(kube, options, metrics=metrics, serve_metrics=True)
    try:
        await until_stopped(start_serving(kube, server), stop)
        await stop.wait()
    except Stopped:
        log.info("stopped before the webhook served")
    finally:
        await server.stop()
        await kube.close()
