"""Prometheus metrics and the health endpoint of `dispatcher run`.

`PrometheusObserver` turns what the dispatcher reports (dispatches, requeues, failures,
admission cycles) into counters and histograms, and reads gauges (AppWrappers by state,
the queue, cluster capacity) from the dispatcher. It has its own registry, so nothing
else in the process (client libraries) leaks into /metrics.

Labels are bounded: states, condition types, reasons and resource names — never an
AppWrapper's name or namespace. Values outside the known sets (a status written by
another controller, say) are counted as ``Other``.

`MetricsServer` serves ``/metrics`` and ``/healthz`` with aiohttp on the event loop the
dispatcher runs on, so the gauges are read where they are written and nothing needs a
lock. Every handler returns without awaiting anything slow, except that with
``--metrics-auth kubernetes`` a new bearer token is first checked with the API server
(bearer.py: a grant is kept a minute, and new tokens are checked at most one a second).

See docs/operations.md for the list of metrics.
"""

from __future__ import annotations

import logging
import platform
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from dispatcher import version
from dispatcher.api.conditions import ConditionType, Reason, latest
from dispatcher.api.models import State
from dispatcher.cluster import ClusterState
from dispatcher.lifecycle import (
    FAILED_PODS,
    ITEMS_CHANGED,
    PODS_LOST,
    PODS_NOT_CREATED,
    PODS_NOT_PENDING,
    PODS_NOT_READY,
    REQUEUE_LIMIT_REACHED,
    RETRY_LIMIT_REACHED,
    WRAPPED_OBJECT_FAILED,
)
from dispatcher.resources import CPU
from dispatcher.wording import span

from .runtime import Dispatcher, Observer
from .status import WRITE_KINDS
from .visibility_api import VisibilityApi

log = logging.getLogger("dispatcher")

PREFIX = "dispatcher"
OTHER = "Other"
NONE = "None"  # an AppWrapper with no state or no condition yet

TOPOLOGY_OUTCOMES = ("one_domain", "spread")
STATES = tuple(s.value for s in State)
CONDITIONS = tuple(c.value for c in ConditionType)
REQUEUE_REASONS = (Reason.MinPodsNotRunning.value, Reason.DispatchDeadlineExceeded.value,
                   Reason.Preempted.value, PODS_NOT_CREATED, PODS_LOST, ITEMS_CHANGED)
# Why a v1beta2 gang was reset (lifecycle.judge_v1beta2).
RESET_REASONS = (WRAPPED_OBJECT_FAILED, FAILED_PODS, PODS_NOT_PENDING, PODS_NOT_READY,
                 PODS_LOST)
FAILURE_REASONS = (Reason.InvalidSpec.value, Reason.ItemCreationFailure.value,
                   WRAPPED_OBJECT_FAILED, REQUEUE_LIMIT_REACHED, RETRY_LIMIT_REACHED,
                   Reason.DispatchDeadlineExceeded.value, Reason.Cancelled.value)

PREEMPTION_REASONS = ("priority", "reclaim")
# Which estimate of a wrapper's start is compared with its start: the initial one (the
# first made while it waited), or the one its status showed when it started.
ESTIMATES = ("initial", "shown")

# Admission cycles take milliseconds on small queues and seconds on 10,000 wrappers.
CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                 10.0, 30.0)
# Waiting for GPUs takes from seconds to days.
WAIT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
                7200.0, 14400.0, 28800.0, 86400.0, 172800.0, 604800.0)

# One request to the API server takes milliseconds; a slow list or an overloaded server,
# seconds (an attempt times out at 15 s). Waiting for the client's own pacing: from nothing
# to seconds when a burst of writes meets --kube-qps.
API_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0,
               30.0)
# The API server waits 10 s for the AppWrapper webhooks and 2 s for the pod webhook.
WEBHOOK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0,
                   10.0)
VERBS = ("GET", "POST", "PUT", "PATCH", "DELETE")
PACING_PRIORITIES = ("urgent", "status", "event")  # kube.URGENT, STATUS, EVENT
WEBHOOK_ENDPOINTS = ("mutate", "validate", "pin-pods", "convert")
WEBHOOK_RESULTS = ("allowed", "denied", "error", "bad_request")
NO_ANSWER_CODE = "none"  # a refused or cut connection, or a timeout

