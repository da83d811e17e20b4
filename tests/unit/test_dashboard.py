"""The dashboard: its data shaping (pure) and its endpoint over HTTP, with the same
authentication as the visibility endpoint: each viewer sees only the namespaces RBAC
lets it list AppWrappers in."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.api.labels import HELD_BY_ANNOTATION
from dispatcher.controller.dashboard import facts, view
from dispatcher.controller.dashboard.api import GATHER_SECONDS, DashboardApi
from dispatcher.controller.dashboard.events import BUSY, KEPT_SECONDS, MAX_READING, RecentEvents
from dispatcher.controller.kube.pacing import EVENT
from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.controller.metrics.prometheus import PrometheusObserver
from dispatcher.controller.metrics.server import MetricsServer
from dispatcher.queue import Policy

from .fake_authz import FakeApi
from .fake_kube import FakeKube
from .test_metrics_auth import auth
from .test_runtime import T0 as START
from .test_runtime import Clock, appwrapper, job, node
from .test_runtime_sharing import TREE, team
from .test_runtime_sharing import started as started_with_quota
from .test_visibility_api import APPWRAPPERS, waiting

TOKENS = {"alice-token": {"username": "alice", "groups": []},
          "admin-token": {"username": "admin", "groups": []}}
RIGHTS = {"alice": {f"list {APPWRAPPERS} in team-a"},
          "admin": {f"list {APPWRAPPERS}", "list events in team-a"}}
NOW = 1_000_000.0
AW = "workload.codeflare.dev/v1beta1"


def w(name: str, position: int | None, ns: str = "a", **kw: Any) -> view.Waiting:
    return view.Waiting(ns, name, position, 0, 0.0, kw.pop("first_seen", NOW - 60), **kw)


# --- the pure shaping --------------------------------------------------------------------

def test_rows_keep_the_controllers_order_and_the_held_come_after_oldest_first() -> None:
    rows = view.in_order([w("held-new", None, held_by="bob", first_seen=NOW - 5),
                          w("second", 2), w("held-old", None, held_by="bob",
                                            first_seen=NOW - 50), w("first", 1)])
    assert [r.name for r in rows] == ["first", "second", "held-old", "held-new"]


@given(st.permutations(range(6)))
def test_the_order_does_not_depend_on_the_order_facts_arrive_in(order: list[int]) -> None:
    facts = [w(f"w{i}", i + 1 if i < 3 else None, held_by=None if i < 3 else "x",
               first_seen=NOW - i) for i in range(6)]
    assert view.in_order(facts[i] for i in order) == view.in_order(facts)


def test_a_page_shows_only_the_viewers_namespaces_with_whole_queue_positions() -> None:
    rows = view.in_order([w("b1", 1, "b"), w("a1", 2, "a", teams=("t/gold",),
                                              kinds=("Job",), estimated_start=NOW + 7800),
                          w("a2", 3, "a", kinds=("PyTorchJob",), message="needs 16 GPUs")])
    page = view.queue_page(rows, frozenset({"a"}), view.Filters(), NOW)
    assert [(i["name"], i["position"]) for i in page["items"]] == [("a1", 2), ("a2", 3)]
    assert page["facets"]["namespaces"] == [["a", 2]]
    assert page["items"][0]["estimatedIn"] == "in 2h10m"
    assert page["items"][0]["estimatedStart"] == view.iso(NOW + 7800)
    assert page["items"][1]["why"] == "needs 16 GPUs"
    kind = view.queue_page(rows, None, view.Filters(kind="PyTorchJob"), NOW)
    assert [i["name"] for i in kind["items"]] == ["a2"] and kind["inScope"] == 3
    team = view.queue_page(rows, None, view.Filters(team="t/gold"), NOW)
    assert [i["name"] for i in team["items"]] == ["a1"]
    paged = view.queue_page(rows, None, view.Filters(offset=1, limit=1), NOW)
    assert [i["name"] for i in paged["items"]] == ["a1"] and paged["total"] == 3


def test_filters_that_cannot_be_read_say_what_to_fix() -> None:
    with pytest.raises(ValueError, match="whole numbers"):
        view.Filters.parse({"offset": "x"})
    with pytest.raises(ValueError, match="limit between 1 and 500"):
        view.Filters.parse({"limit": "100000"})
    with pytest.raises(ValueError, match="waiting, held"):
        view.Filters.parse({"state": "running"})
    assert view.Filters.parse({"state": "held", "offset": "10"}) == view.Filters(
        state="held", offset=10)


def test_teams_show_what_a_parent_lends_its_children() -> None:
    nodes = [view.TeamUsage("t", "root", None, 0, {"gpu": 16}, {"gpu": 12}, {}),
             view.TeamUsage("t", "gold", "root", 1, {"gpu": 8}, {"gpu": 12}, {"gpu": 4}),
             view.TeamUsage("t", "bronze", "root", 1, {"gpu": 8}, {}, {})]
    shaped = {n["name"]: n["resources"][0] for n in view.teams(nodes)}
    assert shaped["root"] == {"resource": "gpu", "guaranteed": 16, "used": 12,
                              "borrowed": 0, "lent": 4}
    assert shaped["gold"]["borrowed"] == 4 and shaped["gold"]["lent"] == 0
    assert shaped["bronze"] == {"resource": "gpu", "guaranteed": 8, "used": 0,
                                "borrowed": 0, "lent": 0}


def test_the_timeline_draws_each_bar_on_its_node_groups_for_its_viewer() -> None:
    bars = [view.Bar("a", "run", "running", NOW - 600, NOW + 1200, ("n1", "n2")),
            view.Bar("b", "next", "estimated", NOW + 1200, NOW + 9000, ("n1",)),
            view.Bar("a", "far", "estimated", NOW + 100, NOW + 200, ())]
    t = view.timeline(bars, frozenset({"a"}), NOW)
    assert [(lane["lane"], [b["name"] for b in lane["bars"]]) for lane in t["lanes"]] == [
        ("n1", ["run"]), ("n2", ["run"]), ("unplaced", ["far"])]
    assert t["lanes"][0]["bars"][0]["from"] == -600 and t["span"] == 3600
    assert view.timeline(bars, None, NOW, max_lanes=1)["moreLanes"] == 2


def test_history_counts_the_last_days_waits_per_team_and_hour() -> None:
    started = [view.Started("a", ("t/gold",), NOW - 900, NOW - 300),
               view.Started("a", ("t/gold",), NOW - 1000, NOW - 100),
               view.Started("b", (), NOW - 90_000, NOW - 89_000),  # more than a day ago
               view.Started("b", (), NOW - 7200, NOW - 3700),
               view.Started("c", (), NOW - 10, NOW)]  # started this very second
    h = view.history(started, None, NOW)
    assert len(h["hours"]) == 24
    gold = next(t for t in h["teams"] if t["team"] == "t/gold")["hours"]
    assert gold[-1] == {"started": 2, "medianSeconds": 750, "longestSeconds": 900}
    b = next(t for t in h["teams"] if t["team"] == "namespace b")["hours"]
    assert sum(x["started"] for x in b) == 1 and b[-2]["medianSeconds"] == 3500
    c = next(t for t in h["teams"] if t["team"] == "namespace c")["hours"]
    assert c[-1] == {"started": 1, "medianSeconds": 10, "longestSeconds": 10}
    assert [t["team"] for t in view.history(started, frozenset({"b"}), NOW)["teams"]] == [
        "namespace b"]


# --- the endpoint ------------------------------------------------------------------------

async def queue_with_a_held_one(kube: FakeKube, clock: Clock, held_by: str = "carol"
                                ) -> Dispatcher:
    kube.put(node("n1"))  # 8 GPUs: none of the 16-GPU wrappers fits, all wait
    runs = team(appwrapper("runs", job("runs", 1, 8)), "gold")  # but this one runs
    runs["metadata"]["namespace"] = "team-a"
    kube.put(runs)
    kube.put(waiting("a-low", "team-a", 1, 1, "gold"))
    kube.put(waiting("b-high", "team-b", 2, 9, "bronze"))
    kube.put(waiting("a-high", "team-a", 3, 5, "gold"))
    held = waiting("a-held", "team-a", 4, 1, "gold")
    held["metadata"]["annotations"] = {HELD_BY_ANNOTATION: held_by}
    kube.put(held)
    kube.objects["/api/v1/namespaces/team-a/events"] = {"items": [
        {"type": "Normal", "reason": "Queued", "message": "waits", "count": 1,
         "lastTimestamp": "2026-01-01T00:00:00Z"}]}
    d = await started_with_quota(kube, clock, TREE, Policy("priority", order="priority"))
    await d.cycle()
    d.ready = True
    return d


async def get(port: int, path: str, token: str | None) -> tuple[int, Any, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, \
            s.get(f"http://127.0.0.1:{port}/dashboard/{path}", headers=headers) as r:
        body = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, body, r.headers


def names(body: dict[str, Any]) -> list[tuple[str, int | None, str]]:
    return [(i["name"], i["position"], i["state"]) for i in body["items"]]


async def serving(d: Dispatcher, api: FakeApi | None = None) -> tuple[MetricsServer, int]:
    api = api or FakeApi(RIGHTS, TOKENS)
    server = MetricsServer(PrometheusObserver(), 0, "127.0.0.1",
                           dashboard=DashboardApi(lambda: d, auth(api)))
    await server.start()
    return server, server.addresses()[0][1]


def test_each_viewer_sees_its_namespaces_in_the_controllers_order() -> None:
    async def scenario() -> None:
        clock = Clock()
        d = await queue_with_a_held_one(FakeKube(clock), clock)
        api = FakeApi(RIGHTS, TOKENS)
        server, port = await serving(d, api)
        try:
            status, body, _ = await get(port, "api/queue?namespaces=team-a", "alice-token")
            assert status == 200 and body["scope"] == ["team-a"]
            assert names(body) == [("a-high", 2, "waiting"), ("a-low", 3, "waiting"),
                                   ("a-held", None, "held")]
            assert body["items"][0]["teams"] == ["quota_gpu/gold"]
            assert body["items"][0]["kinds"] == ["Job"] and body["items"][0]["gpus"] == 16
            assert body["items"][2]["why"].startswith("held by carol")
            assert body["facets"]["namespaces"] == [["team-a", 3]]
            # Alice asks for another namespace, or all of them: refused.
            assert (await get(port, "api/queue?namespaces=team-a,team-b", "alice-token"))[:2] \
                == (403, "alice may not list appwrappers in namespace team-b\n")
            assert (await get(port, "api/queue", "alice-token"))[0] == 403
            assert (await get(port, "api/queue", None))[0] == 401
            assert (await get(port, "api/teams?namespaces=team-a", "alice-token"))[0] == 403
            assert (await get(port, "api/appwrappers/team-b/b-high?namespaces=team-a",
                              "alice-token"))[0] == 403
            status, body, _ = await get(port, "api/queue?state=held", "admin-token")
            assert names(body) == [("a-held", None, "held")] and body["inScope"] == 4
            assert (await get(port, "api/queue?namespaces=../x", "admin-token"))[0] == 400
            # Asking for many namespaces costs no review: refused before any is made.
            many = ",".join(f"ns{i}" for i in range(1000))
            reviews = len(api.requests)
            assert (await get(port, f"api/queue?namespaces={many}", "alice-token"))[:2] == (
                400, "namespaces must be at most 20 namespace names, separated by commas\n")
            assert len(api.requests) == reviews
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_a_refresh_when_nothing_changed_is_answered_unchanged() -> None:
    async def scenario() -> None:
        clock = Clock()
        kube = FakeKube(clock)
        d = await queue_with_a_held_one(kube, clock)
        server, port = await serving(d)
        try:
            _, first, _ = await get(port, "api/queue", "admin-token")
            _, again, _ = await get(port, f"api/queue?since={first['version']}",
                                    "admin-token")
            assert again == {"unchanged": True, "version": first["version"]}
            obj = kube.get(AW, "AppWrapper", "team-a", "a-held")
            assert obj is not None
            obj["metadata"]["annotations"].pop(HELD_BY_ANNOTATION)  # released
            d.on_appwrapper("MODIFIED", copy.deepcopy(obj))
            await d.cycle()
            _, after, _ = await get(port, f"api/queue?since={first['version']}",
                                    "admin-token")
            assert after["version"] != first["version"]
            assert ("a-held", 4, "waiting") in names(after)
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_one_appwrapper_teams_timeline_and_history_for_an_admin() -> None:
    async def scenario() -> None:
        clock = Clock()
        d = await queue_with_a_held_one(FakeKube(clock), clock)
        server, port = await serving(d)
        try:
            status, one, _ = await get(port, "api/appwrappers/team-a/a-high", "admin-token")
            assert status == 200 and one["position"] == 2
            assert [c["type"] for c in one["conditions"]][:2] == ["Init", "Queueing"]
            assert one["events"][0]["reason"] == "Queued"
            assert "plan --live" in one["whatIf"]
            assert (await get(port, "api/appwrappers/team-a/nope", "admin-token"))[0] == 404
            status, teams, _ = await get(port, "api/teams", "admin-token")
            assert [n["name"] for n in teams["nodes"]] == ["root", "bronze", "gold"]
            clock.now += 600
            status, t, _ = await get(port, "api/timeline", "admin-token")
            assert status == 200
            [lane] = t["lanes"]
            assert lane["lane"] == "n1" and [(b["name"], b["kind"], b["from"])
                                             for b in lane["bars"]] == [("runs", "running", -600)]
            assert lane["bars"][0]["to"] > 0  # expected to end later (the default duration)
            status, h, _ = await get(port, "api/history", "admin-token")
            assert status == 200 and len(h["hours"]) == 24
            [gold] = h["teams"]
            assert gold["team"] == "quota_gpu/gold" and gold["hours"][-1]["started"] == 1
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_the_page_is_served_to_anyone_and_forbids_inline_script() -> None:
    async def scenario() -> None:
        clock = Clock()
        d = await queue_with_a_held_one(FakeKube(clock), clock)
        server, port = await serving(d)
        try:
            status, html, headers = await get(port, "", None)
            assert status == 200 and '<script src="app.js"' in html
            assert "script-src 'self'" in headers["Content-Security-Policy"]
            assert headers["Referrer-Policy"] == "no-referrer"
            status, js, headers = await get(port, "app.js", None)
            assert status == 200 and "textContent" in js
            assert (await get(port, "../pyproject.toml", None))[0] == 404
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_a_flood_of_made_up_tokens_from_one_address_does_not_lock_out_another_viewer(
) -> None:
    """An attacker at one address sends made-up tokens to the dashboard's API; alice, at
    another address, opening the dashboard with her token, is still checked and served
    (each address has its own budget of new tokens, as for /metrics)."""
    async def scenario() -> None:
        clock = Clock()
        d = await queue_with_a_held_one(FakeKube(clock), clock)
        server, port = await serving(d)
        flooder = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
        try:
            async with aiohttp.ClientSession(connector=flooder) as s:
                for i in range(50):
                    async with s.get(f"http://127.0.0.1:{port}/dashboard/api/queue",
                                     headers={"Authorization": f"Bearer junk-{i}"}):
                        pass
            status, body, _ = await get(port, "api/queue?namespaces=team-a", "alice-token")
            assert status == 200 and body["scope"] == ["team-a"]
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_a_viewer_of_twenty_namespaces_is_served_on_the_first_load() -> None:
    """Each namespace a viewer picks is one question about its token: once the API server
    vouched for the token, the others are asked within the token's own budget, not the new
    tokens' (which would refuse a viewer of more than a few namespaces with 429)."""
    async def scenario() -> None:
        clock = Clock()
        d = await queue_with_a_held_one(FakeKube(clock), clock)
        spaces = [f"ns{i}" for i in range(19)]
        rights = {**RIGHTS, "alice": RIGHTS["alice"] | {
            f"list {APPWRAPPERS} in {ns}" for ns in spaces}}
        server, port = await serving(d, FakeApi(rights, TOKENS))
        try:
            asked = ",".join(["team-a", *spaces])
            status, body, _ = await get(port, f"api/queue?namespaces={asked}", "alice-token")
            assert status == 200, body
            assert set(body["scope"]) == {"team-a", *spaces}
        finally:
            await server.stop()

    asyncio.run(scenario())


