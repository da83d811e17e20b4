"""The dashboard: a read-only web page served by ``dispatcher run`` beside the visibility
endpoint, on the metrics port, at ``/dashboard/``.

The page itself (HTML, JavaScript, CSS shipped in the package, dashboard_page/) holds
nothing about the cluster and is served to anyone. Everything it shows comes from
``/dashboard/api/...``, which answers only a request carrying ``Authorization: Bearer
TOKEN`` of a user allowed to ``list`` AppWrappers — in every namespace, or, with
``?namespaces=a,b``, in each of those (viewer.py: checked as the visibility endpoint
checks, with a TokenReview and SubjectAccessReviews); a viewer sees only those namespaces.
The page sends the token from script, so it never travels in a URL the server logs.

The queue refresh is cheap: the rows are gathered from memory at most every
:data:`GATHER_SECONDS` and a page asked with ``since=VERSION`` when nothing changed
is answered ``{"unchanged": true}``. The wait history walks every wrapper the controller
tracks, finished ones included: it is gathered at most as often, per namespace, and each
viewer's namespaces' answer shaped once per gathering, so a burst of requests costs the
event loop one walk. An AppWrapper's page shows its Events only to a viewer who may list
Events in its namespace (viewer.py), read as events.py says.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from itertools import chain
from typing import TYPE_CHECKING, Any

from aiohttp import web

from dispatcher.controller.access.bearer import TokenReviewAuth

from . import facts, view, viewer
from .events import RecentEvents

if TYPE_CHECKING:
    from dispatcher.controller.loop.runtime import Dispatcher

FILES = {"": ("index.html", "text/html"), "app.js": ("app.js", "text/javascript"),
         "style.css": ("style.css", "text/css")}
GATHER_SECONDS = 5.0  # the page asks every 5 s: the rows at most once a refresh
TIMELINE_SECONDS = 10.0
#: Histories kept shaped, one per set of namespaces viewers asked for, until the next
#: gathering; the least recently asked dropped first.
MAX_HISTORIES = 100


class Histories:
    """The wait history each viewer sees: the started wrappers walked at most every
    :data:`GATHER_SECONDS` (the walk is the cost), grouped by namespace, and each set of
    namespaces' answer shaped once from its own namespaces' rows only."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self.monotonic = monotonic
        # (monotonic, the dispatcher walked, its clock then, its started per namespace)
        self._gathered: tuple[float, object, float, dict[str, list[view.Started]]] | None \
            = None
        self._shaped: OrderedDict[viewer.Scope, dict[str, Any]] = OrderedDict()

    def of(self, d: Dispatcher, scope: viewer.Scope) -> dict[str, Any]:
        now = self.monotonic()
        if self._gathered is None or self._gathered[1] is not d \
                or now - self._gathered[0] >= GATHER_SECONDS:
            self._gathered = (now, d, d.clock(), facts.started(d))
            self._shaped.clear()
        shaped = self._shaped.get(scope)
        if shaped is None:
            _, _, at, by_namespace = self._gathered
            rows = chain.from_iterable(by_namespace.get(ns, ()) for ns in (
                by_namespace if scope is None else sorted(scope)))
            shaped = self._shaped[scope] = view.history(rows, scope, at)
            while len(self._shaped) > MAX_HISTORIES:
                self._shaped.popitem(last=False)
        self._shaped.move_to_end(scope)
        return shaped