# Quota nodes are named by whoever writes QuotaSubtrees: at most this many get series (the
# upper levels of every tree first), the rest are counted in dispatcher_quota_nodes.
MAX_QUOTA_NODES = 200

# Gauges read from the dispatcher are recomputed after a cycle at most this often, and
# whenever /metrics is scraped after a cycle: exact at scrape time, cheap in the loop.
SNAPSHOT_MIN_INTERVAL_SECONDS = 2.0
# /healthz fails when the admission loop has not finished a cycle for this long. The
# loop cycles at least every 5 s; a cycle waits for its API writes, which can be slow.
HEALTHY_CYCLE_AGE_SECONDS = 60.0


def _bounded(value: str, known: Iterable[str], empty: str = NONE) -> str:
    if not value:
        return empty
    return value if value in known else OTHER


def _in_base_units(resource: str, amount: int) -> float:
    """Canonical amounts are millicores for cpu; Prometheus wants base units (cores)."""
    return amount / 1000 if resource == CPU else float(amount)


def _code(status: int) -> str:
    """An HTTP status as a label: its number (bounded: 100-599), or none for no answer."""
    return str(status) if 100 <= status <= 599 else NO_ANSWER_CODE


class RequestMetrics:
    """How long the process's own requests take: to the API server (each attempt, and the
    wait for the client's pacing before it), and the webhook's answers to the API server.
    Every process that talks to the API has them: `dispatcher run` in its observer's
    registry, `dispatcher webhook` in a registry of its own."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.api_duration = Histogram(
            f"{PREFIX}_api_request_duration_seconds", "One attempt of a request to the API "
            "server, from sending it to the last byte of the answer (watches excluded), by "
            "verb.", ["verb"], buckets=API_BUCKETS, registry=r)
        self.api_requests = Counter(
            f"{PREFIX}_api_requests", "Attempts of requests to the API server, by verb and "
            "HTTP status code (none: no answer, a refused or cut connection or a timeout).",
            ["verb", "code"], registry=r)
        self.pacing_wait = Histogram(
            f"{PREFIX}_api_pacing_wait_seconds", "Time a request waited for the client's "
            "own pacing (--kube-qps, --kube-burst) before it was sent, by priority: urgent "
            "(reads, Dispatched writes, creating items), status (other status writes), "
            "event.", ["priority"], buckets=API_BUCKETS, registry=r)
        self.webhook_duration = Histogram(
            f"{PREFIX}_webhook_request_duration_seconds", "Time to answer one "
            "AdmissionReview or ConversionReview, from reading it to the answer, by endpoint "
            "(mutate, validate, pin-pods, convert) and result (allowed, denied, error: the "
            "review failed, bad_request: not a review; a conversion that fails is denied).",
            ["endpoint", "result"], buckets=WEBHOOK_BUCKETS,
            registry=r)
        for verb in VERBS:
            self.api_duration.labels(verb)
        for priority in PACING_PRIORITIES:
            self.pacing_wait.labels(priority)

    def api_request(self, verb: str, status: int, seconds: float) -> None:
        verb = _bounded(verb, VERBS, OTHER)
        self.api_duration.labels(verb).observe(max(0.0, seconds))
        self.api_requests.labels(verb, _code(status)).inc()

    def api_paced(self, priority: int, seconds: float) -> None:
        name = PACING_PRIORITIES[priority] if 0 <= priority < len(PACING_PRIORITIES) \
            else OTHER
        self.pacing_wait.labels(name).observe(max(0.0, seconds))

    def webhook_review(self, endpoint: str, result: str, seconds: float) -> None:
        self.webhook_duration.labels(_bounded(endpoint, WEBHOOK_ENDPOINTS, OTHER),
                                     _bounded(result, WEBHOOK_RESULTS, OTHER)
                                     ).observe(max(0.0, seconds))


@dataclass
class Snapshot:
    """Gauge values read from the dispatcher."""

    appwrappers: Tally[tuple[str, str]] = field(default_factory=Tally)
    seen_labels: set[tuple[str, str]] = field(default_factory=set)
    pending: int = 0
    nodes: dict[str, int] = field(default_factory=lambda: {"true": 0, "false": 0})
    capacity: dict[str, float] = field(default_factory=dict)
    free: dict[str, float] = field(default_factory=dict)
    largest_free: dict[str, float] = field(default_factory=dict)
    resources: set[str] = field(default_factory=set)
    policy: tuple[str, str] | None = None
    # (tree, node, resource) -> nominal, used, borrowed; MAX_QUOTA_NODES nodes at most, and
    # only resources some node advertises.
    quota: dict[tuple[str, str, str], tuple[float, float, float]] = field(default_factory=dict)
    # (tree, leaf) -> AppWrappers queued there, for the nodes that have series.
    quota_pending: dict[tuple[str, str], int] = field(default_factory=dict)
    quota_nodes: dict[str, int] = field(default_factory=lambda: {"true": 0, "false": 0})
    preemption_holds: int = 0
    status_writes: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(WRITE_KINDS, 0))
    events_dropped: int = 0
    pods_pinned: dict[str, int] = field(default_factory=lambda: {"created": 0, "gate": 0})


def appwrapper_counts(dispatcher: Dispatcher) -> Tally[tuple[str, str]]:
    """(state, latest condition type) -> number of AppWrappers the dispatcher tracks."""
    counts: Tally[tuple[str, str]] = Tally()
    for t in dispatcher.tracked.values():
        status = t.status
        condition = status.queuejobstate
        if not condition:
            last = latest(status.conditions)
            condition = last.type if last is not None else ""
        counts[(_bounded(status.state, STATES), _bounded(condition, CONDITIONS))] += 1
    return counts


def capacity_of(state: ClusterState) -> tuple[dict[str, int], dict[str, int], dict[str, int],
                                              dict[str, int]]:
    """Nodes by schedulability; allocatable, free and largest free per resource, over
    the nodes the dispatcher may place pods on (not cordoned). Free is never below 0 on
    a node (an over-committed node has nothing free, not less than nothing)."""
    nodes = {"true": 0, "false": 0}
    total: dict[str, int] = {}
    resources, rows = state.free_rows()
    free = dict.fromkeys(resources, 0)
    largest = dict.fromkeys(resources, 0)
    for name, node in state.nodes.items():
        if node.unschedulable:
            nodes["false"] += 1
            continue
        nodes["true"] += 1
        for r, amount in node.allocatable.items():
            total[r] = total.get(r, 0) + amount
        for r, amount in zip(resources, rows[name], strict=True):
            amount = max(amount, 0)
            free[r] += amount
            largest[r] = max(largest[r], amount)
    return nodes, total, free, largest


class PrometheusObserver(Observer):
    """The dispatcher's metrics, in a registry of their own (`self.registry`)."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 min_interval: float = SNAPSHOT_MIN_INTERVAL_SECONDS,
                 topology_levels: Sequence[str] = ()) -> None:
        """`topology_levels`: the configured levels, the only values of the `level`
        label of the topology placements."""
        self.registry = registry if registry is not None else CollectorRegistry()
        self.min_interval = min_interval
        self.snapshot_data = Snapshot()
        self.snapshots_computed = 0
        self._dispatcher: Dispatcher | None = None
        self._dirty = False
        self._computed_at = float("-inf")
        self._quota_capped = False
        self._outcome_counters(self.registry)
        r = self.registry
        self.topology_levels = tuple(topology_levels)
        self.topology_placements = Counter(
            f"{PREFIX}_topology_placements", "Pod sets of dispatched AppWrappers that asked "
            "for one domain of a topology level, by level and outcome: one_domain (all their "
            "pods in one domain of it), spread (a preferred level that no domain held).",
            ["level", "outcome"], registry=r)
        for level in self.topology_levels:
            for outcome in TOPOLOGY_OUTCOMES:
                self.topology_placements.labels(level, outcome)
        self.wait_time = Histogram(
            f"{PREFIX}_admission_wait_time_seconds", "Time from when an AppWrapper was "
            "first seen to its dispatch (a requeued one counts from its first arrival).",
            buckets=WAIT_BUCKETS, registry=r)
        self.estimate_error = Histogram(
            f"{PREFIX}_start_estimate_error_seconds", "How far from its estimated start an "
            "AppWrapper was dispatched (absolute), by estimate: initial (the first made while "
            "it waited) or shown (the one its status showed).", ["estimate"],
            buckets=WAIT_BUCKETS, registry=r)
        for which in ESTIMATES:
            self.estimate_error.labels(which)
        self.cycle_duration = Histogram(
            f"{PREFIX}_admission_cycle_duration_seconds", "Duration of one admission "
            "cycle: judging dispatched AppWrappers, deciding the queue, writing results.",
            buckets=CYCLE_BUCKETS, registry=r)
        self.last_cycle = Gauge(
            f"{PREFIX}_admission_cycle_last_timestamp_seconds", "When the last admission "
            "cycle finished, in seconds since the epoch.", registry=r)
        self.build_info = Gauge(
            f"{PREFIX}_build_info", "Always 1; the labels say which dispatcher runs.",
            ["version", "python_version"], registry=r)
        self.build_info.labels(version(), platform.python_version()).set(1)
        self.requests = RequestMetrics(r)
        self.registry.register(_SnapshotCollector(self))

    def _outcome_counters(self, r: CollectorRegistry) -> None:
        """What happened to AppWrappers, counted; every bounded reason shown from 0."""
        self.dispatches = Counter(
            f"{PREFIX}_dispatches", "AppWrappers dispatched: their objects were created.",
            registry=r)
        self.requeues = Counter(
            f"{PREFIX}_requeues", "Dispatched AppWrappers torn down and queued again, by "
            "reason.", ["reason"], registry=r)
        self.resets = Counter(
            f"{PREFIX}_resets", "Gangs of AppWrappers written as v1beta2 reset (torn down "
            "and created again after their retry pause), by reason.", ["reason"],
            registry=r)
        self.failures = Counter(
            f"{PREFIX}_failures", "AppWrappers that failed, by reason.", ["reason"],
            registry=r)
        self.completions = Counter(
            f"{PREFIX}_completions", "AppWrappers that completed.", registry=r)
        self.preemptions = Counter(
            f"{PREFIX}_preemptions", "Gangs torn down for another AppWrapper, by reason: "
            "priority (a higher-priority wrapper), reclaim (a wrapper within its quota "
            "taking back what others borrowed).", ["reason"], registry=r)
        for reason in PREEMPTION_REASONS:
            self.preemptions.labels(reason)
        for reason in REQUEUE_REASONS:
            self.requeues.labels(reason)
        for reason in FAILURE_REASONS:
            self.failures.labels(reason)
        for reason in RESET_REASONS:
            self.resets.labels(reason)

    # --- Observer hooks (called on the event loop) -----------------------------------

    def cycle(self, seconds: float, queued: int, decisions: int) -> None:
        self.cycle_duration.observe(seconds)
        self.last_cycle.set(time.time())

    def dispatched(self, waited_seconds: float) -> None:
        self.dispatches.inc()
        self.wait_time.observe(max(0.0, waited_seconds))

    def requeued(self, reason: str) -> None:
        self.requeues.labels(_bounded(reason, REQUEUE_REASONS, OTHER)).inc()

    def reset(self, reason: str) -> None:
        self.resets.labels(_bounded(reason, RESET_REASONS, OTHER)).inc()

    def failed(self, reason: str) -> None:
        self.failures.labels(_bounded(reason, FAILURE_REASONS, OTHER)).inc()

    def completed(self) -> None:
        self.completions.inc()

    def preempted(self, reason: str) -> None:
        self.preemptions.labels(_bounded(reason, PREEMPTION_REASONS, OTHER)).inc()

    def placed_in_topology(self, level: str, one_domain: bool) -> None:
        self.topology_placements.labels(_bounded(level, self.topology_levels, OTHER),
                                        TOPOLOGY_OUTCOMES[0 if one_domain else 1]).inc()

    def start_estimate_error(self, estimate: str, seconds: float) -> None:
        self.estimate_error.labels(_bounded(estimate, ESTIMATES, OTHER)).observe(
            max(0.0, seconds))

    def snapshot(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._dirty = True
        self.snapshot_data.pending = len(dispatcher.queue)
        if time.monotonic() - self._computed_at >= self.min_interval:
            self.refresh()

    # --- gauges ----------------------------------------------------------------------

    def refresh(self, force: bool = False) -> None:
        """Read the gauges from the dispatcher if a cycle ran since the last reading."""
        d = self._dispatcher
        if d is None or not (self._dirty or force):
            return
        s = self.snapshot_data
        s.appwrappers = appwrapper_counts(d)
        s.seen_labels.update(s.appwrappers)
        s.pending = len(d.queue)
        nodes, total, free, largest = capacity_of(d.state)
        # Only what some node advertises gets a series: resources named by AppWrappers
        # alone (a user can make up any number of them) would grow /metrics without bound.
        advertised = {r for node in d.state.nodes.values() for r in node.allocatable}
        s.nodes = nodes
        s.capacity = {r: _in_base_units(r, v) for r, v in total.items()}
        s.free = {r: _in_base_units(r, v) for r, v in free.items() if r in advertised}
        s.largest_free = {r: _in_base_units(r, v) for r, v in largest.items()
                          if r in advertised}
        s.resources.update(advertised)
        s.policy = (d.policy.name, d.fit)
        s.quota, s.quota_pending, s.quota_nodes = self._quota(d, advertised)
        s.preemption_holds = len(d.memory.sharing.holds)
        s.status_writes = {str(k): n for k, n in d.writer.written.items()}
        s.events_dropped = d.writer.events_dropped
        s.pods_pinned = dict(d.memory.pods_pinned)
        self._dirty = False
        self._computed_at = time.monotonic()
        self.snapshots_computed += 1

    def _quota(self, d: Dispatcher, advertised: set[str]
               ) -> tuple[dict[tuple[str, str, str], tuple[float, float, float]],
                          dict[tuple[str, str], int], dict[str, int]]:
        """Usage and queued wrappers (at or under the node, as quota_used counts) of the
        quota nodes that get series, and how many nodes do and do not: MAX_QUOTA_NODES,
        the upper levels of the trees first."""
        ledger = d.memory.sharing.ledger
        if ledger is None:
            return {}, {}, {"true": 0, "false": 0}
        rows = sorted(ledger.usage(), key=lambda u: (u.depth, u.tree, u.name))
        reported, dropped = rows[:MAX_QUOTA_NODES], rows[MAX_QUOTA_NODES:]
        if dropped and not self._quota_capped:
            log.warning("metrics: %d quota nodes, series for the first %d only (the upper "
                        "levels of the trees); dispatcher_quota_nodes counts the rest",
                        len(rows), MAX_QUOTA_NODES)
        self._quota_capped = bool(dropped)
        usage = {
            (u.tree, u.name, r): (_in_base_units(r, u.nominal.get(r, 0)),
                                  _in_base_units(r, u.used.get(r, 0)),
                                  _in_base_units(r, u.borrowed.get(r, 0)))
            for u in reported for r in sorted(set(u.nominal) | set(u.used)) if r in advertised}
        pending = {(u.tree, u.name): 0 for u in reported}
        forest = ledger.forest
        for w in d.queue:
            for tree_name, leaf in forest.resolve(w.labels).leaves:
                tree = forest.trees[tree_name]
                for i in tree.nodes[leaf].path:  # the leaf and every node above it
                    key = (tree_name, tree.order[i].name)
                    if key in pending:
                        pending[key] += 1
        return usage, pending, {"true": len(reported), "false": len(dropped)}


class _SnapshotCollector:
    """The gauges read from the dispatcher, refreshed when scraped after a cycle."""

    def __init__(self, observer: PrometheusObserver) -> None:
        self.observer = observer

    def describe(self) -> Iterator[Metric]:
        yield from _families(Snapshot())

    def collect(self) -> Iterator[Metric]:
        self.observer.refresh()
        yield from _families(self.observer.snapshot_data)


def _families(s: Snapshot) -> Iterator[Metric]:
    yield from _cluster_families(s)
    yield from _quota_families(s)
    yield from _dispatcher_families(s)


def _cluster_families(s: Snapshot) -> Iterator[Metric]:
    aws = GaugeMetricFamily(
        f"{PREFIX}_appwrappers", "AppWrappers the dispatcher knows, by status.state and "
        "the type of their latest condition.", labels=["state", "condition"])
    for labels in sorted(s.seen_labels):
        aws.add_metric(list(labels), s.appwrappers.get(labels, 0))
    yield aws
    yield GaugeMetricFamily(
        f"{PREFIX}_pending_appwrappers", "AppWrappers in the admission queue: valid, "
        "not dispatched, not finished.", value=s.pending)
    nodes = GaugeMetricFamily(
        f"{PREFIX}_cluster_nodes", "Nodes, by whether pods may be placed on them (not "
        "cordoned).", labels=["schedulable"])
    for schedulable, count in sorted(s.nodes.items()):
        nodes.add_metric([schedulable], count)
    yield nodes
    for name, doc, values in (
        ("cluster_capacity", "Allocatable amount of each resource on schedulable "
         "nodes (cpu in cores, memory and storage in bytes, others in units).",
         s.capacity),
        ("cluster_free_capacity", "Free amount of each resource on schedulable nodes: "
         "allocatable minus requests of bound pods minus capacity held for dispatched "
         "AppWrappers whose pods are not bound yet.", s.free),
        ("cluster_largest_free_capacity", "The largest free amount of each resource "
         "on any one schedulable node: compared with the total, it shows "
         "fragmentation.", s.largest_free),
    ):
        family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["resource"])
        for resource in sorted(s.resources):
            family.add_metric([resource], values.get(resource, 0.0))
        yield family


