"""How long the process's own requests take: the API client's attempts and its pacing, and
the webhook's answers, as Prometheus sees them."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kubernetes_asyncio import client
from prometheus_client.parser import text_string_to_metric_families

from dispatcher.controller.access.creator import Access
from dispatcher.controller.kube.client import ApiError, Kube
from dispatcher.controller.kube.pacing import STATUS
from dispatcher.controller.metrics.requests import RequestMetrics
from dispatcher.controller.webhook.admission_review import AppWrapperReview
from dispatcher.controller.webhook.server import MUTATE_PATH, VALIDATE_PATH, WebhookServer

from .fake_authz import FakeApi
from .test_webhook_certs import review_body

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: str) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def scraped(metrics: RequestMetrics) -> Samples:
    from prometheus_client import generate_latest

    return samples(generate_latest(metrics.registry).decode())


def count(s: Samples, name: str, **labels: str) -> float:
    return s.get((name, frozenset(labels.items())), 0.0)


def kube_for(url: str, metrics: RequestMetrics, qps: float = 0.0, burst: int = 1) -> Kube:
    conf = client.Configuration()
    conf.host = url
    return Kube(client.ApiClient(configuration=conf), qps=qps, burst=burst, observer=metrics)


async def with_api_server(scenario: Callable[[str], Awaitable[None]]) -> None:
    """An API server that knows nodes, refuses pods (403) and fails events (500)."""
    async def nodes(_: web.Request) -> web.Response:
        return web.json_response({"kind": "NodeList", "items": [], "metadata": {}})

    async def forbidden(_: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "reason": "Forbidden",
                                  "message": "no"}, status=403)

    async def broken(_: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "message": "boom"}, status=500)

    app = web.Application()
    app.router.add_get("/api/v1/nodes", nodes)
    app.router.add_post("/api/v1/namespaces/a/pods", forbidden)
    app.router.add_patch("/api/v1/namespaces/a/events/e", broken)
    async with TestServer(app) as server:
        await scenario(str(server.make_url("")).rstrip("/"))


def test_each_attempt_to_the_api_server_is_timed_by_verb_and_counted_by_code() -> None:
    metrics = RequestMetrics()

    async def scenario(url: str) -> None:
        kube = kube_for(url, metrics)
        try:
            await kube.request("GET", "/api/v1/nodes")
            await kube.request("GET", "/api/v1/nodes")
            with pytest.raises(ApiError):
                await kube.request("POST", "/api/v1/namespaces/a/pods", body={})
            with pytest.raises(ApiError):
                await kube.request("PATCH", "/api/v1/namespaces/a/events/e", body={},
                                   retry=False)
        finally:
            await kube.close()

    asyncio.run(with_api_server(scenario))
    s = scraped(metrics)
    assert count(s, "dispatcher_api_requests_total", verb="GET", code="200") == 2
    assert count(s, "dispatcher_api_requests_total", verb="POST", code="403") == 1
    assert count(s, "dispatcher_api_requests_total", verb="PATCH", code="500") == 1
    assert count(s, "dispatcher_api_request_duration_seconds_count", verb="GET") == 2
    assert count(s, "dispatcher_api_request_duration_seconds_count", verb="PATCH") == 1
    assert count(s, "dispatcher_api_request_duration_seconds_sum", verb="GET") > 0


def test_a_request_no_server_answers_counts_as_code_none() -> None:
    metrics = RequestMetrics()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def scenario() -> None:
        kube = kube_for(f"http://127.0.0.1:{port}", metrics)
        try:
            with pytest.raises(ApiError):
                await kube.request("GET", "/api/v1/nodes", retry=False)
        finally:
            await kube.close()

    asyncio.run(scenario())
    assert count(scraped(metrics), "dispatcher_api_requests_total",
                 verb="GET", code="none") == 1


def test_the_wait_for_the_clients_pacing_is_measured_by_priority() -> None:
    metrics = RequestMetrics()

    async def scenario(url: str) -> None:
        kube = kube_for(url, metrics, qps=20, burst=1)  # a token every 50 ms
        try:
            await kube.request("GET", "/api/v1/nodes")  # the burst token: no wait
            await kube.request("GET", "/api/v1/nodes", priority=STATUS)  # waits its token
        finally:
            await kube.close()

    asyncio.run(with_api_server(scenario))
    s = scraped(metrics)
    assert count(s, "dispatcher_api_pacing_wait_seconds_count", priority="urgent") == 1
    assert count(s, "dispatcher_api_pacing_wait_seconds_count", priority="status") == 1
    assert count(s, "dispatcher_api_pacing_wait_seconds_sum", priority="status") > 0


def test_webhook_answers_are_timed_by_endpoint_and_result_and_served() -> None:
    metrics = RequestMetrics()

    async def scenario() -> str:
        review = AppWrapperReview(Access(FakeApi({"alice": {"jobs.batch"}})))  # type: ignore[arg-type]
        server = WebhookServer(review, None, metrics=metrics,  # type: ignore[arg-type]
                               serve_metrics=True)
        async with TestClient(TestServer(server.app())) as http:
            mutated = await (await http.post(MUTATE_PATH, json=review_body())).json()
            body = review_body()
            patch = json.loads(base64.b64decode(mutated["response"]["patch"]))
            body["request"]["object"]["metadata"]["annotations"] = patch[0]["value"]
            assert (await (await http.post(VALIDATE_PATH, json=body)).json()
                    )["response"]["allowed"] is True
            body["request"]["userInfo"] = {"username": "bob"}  # may not create Jobs
            assert (await (await http.post(VALIDATE_PATH, json=body)).json()
                    )["response"]["allowed"] is False
            assert (await http.post(VALIDATE_PATH, data=b"{}")).status == 400
            page = await http.get("/metrics")
            assert page.status == 200
            return await page.text()

    s = samples(asyncio.run(scenario()))
    name = "dispatcher_webhook_request_duration_seconds_count"
    assert count(s, name, endpoint="mutate", result="allowed") == 1
    assert count(s, name, endpoint="validate", result="allowed") == 1
    assert count(s, name, endpoint="validate", result="denied") == 1
    assert count(s, name, endpoint="validate", result="bad_request") == 1


def test_the_webhook_serves_no_metrics_unless_asked() -> None:
    async def scenario() -> int:
        server = WebhookServer(None, None, metrics=RequestMetrics())  # type: ignore[arg-type]
        async with TestClient(TestServer(server.app())) as http:
            return (await http.get("/metrics")).status

    assert asyncio.run(scenario()) == 404



def test_the_manager_counts_its_requests_to_each_worker_by_verb_until_it_goes(
        tmp_path: Path) -> None:
    from dispatcher.controller.manager.manager_metrics import ManagerMetrics, WorkerFigures
    from dispatcher.controller.manager.workers import counted

    metrics = ManagerMetrics()
    link = counted(metrics.requests_to)

    def sent(cluster: str, verb: str) -> float | None:
        return metrics.registry.get_sample_value(
            "dispatcher_worker_api_requests_total", {"cluster": cluster, "verb": verb})

    async def scenario(url: str) -> None:
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
                  "clusters": [{"name": "c", "cluster": {"server": url}}],
                  "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                  "users": [{"name": "u", "user": {}}]}
        w1 = await link({"metadata": {"name": "w1"}}, json.dumps(config).encode(), tmp_path)
        w2 = await link({"metadata": {"name": "w2"}}, json.dumps(config).encode(), tmp_path)
        try:
            for _ in range(2):
                await w1.kube.request("GET", "/api/v1/nodes")
            await w2.kube.request("GET", "/api/v1/nodes")
            with pytest.raises(ApiError):
                await w1.kube.request("POST", "/api/v1/namespaces/a/pods", {}, retry=False)
        finally:
            await w1.close()
            await w2.close()

    asyncio.run(with_api_server(scenario))
    assert (sent("w1", "GET"), sent("w1", "POST"), sent("w2", "GET")) == (2, 1, 1)
    assert sent("w2", "POST") is None
    metrics.observe({"w1": WorkerFigures(0, True, 0), "w2": WorkerFigures(0, True, 0)})
    metrics.observe({"w1": WorkerFigures(0, True, 0)})
    assert sent("w1", "GET") == 2 and sent("w2", "GET") is None
