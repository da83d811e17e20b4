"""The gauges read from the dispatcher (snapshot.py), as Prometheus families."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from dispatcher.controller.record.status import WRITE_KINDS

from .labels import PREFIX
from .snapshot import Snapshot, SnapshotReader


class SnapshotCollector:
    """The gauges read from the dispatcher, refreshed when scraped after a cycle."""

    def __init__(self, reader: SnapshotReader) -> None:
        self.reader = reader

    def describe(self) -> Iterator[Metric]:
        yield from _families(Snapshot())

    def collect(self) -> Iterator[Metric]:
        self.reader.refresh()
        yield from _families(self.reader.data)


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
