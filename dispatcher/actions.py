"""`hold`, `release`, `cancel` and `why`: acting on one AppWrapper as its user
(`dispatcher hold NAME`, `kubectl appwrapper hold NAME`, ...).

Hold and cancel are annotations naming who asks (controller/record/holds.py says what the
dispatcher does with them); setting one takes ``patch`` on ``appwrappers`` in the
AppWrapper's namespace, so plain RBAC decides who may. The name is the user the API server
knows the caller as (a SelfSubjectReview). `why` prints what the dispatcher published in
the AppWrapper's status — its condition, message, place in the queue and estimate — and
the ones ahead of it, as they are; nothing is worked out again here — and, given the
dashboard's address (``--dashboard`` or ``$DISPATCHER_DASHBOARD``), the address of the
AppWrapper's page there.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from dispatcher.api.labels import CANCELLED_BY_ANNOTATION, HELD_BY_ANNOTATION
from dispatcher.api.models import API_GROUP, API_VERSION
from dispatcher.visibility import (
    ClusterError,
    Listing,
    connected,
    is_pending,
    list_appwrappers,
    status_of,
    user_error,
    why_of,
)
from dispatcher.wording import printable, span

EXIT_CLUSTER = 1
EXIT_USAGE = 2  # as argparse's
SHOWN_AHEAD = 5
SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
FINISHED = frozenset({"Completed", "Failed"})
DASHBOARD_ENV = "DISPATCHER_DASHBOARD"


class Refused(RuntimeError):
    """What was asked cannot be done; the message says why."""


def _path(namespace: str, name: str) -> str:
    return f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{namespace}/appwrappers/{name}"


async def _get(kube: Any, namespace: str, name: str) -> dict[str, Any]:
    from dispatcher.controller.kube.client import ApiError

    try:
        obj: dict[str, Any] = await kube.request("GET", _path(namespace, name))
    except ApiError as e:
        raise Refused(_refusal(e, "get", namespace, name)) from None
    return obj


async def _annotate(kube: Any, namespace: str, name: str, key: str,
                    value: str | None) -> None:
    from dispatcher.controller.kube.client import ApiError

    try:
        await kube.request("PATCH", _path(namespace, name),
                           {"metadata": {"annotations": {key: value}}},
                           content_type="application/merge-patch+json")
    except ApiError as e:
        raise Refused(_refusal(e, "patch", namespace, name)) from None


def _refusal(e: Any, verb: str, namespace: str, name: str) -> str:
    if e.status == 404:
        return f"AppWrapper {name} not found in namespace {namespace}"
    if e.status == 403:
        return (f"you may not {verb} AppWrappers in namespace {namespace}: {e.message} "
                "(the Role a tenant needs is in docs/operations.md, \"Permissions\")")
    return user_error(e)


async def whoami(kube: Any) -> str:
    """The user name the API server knows the caller as; "someone" when it will not say."""
    from dispatcher.controller.kube.client import ApiError

    try:
        review = await kube.request("POST", SELF_SUBJECT_REVIEWS, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    except ApiError:
        return "someone"
    user = ((review or {}).get("status") or {}).get("userInfo") or {}
    return str(user.get("username") or "someone")


def _state(obj: Mapping[str, Any]) -> str:
    return str((obj.get("status") or {}).get("state") or "Pending")


def _annotation(obj: Mapping[str, Any], key: str) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(key)
    return None if value is None else str(value) or "someone"


# --- the commands ------------------------------------------------------------------------

async def hold(kube: Any, namespace: str, name: str) -> str:
    obj = await _get(kube, namespace, name)
    held = _annotation(obj, HELD_BY_ANNOTATION)
    if held is not None:
        return f"appwrapper {namespace}/{name} is held already (by {held})"
    if not is_pending(obj):
        raise Refused(f"AppWrapper {namespace}/{name} is {_state(obj)}: a hold keeps a "
                      "waiting AppWrapper from being dispatched; to stop this one, cancel it")
    await _annotate(kube, namespace, name, HELD_BY_ANNOTATION, await whoami(kube))
    return (f"appwrapper {namespace}/{name} held: it keeps its place in the queue and is "
            f"not dispatched until released")


async def release(kube: Any, namespace: str, name: str) -> str:
    obj = await _get(kube, namespace, name)
    if _annotation(obj, HELD_BY_ANNOTATION) is None:
        return f"appwrapper {namespace}/{name} is not held"
    await _annotate(kube, namespace, name, HELD_BY_ANNOTATION, None)
    return f"appwrapper {namespace}/{name} released: back in its place in the queue"


async def cancel(kube: Any, namespace: str, name: str) -> str:
    obj = await _get(kube, namespace, name)
    if _annotation(obj, CANCELLED_BY_ANNOTATION) is not None:
        return f"appwrapper {namespace}/{name} is cancelled already"
    if _state(obj) in FINISHED:
        raise Refused(f"AppWrapper {namespace}/{name} is {_state(obj)} already: nothing to "
                      "cancel (kubectl delete removes it)")
    await _annotate(kube, namespace, name, CANCELLED_BY_ANNOTATION, await whoami(kube))
    return (f"appwrapper {namespace}/{name} cancelled: what it created is deleted and it "
            "stays, Failed with reason Cancelled (kubectl delete removes it)")


async def why(kube: Any, namespace: str, name: str, now: float,
              dashboard: str | None = None) -> str:
    obj = await _get(kube, namespace, name)
    listing = None
    if is_pending(obj) and status_of(obj).queuePosition is not None:
        try:
            listing = await list_appwrappers(kube, namespace)
        except ClusterError:
            listing = None  # the rest of the answer stands without the ones ahead
    return explain(obj, listing, now, dashboard)


# --- the dashboard's page of one AppWrapper -------------------------------------------------

def dashboard_base(given: str) -> str:
    """The dashboard's address from what a user gives: the one `kubectl appwrapper
    dashboard` printed, or an installation's. Its fragment, where that command puts the
    user's token, is dropped: the address printed is one to share."""
    parts = urlsplit(given.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"not an http(s) address: {given.split('#')[0]!r} (e.g. "
                         "http://127.0.0.1:8080/dashboard/)")
    path = parts.path if parts.path not in ("", "/") else "/dashboard/"
    return urlunsplit((parts.scheme, parts.netloc, path.rstrip("/") + "/", "", ""))


def page_address(base: str, namespace: str, name: str) -> str:
    """The address of an AppWrapper's page on the dashboard at `base` (dashboard_base's)."""
    return f"{base}#/aw/{quote(namespace, safe='')}/{quote(name, safe='')}"


# --- why: words from the status ------------------------------------------------------------

def _when(ts: datetime | None, now: float) -> str:
    if ts is None:
        return ""
    seconds = now - ts.timestamp()
    ago = f"{span(seconds)} ago" if seconds >= 0 else f"in {span(-seconds)}"
    return f"{ts.strftime('%Y-%m-%dT%H:%M:%SZ')} ({ago})"


def explain(obj: Mapping[str, Any], listing: Listing | None, now: float,
            dashboard: str | None = None) -> str:
    """Why the AppWrapper `obj` is where it is, from what the dispatcher published;
    `listing`: AppWrappers to find the ones ahead of it in (None: not shown); `dashboard`:
    the dashboard's address (dashboard_base's), to give the AppWrapper's page there."""
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    key = f"{namespace}/{meta.get('name')}"
    status = status_of(obj)
    condition, reason, message = why_of(status)
    if not condition:
        return (f"{key}: no status yet: not taken in by a dispatcher (is one running? "
                "does its webhook refuse it?)")
    last = status.conditions[-1] if status.conditions else None
    state = status.state or "Pending"
    lines = [f"{key}: {state}, {condition}" + (f"/{reason}" if reason else "")
             + (f" since {_when(last.lastTransitionMicroTime, now)}"
                if last is not None and last.lastTransitionMicroTime else "")]
    lines.append(f"  why        {' '.join(message.split()) or '-'}")
    if status.queuePosition is not None:
        quota = "".join(f"; {q.position} in quota node {q.node} (tree {q.tree})"
                        for q in status.quotaPositions or ())
        lines.append(f"  position   {status.queuePosition} in the cluster's queue "
                     f"({status.queuePolicy or 'unknown'} policy){quota}")
    if status.estimatedStart is not None:
        lines.append(f"  estimated  {_when(status.estimatedStart, now)}")
    held = _annotation(obj, HELD_BY_ANNOTATION)
    if held is not None and is_pending(obj):
        lines.append(f"  held by    {held} (kubectl appwrapper release {meta.get('name')})")
    if listing is not None and status.queuePosition is not None:
        lines.extend(_ahead(listing, status.queuePosition))
    if status.numberOfRequeueings:
        lines.append(f"  requeued   {status.numberOfRequeueings} time(s)")
    history = " → ".join(c.type + (f" {c.lastTransitionMicroTime.strftime('%H:%M:%S')}"
                                   if c.lastTransitionMicroTime else "")
                         for c in status.conditions)
    lines.append(f"  history    {history}")
    if dashboard is not None:
        lines.append(f"  dashboard  {page_address(dashboard, namespace, str(meta.get('name')))}")
    return "\n".join(printable(line) for line in lines)  # tenants' words, printed


def _ahead(listing: Listing, position: int) -> list[str]:
    ahead = sorted((status_of(o).queuePosition or 0, o) for o in listing.objects
                   if is_pending(o) and (status_of(o).queuePosition or position) < position)
    if not ahead:
        if listing.scope == "cluster" or position == 1:
            return ["  ahead      nobody: it is considered first"]
        return [f"  ahead      {position - 1} AppWrapper(s) of namespaces you may not list"]
    lines = []
    for i, (place, o) in enumerate(ahead[:SHOWN_AHEAD]):
        meta = o.get("metadata") or {}
        c, r, m = why_of(status_of(o))
        lines.append(f"  {'ahead' if i == 0 else '':<10} {place}  {meta.get('namespace')}/"
                     f"{meta.get('name')}  {c}/{r}  {' '.join(m.split())}")
    if len(ahead) > SHOWN_AHEAD:
        lines.append(f"  {'':<10} and {len(ahead) - SHOWN_AHEAD} more")
    if listing.scope == "namespace":
        lines.append(f"  {'':<10} (of namespace {listing.namespace} only: you may not list "
                     "AppWrappers in all namespaces)")
    return lines


# --- the command line ----------------------------------------------------------------------

HELP = {
    "hold": "keep a waiting AppWrapper queued, not dispatched",
    "release": "let a held AppWrapper be dispatched again",
    "cancel": "stop an AppWrapper for good and delete what it created",
    "why": "why an AppWrapper waits, as the dispatcher published it",
}
DESCRIPTIONS = {
    "hold": "Keep a waiting AppWrapper queued without deleting it: it keeps its place in "
            "the queue and is not dispatched until released (annotation "
            f"{HELD_BY_ANNOTATION}).",
    "release": "Let a held AppWrapper be dispatched again, from its place in the queue.",
    "cancel": "Stop an AppWrapper for good: what it created is deleted and it stays, Failed "
              f"with reason Cancelled (annotation {CANCELLED_BY_ANNOTATION}).",
    "why": "Why an AppWrapper is where it is, as the dispatcher published it in its status: "
           "its condition and message, its place in the queue, its estimated start, and the "
           "AppWrappers ahead of it.",
}


def add_commands(sub: Any, prog: str) -> None:
    """Register hold, release, cancel and why under `sub` (argparse subparsers)."""
    for command, description in DESCRIPTIONS.items():
        p = sub.add_parser(command, help=HELP[command], description=description)
        p.add_argument("name", metavar="NAME", help="the AppWrapper")
        p.add_argument("-n", "--namespace", help="its namespace (default: the context's)")
        p.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config, "
                       "in-cluster")
        p.add_argument("--context", help="the kubeconfig context to use (default: current)")
        if command == "why":
            p.add_argument("--dashboard", metavar="URL", type=_dashboard_option,
                           help="the dashboard's address (as `kubectl appwrapper dashboard` "
                           f"prints it; default: ${DASHBOARD_ENV}): also print the address "
                           "of the AppWrapper's page there")
        p.set_defaults(func=run, action=command, prog=f"{prog} {command}")


def _dashboard_option(given: str) -> str:
    try:
        return dashboard_base(given)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _dashboard(args: argparse.Namespace) -> str | None:
    """--dashboard, else $DISPATCHER_DASHBOARD (a ValueError names it), else None."""
    if args.dashboard is not None:
        return str(args.dashboard)
    given = os.environ.get(DASHBOARD_ENV, "").strip()
    if not given:
        return None
    try:
        return dashboard_base(given)
    except ValueError as e:
        raise ValueError(f"${DASHBOARD_ENV}: {e}") from None


def run(args: argparse.Namespace) -> int:
    import asyncio

    async def act(dashboard: str | None) -> str:
        async with connected(args.kubeconfig, args.context) as (kube, default_ns):
            namespace = args.namespace or default_ns
            if args.action == "why":
                return await why(kube, namespace, args.name, time.time(), dashboard)
            verb = {"hold": hold, "release": release, "cancel": cancel}[args.action]
            return await verb(kube, namespace, args.name)

    try:
        dashboard = _dashboard(args) if args.action == "why" else None
    except ValueError as e:
        print(f"{args.prog}: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        print(asyncio.run(act(dashboard)))
    except (ClusterError, Refused) as e:
        print(f"{args.prog}: {e}", file=sys.stderr)
        return EXIT_CLUSTER
    return 0