async def get_from(address: str, port: int, path: str, token: str) -> int:
    """The status of a dashboard request sent from `address` (a loopback address)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            local_addr=(address, 0))) as s, \
            s.get(f"http://127.0.0.1:{port}/dashboard/{path}",
                  headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status


def test_a_tenant_flooding_from_its_known_good_address_spends_only_its_own_budget() -> None:
    """Alice opens the dashboard once with her valid token, which makes her address known
    good, then sends made-up tokens from it. An administrator whose address is known good
    too comes back with a new token (a fresh `kubectl create token`): it is checked and
    served. Alice's own next new token waits for her address's budget."""
    async def scenario() -> None:
        clock = Clock()
        d = await queue_with_a_held_one(FakeKube(clock), clock)
        tokens = {**TOKENS, "admin-token-2": TOKENS["admin-token"],
                  "alice-token-2": TOKENS["alice-token"]}
        server, port = await serving(d, FakeApi(RIGHTS, tokens))
        tenant, returning = "127.0.0.2", "127.0.0.3"
        try:
            assert await get_from(returning, port, "api/queue", "admin-token") == 200
            assert await get_from(tenant, port, "api/queue?namespaces=team-a",
                                  "alice-token") == 200
            flood = [await get_from(tenant, port, "api/queue", f"junk-{i}")
                     for i in range(50)]
            assert flood.count(429) > 40
            assert await get_from(returning, port, "api/queue", "admin-token-2") == 200
            assert await get_from(tenant, port, "api/queue?namespaces=team-a",
                                  "alice-token-2") == 429
        finally:
            await server.stop()

    asyncio.run(scenario())


async def one_started_in_each_team(kube: FakeKube, clock: Clock) -> Dispatcher:
    """a-runs (team-a, quota leaf gold) and b-runs (team-b, bronze), each on a node."""
    for n, (name, ns, leaf) in enumerate((("a-runs", "team-a", "gold"),
                                          ("b-runs", "team-b", "bronze"))):
        kube.put(node(f"n{n}"))
        obj = team(appwrapper(name, job(name, 1, 8)), leaf)
        obj["metadata"]["namespace"] = ns
        kube.put(obj)
    d = await started_with_quota(kube, clock, TREE, Policy("priority", order="priority"))
    await d.cycle()
    d.ready = True
    return d


def test_the_history_walks_the_wrappers_once_a_refresh_and_each_viewer_sees_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Alice (team-a), Bob (team-b) and an administrator ask for the wait history again
    and again within a refresh: the controller walks its wrappers once, and each sees
    only its namespaces' teams, whoever asked first."""
    walks: list[int] = []
    walk = facts.started

    def counted(d: Dispatcher) -> dict[str, list[view.Started]]:
        walks.append(1)
        return walk(d)

    monkeypatch.setattr(facts, "started", counted)

    async def scenario() -> None:
        clock = Clock()
        d = await one_started_in_each_team(FakeKube(clock), clock)
        rights = {**RIGHTS, "bob": {f"list {APPWRAPPERS} in team-b"}}
        tokens = {**TOKENS, "bob-token": {"username": "bob", "groups": []}}
        server = MetricsServer(PrometheusObserver(), 0, "127.0.0.1", dashboard=DashboardApi(
            lambda: d, auth(FakeApi(rights, tokens)), monotonic=clock))
        await server.start()
        port = server.addresses()[0][1]

        async def teams(who: str, namespaces: str = "") -> list[str]:
            query = f"?namespaces={namespaces}" if namespaces else ""
            status, body, _ = await get(port, f"api/history{query}", f"{who}-token")
            assert status == 200, body
            return [t["team"] for t in body["teams"]]

        try:
            for _ in range(10):
                assert await teams("alice", "team-a") == ["quota_gpu/gold"]
                assert await teams("bob", "team-b") == ["quota_gpu/bronze"]
                assert await teams("admin") == ["quota_gpu/bronze", "quota_gpu/gold"]
                clock.now += GATHER_SECONDS / 40
            assert len(walks) == 1
            clock.now = START + GATHER_SECONDS  # the next refresh: walked again
            assert await teams("bob", "team-b") == ["quota_gpu/bronze"]
            assert await teams("alice", "team-a") == ["quota_gpu/gold"]
            assert len(walks) == 2
        finally:
            await server.stop()

    asyncio.run(scenario())


