"""/metrics behind Kubernetes credentials (`dispatcher run --metrics-auth kubernetes`): a
bearer token checked by TokenReview, the path by SubjectAccessReview; /healthz open."""

from __future__ import annotations

import asyncio

import aiohttp

from dispatcher.controller.access.bearer import BUSY, Answers, TokenReviewAuth
from dispatcher.controller.access.review_budget import (
    KNOWN_BURST,
    PER_SOURCE_BURST,
    PER_SOURCE_PER_SECOND,
    STRANGERS_BURST,
    STRANGERS_PER_SECOND,
)
from dispatcher.controller.kube.client import ApiError
from dispatcher.controller.metrics.prometheus import PrometheusObserver
from dispatcher.controller.metrics.server import MetricsServer

from .fake_authz import FakeApi

PROMETHEUS = {"username": "system:serviceaccount:monitoring:prometheus",
              "groups": ["system:serviceaccounts"]}
TOKENS = {"prom-token": PROMETHEUS, "prom-token-rotated": PROMETHEUS,
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
        assert await a.check("Bearer prom-token", "/metrics", SCRAPER) is None
        flood = [await a.check(f"Bearer made-up-{i}", "/metrics", FLOODER)
                 for i in range(5000)]
        assert token_reviews(api) == 1 + PER_SOURCE_BURST  # the scraper's, then the rest
        assert flood.count(BUSY) == 5000 - PER_SOURCE_BURST  # of a burst
        assert BUSY[0] == 429
        asked = len(api.requests)
        assert await a.check("Bearer prom-token", "/metrics", SCRAPER) is None
        assert len(api.requests) == asked  # still known: not evicted by the flood
        # The flood goes on for five minutes, 20 made-up tokens every 0.1 s; the scraper
        # scrapes every 30 s, and its token is checked again each minute all along.
        for tick in range(1, 3001):
            clock.now = tick / 10
            for i in range(20):
                await a.check(f"Bearer flood-{tick}-{i}", "/metrics", FLOODER)
            if tick % 300 == 0:
                assert await a.check("Bearer prom-token", "/metrics", SCRAPER) is None
        made_up = token_reviews(api) - PER_SOURCE_BURST - 6  # the scraper's: once a minute
        assert made_up <= PER_SOURCE_PER_SECOND * 300

    asyncio.run(scenario())


SCRAPER, FLOODER = "10.0.0.5", "10.6.6.6"


def test_a_scrapers_rotated_token_is_served_through_a_flood_from_one_address() -> None:
    """200 made-up tokens a second from one address: the scraper's new token, from
    another address, is checked and served, and so is another newcomer's."""
    async def scenario() -> None:
        api, clock = FakeApi(RIGHTS, TOKENS), Clock()
        a = auth(api, clock)
        assert await a.check("Bearer prom-token", "/metrics", SCRAPER) is None
        for tick in range(1, 101):
            clock.now = tick / 100
            await a.check(f"Bearer junk-{tick}-a", "/metrics", FLOODER)
            await a.check(f"Bearer junk-{tick}-b", "/metrics", FLOODER)
        assert await a.check("Bearer prom-token-rotated", "/metrics", SCRAPER) is None
        assert (await a.check("Bearer alice-token", "/metrics", "10.0.0.9")
                )[0] == 403  # type: ignore[index]

    asyncio.run(scenario())


def test_a_flood_from_many_addresses_costs_a_bounded_number_of_reviews_and_spares_the_scraper(
) -> None:
    """200 made-up tokens a second, each from an address of its own, for a minute: what
    they cost the API server is bounded, and the scraper's address, known good, still has
    its rotated token checked."""
    async def scenario() -> None:
        api, clock = FakeApi(RIGHTS, TOKENS), Clock()
        a = auth(api, clock)
        assert await a.check("Bearer prom-token", "/metrics", SCRAPER) is None
        busy = 0
        for tick in range(1, 6001):
            clock.now = tick / 100
            for i in range(2):
                busy += await a.check(f"Bearer junk-{tick}-{i}", "/metrics",
                                      f"10.7.{tick % 100}.{i}") == BUSY
        assert busy > 0
        assert token_reviews(api) - 1 <= STRANGERS_BURST + STRANGERS_PER_SECOND * 60
        assert await a.check("Bearer prom-token-rotated", "/metrics", SCRAPER) is None

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
                # Its address is known good now: new tokens from it are checked within
                # the budget of known sources.
                for i in range(KNOWN_BURST + 1):
                    async with http.get(f"{base}/metrics",
                                        headers={"Authorization": f"Bearer x{i}"}) as r:
                        assert r.status == (401 if i < KNOWN_BURST else 429)
                async with http.get(f"{base}/metrics",
                                    headers={"Authorization": "Bearer prom-token"}) as r:
                    assert r.status == 200  # known: no check needed
        finally:
            await server.stop()

    asyncio.run(scenario())


TENANT = "10.1.0.7"
LIST_IN_TEAM_A = ("list appwrappers in namespace team-a", {"resourceAttributes": {
    "group": "workload.codeflare.dev", "resource": "appwrappers", "verb": "list",
    "namespace": "team-a"}})


def test_a_tenant_with_many_valid_tokens_cannot_spend_a_returning_scrapers_renewal() -> None:
    """A tenant mints 30 tokens of its own (each granted, one a second, within its own
    address's budget); once their minute is up it shows them all again at once. The
    scraper, whose token's minute is up too, is checked again and served: renewals are
    each address's own, not one budget every returning token shares."""
    async def scenario() -> None:
        tenants = {f"tenant-{i}": {"username": "tenant", "groups": []} for i in range(30)}
        api = FakeApi({**RIGHTS, "tenant": {"list appwrappers.workload.codeflare.dev in "
                                            "team-a"}}, {**TOKENS, **tenants})
        clock = Clock()
        a = auth(api, clock)
        assert await a.check("Bearer prom-token", "/metrics", SCRAPER) is None
        for i, token in enumerate(tenants, start=1):
            clock.now = float(i)
            assert await a.allowed(f"Bearer {token}", *LIST_IN_TEAM_A, TENANT) is None
        clock.now = 100.0  # every answer above is out of date
        again = [await a.allowed(f"Bearer {token}", *LIST_IN_TEAM_A, TENANT)
                 for token in tenants]
        assert again.count(BUSY) > 0  # the tenant spent its own address's budget
        assert await a.check("Bearer prom-token", "/metrics", SCRAPER) is None

    asyncio.run(scenario())
