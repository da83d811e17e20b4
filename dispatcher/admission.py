"""One admission cycle: queue + cluster + policy -> ordered decisions with reasons.

Every queued wrapper gets a decision, in the order the policy considers them. Each
dispatch takes its capacity before the next wrapper is considered. A wrapper that
could not fit even on the empty cluster waits with its own reason and never holds
the head of the line; an invalid one is reported and skipped.

With quota trees, a wrapper must first fit its quota (at its leaf, or borrowing from an
ancestor) in every tree. One whose labels name no usable quota node (UnknownQuotaNode)
waits without holding the line. One that does not fit (QuotaExceeded) holds the line, when
the policy makes heads block, only for the wrappers that count against the node that is
full for it: its own team's, or everyone's when that node is a root. With a
preemption policy, a wrapper that does not fit may get a `preempt` decision instead: the
whole gangs to tear down first (see dispatcher.preemption).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from dispatcher.api.messages import problems_message
from dispatcher.api.models import AppWrapper
from dispatcher.cluster.state import PlannedPod
from dispatcher.elastic import (
    Candidate,
    Scale,
    Shrink,
    ShrinkRound,
    admitted_now,
    at_minimum,
    demand_at,
    grow,
    newly_admitted,
    rank,
    shrink_search,
)
from dispatcher.fit.capacity import Capacity, IndexArray
from dispatcher.fit.elastic import ElasticNow, describe, lowest
from dispatcher.fit.gang import (
    NEVER_FITS,
    GangPodSet,
    Hopeless,
    Placement,
    Placer,
    Shortfall,
    never_fits,
    never_fits_aggregate,
    place,
    place_aggregate,
)
from dispatcher.fit.topology import Topology
from dispatcher.kinds import InvalidItem, item_pod_sets, topology_request
from dispatcher.kinds.elastic import (
    ElasticSet,
    declared_sets,
    from_min_available,
    tolerant_sets,
)
from dispatcher.preemption import (
    AdmittedWrapper,
    Hold,
    Preemption,
    PreemptionSearch,
    apply_holds,
    give_hold,
    take_hold,
)
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import QueuedWrapper, WrapperKey
from dispatcher.quota import QuotaCheck, QuotaConsumer, QuotaLedger, QuotaPlacement
from dispatcher.wording import all_of, plural, span

Fit = Literal["per-node", "aggregate"]
# preempt: dispatch once the wrappers in `preempts` are torn down (its room is then held).
Verdict = Literal["dispatch", "wait", "invalid", "preempt"]

DISPATCH = "Dispatch"
BEHIND_HEAD = "BehindHeadOfLine"
INVALID = "InvalidSpec"
QUOTA_EXCEEDED = "QuotaExceeded"  # no room in its quota, even borrowing; never holds the line
UNKNOWN_QUOTA = "UnknownQuotaNode"  # its labels name no usable quota leaf; never holds the line
PREEMPTING = "Preempting"  # the reason of a `preempt` verdict
AWAITING_PREEMPTION = "AwaitingPreemption"  # held room not free yet: victims still terminating
NO_TOPOLOGY = Topology()


@dataclass(frozen=True)
class Decision:
    namespace: str
    name: str
    decision: Verdict
    reason: str
    message: str
    placements: tuple[Placement, ...] = ()
    head_of_line: bool = False  # the first wrapper in order that waits for capacity
    effective_priority: float = 0.0
    preempts: tuple[WrapperKey, ...] = ()  # `preempt`: the whole gangs to tear down first
    reclaims: tuple[WrapperKey, ...] = ()  # those of them taken for the quota they borrow
    # Where it sits (or would) in each quota tree, and whether it borrows there.
    quota: tuple[QuotaPlacement, ...] = ()
    # An elastic gang's dispatch: its pods per elastic set (its minimum, and what it
    # grew by in the same cycle); `placements` hold them all.
    elastic: tuple[int, ...] = ()
    # `preempt` by scaling in: the elastic wrappers to shrink first (dispatcher.elastic).
    shrinks: tuple[Scale, ...] = ()

    @property
    def key(self) -> WrapperKey:
        return (self.namespace, self.name)


@dataclass
class CycleStats:
    considered: int = 0
    fit_checks: int = 0
    cache_hits: int = 0
    dispatched: int = 0
    blocked_by: tuple[str, str] | None = None
    preemptions: int = 0
    victims: int = 0
    extra: dict[str, int] = field(default_factory=dict)


def queued_from_appwrapper(aw: AppWrapper, first_seen: float) -> QueuedWrapper:
    """The queue entry of an AppWrapper; invalid items make it invalid, not an error."""
    gang: list[GangPodSet] = []
    problems: list[str] = []
    declared: list[ElasticSet] = []
    tolerant: list[ElasticSet] = []
    for i, item in enumerate(aw.spec.resources.GenericItems):
        custom = [c.model_dump() for c in item.custompodresources]
        try:
            sets = item_pod_sets(item.generictemplate, custom or None, index=i)
            if not custom:
                declared += declared_sets(item.generictemplate, sets, i, len(gang))
                tolerant += tolerant_sets(item.generictemplate, sets, i, len(gang))
        except InvalidItem as e:
            problems.append(f"spec.resources.GenericItems[{i}]: {e}")
            continue
        gang.extend(GangPodSet(i, ps) for ps in sets)
    try:
        whole = topology_request(aw.metadata.annotations, "metadata.annotations",
                                 whole_gang=True)
    except InvalidItem as e:
        problems.append(str(e))
        whole = None
    if whole is not None:  # a pod set's own request wins for that set
        gang = [g if g.pod_set.topology is not None
                else GangPodSet(g.item, dataclasses.replace(g.pod_set, topology=whole))
                for g in gang]
    minimum = aw.spec.schedulingSpec.minAvailable
    if not declared and minimum is not None:
        ranged = from_min_available(tolerant, [g.pod_set.count for g in gang], minimum)
        declared = [ranged] if ranged is not None else []
    return QueuedWrapper(
        namespace=aw.metadata.namespace,
        name=aw.metadata.name,
        uid=aw.metadata.uid,
        first_seen=first_seen,
        gang=tuple(gang),
        priority=aw.spec.priority,
        priority_slope=aw.spec.priorityslope,
        invalid=problems_message(problems) or None,
        labels=tuple(sorted(aw.metadata.labels.items())),
        elastic=tuple(declared) if not problems else (),
    )


# queuejobstate of an admitted one
ADMITTED_STATES = frozenset({"Dispatched", "Running", "RunningHoldCompletion"})
FINISHED_STATES = frozenset({"Completed", "Failed", "Deleted"})


def is_admitted(aw: AppWrapper) -> bool:
    """Dispatched and not finished: it holds capacity and counts against its quota."""
    if aw.status.state in FINISHED_STATES or aw.status.queuejobstate in FINISHED_STATES:
        return False
    return (aw.status.state in ("Running", "RunningHoldCompletion")
            or aw.status.queuejobstate in ADMITTED_STATES)


def admitted_from_appwrapper(aw: AppWrapper, holdings: Iterable[PlannedPod], now: float,
                             preempted: Iterable[WrapperKey] = (),
                             pods: Iterable[tuple[str, PlannedPod]] = ()) -> AdmittedWrapper:
    """The record `admit` needs of a dispatched or running AppWrapper.

    holdings: ``ClusterState.holdings(key)``; preempted: the victims of the Hold it was
    dispatched from, if any. Its priority is the effective priority it was dispatched
    with (status.systempriority), else spec.priority; dispatched_at the time of its
    Dispatched condition, else `now`. An elastic one runs at the size its status records
    (status.elasticPods); `pods`, its bound pods by name, say which a scale-in removes.
    """
    queued = queued_from_appwrapper(aw, first_seen_of(aw, now))
    dispatched = next((c for c in reversed(aw.status.conditions) if c.type == "Dispatched"),
                      None)
    stamp = dispatched.lastTransitionMicroTime if dispatched is not None else None
    return admitted_record(queued, aw.status.systempriority or float(aw.spec.priority),
                           holdings, stamp.timestamp() if stamp is not None else now,
                           preempted, aw.status.elasticPods, pods)


def admitted_record(queued: QueuedWrapper, priority: float, holdings: Iterable[PlannedPod],
                    dispatched_at: float, preempted: Iterable[WrapperKey] = (),
                    recorded: Sequence[int] = (),
                    pods: Iterable[tuple[str, PlannedPod]] = ()) -> AdmittedWrapper:
    """An admitted wrapper's record from its queue entry (see admitted_from_appwrapper)."""
    elastic = (admitted_now(queued, recorded, queued.first_seen, pods) if queued.elastic
               else None)
    need = demand_at(queued.gang, elastic.sets, elastic.counts) if elastic else queued.demand
    return AdmittedWrapper(queued.namespace, queued.name, queued.uid, priority, need,
                           tuple(holdings), dispatched_at, queued.labels, tuple(preempted),
                           elastic)


