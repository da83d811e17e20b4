"""Queue visibility: the AppWrappers waiting for dispatch, in the order the running
dispatcher considers them, with what they ask for and why they wait (`dispatcher queue`,
`kubectl appwrapper queue`).

The order and the reasons are the dispatcher's own, read from the AppWrappers' status,
where it publishes them: each waiting one's place in its queue (``status.queuePosition``,
under ``status.queuePolicy``; quota leaves in ``status.quotaPositions``) and the latest
condition. Nothing is re-sorted here, so what is shown cannot disagree with the running
dispatcher — only lag it by the time its status writes take (a move up is written within a
minute; its visibility endpoint is live). Building the rows is pure; only `fetch` talks to
the cluster, and imports its client when called, so the command starts fast.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dispatcher.admission import first_seen_of, queued_from_appwrapper
from dispatcher.api.conditions import latest
from dispatcher.api.models import (
    API_GROUP,
    API_VERSION,
    AppWrapper,
    AppWrapperStatus,
    InvalidSpec,
    parse_appwrapper,
)
from dispatcher.kinds import InvalidItem
from dispatcher.resources import CPU, GPU, PODS, format_amount
from dispatcher.wording import printable, span

PENDING_STATES = frozenset({"", "Pending"})
UNKNOWN_POLICY = "unknown"  # no waiting AppWrapper says under which policy it waits
# How long `queue` retries a server that does not answer (or answers 429/5xx).
QUICK_RETRY_SECONDS = 3.0


class ClusterError(RuntimeError):
    """The AppWrappers could not be listed; the message says why and what to do."""


@dataclass(frozen=True)
class PendingAppWrapper:
    namespace: str
    name: str
    # 1 = considered first, as the dispatcher published it; None: not numbered (held, not
    # taken in yet, or invalid: it will fail instead)
    position: int | None
    priority: int
    effective_priority: float
    requests: Mapping[str, int] = field(default_factory=dict)  # the whole gang, canonical
    first_seen: float = 0.0
    waiting_seconds: float = 0.0
    requeues: int = 0
    condition: str = ""  # type of the latest condition ("" : not seen by the dispatcher)
    reason: str = ""
    message: str = ""
    estimated_start: float | None = None  # status.estimatedStart (seconds since the epoch)
    estimated_in: float | None = None  # that, in seconds from when the queue was read
    policy: str | None = None  # status.queuePolicy
    quota: tuple[tuple[str, str, int], ...] = ()  # (tree, leaf, position there)
    #: In a manager of worker clusters: the worker it was sent to (and waits in); None:
    #: not sent yet (its message says why no worker can take it now).
    cluster: str | None = None

    @property
    def pods(self) -> int:
        return self.requests.get(PODS, 0)


def is_pending(obj: Mapping[str, Any]) -> bool:
    """Not dispatched yet and not finished: status.state Pending or not set."""
    status = obj.get("status") or {}
    return isinstance(status, Mapping) and str(status.get("state") or "") in PENDING_STATES


def status_of(obj: Mapping[str, Any]) -> AppWrapperStatus:
    try:
        return AppWrapperStatus.model_validate(obj.get("status") or {})
    except ValueError:
        return AppWrapperStatus()


def why_of(status: AppWrapperStatus) -> tuple[str, str, str]:
    """The latest condition's type and reason, and the status message."""
    last = latest(status.conditions)
    if last is None:
        return status.queuejobstate, "", status.message
    return last.type, last.reason, status.message or last.message


def _gang_requests(aw: AppWrapper, first_seen: float) -> tuple[dict[str, int], str | None]:
    queued = queued_from_appwrapper(aw, first_seen)
    total: dict[str, int] = {}
    for g in queued.gang:
        for r, amount in g.pod_set.request.items():
            total[r] = total.get(r, 0) + amount * g.pod_set.count
    return total, queued.invalid


