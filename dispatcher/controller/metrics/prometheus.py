"""Prometheus metrics of `dispatcher run`.

`PrometheusObserver` turns what the dispatcher reports (dispatches, requeues, failures,
admission cycles) into counters and histograms, and has the gauges (AppWrappers by state,
the queue, cluster capacity) read from the dispatcher (snapshot.py). It has its
own registry, so nothing else in the process (client libraries) leaks into /metrics;
server.py serves it.

Labels are bounded: states, condition types, reasons and resource names — never an
AppWrapper's name or namespace. Values outside the known sets (a status written by
another controller, say) are counted as ``Other``.

See docs/operations.md for the list of metrics.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dispatcher import version
from dispatcher.api.conditions import Reason
from dispatcher.controller.loop.runtime import Dispatcher, Observer
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

from .gauges import SnapshotCollector
from .labels import OTHER, PREFIX, bounded
from .requests import RequestMetrics
from .snapshot import SNAPSHOT_MIN_INTERVAL_SECONDS, Snapshot, SnapshotReader

TOPOLOGY_OUTCOMES = ("one_domain", "spread")
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


class PrometheusObserver(Observer):
    """The dispatcher's metrics, in a registry of their own (`self.registry`)."""

    def __init__(self, registry: CollectorRegistry | None = None,
                 min_interval: float = SNAPSHOT_MIN_INTERVAL_SECONDS,
                 topology_levels: Sequence[str] = ()) -> None:
        """`topology_levels`: the configured levels, the only values of the `level`
        label of the topology placements."""
        self.registry = registry if registry is not None else CollectorRegistry()
        self.gauges = SnapshotReader(min_interval)
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
        self.registry.register(SnapshotCollector(self.gauges))

    @property
    def snapshot_data(self) -> Snapshot:
        return self.gauges.data

    @property
    def snapshots_computed(self) -> int:
        return self.gauges.computed

    def refresh(self, force: bool = False) -> None:
        """Read the gauges from the dispatcher if a cycle ran since the last reading."""
        self.gauges.refresh(force)

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
        self.requeues.labels(bounded(reason, REQUEUE_REASONS, OTHER)).inc()

    def reset(self, reason: str) -> None:
        self.resets.labels(bounded(reason, RESET_REASONS, OTHER)).inc()

    def failed(self, reason: str) -> None:
        self.failures.labels(bounded(reason, FAILURE_REASONS, OTHER)).inc()

    def completed(self) -> None:
        self.completions.inc()

    def preempted(self, reason: str) -> None:
        self.preemptions.labels(bounded(reason, PREEMPTION_REASONS, OTHER)).inc()

    def placed_in_topology(self, level: str, one_domain: bool) -> None:
        self.topology_placements.labels(bounded(level, self.topology_levels, OTHER),
                                        TOPOLOGY_OUTCOMES[0 if one_domain else 1]).inc()

    def start_estimate_error(self, estimate: str, seconds: float) -> None:
        self.estimate_error.labels(bounded(estimate, ESTIMATES, OTHER)).observe(
            max(0.0, seconds))

    def snapshot(self, dispatcher: Dispatcher) -> None:
        self.gauges.cycled(dispatcher)
