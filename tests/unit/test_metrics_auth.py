"""/metrics behind Kubernetes credentials (`dispatcher run --metrics-auth kubernetes`): a
bearer token checked by TokenReview, the path by SubjectAccessReview; /healthz open."""

from __future__ import annotations

import asyncio

import aiohttp

from dispatcher.controller.bearer import TokenReviewAuth
from dispatcher.controller.kube import ApiError
from dispatcher.controller.metrics import MetricsServer, PrometheusObserver

from .fake_authz import FakeApi

TOKENS = {"prom-token": {"username": "system:serviceaccount:monitoring:prometheus",
                         "groups": ["system:serviceaccounts"]},
          "alice-token": {"username": "alice", "groups": []}}
RIGHTS = {"system:serviceaccount:monitoring:prometheus": {"/metrics"}}


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def auth(api: FakeApi, clock: Clock | None = None) -> TokenReviewAuth:
    async def connect() -> FakeApi:
        return api

    return TokenReviewAuth(connect, clock=clock or Clock())  # type: ignore[arg-type]


def test_tokens_are_reviewed_and_answers_kept_for_a_minute() -> None:
    async def scenario() -> None:
        api, clock = FakeApi(RIGHTS, TOKENS), Clock()
        a = auth(api, clock)
        assert (await a.check(None, "/metrics"))[0] == 401  # type: ignore[index]
        assert (await a.check("Basic eDp5", "/metrics"))[0] == 401  # type: ignore[index]
        assert await a.check("Bearer nope", "/metrics") == (401, "the token is not valid\n")
        assert await a.check("Bearer alice-token", "/metrics") == (
            403, "alice may not get /metrics\n")
        assert await a.check("Bearer prom-token", "/metrics") is None
        sar = api.reviews[-1]["spec"]
        assert sar["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
        assert sar["groups"] == ["system:serviceaccounts"]
        calls = len(api.requests)
        assert await a.check("Bearer prom-token", "/metrics") is None
        assert len(api.requests) == calls  # cached
        api.rights.clear()  # the grant is gone: seen once the answer is a minute old
        clock.now = 61
        assert (await a.check("Bearer prom-token", "/metrics"))[0] == 403  # type: ignore[index]

    asyncio.run(scenario())


def test_an_api_outage_is_not_remembered() -> None:
    async def scenario() -> None:
        api = FakeApi(RIGHTS, TOKENS)
        api.fail[("POST", "/apis/authentication.k8s.io")] = ApiError(503, "", "down")
        a = auth(api)
        assert (await a.check("Bearer prom-token", "/metrics"))[0] == 503  # type: ignore[index]
        api.fail.clear()
        assert await a.check("Bearer prom-token", "/metrics") is None

    asyncio.run(scenario())


def test_the_server_guards_metrics_but_not_health() -> None:
    async def scenario() -> None:
        server = MetricsServer(PrometheusObserver(), port=0, host="127.0.0.1",
                               auth=auth(FakeApi(RIGHTS, TOKENS)))
        await server.start()
        try:
            ((host, port),) = server.addresses()
            base = f"http://{host}:{port}"
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{base}/metrics") as r:
                    assert r.status == 401
                async with http.get(f"{base}/metrics",
                                    headers={"Authorization": "Bearer alice-token"}) as r:
                    assert r.status == 403
                async with http.get(f"{base}/metrics",
                                    headers={"Authorization": "Bearer prom-token"}) as r:
                    assert r.status == 200
                    assert "dispatcher_build_info" in await r.text()
                async with http.get(f"{base}/healthz") as r:
                    assert r.status == 503  # open, and saying it is starting
        finally:
            await server.stop()

    asyncio.run(scenario())