def _quota_families(s: Snapshot) -> Iterator[Metric]:
    for index, name, doc in (
        (0, "quota_nominal", "Nominal quota of each QuotaSubtree node, per resource."),
        (1, "quota_used", "What the admitted AppWrappers under each quota node use, "
         "per resource, borrowed part included."),
        (2, "quota_borrowed", "The part of quota_used placed above the node, on quota "
         "lent by its ancestors."),
    ):
        family = GaugeMetricFamily(f"{PREFIX}_{name}", doc,
                                   labels=["tree", "node", "resource"])
        for (tree, node, resource), amounts in sorted(s.quota.items()):
            family.add_metric([tree, node, resource], amounts[index])
        yield family
    pending = GaugeMetricFamily(
        f"{PREFIX}_quota_pending_appwrappers", "AppWrappers in the admission queue "
        "whose leaf in the quota tree is this node or under it.", labels=["tree", "node"])
    for (tree, node), n in sorted(s.quota_pending.items()):
        pending.add_metric([tree, node], n)
    yield pending
    quota_nodes = GaugeMetricFamily(
        f"{PREFIX}_quota_nodes", "Nodes of the quota trees, by whether they have "
        "series (reported=false: beyond the cap on quota node series).",
        labels=["reported"])
    for reported, n in sorted(s.quota_nodes.items()):
        quota_nodes.add_metric([reported], n)
    yield quota_nodes
    yield GaugeMetricFamily(
        f"{PREFIX}_preemption_holds", "AppWrappers that preempted others and hold the "
        "room freed for them while the victims' pods terminate.",
        value=s.preemption_holds)


