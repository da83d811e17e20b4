"""What the manager's Clusters view shows, shaped from plain values: each worker cluster
(answering or not, since when and why; its nodes; its free and total resources; the
manager's AppWrappers sent there, by state), the manager's waiting AppWrappers in the order
it considers them with why they wait, and where each sent one went.

Pure: no I/O, no clock, no Kubernetes client. The manager gathers the facts from its memory
(manager/clusters_facts.py); clusters_api.py serves them; the tests call this directly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatcher.resources import GPU, amount_number, resource_order
from dispatcher.wording import span

#: Rows of each list sent to the page; past it, counted (a page of thousands helps nobody).
MAX_ROWS = 500
#: The state a sent wrapper has before its worker's dispatcher says anything of its copy.
NO_STATE = "just sent"


@dataclass(frozen=True)
class WorkerFacts:
    """A worker cluster as the manager's last pass saw it."""

    name: str
    reachable: bool
    #: Seconds it has not answered for (None: it answers); counted from the last heartbeat
    #: it acknowledged, as the manager's grace is.
    silent_for: float | None = None
    problem: str = ""  # why it does not answer, its WorkerCluster is refused, or it is unusable
    nodes: int = 0
    cordoned: int = 0
    #: Free now on its schedulable nodes, less what the wrappers sent there still need.
    free: Mapping[str, int] = field(default_factory=dict, hash=False)
    total: Mapping[str, int] = field(default_factory=dict, hash=False)  # schedulable nodes
    listed: bool = True  # False: never listed yet, its nodes unknown


@dataclass(frozen=True)
class SentFacts:
    namespace: str
    name: str
    worker: str
    state: str  # as its copy's status says, mirrored back ("" before it says anything)


@dataclass(frozen=True)
class WaitingFacts:
    """A wrapper in the manager's queue, at its place in the manager's order."""

    namespace: str
    name: str
    priority: int
    first_seen: float  # seconds since the epoch
    gpus: int
    why: str  # the message the manager wrote on it: each worker's best offer, or none yet


@dataclass(frozen=True)
class Fleet:
    workers: Sequence[WorkerFacts]
    sent: Sequence[SentFacts]
    waiting: Sequence[WaitingFacts]  # in the manager's order
    passes: int
    last_pass_ago: float
    #: When gathered, on the manager's clock (seconds since the epoch): the waits count to it.
    at: float


def clusters(facts: Fleet) -> dict[str, Any]:
    """The whole view."""
    by_worker: dict[str, Counter[str]] = {}
    for s in facts.sent:
        by_worker.setdefault(s.worker, Counter())[s.state or NO_STATE] += 1
    return {
        "passes": facts.passes, "lastPass": span(facts.last_pass_ago),
        "workers": [worker(w, by_worker.get(w.name, Counter())) for w in facts.workers],
        "waiting": [waiting_row(w, i + 1, facts.at)
                    for i, w in enumerate(facts.waiting[:MAX_ROWS])],
        "moreWaiting": max(0, len(facts.waiting) - MAX_ROWS),
        "sent": [sent_row(s) for s in sorted(facts.sent, key=_by_worker)[:MAX_ROWS]],
        "moreSent": max(0, len(facts.sent) - MAX_ROWS),
    }


def answering(w: WorkerFacts) -> str:
    """Whether it answers, in words: "yes", "no, for 2m10s: why"."""
    if w.reachable:
        return "yes" + (f" ({w.problem})" if w.problem else "")
    since = "" if w.silent_for is None else f" for {span(w.silent_for)}"
    return f"no{since}: {w.problem or 'no answer'}"


def worker(w: WorkerFacts, sent: Counter[str]) -> dict[str, Any]:
    return {
        "name": w.name, "reachable": w.reachable, "answering": answering(w),
        "nodes": w.nodes if w.listed else None, "cordoned": w.cordoned,
        "gpusFree": w.free.get(GPU, 0) if w.listed else None,
        "gpusTotal": w.total.get(GPU, 0) if w.listed else None,
        "resources": resources(w.free, w.total),
        "sent": sum(sent.values()), "sentByState": sorted([s, n] for s, n in sent.items()),
    }


def resources(free: Mapping[str, int], total: Mapping[str, int]) -> list[dict[str, Any]]:
    """Free and total per resource, GPUs and other extended resources first."""
    return [{"resource": r, "free": amount_number(r, free.get(r, 0)),
             "total": amount_number(r, total.get(r, 0))}
            for r in sorted(set(free) | set(total), key=resource_order)]


def waiting_row(w: WaitingFacts, position: int, now: float) -> dict[str, Any]:
    return {"position": position, "namespace": w.namespace, "name": w.name,
            "priority": w.priority, "gpus": w.gpus,
            "waiting": span(max(0.0, now - w.first_seen)),
            "why": " ".join(w.why.split()) or "not looked at by a pass yet"}


def sent_row(s: SentFacts) -> dict[str, Any]:
    return {"namespace": s.namespace, "name": s.name, "worker": s.worker,
            "state": s.state or NO_STATE}


def _by_worker(s: SentFacts) -> tuple[str, str, str]:
    return s.worker, s.namespace, s.name
