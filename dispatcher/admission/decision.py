"""What an admission cycle says of each wrapper, and why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from dispatcher.elastic import Scale
from dispatcher.fit.capacity import Capacity
from dispatcher.fit.gang import Placement, Shortfall
from dispatcher.fit.rules import Fit
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import WrapperKey
from dispatcher.quota import QuotaCheck, QuotaPlacement
from dispatcher.wording import all_of, plural, span

# preempt: dispatch once the wrappers in `preempts` are torn down (its room is then held).
DecisionKind = Literal["dispatch", "wait", "invalid", "preempt"]

DISPATCH = "Dispatch"
BEHIND_HEAD = "BehindHeadOfLine"
INVALID = "InvalidSpec"
QUOTA_EXCEEDED = "QuotaExceeded"  # no room in its quota, even borrowing; never holds the line
UNKNOWN_QUOTA = "UnknownQuotaNode"  # its labels name no usable quota leaf; never holds the line
PREEMPTING = "Preempting"  # the reason of a `preempt` decision
AWAITING_PREEMPTION = "AwaitingPreemption"  # held room not free yet: victims still terminating
# It fits now, but only where it would still run when a reserved head is to start there.
WAITS_FOR_RESERVATION = "WaitingForReservation"
# The rules raised on it (a defect, or input nothing else refused): it waits, alone, and
# the wrappers behind it are decided as if it were not there.
NOT_DECIDED = "NotDecided"


def past_guard(policy: Policy) -> str:
    """Why a head holds the line under backfill (only past the starvation guard), to end
    the words of those behind it; "" under other policies. The guard, not the head's
    wait, which grows every cycle and would rewrite every status behind it."""
    guard = policy.max_head_wait_seconds
    if not policy.backfill or guard is None:
        return ""
    return (f": the head has waited over {span(guard)}, past the starvation guard: nothing "
            "passes it until it starts")


def behind_head(head: WrapperKey, policy: Policy) -> str:
    """The words of a wrapper waiting behind the head of the line `head`."""
    return (f"waiting behind {head[0]}/{head[1]} at the head of the line ({policy.name} "
            f"policy){past_guard(policy)}")


@dataclass(frozen=True)
class Decision:
    namespace: str
    name: str
    decision: DecisionKind
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


class EmptyClusterAnswers:
    """Whether each gang shape could fit the cluster with nothing running on it.

    The answer depends only on the nodes, not on what runs on them, so a caller whose node
    set stays the same (the simulator; a controller between node changes) keeps one of
    these across cycles instead of asking again every cycle.
    """

    def __init__(self) -> None:
        self.empty: Capacity | None = None
        self.never: dict[tuple[object, ...], Shortfall | None] = {}


def with_notes(message: str, check: QuotaCheck | None) -> str:
    if check is None or not check.notes:
        return message
    return "; ".join((message, *check.notes))


def placed_message(placements: Sequence[Placement], fit: Fit) -> str:
    if fit == "aggregate":
        return (f"{all_of(len(placements), 'pod')} {plural(len(placements), 'fits', 'fit')} "
                "in the cluster's total free capacity")
    nodes = sorted({p.node for p in placements if p.node is not None})
    shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
    return f"{all_of(len(placements), 'pod')} {plural(len(placements), 'fits', 'fit')}: on {shown}"
