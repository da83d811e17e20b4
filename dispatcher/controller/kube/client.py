"""A small async client for any kind the API server serves, by plain REST paths.

The wrapped objects can be of any kind (CRDs included), so the controller works with
dicts and paths rather than generated typed clients. Kinds are mapped to their REST
resources by API discovery, cached per group/version.

Every request has a deadline, and transient failures (429, 5xx, timeouts, refused or
cut connections) are retried with exponential backoff, honouring ``Retry-After``, for
a bounded time; what is still failing then surfaces as an :class:`ApiError` whose
``transient`` is true, so callers try again later instead of calling it permanent.
Requests may be paced by a token bucket (``qps``/``burst``; `dispatcher run` sets 1000/1000,
so that the API server's priority and fairness, and its 429s, set the pace, not the
client).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client
from yarl import URL

from .kubeconfig import load
from .pacing import URGENT, TokenBucket

log = logging.getLogger("dispatcher.kube")

Objects = list[dict[str, Any]]
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
# Status 0 stands for "no HTTP answer": a refused or cut connection, or a timeout.
NO_ANSWER = 0


@dataclass(frozen=True)
class Request:
    """What was asked of whom, for messages: `method` is WATCH for a watch."""

    method: str
    path: str
    server: str


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str,
                 retry_after: float | None = None, request: Request | None = None) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after
        self.request = request

    @property
    def transient(self) -> bool:
        """Worth trying again later: the API server was overloaded, down or slow."""
        return self.status in TRANSIENT_STATUSES or self.status == NO_ANSWER


def is_transient(error: BaseException) -> bool:
    return isinstance(error, ApiError) and error.transient


@dataclass(frozen=True)
class Resource:
    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None,
             subresource: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name)}"
        if subresource:
            base += f"/{subresource}"
        return base


@dataclass(frozen=True)
class RetryPolicy:
    """How long a transient failure is retried within one call."""

    first_delay: float = 0.2
    max_delay: float = 5.0
    budget: float = 20.0  # seconds of retrying before the error surfaces
    request_timeout: float = 15.0  # one attempt, connect to last byte (lists are paged)


class RequestObserver(Protocol):
    """Told how long requests take (metrics.RequestMetrics)."""

    def api_request(self, verb: str, status: int, seconds: float) -> None:
        """One attempt answered with HTTP `status` (NO_ANSWER: none) after `seconds`."""

    def api_paced(self, priority: int, seconds: float) -> None:
        """A request of `priority` waited `seconds` for the client's pacing."""


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    if not headers:
        return None
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _error_of(status: int, http_reason: str, raw: bytes,
              headers: Mapping[str, str] | None, request: Request) -> ApiError:
    # Unknown paths answer with plain text ("404 page not found"), not a Status.
    try:
        data = json.loads(raw) if raw else None
    except ValueError:
        data = None
    text = raw.decode(errors="replace")
    reason = data.get("reason", "") if isinstance(data, dict) else ""
    message = data.get("message", text) if isinstance(data, dict) else text
    return ApiError(status, reason or http_reason or "", message, _retry_after(headers),
                    request)


def read_environment_once(api: client.ApiClient) -> None:
    """The proxy the environment names for the API server (HTTPS_PROXY, NO_PROXY, with its
    credentials from ~/.netrc), looked up once, by aiohttp's own rules.
    kubernetes_asyncio has aiohttp trust the environment, and aiohttp then looks all of
    this up again in a thread at every request: about a seventh of the dispatcher's CPU
    on a busy cluster (bench/e2e.py)."""
    rest = api.rest_client
    if not rest.proxy:
        try:
            proxy, auth = get_env_proxy_for_url(URL(str(api.configuration.host)))
        except LookupError:
            pass  # no proxy for the API server
        else:
            rest.proxy = str(proxy)
            if auth is not None and not rest.proxy_headers:
                rest.proxy_headers = {"Proxy-Authorization": auth.encode()}
    old = rest.pool_manager
    # The read buffer kubernetes_asyncio sets: a watch event of a big object fits in it.
    rest.pool_manager = aiohttp.ClientSession(
        connector=old.connector, trust_env=False, read_bufsize=2**21)
    old.detach()  # its connector (and TLS settings) now belong to the new session