class DashboardApi:
    def __init__(self, dispatcher: Callable[[], Dispatcher | None], auth: TokenReviewAuth,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.dispatcher = dispatcher
        self.auth = auth
        self.monotonic = monotonic
        self.version = 0
        self._rows: list[view.Waiting] = []
        self._gathering = facts.Gathering()
        self._gathered: tuple[object, float] | None = None  # (snapshot, monotonic)
        self._bars: tuple[float, list[view.Bar]] | None = None
        self.histories = Histories(monotonic)
        self.events = RecentEvents(monotonic)

    def add_routes(self, app: web.Application) -> None:
        viewer.serve_page(app, FILES)
        app.router.add_get("/dashboard/api/queue", self.queue)
        app.router.add_get("/dashboard/api/teams", self.teams)
        app.router.add_get("/dashboard/api/timeline", self.timeline)
        app.router.add_get("/dashboard/api/history", self.history)
        app.router.add_get("/dashboard/api/appwrappers/{namespace}/{name}", self.one)

    async def _ready(self, request: web.Request
                     ) -> tuple[Dispatcher, viewer.Scope] | web.Response:
        scope = await viewer.scope(self.auth, request)
        if isinstance(scope, web.Response):
            return scope
        d = self.dispatcher()
        if d is None or not d.ready:
            return viewer.text(503, "this replica does not run the queue now (standing by for "
                              "the Lease, or starting): ask the leader")
        return d, scope

    # --- the views ----------------------------------------------------------------------

    def rows(self, d: Dispatcher) -> list[view.Waiting]:
        """The waiting wrappers in order, gathered again when the queue was numbered
        anew or after a few seconds (statuses change between numberings)."""
        snapshot, now = d.positions.snapshot, self.monotonic()
        if self._gathered is None or self._gathered[0] is not snapshot \
                or now - self._gathered[1] >= GATHER_SECONDS:
            rows = view.in_order(self._gathering.waiting(d))
            if rows != self._rows:
                self._rows = rows
                self.version += 1
            self._gathered = (snapshot, now)
        return self._rows

    async def queue(self, request: web.Request) -> web.Response:
        ready = await self._ready(request)
        if isinstance(ready, web.Response):
            return ready
        d, scope = ready
        try:
            filters = view.Filters.parse(request.query)
        except ValueError as e:
            return viewer.text(400, str(e))
        rows = self.rows(d)
        if request.query.get("since") == str(self.version):
            return viewer.as_json({"unchanged": True, "version": self.version})
        return viewer.as_json({"version": self.version, "policy": d.positions.snapshot.policy,
                      "scope": None if scope is None else sorted(scope),
                      **view.queue_page(rows, scope, filters, d.clock())})

    async def teams(self, request: web.Request) -> web.Response:
        ready = await self._ready(request)
        if isinstance(ready, web.Response):
            return ready
        d, scope = ready
        if scope is not None:
            return viewer.text(403, "the quota trees show every team's use: they are shown to "
                              "users who may list AppWrappers in all namespaces")
        return viewer.as_json({"nodes": view.teams(facts.teams(d))})

    async def timeline(self, request: web.Request) -> web.Response:
        ready = await self._ready(request)
        if isinstance(ready, web.Response):
            return ready
        d, scope = ready
        now = d.clock()
        if self._bars is None or self.monotonic() - self._bars[0] >= TIMELINE_SECONDS:
            self._bars = (self.monotonic(), facts.bars(d, now))
        return viewer.as_json(view.timeline(self._bars[1], scope, now))

    async def history(self, request: web.Request) -> web.Response:
        ready = await self._ready(request)
        if isinstance(ready, web.Response):
            return ready
        d, scope = ready
        return viewer.as_json(self.histories.of(d, scope))

    async def one(self, request: web.Request) -> web.Response:
        ready = await self._ready(request)
        if isinstance(ready, web.Response):
            return ready
        d, scope = ready
        ns, name = request.match_info["namespace"], request.match_info["name"]
        if scope is not None and ns not in scope:
            return viewer.text(403, f"namespace {ns} is not among the namespaces you asked to see")
        found = facts.one(d, (ns, name))
        if found is None:
            return viewer.text(404, f"no AppWrapper {ns}/{name} is known to the dispatcher")
        hidden = await viewer.events_hidden(self.auth, request, ns)
        found["events"] = hidden if hidden is not None else \
            await self.events.of(d.kube, (ns, name))
        return viewer.as_json(found)