def first_seen_of(aw: AppWrapper, default: float) -> float:
    stamp: datetime | None = aw.status.controllerfirsttimestamp or aw.metadata.creationTimestamp
    return stamp.timestamp() if stamp is not None else default


class EmptyClusterAnswers:
    """Whether each gang shape could fit the cluster with nothing running on it.

    The answer depends only on the nodes, not on what runs on them, so a caller whose node
    set stays the same (the simulator; a controller between node changes) keeps one of
    these across cycles instead of asking again every cycle.
    """

    def __init__(self) -> None:
        self.empty: Capacity | None = None
        self.never: dict[tuple[object, ...], Shortfall | None] = {}


def admit(
    ordered: Iterable[QueuedWrapper],
    capacity: Capacity,
    policy: Policy,
    now: float,
    fit: Fit = "per-node",
    stats: CycleStats | None = None,
    empty_answers: EmptyClusterAnswers | None = None,
    *,
    quota: QuotaLedger | None = None,
    admitted: Sequence[AdmittedWrapper] = (),
    holds: Mapping[WrapperKey, Hold] | None = None,
    scaling: list[Scale] | None = None,
    topology: Topology | None = None,
) -> list[Decision]:
    """Decide every wrapper of `ordered`; dispatches take capacity from `capacity`.

    `empty_answers` may be kept by the caller across cycles only while the nodes are
    unchanged, and only for one fit rule.

    Quotas and preemption (all optional; without them nothing changes):
    `quota` is the usage of the quota trees by the admitted and held wrappers
    (``preemption.quota_ledger``); each wrapper must then fit its quota before its pods
    are placed, and each dispatch adds to the usage, so the caller sees it afterwards.
    `admitted` are the dispatched and running wrappers, which a policy with preemption
    may tear down. `holds` is the room kept for preemptors until they dispatch.

    Elastic gangs (dispatcher.elastic) are admitted at their minimum and grown in the
    same cycle by what is left; pass `scaling` to have the admitted ones grown too (their
    scale-outs are appended to it). Scale-ins come as `preempt` decisions' `shrinks`.

    `topology`: the installation's topology levels (fit.topology). A pod set asking for a
    level it lacks is invalid; one asking for a domain is placed in one (per-node fit;
    the aggregate rule places no pod and so ignores the requests).
    """
    stats = stats if stats is not None else CycleStats()
    topology = topology if topology is not None else NO_TOPOLOGY
    fit_gang, hopeless_gang = fit_rules(fit, topology)
    answers = empty_answers if empty_answers is not None else EmptyClusterAnswers()
    never = answers.never
    holds, expired = _live_holds(holds or {}, admitted, policy, now, quota)
    held = apply_holds(capacity, holds)
    ledger = quota if quota is not None and quota.active else None
    search = (PreemptionSearch(policy, now, admitted, ledger, fit_gang,
                               topology if fit == "per-node" and topology.levels else None)
              if policy.preemption != "never" and admitted else None)
    # Capacity only shrinks during a cycle, so a gang shape that did not fit once will
    # not fit later in the same cycle: remember the answer. Quota may free up when a
    # preemption is decided, so its answers are remembered only until then.
    failed: dict[tuple[object, ...], Shortfall] = {}
    quota_failed: dict[tuple[object, ...], QuotaCheck] = {}
    blocking: QueuedWrapper | None = None
    # Quota nodes a waiting wrapper holds the line at, for the wrappers under them only.
    quota_blocks: dict[tuple[str, str], QueuedWrapper] = {}
    head_seen = False
    said: tuple[QueuedWrapper, str] | None = None  # the blocking head, and what waits say
    decisions: list[Decision] = []
    seen: dict[WrapperKey, QueuedWrapper] = {}
    elastic_pool = [a for a in admitted if a.elastic is not None] if fit == "per-node" else []
    shrinking = ShrinkRound()  # the cycle's scale-ins (bounded work, who was scaled in)
    for w in ordered:
        stats.considered += 1
        seen[w.key] = w
        w = at_minimum(w)
        prio = w.effective_priority(now)
        invalid = w.invalid
        if invalid is None and w.asks_topology:
            invalid = topology.problem(w.gang)
        if invalid is not None:
            decisions.append(Decision(w.namespace, w.name, "invalid", INVALID, invalid,
                                      effective_priority=prio))
            continue
        own_hold = held.get(w.key) if held else None
        # A wrapper holding room passes any head: the room was given to it already.
        if blocking is not None and own_hold is None:
            # The head's own decision says why it waits; repeating that here would
            # rewrite every queued wrapper's status whenever the head's reason changes.
            # The same words for everyone behind it: written once.
            if said is None or said[0] is not blocking:
                said = (blocking, f"waiting behind {blocking.namespace}/{blocking.name} at "
                                  f"the head of the line ({policy.name} policy)")
            decisions.append(Decision(w.namespace, w.name, "wait", BEHIND_HEAD, said[1],
                                      effective_priority=prio))
            continue
        in_quota: QuotaCheck | None = None
        if ledger is not None and quota_blocks and own_hold is None:
            behind = _behind_quota(ledger, w, quota_blocks)
            if behind is not None:
                (tree, node), first = behind
                decisions.append(Decision(
                    w.namespace, w.name, "wait", BEHIND_HEAD,
                    f"waiting behind {first.namespace}/{first.name}, which waits for room in "
                    f"quota {node} (tree {tree}) ({policy.name} policy)",
                    effective_priority=prio))
                continue
        if ledger is not None:
            # A held wrapper is counted already, for its hold: not twice.
            mine = ledger.remove(w.key) if own_hold is not None else None
            # Without its hold counted, the quota answers of others are not its answer.
            in_quota = (ledger.check(w.labels, w.demand) if mine is not None
                        else _quota_check(ledger, w, quota_failed))
            if not in_quota.fits:
                if mine is not None:
                    ledger.add(mine, force=True)
                shrunk = None if own_hold is not None or in_quota.unknown else _try_shrink(
                    w, prio, capacity, elastic_pool, policy, now, ledger, shrinking, search,
                    stats, fit_gang)
                if shrunk is not None:  # a borrower gives back quota (and room) it owes
                    decisions.append(shrunk)
                    quota_failed.clear()
                    continue
                if search is not None and own_hold is None and not in_quota.unknown:
                    found = search.search(w, capacity)
                    if found is not None:
                        decisions.append(_preempt(w, found, capacity, ledger, search, prio, fit,
                                                  stats))
                        quota_failed.clear()
                        continue
                reason = UNKNOWN_QUOTA if in_quota.unknown else QUOTA_EXCEEDED
                # Short of quota it holds the line, as a head short of capacity does, but
                # only for the wrappers that count against the node that is full for it:
                # its team's when its own quota is full, everyone's when the root is.
                holds_all = bool(in_quota.full) and blocks(policy, w, now) and any(
                    ledger.forest.trees[t].root.name == n for t, n in in_quota.full)
                decisions.append(Decision(
                    w.namespace, w.name, "wait", reason, _with_notes(in_quota.message, in_quota),
                    head_of_line=holds_all and not head_seen, effective_priority=prio,
                    quota=in_quota.placements))
                if holds_all:
                    head_seen = True
                    blocking = w
                    stats.blocked_by = w.key
                elif in_quota.full and blocks(policy, w, now):
                    quota_blocks.update(dict.fromkeys(in_quota.full, w))
                continue
        key = w.gang_key
        shortfall = None if own_hold is not None else failed.get(key)
        if shortfall is None:
            stats.fit_checks += 1
            if own_hold is not None:
                give_hold(capacity, own_hold)
            result = fit_gang(w.gang, capacity)
            if not isinstance(result, Shortfall):
                stats.dispatched += 1
                quota_text = ""
                if ledger is not None and in_quota is not None:
                    ledger.add(_consumer(w, prio, now))
                    quota_text = in_quota.describe()
                message = "; ".join(filter(None, (_placed_message(result, fit), quota_text,
                                                  _minimum_message(w))))
                decisions.append(Decision(
                    w.namespace, w.name, "dispatch", DISPATCH, _with_notes(message, in_quota),
                    tuple(result), effective_priority=prio,
                    quota=in_quota.placements if in_quota is not None else (),
                    elastic=lowest(w.elastic)))
                continue
            if own_hold is not None:
                for node, part in own_hold:
                    capacity.take(node, part)
            else:
                failed[key] = result
            shortfall = result
        else:
            stats.cache_hits += 1
        if ledger is not None and own_hold is not None:
            ledger.add(_consumer(w, prio, now), force=True)  # still held: still counted
        if key not in never:
            if answers.empty is None:
                answers.empty = Capacity.empty(capacity.nodes.values())
            never[key] = hopeless_gang(w.gang, answers.empty)
        hopeless = never[key]
        if hopeless is not None:
            decisions.append(Decision(w.namespace, w.name, "wait", hopeless.reason,
                                      hopeless.message, effective_priority=prio))
            continue
        shrunk = None if own_hold is not None else _try_shrink(
            w, prio, capacity, elastic_pool, policy, now, ledger, shrinking, search, stats,
            fit_gang)
        if shrunk is not None:
            decisions.append(shrunk)
            quota_failed.clear()
            continue
        if own_hold is None and search is not None:
            found = search.search(w, capacity)
            if found is not None:
                decisions.append(_preempt(w, found, capacity, ledger, search, prio, fit, stats))
                quota_failed.clear()
                continue
        reason, message = shortfall.reason, shortfall.message
        if own_hold is not None:
            reason = AWAITING_PREEMPTION
            message = ("the capacity freed by preemption is held for it until the preempted "
                       "pods are gone: " + message)
        decisions.append(Decision(w.namespace, w.name, "wait", reason, message,
                                  head_of_line=not head_seen, effective_priority=prio,
                                  quota=in_quota.placements if in_quota is not None else ()))
        head_seen = True
        if blocks(policy, w, now):
            blocking = w
            stats.blocked_by = w.key
    if fit == "per-node":
        gone = shrinking.scaled | (search.gone if search is not None else set())
        _grow(decisions, seen, elastic_pool if scaling is not None else [], gone, capacity,
              policy, ledger, scaling, topology)
    if expired:
        decisions = [dataclasses.replace(d, message=f"gave up the room held for it: "
                                         f"{expired[d.key]}; {d.message}")
                     if d.key in expired and d.decision != "dispatch" else d
                     for d in decisions]
    return decisions


