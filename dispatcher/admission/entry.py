"""An AppWrapper as the admission core sees it: its queue entry, and the record of an
admitted one."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from dispatcher.api.conversion import ConversionError, V1beta2Fields, v1beta2_fields
from dispatcher.api.messages import problems_message
from dispatcher.api.models import AppWrapper
from dispatcher.cluster.state import ClusterState, PlannedPod
from dispatcher.elastic import admitted_now, demand_at
from dispatcher.fit.gang import GangPodSet
from dispatcher.kinds import InvalidItem, item_pod_sets, topology_request
from dispatcher.kinds.declared import component_view, pod_set_count_problems
from dispatcher.kinds.elastic import (
    ElasticSet,
    declared_sets,
    from_min_available,
    tolerant_sets,
)
from dispatcher.preemption import AdmittedWrapper
from dispatcher.queue.queue import QueuedWrapper, WrapperKey
from dispatcher.resources import is_extended

# queuejobstate of an admitted one
ADMITTED_STATES = frozenset({"Dispatched", "Running", "RunningHoldCompletion"})
FINISHED_STATES = frozenset({"Completed", "Failed", "Deleted"})


def queued_from_appwrapper(aw: AppWrapper, first_seen: float) -> QueuedWrapper:
    """The queue entry of an AppWrapper; invalid items make it invalid, not an error."""
    gang: list[GangPodSet] = []
    problems: list[str] = []
    declared: list[ElasticSet] = []
    tolerant: list[ElasticSet] = []
    try:
        v1beta2 = v1beta2_fields(aw.metadata.annotations)
    except ConversionError as e:
        problems.append(f"metadata.annotations: {e}")
        v1beta2 = V1beta2Fields()
    for i, item in enumerate(aw.spec.resources.GenericItems):
        custom = [c.model_dump() for c in item.custompodresources]
        try:
            if v1beta2.written_as_v1beta2:
                _, sets = component_view(item.generictemplate, v1beta2.component(i),
                                         f"spec.components[{i}]")
            else:
                sets = item_pod_sets(item.generictemplate, custom or None, index=i)
            if not custom:
                declared += declared_sets(item.generictemplate, sets, i, len(gang))
                tolerant += tolerant_sets(item.generictemplate, sets, i, len(gang))
        except InvalidItem as e:
            problems.append(str(e) if v1beta2.written_as_v1beta2
                            else f"spec.resources.GenericItems[{i}]: {e}")
            continue
        gang.extend(GangPodSet(i, ps) for ps in sets)
    if v1beta2.written_as_v1beta2 and not problems:
        problems += pod_set_count_problems(len(gang))
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


def admitted_records(admitted: Iterable[AppWrapper], state: ClusterState, now: float
                     ) -> list[AdmittedWrapper]:
    """The records of dispatched or running AppWrappers in a cluster, each holding what
    `state` shows for it (its bound pods, by name, for an elastic one)."""
    records = []
    for aw in admitted:
        key = (aw.metadata.namespace, aw.metadata.name)
        pods = [(p.name, PlannedPod(p.node, p.request)) for p in state.bound_pods_of(key)]
        records.append(admitted_from_appwrapper(aw, state.holdings(key), now, pods=pods))
    return records


def admitted_record(queued: QueuedWrapper, priority: float, holdings: Iterable[PlannedPod],
                    dispatched_at: float, preempted: Iterable[WrapperKey] = (),
                    recorded: Sequence[int] = (),
                    pods: Iterable[tuple[str, PlannedPod]] = ()) -> AdmittedWrapper:
    """An admitted wrapper's record from its queue entry (see admitted_from_appwrapper)."""
    elastic = (admitted_now(queued, recorded, queued.first_seen, pods) if queued.elastic
               else None)
    need = demand_at(queued.gang, elastic.sets, elastic.counts) if elastic else queued.demand
    holdings = tuple(holdings)
    return AdmittedWrapper(queued.namespace, queued.name, queued.uid, priority,
                           charged(need, holdings), holdings, dispatched_at, queued.labels,
                           tuple(preempted), elastic)


def charged(demand: Mapping[str, int], holdings: Iterable[PlannedPod]) -> dict[str, int]:
    """What a dispatched gang counts against its quota: of each resource, what it was
    admitted with, or what its pods and held room really take when that is more. cpu and
    memory too: a v1beta1 declaration may ask less than the pods (MCAD's semantics), and
    the pods of a kind the dispatcher cannot count may be more than declared, and the
    difference runs in free room; charged, it makes the gang borrow (or go over a hard
    limit), so that borrowing and reclaim go by what is really used."""
    out = dict(demand)
    for r, v in _held(holdings).items():
        out[r] = max(out.get(r, 0), v)
    return out


def extended_allowance(admitted: Iterable[tuple[int, Mapping[str, int]]],
                       taken: Mapping[str, int],
                       request: Mapping[str, int]) -> dict[str, int]:
    """How much of each GPU or other extended resource one more pod of a dispatched gang
    may ask: what the gang was admitted with (`admitted`: pods of each request) less what
    its other pods take (`taken`: bound, or pinned to room not bound yet), never below 0.
    Every extended resource `request` asks is listed (0: one it was not admitted with)."""
    total: dict[str, int] = {}
    for n, each in admitted:
        for r, v in each.items():
            if is_extended(r):
                total[r] = total.get(r, 0) + n * v
    names = {*total, *(r for r in request if is_extended(r))}
    return {r: max(0, total.get(r, 0) - taken.get(r, 0)) for r in sorted(names)}


def _held(holdings: Iterable[PlannedPod]) -> dict[str, int]:
    held: dict[str, int] = {}
    for p in holdings:
        for r, v in p.request.items():
            held[r] = held.get(r, 0) + v
    return held


def first_seen_of(aw: AppWrapper, default: float) -> float:
    stamp: datetime | None = aw.status.controllerfirsttimestamp or aw.metadata.creationTimestamp
    return stamp.timestamp() if stamp is not None else default
