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

The rooms: cycle (the steps each wrapper goes through), decision (what is said),
making_room (shrink, else preempt), reserving (backfill around reservations), growth
(elastic gangs grown), entry (an AppWrapper as a queue entry or an admitted record).
"""

from dispatcher.fit.rules import NO_TOPOLOGY, Fit, fit_rules

from .cycle import Cycle, admit, blocks
from .decision import (
    AWAITING_PREEMPTION,
    BEHIND_HEAD,
    DISPATCH,
    INVALID,
    NOT_DECIDED,
    PREEMPTING,
    QUOTA_EXCEEDED,
    UNKNOWN_QUOTA,
    WAITS_FOR_RESERVATION,
    CycleStats,
    Decision,
    DecisionKind,
    EmptyClusterAnswers,
    behind_head,
    past_guard,
)
from .entry import (
    ADMITTED_STATES,
    FINISHED_STATES,
    admitted_from_appwrapper,
    admitted_record,
    admitted_records,
    charged,
    extended_allowance,
    first_seen_of,
    is_admitted,
    queued_from_appwrapper,
)

__all__ = [
    "ADMITTED_STATES",
    "AWAITING_PREEMPTION",
    "BEHIND_HEAD",
    "DISPATCH",
    "FINISHED_STATES",
    "INVALID",
    "NOT_DECIDED",
    "NO_TOPOLOGY",
    "PREEMPTING",
    "QUOTA_EXCEEDED",
    "UNKNOWN_QUOTA",
    "WAITS_FOR_RESERVATION",
    "Cycle",
    "CycleStats",
    "Decision",
    "DecisionKind",
    "EmptyClusterAnswers",
    "Fit",
    "admit",
    "admitted_from_appwrapper",
    "admitted_record",
    "admitted_records",
    "behind_head",
    "blocks",
    "charged",
    "extended_allowance",
    "first_seen_of",
    "fit_rules",
    "is_admitted",
    "past_guard",
    "queued_from_appwrapper",
]
