"""The manager's Clusters view: its shaping (pure), its endpoint over HTTP with the
dashboard's access rules, and its facts read from the manager's memory, so that a page
load asks the workers nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp

from dispatcher.controller.dashboard.clusters_api import ClustersApi
from dispatcher.controller.dashboard.clusters_view import (
    Fleet,
    SentFacts,
    WaitingFacts,
    WorkerFacts,
    clusters,
)
from dispatcher.controller.manager import clusters_facts
from dispatcher.controller.manager.manager_metrics import ManagerMetrics, ManagerServer
from dispatcher.resources import GPU

from .fake_authz import FakeApi
from .test_dashboard import RIGHTS, TOKENS
from .test_manager import Fleet as Stand
from .test_manager import Worker
from .test_metrics_auth import auth

NOW = 1_000_000.0
GiB = 2**30


def fleet() -> Fleet:
    return Fleet(
        workers=[WorkerFacts("w1", True, nodes=2, free={GPU: 6, "cpu": 3500},
                             total={GPU: 16, "cpu": 8000, "memory": 64 * GiB}),
                 WorkerFacts("w2", False, silent_for=130.0,
                             problem="watch of nodes: connection refused", nodes=2,
                             cordoned=1, free={GPU: 8}, total={GPU: 8})],
        sent=[SentFacts("team", "b", "w1", "Running"), SentFacts("team", "a", "w1", ""),
              SentFacts("team", "c", "w2", "Running")],
        waiting=[WaitingFacts("team", "big", 5, NOW - 600, 32,
                              "no worker cluster fits it now:\n w1: 6 of 32 free"),
                 WaitingFacts("team", "new", 0, NOW - 5, 8, "")],
        passes=42, last_pass_ago=0.4, at=NOW)


# --- the pure shaping --------------------------------------------------------------------

def test_each_worker_says_whether_it_answers_since_when_and_why() -> None:
    view = clusters(fleet())
    w1, w2 = view["workers"]
    assert (w1["name"], w1["reachable"], w1["answering"]) == ("w1", True, "yes")
    assert not w2["reachable"]
    assert w2["answering"] == "no for 2m10s: watch of nodes: connection refused"
    assert (w2["nodes"], w2["cordoned"]) == (2, 1)


def test_each_worker_shows_its_free_and_total_gpus_then_its_other_resources() -> None:
    w1 = clusters(fleet())["workers"][0]
    assert (w1["gpusFree"], w1["gpusTotal"]) == (6, 16)
    assert w1["resources"] == [
        {"resource": GPU, "free": "6", "total": "16"},
        {"resource": "cpu", "free": "3.5", "total": "8"},
        {"resource": "memory", "free": "0", "total": "64Gi"}]


def test_a_worker_never_listed_shows_nothing_it_does_not_know() -> None:
    facts = Fleet([WorkerFacts("w3", False, silent_for=5.0, problem="not listed yet",
                               listed=False)], [], [], 1, 0.0, NOW)
    [w3] = clusters(facts)["workers"]
    assert (w3["nodes"], w3["gpusFree"], w3["gpusTotal"]) == (None, None, None)
    assert w3["answering"] == "no for 5s: not listed yet"


def test_the_wrappers_sent_are_counted_per_worker_and_state_and_listed() -> None:
    view = clusters(fleet())
    w1, w2 = view["workers"]
    assert w1["sent"] == 2 and w1["sentByState"] == [["Running", 1], ["just sent", 1]]
    assert w2["sentByState"] == [["Running", 1]]
    assert [(s["name"], s["worker"], s["state"]) for s in view["sent"]] == [
        ("a", "w1", "just sent"), ("b", "w1", "Running"), ("c", "w2", "Running")]


def test_the_waiting_keep_the_managers_order_and_its_words() -> None:
    view = clusters(fleet())
    assert [(w["position"], w["name"], w["gpus"], w["waiting"]) for w in view["waiting"]] \
        == [(1, "big", 32, "10m"), (2, "new", 8, "5s")]
    assert view["waiting"][0]["why"] == "no worker cluster fits it now: w1: 6 of 32 free"
    assert view["waiting"][1]["why"] == "not looked at by a pass yet"


def test_long_lists_are_cut_and_counted() -> None:
    many = [WaitingFacts("team", f"w{i}", 0, NOW, 1, "") for i in range(600)]
    view = clusters(Fleet([], [], many, 1, 0.0, NOW))
    assert len(view["waiting"]) == 500 and view["moreWaiting"] == 100


# --- over HTTP ---------------------------------------------------------------------------

async def serving(facts: Callable[[], Fleet | str], api: FakeApi | None = None
                  ) -> tuple[ManagerServer, int]:
    server = ManagerServer(ManagerMetrics(), 0, "127.0.0.1", dashboard=ClustersApi(
        facts, auth(api or FakeApi(RIGHTS, TOKENS))))
    await server.start()
    assert server._runner is not None
    return server, next(a[1] for a in server._runner.addresses if isinstance(a, tuple))


async def get(port: int, path: str, token: str | None) -> tuple[int, Any, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, \
            s.get(f"http://127.0.0.1:{port}/dashboard/{path}", headers=headers) as r:
        body = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, body, r.headers


def test_only_a_user_who_may_list_appwrappers_everywhere_sees_the_clusters() -> None:
    async def scenario() -> None:
        server, port = await serving(fleet)
        try:
            assert (await get(port, "api/clusters", None))[0] == 401
            assert (await get(port, "api/clusters", "junk"))[0] == 401
            assert (await get(port, "api/clusters", "alice-token"))[:2] == (
                403, "alice may not list appwrappers in all namespaces\n")
            assert (await get(port, "api/clusters?namespaces=team-a", "alice-token"))[0] \
                == 403
            status, body, headers = await get(port, "api/clusters", "admin-token")
            assert status == 200 and [w["name"] for w in body["workers"]] == ["w1", "w2"]
            assert "script-src 'self'" in headers["Content-Security-Policy"]
        finally:
            await server.stop()

    asyncio.run(scenario())


def test_the_page_is_served_to_anyone_and_a_standby_says_it_stands_by() -> None:
    async def scenario() -> None:
        server, port = await serving(lambda: "this replica stands by (waiting for Lease "
                                             "x/y): the leader shows the clusters; reload")
        try:
            status, html, headers = await get(port, "", None)
            assert status == 200 and '<script src="clusters.js"' in html
            assert headers["Referrer-Policy"] == "no-referrer"
            status, js, _ = await get(port, "clusters.js", None)
            assert status == 200 and "innerHTML" not in js
            assert (await get(port, "app.js", None))[0] == 404
            status, why, _ = await get(port, "api/clusters", "admin-token")
            assert status == 503 and why.startswith("this replica stands by")
        finally:
            await server.stop()

    asyncio.run(scenario())


# --- from the manager's memory -----------------------------------------------------------

class Counted(Worker):
    """A worker that counts everything it is asked."""

    def __init__(self, name: str, gpus: int = 8) -> None:
        super().__init__(name, gpus)
        self.asked = 0

    async def list(self, *args: Any, **kw: Any) -> list[dict[str, Any]]:
        self.asked += 1
        return await super().list(*args, **kw)

    def watch(self, *args: Any, **kw: Any) -> Any:
        self.asked += 1
        return super().watch(*args, **kw)

    async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        self.asked += 1
        return await super().request(method, path, body, **kw)


def test_a_page_load_reads_the_managers_memory_and_asks_the_workers_nothing() -> None:
    stand = Stand(Counted("w1"), Counted("w2", gpus=4))
    stand.submit("a", gpus=6)  # only w1 has 6
    stand.submit("huge", gpus=16)  # nobody has 16 on one node
    stand.cycle(2)
    stand.workers["w2"].down = True
    stand.now += 30
    stand.cycle()
    manager = stand.process
    asked = {n: w.asked for n, w in stand.workers.items()}  # type: ignore[attr-defined]
    manager_asked = len(stand.manager.reads), len(stand.manager.writes)

    async def scenario() -> dict[str, Any]:
        server, port = await serving(clusters_facts.source(manager, lambda: None))
        try:
            status, body, _ = await get(port, "api/clusters", "admin-token")
            assert status == 200, body
            return dict(body)
        finally:
            await server.stop()

    body = stand.loop.run_until_complete(scenario())
    assert {n: w.asked for n, w in stand.workers.items()} == asked  # type: ignore[attr-defined]
    assert (len(stand.manager.reads), len(stand.manager.writes)) == manager_asked
    w1, w2 = body["workers"]
    assert (w1["answering"], w1["gpusFree"], w1["gpusTotal"]) == ("yes", 2, 8)
    assert w1["sentByState"] == [["just sent", 1]]
    assert not w2["reachable"] and w2["answering"].startswith("no for 30s: ")
    assert w2["gpusTotal"] == 4  # as last seen
    assert [(s["name"], s["worker"]) for s in body["sent"]] == [("a", "w1")]
    [huge] = body["waiting"]
    assert huge["name"] == "huge" and huge["gpus"] == 16
    assert huge["why"].endswith("w1: 2 of 16 nvidia.com/gpu free on one node; "
                                "w2: unreachable")  # as the manager wrote it
