"""The manager's Clusters view: a read-only web page served by ``dispatcher run --manager``
on its metrics port, at ``/dashboard/``: the worker clusters, the manager's waiting
AppWrappers and why they wait, and where the sent ones went.

As the controller's dashboard (api.py): the page (dashboard_page/clusters.html) holds
nothing about the clusters and is served to anyone; ``/dashboard/api/clusters`` answers
only a token of a user allowed to ``list`` AppWrappers in every namespace of the manager
cluster (viewer.py), since the view shows every namespace's wrappers.

Everything comes from what the manager holds in memory (its views of the workers, kept by
watches, and of its own wrappers): a page load asks nothing of the workers, and the facts
are gathered at most every :data:`GATHER_SECONDS` however many viewers ask.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from aiohttp import web

from dispatcher.controller.access.bearer import TokenReviewAuth

from . import viewer
from .clusters_view import Fleet, clusters

FILES = {"": ("clusters.html", "text/html"), "clusters.js": ("clusters.js", "text/javascript"),
         "style.css": ("style.css", "text/css")}
GATHER_SECONDS = 2.0
#: The facts now, or why there are none to show (a standby replica, a manager starting).
Facts = Callable[[], Fleet | str]


class ClustersApi:
    def __init__(self, facts: Facts, auth: TokenReviewAuth,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.facts = facts
        self.auth = auth
        self.monotonic = monotonic
        self._gathered: tuple[float, Fleet | str] | None = None

    def add_routes(self, app: web.Application) -> None:
        viewer.serve_page(app, FILES)
        app.router.add_get("/dashboard/api/clusters", self.clusters)

    async def clusters(self, request: web.Request) -> web.Response:
        scope = await viewer.scope(self.auth, request)
        if isinstance(scope, web.Response):
            return scope
        if scope is not None:
            return viewer.text(403, "the Clusters view shows every namespace's AppWrappers: "
                                    "it is shown to users who may list AppWrappers in all "
                                    "namespaces")
        facts = self.gathered()
        if isinstance(facts, str):
            return viewer.text(503, facts)
        return viewer.as_json(clusters(facts))

    def gathered(self) -> Fleet | str:
        now = self.monotonic()
        if self._gathered is None or now - self._gathered[0] >= GATHER_SECONDS:
            self._gathered = (now, self.facts())
        return self._gathered[1]

    async def close(self) -> None:
        await self.auth.close()
