"""The visibility endpoint of `dispatcher run`: the queue as the controller numbered it, per
namespace, per quota node and whole, to the users RBAC lets list AppWrappers there."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.controller.metrics.prometheus import PrometheusObserver
from dispatcher.controller.metrics.server import MetricsServer
from dispatcher.controller.metrics.visibility_api import BASE, VisibilityApi
from dispatcher.queue import Policy

from .fake_authz import FakeApi
from .fake_kube import FakeKube
from .test_metrics_auth import auth
from .test_runtime import Clock, appwrapper, job, node
from .test_runtime_sharing import TREE, team
from .test_runtime_sharing import started as started_with_quota

TOKENS = {"alice-token": {"username": "alice", "groups": []},
          "admin-token": {"username": "admin", "groups": []}}
APPWRAPPERS = "appwrappers.workload.codeflare.dev"
RIGHTS = {"alice": {f"list {APPWRAPPERS} in team-a"}, "admin": {f"list {APPWRAPPERS}"}}


def waiting(name: str, namespace: str, created: int, priority: int, leaf: str
            ) -> dict[str, Any]:
    obj = team(appwrapper(name, job(name, 1, 16), created=created, priority=priority), leaf)
    obj["metadata"]["namespace"] = namespace
    return obj


async def queue_of_two_teams(kube: FakeKube, clock: Clock) -> Dispatcher:
    kube.put(node("n1"))  # 8 GPUs: none of the 16-GPU wrappers fits, all wait
    kube.put(waiting("a-low", "team-a", 1, 1, "gold"))
    kube.put(waiting("b-high", "team-b", 2, 9, "bronze"))
    kube.put(waiting("a-high", "team-a", 3, 5, "gold"))
    d = await started_with_quota(kube, clock, TREE, Policy("priority", order="priority"))
    await d.cycle()
    d.ready = True
    return d


async def get(port: int, path: str, token: str | None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, \
            s.get(f"http://127.0.0.1:{port}{BASE}{path}", headers=headers) as r:
        body = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, body


def rows(body: dict[str, Any]) -> list[tuple[str, int, int]]:
    return [(i["metadata"]["name"], i["positionInCluster"], i["positionInScope"])
            for i in body["items"]]


def test_each_user_sees_the_controllers_order_where_rbac_lets_them_list_appwrappers() -> None:
    async def scenario() -> None:
        clock = Clock()
        d = await queue_of_two_teams(FakeKube(clock), clock)
        api = FakeApi(RIGHTS, TOKENS)
        served: list[Dispatcher | None] = [d]
        server = MetricsServer(PrometheusObserver(), 0, "127.0.0.1",
                               visibility=VisibilityApi(lambda: served[0], auth(api)))
        await server.start()
        port = server.addresses()[0][1]
        try:
            status, body = await get(port, "/namespaces/team-a/pendingappwrappers",
                                     "alice-token")
            assert status == 200 and body["policy"] == "priority"
            assert body["scope"] == {"namespace": "team-a"}
            # Priority order over the whole cluster: b-high, a-high, a-low.
            assert rows(body) == [("a-high", 2, 1), ("a-low", 3, 2)]
            assert body["items"][0]["quota"] == [
                {"tree": "quota_gpu", "node": "gold", "position": 1}]
            assert body["items"][0]["reason"] == "AppWrapperNotRunnable"
            # Alice may not list team-b's AppWrappers, nor every namespace's.
            assert await get(port, "/namespaces/team-b/pendingappwrappers",
                             "alice-token") == (
                403, "alice may not list appwrappers in namespace team-b\n")
            assert (await get(port, "/pendingappwrappers", "alice-token"))[0] == 403
            assert (await get(port, "/namespaces/team-a/pendingappwrappers", None))[0] == 401
            assert (await get(port, "/namespaces/team-a/pendingappwrappers",
                              "made-up"))[0] == 401
            # The whole queue and a quota node, to who may list every namespace's.
            status, body = await get(port, "/pendingappwrappers?limit=2", "admin-token")
            assert status == 200 and body["total"] == 3
            assert rows(body) == [("b-high", 1, 1), ("a-high", 2, 2)]
            status, body = await get(port, "/pendingappwrappers?limit=2&offset=2",
                                     "admin-token")
            assert rows(body) == [("a-low", 3, 3)]
            status, body = await get(port, "/quotatrees/quota_gpu/nodes/gold/"
                                     "pendingappwrappers", "admin-token")
            assert rows(body) == [("a-high", 2, 1), ("a-low", 3, 2)]
            assert (await get(port, "/pendingappwrappers?limit=-1", "admin-token"))[0] == 400
            served[0] = None  # a replica standing by for the Lease
            assert (await get(port, "/pendingappwrappers", "admin-token"))[0] == 503
        finally:
            await server.stop()

    asyncio.run(scenario())