def fit_rules(fit: Fit, topology: Topology = NO_TOPOLOGY) -> tuple[Placer, Hopeless]:
    """How gangs are placed, and how "never fits" is answered, under `fit`: topology
    requests count under per-node fit only (the aggregate rule places no pod)."""
    if fit == "aggregate":
        return place_aggregate, never_fits_aggregate
    if topology.levels:
        return topology.place, topology.never_fits
    return place, never_fits


def _live_holds(holds: Mapping[WrapperKey, Hold], admitted: Sequence[AdmittedWrapper],
                policy: Policy, now: float, quota: QuotaLedger | None
                ) -> tuple[dict[WrapperKey, Hold], dict[WrapperKey, str]]:
    """The holds still alive, and why each of the others was given up: older than
    `policy.max_hold_seconds`, or waiting for a wrapper to scale in that is admitted as
    not elastic now (its resize was refused). Their room and the quota counted for them
    are everyone's again, and their owners compete as any queued wrapper: a victim that
    never goes, or never shrinks, would otherwise hold the room, and the line, for ever."""
    rigid = {a.key for a in admitted if a.elastic is None}
    expired: dict[WrapperKey, str] = {}
    for key, hold in holds.items():
        stuck = next((k for k in hold.shrinks if k in rigid), None)
        if stuck is not None:
            expired[key] = f"{stuck[0]}/{stuck[1]} cannot be scaled in now"
        elif now - hold.since >= policy.max_hold_seconds:
            expired[key] = (f"what it waited for was not gone after "
                            f"{span(policy.max_hold_seconds)}")
    if quota is not None:
        for key in expired:
            quota.remove(key)
    return {k: h for k, h in holds.items() if k not in expired}, expired


