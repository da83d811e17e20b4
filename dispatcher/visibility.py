"""Queue visibility: the AppWrappers waiting for dispatch, in the order they will be
considered, with what they ask for and why they wait (`dispatcher queue`,
`kubectl appwrapper queue`).

The order is the dispatcher's own: the same queue and policy, fed from the
AppWrappers' specs and first-seen times (``status.controllerfirsttimestamp``, else
``metadata.creationTimestamp``). The reasons are read from their status, where the
dispatcher writes them. Building the rows is pure; only `fetch` talks to the cluster,
and imports its client when called, so the command starts fast.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
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
from dispatcher.queue import AdmissionQueue, Policy
from dispatcher.resources import CPU, GPU, PODS, format_amount

PENDING_STATES = frozenset({"", "Pending"})
SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ClusterError(RuntimeError):
    """The AppWrappers could not be listed; the message says why and what to do."""


@dataclass(frozen=True)
class PendingAppWrapper:
    namespace: str
    name: str
    position: int | None  # 1 = considered first; None: invalid, it will fail instead
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

    @property
    def pods(self) -> int:
        return self.requests.get(PODS, 0)


def is_pending(obj: Mapping[str, Any]) -> bool:
    """Not dispatched yet and not finished: status.state Pending or not set."""
    status = obj.get("status") or {}
    return isinstance(status, Mapping) and str(status.get("state") or "") in PENDING_STATES


def _status(obj: Mapping[str, Any]) -> AppWrapperStatus:
    try:
        return AppWrapperStatus.model_validate(obj.get("status") or {})
    except ValueError:
        return AppWrapperStatus()


def _why(status: AppWrapperStatus) -> tuple[str, str, str]:
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


def pending_queue(objects: Iterable[Mapping[str, Any]], policy: Policy,
                  now: float) -> list[PendingAppWrapper]:
    """The pending AppWrappers among `objects`, in the order `policy` considers them;
    invalid ones (they will fail, not dispatch) last, without a position."""
    queue = AdmissionQueue(policy)
    info: dict[tuple[str, str], tuple[AppWrapperStatus, dict[str, int]]] = {}
    invalid: list[PendingAppWrapper] = []
    for obj in objects:
        if not is_pending(obj):
            continue
        meta = obj.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "")
        status = _status(obj)
        condition, reason, message = _why(status)
        try:
            aw = parse_appwrapper(obj)
            first_seen = first_seen_of(aw, now)
            requests, problem = _gang_requests(aw, first_seen)
        except (InvalidSpec, InvalidItem) as e:
            stamp = status.controllerfirsttimestamp
            first_seen = stamp.timestamp() if stamp is not None else now
            requests, problem = {}, str(e).replace("\n", "; ")
        if problem is not None:
            spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
            priority = spec.get("priority", 0) if isinstance(spec, Mapping) else 0
            invalid.append(PendingAppWrapper(
                namespace, name, None, priority if isinstance(priority, int) else 0, 0.0,
                requests, first_seen, max(0.0, now - first_seen), status.numberOfRequeueings,
                condition, "InvalidSpec", problem))
            continue
        queue.put(queued_from_appwrapper(aw, first_seen))
        info[(namespace, name)] = (status, requests)
    rows: list[PendingAppWrapper] = []
    for position, w in enumerate(queue.ordered(now), start=1):
        status, requests = info[w.key]
        condition, reason, message = _why(status)
        estimate = status.estimatedStart
        rows.append(PendingAppWrapper(
            w.namespace, w.name, position, w.priority, w.effective_priority(now), requests,
            w.first_seen, max(0.0, now - w.first_seen), status.numberOfRequeueings,
            condition, reason, message,
            estimate.timestamp() if estimate is not None else None,
            estimate.timestamp() - now if estimate is not None else None))
    rows.extend(sorted(invalid, key=lambda r: (r.first_seen, r.namespace, r.name)))
    return rows


# --- rendering ---------------------------------------------------------------------------

def duration(seconds: float) -> str:
    """A short age, as kubectl prints them: 45s, 5m3s, 2h10m, 3d4h."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s" if s < 600 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


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
    return "now" if row.estimated_in < 1 else f"in {duration(row.estimated_in)}"


def _status_text(row: PendingAppWrapper) -> str:
    if row.condition and row.reason:
        return f"{row.condition}/{row.reason}"
    return row.condition or row.reason or "-"


def _message(row: PendingAppWrapper) -> str:
    if not row.condition and not row.reason:
        return "not taken in by a dispatcher yet (is one running?)"
    return " ".join(row.message.split())


