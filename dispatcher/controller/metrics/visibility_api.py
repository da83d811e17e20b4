"""The queue as the controller numbers it, over HTTP, in the style of Kueue's visibility API.

Served by ``dispatcher run`` on its metrics port (the leader; a standby answers 503):

- ``GET /apis/visibility.workload.codeflare.dev/v1beta1/namespaces/NS/pendingappwrappers``:
  the waiting AppWrappers of namespace NS, for a user who may ``list`` AppWrappers there;
- ``GET .../v1beta1/pendingappwrappers``: the whole queue, and
  ``GET .../v1beta1/quotatrees/TREE/nodes/NODE/pendingappwrappers``: those under a quota
  node (its leaf or below it, across namespaces), both for a user who may ``list``
  AppWrappers in every namespace.

A request carries ``Authorization: Bearer TOKEN``: the token is checked with a TokenReview
and the right with a SubjectAccessReview (access/bearer.py), whatever ``--metrics-auth`` says.
``?limit=N&offset=M`` pages (default 1000 from 0). Each item gives its place in the whole
queue (``positionInCluster``), in the scope asked (``positionInScope``) and in its quota
leaves, its priorities, and why it waits — the dispatcher's own words, as in its status.
The order is the last admission cycle's (record/positions.py): what the statuses say once their
writes have caught up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from dispatcher.api.conditions import latest
from dispatcher.api.models import API_GROUP
from dispatcher.controller.access.bearer import TokenReviewAuth

if TYPE_CHECKING:
    from dispatcher.controller.loop.runtime import Dispatcher
    from dispatcher.controller.record.positions import Entry

GROUP = f"visibility.{API_GROUP}"
VERSION = "v1beta1"
BASE = f"/apis/{GROUP}/{VERSION}"
KIND = "PendingAppWrappers"
DEFAULT_LIMIT = 1000


class VisibilityApi:
    def __init__(self, dispatcher: Callable[[], Dispatcher | None],
                 auth: TokenReviewAuth) -> None:
        """`dispatcher`: the running one, None while this replica stands by or starts."""
        self.dispatcher = dispatcher
        self.auth = auth

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(f"{BASE}/pendingappwrappers", self.cluster)
        app.router.add_get(f"{BASE}/namespaces/{{namespace}}/pendingappwrappers",
                           self.namespace)
        app.router.add_get(f"{BASE}/quotatrees/{{tree}}/nodes/{{node}}/pendingappwrappers",
                           self.quota_node)

    async def close(self) -> None:
        await self.auth.close()

    async def cluster(self, request: web.Request) -> web.Response:
        return await self._answer(request, None, {}, lambda d: d.positions.snapshot.entries)

    async def namespace(self, request: web.Request) -> web.Response:
        ns = request.match_info["namespace"]
        return await self._answer(request, ns, {"namespace": ns}, lambda d: [
            e for e in d.positions.snapshot.entries if e.namespace == ns])

    async def quota_node(self, request: web.Request) -> web.Response:
        tree, node = request.match_info["tree"], request.match_info["node"]
        return await self._answer(request, None, {"quotaTree": tree, "quotaNode": node},
                                  lambda d: d.positions.snapshot.under(tree, node))

    async def _answer(self, request: web.Request, namespace: str | None,
                      scope: dict[str, str],
                      select: Callable[[Dispatcher], Sequence[Entry]]) -> web.Response:
        where = f"in namespace {namespace}" if namespace else "in all namespaces"
        refused = await self.auth.allowed(
            request.headers.get("Authorization"), f"list appwrappers {where}",
            {"resourceAttributes": {"group": API_GROUP, "resource": "appwrappers",
                                    "verb": "list", "namespace": namespace or ""}},
            request.remote or "")
        if refused is not None:
            return web.Response(status=refused[0], text=refused[1])
        try:
            limit = int(request.query.get("limit", DEFAULT_LIMIT))
            offset = int(request.query.get("offset", 0))
        except ValueError:
            limit = offset = -1
        if limit < 0 or offset < 0:
            return web.Response(status=400, text="limit and offset must be whole numbers "
                                                 "≥ 0\n")
        d = self.dispatcher()
        if d is None or not d.ready:
            return web.Response(status=503, text="this replica does not run the queue now "
                                "(standing by for the Lease, or starting): ask the leader\n")
        entries = select(d)
        snapshot = d.positions.snapshot
        return web.json_response({
            "apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "policy": snapshot.policy,
            "scope": scope, "numberedAt": _time(snapshot.at), "total": len(entries),
            "items": [self._item(d, e, place)
                      for place, e in enumerate(entries[offset:offset + limit],
                                                start=offset + 1)]})

    @staticmethod
    def _item(d: Dispatcher, e: Entry, place: int) -> dict[str, Any]:
        t = d.tracked.get(e.key)
        last = latest(t.status.conditions) if t is not None else None
        return {
            "metadata": {"namespace": e.namespace, "name": e.name},
            "positionInCluster": e.position, "positionInScope": place,
            "quota": [q.model_dump() for q in e.quota],
            "priority": e.priority, "effectivePriority": e.effective_priority,
            "firstSeen": _time(e.first_seen),
            "condition": last.type if last is not None else "",
            "reason": last.reason if last is not None else "",
            "message": t.status.message if t is not None else "",
        }


def _time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
