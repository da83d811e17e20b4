"""One admission cycle: queue + cluster + policy -> ordered decisions with reasons.

Every queued wrapper gets a decision, in the order the policy considers them. Each
dispatch takes its capacity before the next wrapper is considered. A wrapper that
could not fit even on the empty cluster waits with its own reason and never holds
the head of the line; an invalid one is reported and skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from dispatcher.api.messages import problems_message
from dispatcher.api.models import AppWrapper
from dispatcher.fit.capacity import Capacity
from dispatcher.fit.gang import (
    GangPodSet,
    Placement,
    Shortfall,
    never_fits,
    never_fits_aggregate,
    place,
    place_aggregate,
)
from dispatcher.kinds import InvalidItem, item_pod_sets
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import QueuedWrapper

Fit = Literal["per-node", "aggregate"]
Verdict = Literal["dispatch", "wait", "invalid"]

DISPATCH = "Dispatch"
BEHIND_HEAD = "BehindHeadOfLine"
INVALID = "InvalidSpec"


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


@dataclass
class CycleStats:
    considered: int = 0
    fit_checks: int = 0
    cache_hits: int = 0
    dispatched: int = 0
    blocked_by: tuple[str, str] | None = None
    extra: dict[str, int] = field(default_factory=dict)


def queued_from_appwrapper(aw: AppWrapper, first_seen: float) -> QueuedWrapper:
    """The queue entry of an AppWrapper; invalid items make it invalid, not an error."""
    gang: list[GangPodSet] = []
    problems: list[str] = []
    for i, item in enumerate(aw.spec.resources.GenericItems):
        custom = [c.model_dump() for c in item.custompodresources]
        try:
            sets = item_pod_sets(item.generictemplate, custom or None, index=i)
        except InvalidItem as e:
            problems.append(f"spec.resources.GenericItems[{i}]: {e}")
            continue
        gang.extend(GangPodSet(i, ps) for ps in sets)
    return QueuedWrapper(
        namespace=aw.metadata.namespace,
        name=aw.metadata.name,
        uid=aw.metadata.uid,
        first_seen=first_seen,
        gang=tuple(gang),
        priority=aw.spec.priority,
        priority_slope=aw.spec.priorityslope,
        invalid=problems_message(problems) or None,
    )


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
) -> list[Decision]:
    """Decide every wrapper of `ordered`; dispatches take capacity from `capacity`.

    `empty_answers` may be kept by the caller across cycles only while the nodes are
    unchanged, and only for one fit rule.
    """
    stats = stats if stats is not None else CycleStats()
    fit_gang, hopeless_gang = (
        (place, never_fits) if fit == "per-node" else (place_aggregate, never_fits_aggregate)
    )
    answers = empty_answers if empty_answers is not None else EmptyClusterAnswers()
    never = answers.never
    # Capacity only shrinks during a cycle, so a gang shape that did not fit once will
    # not fit later in the same cycle: remember the answer.
    failed: dict[tuple[object, ...], Shortfall] = {}
    blocking: QueuedWrapper | None = None
    head_seen = False
    decisions: list[Decision] = []
    for w in ordered:
        stats.considered += 1
        prio = w.effective_priority(now)
        if w.invalid is not None:
            decisions.append(Decision(w.namespace, w.name, "invalid", INVALID, w.invalid,
                                      effective_priority=prio))
            continue
        if blocking is not None:
            # The head's own decision says why it waits; repeating that here would
            # rewrite every queued wrapper's status whenever the head's reason changes.
            decisions.append(Decision(
                w.namespace, w.name, "wait", BEHIND_HEAD,
                f"waiting behind {blocking.namespace}/{blocking.name} at the head of the "
                f"line ({policy.name} policy)",
                effective_priority=prio,
            ))
            continue
        key = w.gang_key
        shortfall = failed.get(key)
        if shortfall is None:
            stats.fit_checks += 1
            result = fit_gang(w.gang, capacity)
            if not isinstance(result, Shortfall):
                stats.dispatched += 1
                decisions.append(Decision(
                    w.namespace, w.name, "dispatch", DISPATCH, _placed_message(result, fit),
                    tuple(result), effective_priority=prio,
                ))
                continue
            shortfall = failed[key] = result
        else:
            stats.cache_hits += 1
        if key not in never:
            if answers.empty is None:
                answers.empty = Capacity.empty(capacity.nodes.values())
            never[key] = hopeless_gang(w.gang, answers.empty)
        hopeless = never[key]
        if hopeless is not None:
            decisions.append(Decision(w.namespace, w.name, "wait", hopeless.reason,
                                      hopeless.message, effective_priority=prio))
            continue
        decisions.append(Decision(w.namespace, w.name, "wait", shortfall.reason,
                                  shortfall.message, head_of_line=not head_seen,
                                  effective_priority=prio))
        head_seen = True
        if _blocks(policy, w, now):
            blocking = w
            stats.blocked_by = w.key
    return decisions


def _blocks(policy: Policy, w: QueuedWrapper, now: float) -> bool:
    if not policy.backfill:
        return True
    guard = policy.max_head_wait_seconds
    return guard is not None and now - w.first_seen > guard


def _placed_message(placements: Sequence[Placement], fit: Fit) -> str:
    if fit == "aggregate":
        return f"all {len(placements)} pods fit in the cluster's total free capacity"
    nodes = sorted({p.node for p in placements if p.node is not None})
    shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
    return f"all {len(placements)} pods fit: on {shown}"