def scope_line(rows: Sequence[PendingAppWrapper], policy: Policy, scope: str,
               namespace: str | None) -> str:
    where = "in all namespaces" if namespace is None else f"in namespace {namespace}"
    text = f"policy {policy.name}: {len(rows)} pending {where}"
    if scope == "namespace":
        text += ("; positions count only this namespace (listing AppWrappers in all "
                 "namespaces is not allowed)")
    return text


def to_table(rows: Sequence[PendingAppWrapper], policy: Policy, scope: str = "cluster",
             namespace: str | None = None) -> str:
    header = ("#", "APPWRAPPER", "PRIORITY", "PODS", "GPUS", "CPU", "MEMORY", "WAITING",
              "ETA", "STATUS", "MESSAGE")
    table = [header]
    for r in rows:
        prio = f"{r.effective_priority:g}" if r.effective_priority != r.priority \
            else str(r.priority)
        table.append((
            "-" if r.position is None else str(r.position), f"{r.namespace}/{r.name}", prio,
            str(r.pods), _amount(GPU, r.requests.get(GPU, 0)),
            _amount(CPU, r.requests.get(CPU, 0)), _amount("memory", r.requests.get("memory", 0)),
            duration(r.waiting_seconds),
            eta(r),
            _status_text(r), _message(r)))
    widths = [max(len(t[c]) for t in table) for c in range(len(header) - 1)]
    lines = [scope_line(rows, policy, scope, namespace)]
    if rows:
        lines += ["  ".join(t[c].ljust(widths[c]) for c in range(len(widths))) + "  " + t[-1]
                  for t in table]
    return "\n".join(line.rstrip() for line in lines)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_json(rows: Sequence[PendingAppWrapper], policy: Policy, scope: str = "cluster",
            namespace: str | None = None) -> str:
    return json.dumps({
        "policy": policy.name,
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


async def list_appwrappers(kube: Any, namespace: str | None) -> Listing:
    """Every AppWrapper when allowed, so positions are those of the one queue; when only
    `namespace` may be listed, its AppWrappers alone."""
    from dispatcher.controller.kube import ApiError

    try:
        objects = await _list(kube, None)
    except ApiError as e:
        if e.status == 404:
            raise ClusterError("AppWrappers are not served by this cluster: install the "
                               "CRD (crds/ or deploy/)") from None
        if e.status != 403 or namespace is None:
            raise ClusterError(f"cannot list AppWrappers: {e}") from None
        try:
            objects = await _list(kube, namespace)
        except ApiError as e2:
            raise ClusterError(f"cannot list AppWrappers in namespace {namespace}: "
                               f"{e2}") from None
        return Listing(objects, "namespace", namespace)
    # With a namespace, the others are filtered out when shown: positions stay those of
    # the whole queue.
    return Listing(objects, "cluster", namespace)


async def fetch(kubeconfig: str | None, context: str | None, namespace: str | None,
                all_namespaces: bool) -> Listing:
    """List the AppWrappers as the kubeconfig's user (in-cluster in a pod without one);
    the namespace defaults to the context's, as for kubectl."""
    from aiohttp import ClientError

    kube, default_ns = await connect(kubeconfig, context)
    shown = None if all_namespaces else (namespace or default_ns)
    try:
        return await list_appwrappers(kube, shown)
    except (OSError, ClientError) as e:  # connection refused, DNS, TLS
        raise ClusterError(f"cannot reach the API server: {e}") from None
    finally:
        await kube.close()


async def connect(kubeconfig: str | None, context: str | None) -> tuple[Any, str]:
    """A client as the kubeconfig's user (in-cluster in a pod without one), and the
    context's namespace."""
    from kubernetes_asyncio import client, config

    from dispatcher.controller.kube import Kube

    in_cluster = kubeconfig is None and context is None \
        and "KUBERNETES_SERVICE_HOST" in os.environ and not os.environ.get("KUBECONFIG")
    default_ns = "default"
    try:
        if in_cluster:
            kube = await Kube.connect(None)
            if SA_NAMESPACE_FILE.exists():
                default_ns = SA_NAMESPACE_FILE.read_text().strip() or default_ns
        else:
            conf = client.Configuration()
            loader = await config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=conf,
                persist_config=False)
            current = loader.current_context or {}
            default_ns = (current.get("context") or {}).get("namespace") or default_ns
            kube = Kube(client.ApiClient(configuration=conf))
    except (config.ConfigException, OSError) as e:
        raise ClusterError(f"cannot read the kubeconfig: {e}") from None
    return kube, default_ns
