"""Who may see what of the dashboards, and the headers every answer carries: shared by the
controller's dashboard (api.py) and the manager's Clusters view (clusters_api.py).

A request carries ``Authorization: Bearer TOKEN`` of a user allowed to ``list`` AppWrappers
— in every namespace, or, with ``?namespaces=a,b``, in each of those — checked with a
TokenReview and SubjectAccessReviews (access/bearer.py: answers kept a minute, new tokens'
questions bounded per address). An AppWrapper's Events are shown to a user allowed to
``list`` Events in its namespace too, asked the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from dispatcher.api.models import API_GROUP
from dispatcher.controller.access.bearer import TokenReviewAuth

MAX_NAMESPACES = 20
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self'; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
Scope = frozenset[str] | None  # the namespaces a viewer may see; None: all
PAGE = Path(__file__).resolve().parents[2] / "dashboard_page"


def serve_page(app: web.Application, files: Mapping[str, tuple[str, str]]) -> None:
    """A page at /dashboard/ (/dashboard sends there): `files` maps each path under it to
    its file in dashboard_page/ and its content type. Anyone may load it: its data comes
    from the API, which checks every token."""
    async def to_page(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/dashboard/")

    async def page(request: web.Request) -> web.Response:
        name, content_type = files[request.match_info["file"]]
        return web.Response(body=(PAGE / name).read_bytes(), content_type=content_type,
                            charset="utf-8", headers=HEADERS)

    served = "|".join(re.escape(path) for path in files)
    app.router.add_get("/dashboard", to_page)
    app.router.add_get(f"/dashboard/{{file:({served})}}", page)


async def scope(auth: TokenReviewAuth, request: web.Request) -> Scope | web.Response:
    """The namespaces the request's user may see, or the refusal to send."""
    asked = [n for n in request.query.get("namespaces", "").split(",") if n]
    bad = [n for n in asked if not NAMESPACE.match(n)]
    if bad or len(asked) > MAX_NAMESPACES:
        return text(400, f"namespaces must be at most {MAX_NAMESPACES} namespace names, "
                         "separated by commas" + (f" (not {bad[0][:64]!r})" if bad else ""))
    header = request.headers.get("Authorization")
    for ns in asked or [""]:
        where = f"in namespace {ns}" if ns else "in all namespaces"
        refused = await auth.allowed(header, f"list appwrappers {where}", {
            "resourceAttributes": {"group": API_GROUP, "resource": "appwrappers",
                                   "verb": "list", "namespace": ns}},
            request.remote or "")
        if refused is not None:
            return text(*refused)
    return frozenset(asked) if asked else None


async def events_hidden(auth: TokenReviewAuth, request: web.Request, namespace: str
                       ) -> str | None:
    """None if the request's user may list Events in `namespace` (asked as the user, as
    every question here: kept a minute per token, a refusal 10 s); else why its AppWrapper
    pages show none. Listing AppWrappers there does not imply it."""
    refused = await auth.allowed(
        request.headers.get("Authorization"), f"list events in namespace {namespace}",
        {"resourceAttributes": {"group": "", "resource": "events", "verb": "list",
                                "namespace": namespace}}, request.remote or "")
    if refused is None:
        return None
    if refused[0] == 403:
        return f"shown to users who may list Events in namespace {namespace}"
    return f"not shown now: {refused[1].strip()}"


def text(status: int, words: str) -> web.Response:
    return web.Response(status=status, text=words.rstrip("\n") + "\n", headers=HEADERS)


def as_json(body: dict[str, Any]) -> web.Response:
    return web.json_response(body, headers=HEADERS)