# Waits that room on a node would not end: they never keep an elastic gang from growing.
_NOT_FOR_ROOM = frozenset({NEVER_FITS, UNKNOWN_QUOTA, AWAITING_PREEMPTION, INVALID})


def _grow(decisions: list[Decision], seen: Mapping[WrapperKey, QueuedWrapper],
          pool: Sequence[AdmittedWrapper], gone: set[WrapperKey], capacity: Capacity,
          policy: Policy, ledger: QuotaLedger | None, scaling: list[Scale] | None,
          topology: Topology) -> None:
    """Grow the elastic gangs dispatched in this cycle (their decisions are rewritten)
    and, into `scaling`, the admitted ones of `pool` (see dispatcher.elastic). A gang
    that requires a topology domain grows inside the one its pods occupy."""
    candidates: list[Candidate] = []
    new: dict[WrapperKey, int] = {}
    for i, d in enumerate(decisions):
        if not d.elastic:
            continue  # most of them: only an elastic gang's dispatch has sizes
        w = seen.get(d.key)
        if w is not None and d.decision == "dispatch":
            new[d.key] = i
            now = newly_admitted(w)
            sets = [now.gang[s.position] for s in now.sets]
            within = _growth_within(now, capacity, topology, d.placements, [
                [p for p in d.placements if (p.item, p.pod_set) == (g.item, g.pod_set.name)]
                for g in sets])
            candidates.append(Candidate(d.key, rank(policy, d.effective_priority, w.first_seen),
                                        w.labels, now, within))
    for a in pool:
        e = a.elastic
        if e is not None and a.key not in gone and a.key not in seen:
            within = _growth_within(e, capacity, topology, a.holdings, e.removable)
            candidates.append(Candidate(a.key, rank(policy, a.priority, e.first_seen),
                                        a.labels, e, within))
    if not candidates:
        return  # the usual cycle: no elastic gang, nothing more to do
    blockers = [(rank(policy, d.effective_priority, w.first_seen), at_minimum(w).gang)
                for d in decisions
                if d.decision == "wait" and d.reason not in _NOT_FOR_ROOM
                and (w := seen.get(d.key)) is not None]
    for s in grow(candidates, blockers, capacity, ledger):
        at = new.get(s.key)
        if at is None:
            if scaling is not None:
                scaling.append(s)
            continue
        d = decisions[at]
        decisions[at] = dataclasses.replace(
            d, elastic=s.after, placements=tuple(sorted(
                (*d.placements, *s.placements), key=lambda p: (p.item, p.pod_set, p.pod))),
            message=f"{d.message}; {s.message}")


