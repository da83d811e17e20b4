"""`dispatcher plan --live -f wrapper.yaml`: what if I submit this, on the cluster as it is?

The Nodes, Pods, AppWrappers and QuotaSubtrees are listed through the kubeconfig (read
only: nothing is created or changed). The AppWrappers of the file join the queue as if
just submitted (one that exists already is planned as its new version), and for each the
answer says:

- now: the decision of one admission cycle of the same core the controller runs -- where
  its pods go, whom it would preempt, which quota it would borrow -- or why it waits;
- when: the start the replay of expected durations estimates for it (the replay behind
  ``status.estimatedStart``), and on which nodes;
- what it delays: the queued wrappers whose estimated start moves later because of it
  and, under a policy that reserves (``backfill: reserve``), whether it moves the head's
  reservation.

Expected durations as the controller's: declared (``dispatchDuration.expected`` or the
annotation), else the installation default -- the live cluster keeps no history of
completed wrappers to take medians from. Building the answer is pure; only `fetch` talks
to the cluster.
"""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from dispatcher.admission import (
    NO_TOPOLOGY,
    Decision,
    Fit,
)
from dispatcher.eta import DurationRule, Estimate, Limits, forecast
from dispatcher.eta.reserve import planner, reservations
from dispatcher.eta.text import describe
from dispatcher.fit.capacity import Capacity
from dispatcher.fit.topology import Topology
from dispatcher.kinds.scope import DEFAULT_ALLOWED_KINDS, GroupKind
from dispatcher.plan import (
    Document,
    InputError,
    appwrappers_from_documents,
    cluster_from_documents,
    expected_durations,
    plan,
    read_some_documents,
    running_wrappers,
)
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import AdmissionQueue, QueuedWrapper, WrapperKey
from dispatcher.queue.reservation import Reservation, Reservations, clock_time, node_list
from dispatcher.quota import QuotaForest
from dispatcher.visibility import ClusterError, connected, list_path, user_error
from dispatcher.wording import printable

# What `fetch` lists, with the apiVersion and kind its items are given where they carry
# none (the items of a core list do not).
LISTED = (("/api/v1/nodes", "v1", "Node"), ("/api/v1/pods", "v1", "Pod"),
          ("/apis/quota.codeflare.dev/v1alpha1/quotasubtrees", "quota.codeflare.dev/v1alpha1",
           "QuotaSubtree"),
          ("/apis/workload.codeflare.dev/v1beta1/appwrappers", "workload.codeflare.dev/v1beta1",
           "AppWrapper"))
# Each replay stops after the first instant that ends past this (an instant of 10,000
# queued wrappers takes some 0.15 s), so the two, the reading and the cycle fit the 2 s
# an answer is meant to take; further, the estimates say "not before".
LIMITS = Limits(budget_seconds=0.3)


@dataclass(frozen=True)
class Live:
    """The cluster as listed: Nodes, Pods and QuotaSubtrees; AppWrappers."""

    cluster: Sequence[Document]
    appwrappers: Sequence[Document]


@dataclass(frozen=True)
class Delay:
    key: WrapperKey
    before: float  # its estimated start without the submitted wrappers
    after: float | None  # with them; None: no start foreseen within the estimate's reach


@dataclass(frozen=True)
class Answer:
    decision: Decision  # this cycle's
    estimate: Estimate | None  # None: dispatched (or preempting) now
    delays: tuple[Delay, ...]
    reserved_before: Reservation | None
    reserved_after: Reservation | None

    @property
    def moves_reservation(self) -> bool:
        return self.reserved_before != self.reserved_after and self.reserved_before is not None


@dataclass(frozen=True)
class WhatIf:
    policy: Policy
    fit: Fit
    now: float
    answers: tuple[Answer, ...]
    problems: tuple[str, ...]  # QuotaSubtrees that could not be used