class Kube:
    def __init__(self, api: client.ApiClient, retry: RetryPolicy | None = None,
                 qps: float = 0.0, burst: int = 1,
                 observer: RequestObserver | None = None) -> None:
        self.api = api
        self.retry = retry or RetryPolicy()
        self.bucket = TokenBucket(qps, burst)
        self.observer = observer
        self._discovered: dict[str, dict[str, Resource] | None] = {}

    @classmethod
    async def connect(cls, kubeconfig: str | None = None, qps: float = 0.0,
                      burst: int = 1, retry: RetryPolicy | None = None,
                      observer: RequestObserver | None = None,
                      context: str | None = None) -> Kube:
        """In-cluster when running in a pod with no kubeconfig given, else kubeconfig
        (kubeconfig.py); raises KubeconfigError, saying what to do, when there is none."""
        conf = (await load(kubeconfig, context, persist=True)).configuration
        # The default pool (5 per core) is smaller than three watches plus a cycle's writes.
        conf.connection_pool_maxsize = 64
        api = client.ApiClient(configuration=conf)
        read_environment_once(api)
        return cls(api, retry=retry, qps=qps, burst=burst, observer=observer)

    @property
    def server(self) -> str:
        return str(self.api.configuration.host)

    async def close(self) -> None:
        await self.api.close()

    async def _once(self, method: str, path: str, body: Any,
                    query: Mapping[str, str] | None, content_type: str,
                    timeout: aiohttp.ClientTimeout) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        started = time.monotonic()
        request = Request(method, path, self.server)
        try:
            response = await self.api.call_api(
                path, method, query_params=list((query or {}).items()),
                header_params=headers, body=body, auth_settings=["BearerToken"],
                _preload_content=False, _return_http_data_only=True,
                _request_timeout=timeout,
            )
            try:
                raw = await response.read()
            finally:
                response.release()
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            self._answered(method, NO_ANSWER, started)
            raise ApiError(NO_ANSWER, type(e).__name__, str(e) or type(e).__name__,
                           request=request) from e
        self._answered(method, response.status, started)
        if response.status >= 400:
            raise _error_of(response.status, response.reason or "", raw,
                            getattr(response, "headers", None), request)
        return json.loads(raw) if raw else None

    async def request(self, method: str, path: str, body: Any = None,
                      query: Mapping[str, str] | None = None,
                      content_type: str = "application/json", retry: bool = True,
                      priority: int = URGENT,
                      on_send: Callable[[], None] | None = None) -> Any:
        """One API call. Transient failures are retried (with `retry`) for up to the
        policy's budget; the last one is raised with ``transient`` true. `priority`: its
        place among paced requests waiting for a token. `on_send()` is called as each attempt
        goes on the wire."""
        policy = self.retry
        timeout = aiohttp.ClientTimeout(total=policy.request_timeout)
        deadline = time.monotonic() + policy.budget
        delay = policy.first_delay
        while True:
            await self._paced(priority)
            if on_send is not None:
                on_send()
            try:
                return await self._once(method, path, body, query, content_type, timeout)
            except ApiError as e:
                if not (retry and e.transient):
                    raise
                # The API server's own Retry-After (priority and fairness shedding load) is
                # waited in full, never less; without one, backoff with jitter.
                pause = e.retry_after * random.uniform(1.0, 1.2) \
                    if e.retry_after is not None \
                    else min(delay, policy.max_delay) * random.uniform(0.8, 1.2)
                if time.monotonic() + pause > deadline:
                    raise
                log.debug("%s %s: %s; retrying in %.1fs", method, path, e, pause)
                await asyncio.sleep(pause)
                delay = min(delay * 2, policy.max_delay)

    def _answered(self, method: str, status: int, started: float) -> None:
        if self.observer is not None:
            self.observer.api_request(method, status, time.monotonic() - started)

    async def _paced(self, priority: int) -> None:
        started = time.monotonic()
        await self.bucket.take(priority)
        if self.observer is not None:
            self.observer.api_paced(priority, time.monotonic() - started)

    def queued(self, priority: int) -> int:
        """Requests of `priority` waiting for a token now."""
        return self.bucket.waiting()[priority]

    async def resource(self, api_version: str, kind: str) -> Resource | None:
        """The REST resource serving `kind` in `api_version`, or None if not served."""
        if api_version not in self._discovered:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            try:
                listing = await self.request("GET", path)
            except ApiError as e:
                if e.status != 404:
                    raise
                self._discovered[api_version] = None
            else:
                self._discovered[api_version] = {
                    r["kind"]: Resource(api_version, r["kind"], r["name"], r["namespaced"])
                    for r in listing.get("resources", []) if "/" not in r["name"]
                }
        served = self._discovered[api_version]
        return None if served is None else served.get(kind)

    def knows(self, api_version: str) -> bool:
        """Whether an answer of discovery for `api_version` is kept (it may be out of date)."""
        return api_version in self._discovered

    def forget(self, api_version: str) -> None:
        """Look the group/version up again next time (a CRD may have been installed)."""
        self._discovered.pop(api_version, None)

    async def list(self, resource: Resource, label_selector: str | None = None,
                   namespace: str | None = None, field_selector: str | None = None
                   ) -> list[dict[str, Any]]:
        items, _ = await self.list_with_version(resource, label_selector, namespace,
                                                field_selector)
        return items

    async def list_with_version(self, resource: Resource, label_selector: str | None = None,
                                namespace: str | None = None, field_selector: str | None = None
                                ) -> tuple[Objects, str]:
        """Every object of `resource`, paged, and the list's resourceVersion (to watch
        from). A page token that expired mid-listing restarts the listing."""
        while True:
            items: Objects = []
            query: dict[str, str] = {"limit": "500"}
            if label_selector:
                query["labelSelector"] = label_selector
            if field_selector:
                query["fieldSelector"] = field_selector
            try:
                while True:
                    page = await self.request("GET", resource.path(namespace), query=query)
                    for item in page.get("items", []):
                        item.setdefault("apiVersion", resource.api_version)
                        item.setdefault("kind", resource.kind)
                        items.append(item)
                    meta = page.get("metadata", {})
                    token = meta.get("continue")
                    if not token:
                        return items, str(meta.get("resourceVersion", ""))
                    query["continue"] = token
            except ApiError as e:
                if e.status != 410:
                    raise
                log.info("listing %s: page token expired; listing again", resource.plural)

    async def watch(self, resource: Resource, resource_version: str,
                    timeout_seconds: int, opened: Callable[[], None] | None = None,
                    label_selector: str | None = None, field_selector: str | None = None
                    ) -> AsyncIterator[dict[str, Any]]:
        """The events of one watch request from `resource_version`, as dicts
        ``{"type", "object"}`` (BOOKMARK and ERROR included), until the server ends it.

        A connection that stays silent past the server's own timeout is treated as dead:
        the read times out and an :class:`ApiError` (status 0) is raised."""
        await self._paced(URGENT)
        query = {"watch": "1", "resourceVersion": resource_version,
                 "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_seconds)}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        timeout = aiohttp.ClientTimeout(sock_connect=10, sock_read=timeout_seconds + 15)
        request = Request("WATCH", resource.path(), self.server)
        try:
            response = await self.api.call_api(
                resource.path(), "GET", query_params=list(query.items()),
                header_params={"Accept": "application/json"},
                auth_settings=["BearerToken"], _preload_content=False,
                _return_http_data_only=True, _request_timeout=timeout,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise ApiError(NO_ANSWER, type(e).__name__, str(e) or type(e).__name__,
                           request=request) from e
        try:
            if response.status >= 400:
                raw = await response.read()
                raise _error_of(response.status, response.reason or "", raw, response.headers,
                                request)
            if opened is not None:
                opened()
            while True:
                try:
                    line = await response.content.readline()
                except (aiohttp.ClientError, TimeoutError, OSError) as e:
                    raise ApiError(NO_ANSWER, type(e).__name__,
                                   str(e) or type(e).__name__, request=request) from e
                if not line:
                    return
                if line.strip():
                    event: dict[str, Any] = json.loads(line)
                    yield event
        finally:
            response.close()  # a stream cut short must not go back to the pool