def _growth_within(e: ElasticNow, capacity: Capacity, topology: Topology,
                   pods: Sequence[Placement | PlannedPod],
                   by_set: Sequence[Sequence[Placement | PlannedPod]]) -> IndexArray | None:
    """The nodes an elastic gang's growth may use: for each elastic set that requires a
    domain, the one its pods occupy (the whole gang's, for the wrapper's request; that
    set's own, for the set's); None when none requires one. `pods`: all the gang's pods;
    `by_set`: each elastic set's (a set's unknown pods: it has no domain to grow in)."""
    asks: list[tuple[str, list[str]]] = []
    for j, s in enumerate(e.sets):
        t = e.gang[s.position].pod_set.topology
        if t is not None and t.required:
            mine = pods if t.whole_gang else by_set[j] if j < len(by_set) else ()
            asks.append((t.level, [p.node for p in mine if p.node is not None]))
    return topology.shared_domain(capacity, asks) if asks else None


def _minimum_message(w: QueuedWrapper) -> str:
    if not w.elastic:
        return ""
    return f"admitted at its minimum, {describe(w.elastic, lowest(w.elastic))}"


def _try_shrink(w: QueuedWrapper, prio: float, capacity: Capacity,
                pool: Sequence[AdmittedWrapper], policy: Policy, now: float,
                ledger: QuotaLedger | None, shrinking: ShrinkRound,
                search: PreemptionSearch | None, stats: CycleStats,
                placer: Placer) -> Decision | None:
    """`w`'s decision to wait for elastic gangs to shrink, if that lets it fit (its pods
    placed by `placer`)."""
    if not pool or not shrinking.may_search(w, prio):
        return None
    found = shrink_search(w, prio, capacity, pool, policy, now, ledger,
                          gone=shrinking.scaled | (search.gone if search is not None else set()),
                          placer=placer)
    if found is None:
        shrinking.failed(w, prio)
        return None
    shrinking.scaled.update(s.key for s in found.scales)
    return _shrink(w, found, capacity, ledger, pool, prio, now, stats)