def what_if(live: Live, submitted: Sequence[Document], policy: Policy, fit: Fit, now: float,
            rule: DurationRule | None = None, limits: Limits = LIMITS,
            allowed: Collection[GroupKind] = DEFAULT_ALLOWED_KINDS,
            topology: Topology = NO_TOPOLOGY) -> WhatIf:
    with _collector_paused():
        return _what_if(live, submitted, policy, fit, now, rule or DurationRule(), limits,
                        allowed, topology)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off for the duration (as it was after).

    An answer reads some ten thousand AppWrappers into a million objects that all live
    until it is given, and makes few reference cycles: the collector's passes over them,
    each full one longer than the last, cost as much CPU as the reading itself.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _what_if(live: Live, submitted: Sequence[Document], policy: Policy, fit: Fit, now: float,
             rule: DurationRule, limits: Limits, allowed: Collection[GroupKind],
             topology: Topology) -> WhatIf:
    subtrees: list[Mapping[str, Any]] = []
    state = cluster_from_documents(live.cluster, subtrees)
    new = appwrappers_from_documents(submitted, now, allowed)
    mine = {w.key for w in new.queued}
    # What the listed ones would be warned about is not asked: the answers are for `new`.
    current = appwrappers_from_documents(
        [d for d in live.appwrappers if _key(d.obj) not in mine], now, allowed, warn=False)
    subtrees += [*current.subtrees, *new.subtrees]
    durations = expected_durations([*current.queued, *new.queued],
                                   {**current.specs, **new.specs}, rule)
    running = running_wrappers(current.admitted, state, rule, now)
    forest = QuotaForest.from_objects(subtrees)
    capacity = Capacity.of(state)

    def replay(queued: list[QueuedWrapper]) -> tuple[dict[WrapperKey, Estimate],
                                                     Reservations | None]:
        found = forecast(queued, running, capacity.copy(), policy, now, durations, fit=fit,
                         forest=forest or None, limits=limits, topology=topology,
                         planner=planner(policy, fit, limits=limits, topology=topology))
        held = None
        if policy.reserve:
            queue = AdmissionQueue(policy)
            for w in queued:
                queue.put(w)
            held = reservations(queue.ordered(now), running, capacity, policy, now,
                                durations, fit=fit, limits=limits, topology=topology)
        return found.estimates, held

    before, held_before = replay(current.queued)
    after, held_after = replay([*current.queued, *new.queued])
    result = plan(state, [*current.queued, *new.queued], policy, fit, now, current.admitted,
                  subtrees, topology, reservations=held_after)
    delays = tuple(Delay(k, e.at, after[k].at if after[k].outcome == "start" else None)
                   for k, e in before.items()
                   if e.outcome == "start" and e.at is not None and k in after
                   and _later(after[k], e.at))
    first_before = held_before.held[0] if held_before and held_before.held else None
    first_after = held_after.held[0] if held_after and held_after.held else None
    answers = tuple(
        Answer(d, None if d.decision in ("dispatch", "preempt") else after.get(d.key),
               delays, first_before, first_after)
        for d in result.decisions if d.key in mine)
    return WhatIf(policy, fit, now, answers, tuple(result.problems))


def _later(e: Estimate, before: float) -> bool:
    """Whether an estimate `e` is a start later than `before` (or none foreseen any more);
    a replay that stopped on its budget knows nothing of it."""
    if e.outcome == "start":
        return e.at is not None and e.at > before + 1
    return e.outcome in ("beyond", "stuck", "never")


def _key(obj: Mapping[str, Any]) -> WrapperKey:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


# --- output -----------------------------------------------------------------------------

def _iso(at: float | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, UTC).isoformat()


def _reservation_json(r: Reservation | None) -> dict[str, Any] | None:
    if r is None:
        return None
    return {"namespace": r.key[0], "name": r.key[1], "startsAt": _iso(r.at),
            "nodes": sorted(r.nodes)}


def _nodes(d: Decision) -> list[str]:
    return sorted({p.node for p in d.placements if p.node is not None})


def to_json(w: WhatIf) -> str:
    out = []
    for a in w.answers:
        d, e = a.decision, a.estimate
        start = w.now if e is None else (e.at if e.outcome == "start" else None)
        out.append({
            "namespace": d.namespace, "name": d.name, "decision": d.decision,
            "reason": d.reason, "message": d.message,
            "startsAt": _iso(start), "estimate": "" if e is None else describe(e, w.now),
            "nodes": _nodes(d) if e is None else list(e.nodes),
            "preempts": [f"{ns}/{n}" for ns, n in d.preempts],
            "reclaims": [f"{ns}/{n}" for ns, n in d.reclaims],
            "borrows": [{"tree": q.tree, "leaf": q.leaf, "from": q.node}
                        for q in d.quota if q.borrows],
            "delays": [{"namespace": x.key[0], "name": x.key[1], "before": _iso(x.before),
                        "after": _iso(x.after)} for x in a.delays],
            "reservation": {"before": _reservation_json(a.reserved_before),
                            "after": _reservation_json(a.reserved_after),
                            "moved": a.moves_reservation},
        })
    return json.dumps({"policy": w.policy.name, "fit": w.fit, "now": _iso(w.now),
                       "answers": out, "quotaProblems": list(w.problems)}, indent=2)


