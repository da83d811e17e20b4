"""The gauges' values, read from the dispatcher: AppWrappers by state, the queue,
cluster capacity, quota use, status writes.

Read after a cycle at most every `min_interval` seconds, and whenever /metrics is scraped
after a cycle: exact at scrape time, cheap in the loop. Read on the event loop the
dispatcher runs on, so nothing needs a lock.
"""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally
from dataclasses import dataclass, field

from dispatcher.api.conditions import ConditionType, latest
from dispatcher.api.models import State
from dispatcher.cluster import ClusterState
from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.controller.record.status import WRITE_KINDS
from dispatcher.resources import CPU

from .labels import bounded

log = logging.getLogger("dispatcher")

STATES = tuple(s.value for s in State)
CONDITIONS = tuple(c.value for c in ConditionType)

# Quota nodes are named by whoever writes QuotaSubtrees: at most this many get series (the
# upper levels of every tree first), the rest are counted in dispatcher_quota_nodes.
MAX_QUOTA_NODES = 200

# Gauges read from the dispatcher are recomputed after a cycle at most this often, and
# whenever /metrics is scraped after a cycle: exact at scrape time, cheap in the loop.
SNAPSHOT_MIN_INTERVAL_SECONDS = 2.0


def in_base_units(resource: str, amount: int) -> float:
    """Canonical amounts are millicores for cpu; Prometheus wants base units (cores)."""
    return amount / 1000 if resource == CPU else float(amount)


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
        counts[(bounded(status.state, STATES), bounded(condition, CONDITIONS))] += 1
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


class SnapshotReader:
    """The latest `Snapshot`, read again when a cycle ran since."""

    def __init__(self, min_interval: float = SNAPSHOT_MIN_INTERVAL_SECONDS) -> None:
        self.min_interval = min_interval
        self.data = Snapshot()
        self.computed = 0  # how many times it was read
        self._dispatcher: Dispatcher | None = None
        self._dirty = False
        self._computed_at = float("-inf")
        self._quota_capped = False

    def cycled(self, dispatcher: Dispatcher) -> None:
        """A cycle ran: the queue's length now, the rest if not read for a while."""
        self._dispatcher = dispatcher
        self._dirty = True
        self.data.pending = len(dispatcher.queue)
        if time.monotonic() - self._computed_at >= self.min_interval:
            self.refresh()

    def refresh(self, force: bool = False) -> None:
        """Read the gauges from the dispatcher if a cycle ran since the last reading."""
        d = self._dispatcher
        if d is None or not (self._dirty or force):
            return
        s = self.data
        s.appwrappers = appwrapper_counts(d)
        s.seen_labels.update(s.appwrappers)
        s.pending = len(d.queue)
        nodes, total, free, largest = capacity_of(d.state)
        # Only what some node advertises gets a series: resources named by AppWrappers
        # alone (a user can make up any number of them) would grow /metrics without bound.
        advertised = {r for node in d.state.nodes.values() for r in node.allocatable}
        s.nodes = nodes
        s.capacity = {r: in_base_units(r, v) for r, v in total.items()}
        s.free = {r: in_base_units(r, v) for r, v in free.items() if r in advertised}
        s.largest_free = {r: in_base_units(r, v) for r, v in largest.items()
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
        self.computed += 1

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
            (u.tree, u.name, r): (in_base_units(r, u.nominal.get(r, 0)),
                                  in_base_units(r, u.used.get(r, 0)),
                                  in_base_units(r, u.borrowed.get(r, 0)))
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