def _shrink(w: QueuedWrapper, found: Shrink, capacity: Capacity, ledger: QuotaLedger | None,
            pool: Sequence[AdmittedWrapper], prio: float, now: float,
            stats: CycleStats) -> Decision:
    """Record a scale-in for `w`: its room is held as it will be until it dispatches,
    and the wrappers scaled in count at their new size."""
    take_hold(capacity, [PlannedPod(p.node, p.request) for p in found.placements
                         if p.node is not None])
    placed = QuotaCheck()
    if ledger is not None:
        by_key = {a.key: a for a in pool}
        for s in found.scales:
            old = ledger.remove(s.key)
            e = by_key[s.key].elastic
            if old is not None and e is not None:
                ledger.add(dataclasses.replace(old, demand=demand_at(e.gang, e.sets, s.after)),
                           force=True)
        placed = ledger.add(_consumer(w, prio, now), force=True)
    stats.preemptions += 1
    message = found.message(_placed_message(found.placements, "per-node"))
    if placed.placements:
        message += "; " + placed.describe()
    return Decision(w.namespace, w.name, "preempt", PREEMPTING, message, found.placements,
                    effective_priority=prio, quota=placed.placements, shrinks=found.scales)


def _behind_quota(ledger: QuotaLedger, w: QueuedWrapper,
                  blocks: Mapping[tuple[str, str], QueuedWrapper]
                  ) -> tuple[tuple[str, str], QueuedWrapper] | None:
    """The blocked quota node on `w`'s paths, and the wrapper waiting there, if any."""
    res = ledger.forest.resolve(w.labels)
    for tree, leaf in res.leaves:
        t = ledger.forest.trees[tree]
        for x in t.nodes[leaf].path:
            spot = (tree, t.order[x].name)
            first = blocks.get(spot)
            if first is not None:
                return spot, first
    return None