def pending_queue(objects: Iterable[Mapping[str, Any]], now: float) -> list[PendingAppWrapper]:
    """The pending AppWrappers among `objects`: those the dispatcher numbered, in its order;
    then those it did not (held, or not taken in yet), oldest first; invalid ones (they
    will fail, not dispatch) last."""
    rows: list[PendingAppWrapper] = []
    for obj in objects:
        if not is_pending(obj):
            continue
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
        priority = spec.get("priority", 0) if isinstance(spec, Mapping) else 0
        status = status_of(obj)
        condition, reason, message = why_of(status)
        position = status.queuePosition
        try:
            aw = parse_appwrapper(obj)
            first_seen = first_seen_of(aw, now)
            requests, problem = _gang_requests(aw, first_seen)
            effective = aw.spec.priority + aw.spec.priorityslope * max(0.0, now - first_seen)
        except (InvalidSpec, InvalidItem) as e:
            stamp = status.controllerfirsttimestamp
            first_seen = stamp.timestamp() if stamp is not None else now
            requests, problem, effective = {}, str(e).replace("\n", "; "), 0.0
        if problem is not None:
            position, reason, message = None, "InvalidSpec", problem
        estimate = status.estimatedStart
        rows.append(PendingAppWrapper(
            str(meta.get("namespace") or "default"), str(meta.get("name") or ""), position,
            priority if isinstance(priority, int) else 0, effective, requests, first_seen,
            max(0.0, now - first_seen), status.numberOfRequeueings, condition, reason,
            message, estimate.timestamp() if estimate is not None else None,
            estimate.timestamp() - now if estimate is not None else None,
            status.queuePolicy, tuple((q.tree, q.node, q.position)
                                      for q in status.quotaPositions or ()),
            status.workerCluster))
    return sorted(rows, key=lambda r: (r.reason == "InvalidSpec", r.position is None,
                                       r.position or 0, r.first_seen, r.namespace, r.name))


def policy_of(rows: Sequence[PendingAppWrapper]) -> str:
    """The policy the dispatcher says it orders the queue by (the most said, during a
    restart with another one)."""
    said = Counter(r.policy for r in rows if r.policy)
    return said.most_common(1)[0][0] if said else UNKNOWN_POLICY


# --- rendering ---------------------------------------------------------------------------

def _amount(resource: str, value: int) -> str:
    if not value:
        return "-"
    return format_amount(resource, value).rsplit(" ", 1)[0] if resource != PODS else str(value)


