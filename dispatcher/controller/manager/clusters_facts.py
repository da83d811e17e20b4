"""The facts of the manager's Clusters view (dashboard/clusters_view.py), read from the
manager's memory: its links to the workers and their views (kept by watches), the room its
last pass saw free in each, and its own wrappers as its watch last saw them (parsed through
the pass's cache, once per version). Nothing here asks a worker or the manager cluster
anything: a page load costs the workers nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from dispatcher.admission import FINISHED_STATES
from dispatcher.controller.dashboard.clusters_api import Facts
from dispatcher.controller.dashboard.clusters_view import (
    Fleet,
    SentFacts,
    WaitingFacts,
    WorkerFacts,
)
from dispatcher.fleet import order
from dispatcher.fleet.copies import target as sent_to
from dispatcher.queue.queue import QueuedWrapper
from dispatcher.resources import GPU

from .passes import Manager
from .workers import WorkerLink

Obj = dict[str, Any]


def source(manager: Manager, standby: Callable[[], str | None]) -> Facts:
    """The view's facts now, or why this replica has none to show."""
    def facts() -> Fleet | str:
        waiting = standby()
        if waiting is not None:
            return f"this replica stands by ({waiting}): the leader shows the clusters; reload"
        if manager.metrics.passed_at is None:
            return "starting: no pass over the worker clusters finished yet"
        return gather(manager)
    return facts


def gather(manager: Manager) -> Fleet:
    now = manager.clock()
    names = sorted(manager.clusters.links.keys() | manager.clusters.refused.keys())
    sent, queued = _split(manager.own.objects.values())
    metrics = manager.metrics
    ago = metrics.clock() - metrics.passed_at if metrics.passed_at is not None else 0.0
    wall = manager.wall()
    return Fleet([_worker(manager, name, now) for name in names], sent,
                 _waiting(manager, queued, wall), metrics.passes, ago, wall)


def _worker(manager: Manager, name: str, now: float) -> WorkerFacts:
    link = manager.clusters.links.get(name)
    refused = manager.clusters.refused.get(name)
    if link is None:  # its WorkerCluster cannot be used, and never could
        return WorkerFacts(name, False, problem=refused or "", listed=False)
    silent = None if link.reachable else now - manager.clusters.down_since.get(name, now)
    fault = manager.clusters.faults.get(name)
    problem = link.problem if refused is None else \
        f"{refused} (the kubeconfig it had before is used meanwhile)"
    if fault is not None and link.reachable and refused is None:
        problem = f"the manager cannot use what it holds: {fault}"
    if link.look is None:
        return WorkerFacts(name, link.reachable, silent, problem, listed=False)
    nodes = link.look.state.nodes.values()
    schedulable = [n for n in nodes if not n.unschedulable]
    return WorkerFacts(name, link.reachable, silent, problem, len(nodes),
                       len(nodes) - len(schedulable), _free(manager, link),
                       _sum(n.allocatable for n in schedulable))


def _free(manager: Manager, link: WorkerLink) -> dict[str, int]:
    """What the last pass saw free there: the room the next wrapper would be offered."""
    seen = manager.last_workers.get(link.name)
    return {} if seen is None else dict(seen.capacity.free_total)


def _sum(amounts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for amount in amounts:
        for r, n in amount.items():
            total[r] = total.get(r, 0) + n
    return total


def _split(wrappers: Iterable[Obj]) -> tuple[list[SentFacts], list[Obj]]:
    """The sent wrappers (wherever they are), and those in the manager's queue."""
    sent: list[SentFacts] = []
    queued: list[Obj] = []
    for obj in wrappers:
        meta, status = obj["metadata"], obj.get("status") or {}
        if meta.get("deletionTimestamp"):
            continue
        target = sent_to(obj)
        if target is not None:
            sent.append(SentFacts(str(meta.get("namespace") or ""), str(meta["name"]),
                                  str(target), str(status.get("state") or "")))
        elif status.get("state") not in FINISHED_STATES:
            queued.append(obj)
    return sent, queued


def _waiting(manager: Manager, queued: list[Obj], wall: float) -> list[WaitingFacts]:
    """The queue in the manager's order, with what the manager wrote on each; those it
    cannot read last, with why."""
    entries: dict[tuple[str, str], tuple[QueuedWrapper, Obj]] = {}
    unread: list[WaitingFacts] = []
    for obj in queued:
        read = manager.entries.read(obj, wall)
        meta = obj["metadata"]
        if isinstance(read, str):
            unread.append(WaitingFacts(meta["namespace"], meta["name"], 0, wall, 0, read))
        else:
            entries[read[0].key] = (read[0], obj)
    return [WaitingFacts(e.namespace, e.name, e.priority, e.first_seen, _gpus(e),
                         str((entries[e.key][1].get("status") or {}).get("message") or ""))
            for e in order((e for e, _ in entries.values()), wall)] + unread


def _gpus(entry: QueuedWrapper) -> int:
    return sum(g.pod_set.request.get(GPU, 0) * g.pod_set.count for g in entry.gang)