def _consumer(w: QueuedWrapper, priority: float, now: float) -> QuotaConsumer:
    return QuotaConsumer(w.key, w.labels, w.demand, priority, now)


def _quota_check(ledger: QuotaLedger, w: QueuedWrapper,
                 failed: dict[tuple[object, ...], QuotaCheck]) -> QuotaCheck:
    memo = (w.labels, w.gang_key)
    known = failed.get(memo)
    if known is not None:
        return known
    check = ledger.check(w.labels, w.demand)
    if not check.fits:
        failed[memo] = check
    return check


def _with_notes(message: str, check: QuotaCheck | None) -> str:
    if check is None or not check.notes:
        return message
    return "; ".join((message, *check.notes))


def _preempt(w: QueuedWrapper, found: Preemption, capacity: Capacity,
             ledger: QuotaLedger | None, search: PreemptionSearch, prio: float, fit: Fit,
             stats: CycleStats) -> Decision:
    """Record a preemption: the victims are gone for the rest of the cycle, and the
    preemptor's room is held as it will be in the cycles until it dispatches."""
    for v in found.victims:
        search.gone.add(v.key)
        if ledger is not None:
            ledger.remove(v.key)
    placements = found.placements
    if fit == "aggregate":
        capacity.take_total({r: min(v, max(capacity.free_total.get(r, 0), 0))
                             for r, v in w.demand.items()})
    else:
        take_hold(capacity, [PlannedPod(p.node, p.request) for p in placements
                             if p.node is not None])
    placed = QuotaCheck()
    if ledger is not None:
        placed = ledger.add(_consumer(w, prio, search.now), force=True)
    stats.preemptions += 1
    stats.victims += len(found.victims)
    message = found.message(_placed_message(placements, fit))
    if placed.placements:
        message += "; " + placed.describe()
    return Decision(w.namespace, w.name, "preempt", PREEMPTING, message, placements,
                    effective_priority=prio, preempts=found.keys,
                    reclaims=tuple(k for k in found.keys if k in found.reclaimed),
                    quota=placed.placements)


def blocks(policy: Policy, w: QueuedWrapper, now: float) -> bool:
    """Whether `w`, waiting at `now`, holds the line for the wrappers behind it."""
    if not policy.backfill:
        return True
    guard = policy.max_head_wait_seconds
    return guard is not None and now - w.first_seen > guard


def _placed_message(placements: Sequence[Placement], fit: Fit) -> str:
    if fit == "aggregate":
        return (f"{all_of(len(placements), 'pod')} {plural(len(placements), 'fits', 'fit')} "
                "in the cluster's total free capacity")
    nodes = sorted({p.node for p in placements if p.node is not None})
    shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
    return f"{all_of(len(placements), 'pod')} {plural(len(placements), 'fits', 'fit')}: on {shown}"