def quantity(resource: str, value: int) -> str:
    """An exact Kubernetes quantity for a canonical amount (millicores for cpu)."""
    if resource == CPU:
        return str(value // 1000) if value % 1000 == 0 else f"{value}m"
    return str(value)


def eta(row: PendingAppWrapper) -> str:
    """When it is estimated to start, from now: "in 2h10m", "now" (overdue: the next
    cycles should start it), "unknown" (no estimate: none within the horizon, or it
    cannot fit this cluster; the message says which)."""
    if row.estimated_in is None:
        return "unknown"
    return "now" if row.estimated_in < 1 else f"in {span(row.estimated_in)}"


def _status_text(row: PendingAppWrapper) -> str:
    if row.condition and row.reason:
        return f"{row.condition}/{row.reason}"
    return row.condition or row.reason or "-"


def _message(row: PendingAppWrapper) -> str:
    if not row.condition and not row.reason and not row.message:
        return "not taken in by a dispatcher yet (is one running?)"
    return " ".join(row.message.split())


def scope_line(rows: Sequence[PendingAppWrapper], namespace: str | None) -> str:
    where = "in all namespaces" if namespace is None else f"in namespace {namespace}"
    return (f"policy {policy_of(rows)}: {len(rows)} pending {where}; positions in the "
            "whole cluster's queue, as the dispatcher published them")


def to_table(rows: Sequence[PendingAppWrapper], scope: str = "cluster",
             namespace: str | None = None) -> str:
    # A manager's queue: which worker each went to (none yet: the message says why).
    fleet = any(r.cluster for r in rows)
    header = ("#", "APPWRAPPER", "PRIORITY", "PODS", "GPUS", "CPU", "MEMORY", "WAITING",
              "ETA", *(("CLUSTER",) if fleet else ()), "STATUS", "MESSAGE")
    table = [header]
    for r in rows:
        prio = f"{r.effective_priority:g}" if r.effective_priority != r.priority \
            else str(r.priority)
        table.append((
            "-" if r.position is None else str(r.position), f"{r.namespace}/{r.name}", prio,
            str(r.pods), _amount(GPU, r.requests.get(GPU, 0)),
            _amount(CPU, r.requests.get(CPU, 0)), _amount("memory", r.requests.get("memory", 0)),
            span(r.waiting_seconds),
            eta(r), *((r.cluster or "-",) if fleet else ()),
            _status_text(r), _message(r)))
    # Messages, names and statuses are tenants' words: made printable before measured.
    table = [tuple(printable(cell) for cell in row) for row in table]
    widths = [max(len(t[c]) for t in table) for c in range(len(header) - 1)]
    lines = [scope_line(rows, namespace)]
    if rows:
        lines += ["  ".join(t[c].ljust(widths[c]) for c in range(len(widths))) + "  " + t[-1]
                  for t in table]
    return "\n".join(line.rstrip() for line in lines)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_json(rows: Sequence[PendingAppWrapper], scope: str = "cluster",
            namespace: str | None = None) -> str:
    return json.dumps({
        "policy": policy_of(rows),
        "scope": scope,
        "namespace": namespace,
        "pending": [{
            "position": r.position, "namespace": r.namespace, "name": r.name,
            "priority": r.priority, "effectivePriority": r.effective_priority,
            "pods": r.pods,
            "requests": {k: quantity(k, v) for k, v in sorted(r.requests.items())
                         if k != PODS and v},
            "firstSeen": _iso(r.first_seen), "waitingSeconds": round(r.waiting_seconds, 3),
            "requeues": r.requeues, "condition": r.condition, "reason": r.reason,
            "message": r.message,
            "estimatedStart": None if r.estimated_start is None else _iso(r.estimated_start),
            "estimatedStartInSeconds": None if r.estimated_in is None
            else round(r.estimated_in, 3),
            "quotaPositions": [{"tree": t, "node": n, "position": p} for t, n, p in r.quota],
            "cluster": r.cluster,
        } for r in rows],
    }, indent=2)


# --- reading the cluster ------------------------------------------------------------------

@dataclass
class Listing:
    objects: list[dict[str, Any]]
    scope: str  # "cluster": positions are the cluster-wide queue's; "namespace": only one
    namespace: str | None  # the namespace shown; None: all


def _appwrappers_path(namespace: str | None) -> str:
    base = f"/apis/{API_GROUP}/{API_VERSION}"
    return f"{base}/namespaces/{namespace}/appwrappers" if namespace else f"{base}/appwrappers"


async def _list(kube: Any, namespace: str | None) -> list[dict[str, Any]]:
    return await list_path(kube, _appwrappers_path(namespace))


async def list_path(kube: Any, path: str) -> list[dict[str, Any]]:
    """Every item of a list endpoint, page by page."""
    items: list[dict[str, Any]] = []
    query = {"limit": "500"}
    while True:
        page = await kube.request("GET", path, query=query)
        items.extend(page.get("items") or [])
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items
        query["continue"] = token


def user_error(e: Any) -> str:
    """A failed API call (an ApiError) in the words every command uses: the server not
    reached, the credentials refused, the grant the user lacks."""
    from dispatcher.controller.kube.explain import explain

    return explain(e, "your user", "ask your cluster's administrator")


async def list_appwrappers(kube: Any, namespace: str | None) -> Listing:
    """Every AppWrapper when allowed, so positions are those of the one queue; when only
    `namespace` may be listed, its AppWrappers alone."""
    from dispatcher.controller.kube.client import ApiError

    why = user_error
    try:
        objects = await _list(kube, None)
    except ApiError as e:
        if e.status == 404:
            raise ClusterError("AppWrappers are not served by this cluster: install the "
                               "CRD (crds/ or deploy/)") from None
        if e.status != 403 or namespace is None:
            raise ClusterError(f"cannot list AppWrappers: {why(e)}") from None
        try:
            objects = await _list(kube, namespace)
        except ApiError as e2:
            raise ClusterError(f"cannot list AppWrappers in namespace {namespace}: "
                               f"{why(e2)}") from None
        return Listing(objects, "namespace", namespace)
    # With a namespace, the others are filtered out when shown: positions stay those of
    # the whole queue.
    return Listing(objects, "cluster", namespace)


@asynccontextmanager
async def connected(kubeconfig: str | None, context: str | None
                    ) -> AsyncIterator[tuple[Any, str]]:
    """A client acting as the kubeconfig's user (in-cluster in a pod without one), and the
    namespace kubectl would default to (the context's); a failure to read the kubeconfig
    or reach the API server is a ClusterError."""
    from aiohttp import ClientError
    from kubernetes_asyncio import client

    from dispatcher.controller.kube.client import Kube, RetryPolicy
    from dispatcher.controller.kube.kubeconfig import KubeconfigError, load

    try:
        connection = await load(kubeconfig, context)
    except KubeconfigError as e:
        raise ClusterError(str(e)) from None
    # A command answers at once: a server that refuses connections is not waited for.
    kube = Kube(client.ApiClient(configuration=connection.configuration),
                retry=RetryPolicy(budget=QUICK_RETRY_SECONDS))
    default_ns = connection.namespace
    try:
        yield kube, default_ns
    except (OSError, ClientError) as e:  # connection refused, DNS, TLS
        raise ClusterError(f"cannot reach the API server: {e}") from None
    finally:
        await kube.close()


async def fetch(kubeconfig: str | None, context: str | None, namespace: str | None,
                all_namespaces: bool) -> Listing:
    """List the AppWrappers as the kubeconfig's user; the namespace defaults to the
    context's, as for kubectl."""
    async with connected(kubeconfig, context) as (kube, default_ns):
        return await list_appwrappers(kube, None if all_namespaces
                                      else (namespace or default_ns))