def _dispatcher_families(s: Snapshot) -> Iterator[Metric]:
    info = GaugeMetricFamily(
        f"{PREFIX}_policy_info", "Always 1; the labels name the queue policy and the "
        "fit rule in use.", labels=["policy", "fit"])
    if s.policy is not None:
        info.add_metric(list(s.policy), 1)
    yield info
    writes = CounterMetricFamily(
        f"{PREFIX}_status_writes", "AppWrapper status PATCHes sent, by what made them: "
        "news (a condition, state or requeue), details alone (pod counts, item uids, a "
        "start estimate) or a message alone.", labels=["kind"])
    for kind in WRITE_KINDS:
        writes.add_metric([kind], s.status_writes.get(kind, 0))
    yield writes
    pinned = CounterMetricFamily(
        f"{PREFIX}_pods_pinned", "Pods of gangs let onto the node held for them, by how: "
        "created (by the pod webhook, as the pod was created) or gate (its scheduling "
        "gate lifted by a PATCH).", labels=["how"])
    for how in ("created", "gate"):
        pinned.add_metric([how], s.pods_pinned.get(how, 0))
    yield pinned
    yield CounterMetricFamily(
        f"{PREFIX}_events_dropped", "Events not posted because too many already waited "
        "for the API client (the conditions in status say the same).",
        value=s.events_dropped)