def to_table(w: WhatIf) -> str:
    lines = [f"policy {w.policy.name}, {w.fit} fit, the live cluster at "
             f"{clock_time(w.now, w.now)} (nothing was created)"]
    for a in w.answers:
        d, e = a.decision, a.estimate
        lines += ["", f"{d.namespace}/{d.name}: {d.decision} ({d.reason}): {d.message}"]
        if e is None:
            lines.append(f"  starts: now, on {node_list(_nodes(d)) or '-'}")
        else:
            where = f", on {node_list(e.nodes)}" if e.nodes else ""
            lines.append(f"  starts: {describe(e, w.now) or e.reason or e.outcome}{where}")
        if d.preempts:
            lines.append(f"  preempts: {', '.join(f'{ns}/{n}' for ns, n in d.preempts)}")
        borrows = [q for q in d.quota if q.borrows]
        if borrows:
            lines.append("  borrows: " + ", ".join(f"quota of {q.node} for {q.leaf} "
                                                   f"(tree {q.tree})" for q in borrows))
        for x in a.delays:
            moved = clock_time(x.after, w.now) if x.after is not None else "no start foreseen"
            lines.append(f"  delays: {x.key[0]}/{x.key[1]} from {clock_time(x.before, w.now)} "
                         f"to {moved}")
        if a.moves_reservation and a.reserved_before is not None:
            to = (f"{a.reserved_after.name} at {clock_time(a.reserved_after.at, w.now)}"
                  if a.reserved_after is not None else "none")
            lines.append(f"  moves the reservation of {a.reserved_before.name} at "
                         f"{clock_time(a.reserved_before.at, w.now)}: now {to}")
    lines.extend(f"quota problem: {p}" for p in w.problems)
    return "\n".join(printable(line) for line in lines)


# --- the cluster ------------------------------------------------------------------------

async def fetch(kubeconfig: str | None, context: str | None) -> Live:
    """List what an answer needs, as the kubeconfig's user; QuotaSubtrees only where
    served."""
    from dispatcher.controller.kube.client import ApiError

    cluster: list[Document] = []
    appwrappers: list[Document] = []
    async with connected(kubeconfig, context) as (kube, _):
        for path, version, kind in LISTED:
            try:
                items = await list_path(kube, path)
            except ApiError as e:
                if kind == "QuotaSubtree" and e.status == 404:
                    continue  # not served: no quota trees
                if kind == "AppWrapper" and e.status == 404:
                    raise ClusterError("AppWrappers are not served by this cluster: install "
                                       "the CRD (crds/ or deploy/)") from None
                raise ClusterError(user_error(e)) from None
            listed = [Document(f"{kind} {_where(i)}", {"apiVersion": version, "kind": kind,
                                                       **i}) for i in items]
            (appwrappers if kind == "AppWrapper" else cluster).extend(listed)
    return Live(cluster, appwrappers)


def _where(item: Mapping[str, Any]) -> str:
    ns, name = _key(item)
    return f"{ns}/{name}"


# --- the command ------------------------------------------------------------------------

def command(policy: Policy, fit: Fit, files: Sequence[str], kubeconfig: str | None,
            context: str | None, output: str, now: float, out: TextIO, err: TextIO,
            allowed: Collection[GroupKind] = DEFAULT_ALLOWED_KINDS,
            topology: Topology = NO_TOPOLOGY) -> int:
    """`dispatcher plan --live`: 0, 1 when the cluster cannot be read, 2 for bad input."""
    try:
        submitted = [d for f in files for d in read_some_documents(Path(f))]
    except InputError as e:
        print(f"dispatcher plan: {e}", file=err)
        return 2
    try:
        with _collector_paused():  # the listing is as many objects again
            live = asyncio.run(fetch(kubeconfig, context))
    except ClusterError as e:
        print(f"dispatcher plan --live: {e}", file=err)
        return 1
    try:
        answer = what_if(live, submitted, policy, fit, now, allowed=allowed,
                         topology=topology)
    except InputError as e:
        print(f"dispatcher plan: {e}", file=err)
        return 2
    print(to_json(answer) if output == "json" else to_table(answer), file=out)
    return 0
