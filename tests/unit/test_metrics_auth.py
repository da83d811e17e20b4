"""/metrics behind Kubernetes credentials (`dispatcher run --metrics-auth kubernetes`): a
bearer token checked by TokenReview, the path by SubjectAccessReview; /healthz open."""

from __future__ import annotations

import asyncio

import aiohttp

from dispatcher.controller.bearer import (
    BUSY,
    NEW_TOKENS_BURST,
    NEW_TOKENS_PER_SECOND,
    Answers,
    TokenReviewAuth,
)
from dispatcher.controller.kube import ApiError
from dispatcher.controller.metrics import PrometheusObserver
from dispatcher.controller.metrics_server import MetricsServer

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


def token_reviews(api: FakeApi) -> int:
    return sum(1 for _, path in api.requests if path.endswith("/tokenreviews"))


def test_a_flood_of_made_up_tokens_costs_few_reviews_and_the_scraper_keeps_working() -> None:
    async def scenario() -> None:
        api, clock = FakeApi(RIGHTS, TOKENS), Clock()
        a = auth(api, clock)
        assert await a.check("Bearer prom-token", "/metrics") is None
        flood = [await a.check(f"Bearer made-up-{i}", "/metrics") for i in range(5000)]
        assert token_reviews(api) == NEW_TOKENS_BURST  # the scraper's, then the rest
        assert flood.count(BUSY) == 5000 - (NEW_TOKENS_BURST - 1)  # of a burst
        assert BUSY[0] == 429
        asked = len(api.requests)
        assert await a.check("Bearer prom-token", "/metrics") is None
        assert len(api.requests) == asked  # still known: not evicted by the flood
        # The flood goes on for five minutes, 20 made-up tokens every 0.1 s; the scraper
        # scrapes every 30 s, and its token is checked again each minute all along.
        for tick in range(1, 3001):
            clock.now = tick / 10
            for i in range(20):
                await a.check(f"Bearer flood-{tick}-{i}", "/metrics")
            if tick % 300 == 0:
                assert await a.check("Bearer prom-token", "/metrics") is None
        made_up = token_reviews(api) - NEW_TOKENS_BURST - 5  # the scraper's: once a minute
        assert made_up <= NEW_TOKENS_PER_SECOND * 300

    asyncio.run(scenario())


def test_refusals_are_kept_briefly() -> None:
    async def scenario() -> None:
        api, clock = FakeApi(RIGHTS, TOKENS), Clock()
        a = auth(api, clock)
        for _ in range(3):
            assert (await a.check("Bearer alice-token", "/metrics"))[0] == 403  # type: ignore[index]
        assert token_reviews(api) == 1
        api.rights["alice"] = {"/metrics"}  # granted: seen within seconds, not a minute
        clock.now = 11
        assert await a.check("Bearer alice-token", "/metrics") is None
        assert token_reviews(api) == 2

    asyncio.run(scenario())


def test_the_least_recently_used_answer_goes_first() -> None:
    kept = Answers(size=2)
    kept.put(("a", "/metrics"), 60.0, None)
    kept.put(("b", "/metrics"), 60.0, None)
    assert kept.get(("a", "/metrics")) == (60.0, None)  # a is used: b is the oldest now
    kept.put(("c", "/metrics"), 60.0, (401, "no\n"))
    assert kept.get(("b", "/metrics")) is None
    assert kept.get(("a", "/metrics")) == (60.0, None)
    assert kept.get(("c", "/metrics")) == (60.0, (401, "no\n"))


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
                for i in range(NEW_TOKENS_BURST):  # two were checked above
                    async with http.get(f"{base}/metrics",
                                        headers={"Authorization": f"Bearer x{i}"}) as r:
                        assert r.status == (401 if i < NEW_TOKENS_BURST - 2 else 429)
                async with http.get(f"{base}/metrics",
                                    headers={"Authorization": "Bearer prom-token"}) as r:
                    assert r.status == 200  # known: no check needed
        finally:
            await server.stop()

    asyncio.run(scenario())