class ListingKube(FakeKube):
    """The stand-in API server, noting each list of Events: its priority and query."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock)
        self.events_listed: list[tuple[int, dict[str, str]]] = []

    async def request(self, method: str, path: str, body: Any = None,
                      query: Any = None, content_type: str = "application/json",
                      retry: bool = True, priority: int = 0, on_send: Any = None) -> Any:
        if method == "GET" and path.endswith("/events"):
            self.events_listed.append((priority, dict(query or {})))
        return await super().request(method, path, body, query, content_type, retry,
                                     priority, on_send)


def test_events_are_shown_to_who_may_list_them_and_listed_once_a_refresh_at_low_priority(
) -> None:
    """Alice may list AppWrappers in team-a but not Events: her AppWrapper page says so
    and the controller lists nothing for her. Ella may list both: ten viewers' requests,
    at once and in turn, within a refresh cost one list of the AppWrapper's Events,
    bounded, at the client's lowest priority; the next refresh lists them again."""
    async def scenario() -> None:
        clock = Clock()
        kube = ListingKube(clock)
        d = await queue_with_a_held_one(kube, clock)
        rights = {**RIGHTS, "ella": {f"list {APPWRAPPERS} in team-a", "list events in team-a"}}
        tokens = {**TOKENS, "ella-token": {"username": "ella", "groups": []}}
        server = MetricsServer(PrometheusObserver(), 0, "127.0.0.1", dashboard=DashboardApi(
            lambda: d, auth(FakeApi(rights, tokens)), monotonic=clock))
        await server.start()
        port = server.addresses()[0][1]
        page = "api/appwrappers/team-a/a-high?namespaces=team-a"
        try:
            status, alices, _ = await get(port, page, "alice-token")
            assert status == 200 and alices["conditions"]
            assert alices["events"] == "shown to users who may list Events in namespace team-a"
            assert kube.events_listed == []
            at_once = await asyncio.gather(*(get(port, page, "ella-token") for _ in range(5)))
            in_turn = [await get(port, page, "ella-token") for _ in range(5)]
            for status, body, _ in at_once + in_turn:
                assert status == 200 and [e["reason"] for e in body["events"]] == ["Queued"]
            assert kube.events_listed == [(EVENT, {
                "fieldSelector": "involvedObject.kind=AppWrapper,involvedObject.name=a-high",
                "limit": "100"})]
            clock.now += KEPT_SECONDS
            assert (await get(port, page, "ella-token"))[1]["events"][0]["reason"] == "Queued"
            assert len(kube.events_listed) == 2
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_past_a_few_lists_under_way_the_page_is_told_to_wait_for_its_next_refresh() -> None:
    """A viewer opening the pages of many AppWrappers at once while the API server is
    slow: a few lists of Events are under way at a time, the others' pages say so."""
    async def scenario() -> None:
        clock = Clock()
        kube = FakeKube(clock)
        kube.hang.add(("GET", "/api/v1/namespaces/team-a/events"))
        events = RecentEvents(clock)
        slow = [asyncio.ensure_future(events.of(kube, ("team-a", f"w{i}")))  # type: ignore[arg-type]
                for i in range(MAX_READING)]
        await asyncio.sleep(0)
        assert await events.of(kube, ("team-a", "another")) == BUSY  # type: ignore[arg-type]
        for s in slow:
            s.cancel()

    asyncio.run(scenario())
