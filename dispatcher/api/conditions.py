"""AppWrapper conditions: their types, their reasons, and how a new one is recorded.

MCAD keeps ``status.conditions`` as a history: a new condition is appended when the
type changes, and ``status.queuejobstate`` names the type of the latest one. A happy life
reads ``Init → Queueing → HeadOfLine → Dispatched → Running → Completed``.

Each condition also records ``observedGeneration``, the spec generation it was reached
for: ``kubectl wait --for=condition=TYPE`` then waits on when the spec was edited since. The
history stays MCAD's (a type entered again is appended again): kubectl reads the first
condition of a type, so it is the way to wait for ``Completed`` and ``Failed``, which end a
run; for where an AppWrapper is now, ``status.state``.

MCAD also defines the condition types ``Preempted`` and ``Deleted``, and no
``Requeued``; the dispatcher records a requeue as ``PreemptCandidate`` with a reason
(MinPodsNotRunning, DispatchDeadlineExceeded, Preempted) and never writes those two.
``RunningHoldCompletion`` (reason ``SomeItemsCompleted``) is MCAD's: the items that decide
completion (``completionstatus``) are done while pods of the others still run.
:class:`~dispatcher.api.models.Condition` keeps ``type`` a plain string, so statuses written
by MCAD still parse.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum

from dispatcher.api.models import Condition

# The oldest conditions are dropped beyond this many, so a wrapper that goes back and
# forth between two conditions for days does not grow without bound.
MAX_CONDITIONS = 20


class ConditionType(StrEnum):
    Init = "Init"
    Queueing = "Queueing"
    HeadOfLine = "HeadOfLine"
    Dispatched = "Dispatched"
    Running = "Running"
    RunningHoldCompletion = "RunningHoldCompletion"
    Completed = "Completed"
    Backoff = "Backoff"
    PreemptCandidate = "PreemptCandidate"
    Failed = "Failed"


class Reason(StrEnum):
    AwaitingHeadOfLine = "AwaitingHeadOfLine"  # Queueing
    Held = "Held"  # Queueing: kept out of dispatch by a user (HELD_BY_ANNOTATION)
    FrontOfQueue = "FrontOfQueue"  # HeadOfLine
    AppWrapperRunnable = "AppWrapperRunnable"  # Dispatched
    Resetting = "Resetting"  # Dispatched: a v1beta2 gang reset, its objects to come again
    PodsRunning = "PodsRunning"  # Running
    PodsCompleted = "PodsCompleted"  # Completed
    SomeItemsCompleted = "SomeItemsCompleted"  # RunningHoldCompletion
    AppWrapperNotRunnable = "AppWrapperNotRunnable"  # Backoff
    MinPodsNotRunning = "MinPodsNotRunning"  # PreemptCandidate (requeue)
    DispatchDeadlineExceeded = "DispatchDeadlineExceeded"  # PreemptCandidate (requeue)
    Preempted = "Preempted"  # PreemptCandidate (requeue)
    ItemCreationFailure = "ItemCreationFailure"  # Failed
    InvalidSpec = "InvalidSpec"  # Failed
    Cancelled = "Cancelled"  # Failed: by a user (CANCELLED_BY_ANNOTATION)
    DispatcherError = "DispatcherError"  # Failed: a step raised on this wrapper (tasks.py)


def latest(conditions: Sequence[Condition]) -> Condition | None:
    """The most recent condition (the last one), or None for a new AppWrapper."""
    return conditions[-1] if conditions else None


def says(conditions: Sequence[Condition], type: str, reason: str, message: str,
         status: str = "True", generation: int | None = None) -> bool:
    """Whether the latest condition says exactly this already (type, reason, message,
    status, and the generation it was reached for): recording it again would change
    nothing."""
    current = latest(conditions)
    return current is not None and (
        current.type, current.reason, current.message, current.status,
        current.observedGeneration) == (
        str(type), str(reason), str(message), str(status), generation)


def set_condition(
    conditions: Sequence[Condition],
    type: str,
    reason: str,
    message: str,
    now: datetime,
    status: str = "True",
    generation: int | None = None,
) -> tuple[list[Condition], bool]:
    """Record a condition reached for spec `generation`; return the new list and whether
    anything changed.

    - The latest condition already says exactly this (type, reason, message, status,
      generation): nothing changes and ``(conditions, False)`` comes back, so no status
      write is due.
    - The latest condition has this type but another reason, message, status or
      generation: it is updated in place (``lastUpdateMicroTime = now``;
      ``lastTransitionMicroTime = now`` only when the status flips).
    - Otherwise a new condition is appended, both times ``now`` (MCAD's history: an
      earlier one of the same type stays).

    The input list and its conditions are never mutated.
    """
    if says(conditions, type, reason, message, status, generation):
        return list(conditions), False
    type_, reason_, message_, status_ = str(type), str(reason), str(message), str(status)
    current = latest(conditions)
    if current is not None and current.type == type_:
        transition = now if current.status != status_ else current.lastTransitionMicroTime
        updated = Condition.model_validate(
            {
                **current.model_dump(),
                "status": status_,
                "reason": reason_,
                "message": message_,
                "lastUpdateMicroTime": now,
                "lastTransitionMicroTime": transition or now,
                "observedGeneration": generation,
            }
        )
        return [*conditions[:-1], updated], True
    new = Condition(
        type=type_,
        status=status_,
        reason=reason_,
        message=message_,
        lastUpdateMicroTime=now,
        lastTransitionMicroTime=now,
        observedGeneration=generation,
    )
    result = [*conditions, new]
    return result[-MAX_CONDITIONS:], True