# --- the HTTP server -------------------------------------------------------------------

def exposition(registry: CollectorRegistry, accept: str) -> web.Response:
    """The registry's metrics in the format the scraper accepts."""
    encode, content_type = choose_encoder(accept)
    return web.Response(body=encode(registry), headers={"Content-Type": content_type})


class MetricsAuth(Protocol):
    async def check(self, authorization: str | None, path: str) -> tuple[int, str] | None:
        """None if the request may read ``path``, else (HTTP status, reason)."""

    async def close(self) -> None: ...


class MetricsServer:
    """/metrics and /healthz on the running event loop. With ``auth``, /metrics answers
    only requests it lets through; /healthz stays open (the kubelet's probes carry no
    credentials, and it tells nothing about the cluster)."""

    # `dispatcher run --metrics-auth` sets this before the operator starts the server.
    default_auth: MetricsAuth | None = None

    def __init__(self, observer: PrometheusObserver, port: int, host: str = "0.0.0.0",
                 max_cycle_age: float = HEALTHY_CYCLE_AGE_SECONDS,
                 auth: MetricsAuth | None = None,
                 visibility: VisibilityApi | None = None,
                 problem: Callable[[], str | None] = lambda: None,
                 dispatcher: Callable[[], Dispatcher | None] = lambda: None,
                 standby: Callable[[], str | None] = lambda: None) -> None:
        """`visibility`: the queue's visibility endpoint, served beside the metrics;
        `problem`: why start-up is stuck, if it is (the API server unreachable, a grant
        missing); `dispatcher`: the loop, once made; `standby`: what this replica waits
        for while another leads (a standby is healthy)."""
        self.observer = observer
        self.host = host
        self.port = port
        self.max_cycle_age = max_cycle_age
        self.auth = auth if auth is not None else MetricsServer.default_auth
        self.visibility = visibility
        self.problem = problem
        self.dispatcher = dispatcher
        self.standby = standby
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/healthz", self.healthz)
        if self.visibility is not None:
            self.visibility.add_routes(app)
        return app

    async def start(self) -> None:
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        log.info("serving /metrics and /healthz on %s", ", ".join(
            f"http://{h}:{p}" for h, p in self.addresses()))

    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) pairs listened on; the real port when started with port 0."""
        if self._runner is None:
            return []
        out = []
        for addr in self._runner.addresses:
            if isinstance(addr, tuple) and len(addr) >= 2:
                out.append((str(addr[0]), int(addr[1])))
        return out

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.auth is not None:
            await self.auth.close()
        if self.visibility is not None:
            await self.visibility.close()

    async def metrics(self, request: web.Request) -> web.Response:
        if self.auth is not None:
            refused = await self.auth.check(request.headers.get("Authorization"),
                                            request.path)
            if refused is not None:
                return web.Response(status=refused[0], text=refused[1])
        return exposition(self.observer.registry, request.headers.get("Accept", ""))

    def health(self) -> tuple[bool, str]:
        d = self.dispatcher()
        if d is None or not d.ready:
            problem = self.problem()
            if problem is not None:
                return False, f"starting: {problem}"
            standby = self.standby()
            if d is None and standby is not None:
                return True, f"standby: {standby}"
            return False, "starting: the cluster is not listed yet"
        blind = d.blind()
        if blind is not None:
            return False, f"blind: {blind}; deciding nothing until the watch resumes"
        age = time.monotonic() - d.last_cycle_at
        if age > self.max_cycle_age:
            return False, (f"the admission loop has not finished a cycle for {span(age)} "
                           f"(limit {span(self.max_cycle_age)})")
        return True, f"ok: {d.cycles} admission cycles, the last {age:.1f}s ago"

    async def healthz(self, request: web.Request) -> web.Response:
        ok, text = self.health()
        return web.Response(status=200 if ok else 503, text=text + "\n")
