"""What happens to a dispatched AppWrapper: running, completed, failed or requeued.

Pure rules over what the controller observed (pod counts, the wrapped objects'
outcome, the clock); the controller carries out the verdict. Keeping them here means
every timing rule is unit-tested without a cluster and the simulator could reuse them.

- A gang is running once `minAvailable` pods (default: every pod of the gang) are
  running or have succeeded.
- A gang that is not running `pods_allowed_seconds` after its dispatch is torn down and
  requeued; the time allowed grows with each requeue (exponential by default), capped by
  `maxTimeInSeconds` (or the installation's cap), never below the installation's floor
  (so `timeInSeconds: 0` cannot loop); after `maxNumRequeuings` requeues (0: no limit)
  it fails instead.
- Admission grace: a gang with no pod at all `admission_grace` seconds after dispatch
  is requeued at once, with the likely cause (its operator is not running, a
  ResourceQuota or a webhook refuses its pods): it holds capacity it will not use.
- A gang not running yet, one of whose pods fits neither the room the gang holds nor
  any free room (its declared pods do not match its real ones), is requeued (or failed,
  as the requeuing rules say) once that has lasted `admission_grace` seconds.
- Failure grace: a running gang that falls below `minAvailable` pods up (a node gone,
  an eviction) for longer than `failure_grace` is torn down and requeued whole.
- `dispatchDuration.limit`: a wrapper dispatched longer than that, and not finished,
  fails and is torn down.
- It completes when its wrapped objects report success (or, if none of them can
  finish on its own, when every pod of the gang has succeeded), and fails when one of
  them reports failure. When items declare `completionstatus`, those decide (MCAD): once
  they are done while pods of the others still run or wait, it is MCAD's
  `RunningHoldCompletion` ("holding"), and `Completed` when no pod is left.

A wrapper written as v1beta2 follows codeflare's rules instead (:func:`judge_v1beta2`,
its settings in :mod:`dispatcher.api.fault_tolerance`): an unhealthy gang is *reset* — its
objects torn down and, after the retry pause, created again, while it keeps its room and
quota — rather than requeued; after `retryLimit` resets it fails. Pods of its deleted
objects still there `forcefulDeletionGracePeriod` after the deletion are deleted at once
(:func:`leftover_step`), and a reset waits for them to be gone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from dispatcher.api.conditions import Reason
from dispatcher.api.fault_tolerance import (
    DEFAULT_FAULT_TOLERANCE,
    FaultTolerance,
    annotation_of,
    v1beta2_fault_tolerance,
)
from dispatcher.api.models import AppWrapper, AppWrapperStatus, Requeuing
from dispatcher.cluster.autopilot import DEFAULT_AUTOPILOT, Autopilot
from dispatcher.kinds.completion import Outcome
from dispatcher.queue.policy import BackfillLimitAction, Policy
from dispatcher.queue.reservation import BACKFILLED
from dispatcher.wording import all_of, counted, plural, span

Action = Literal["wait", "running", "holding", "completed", "failed", "requeue", "reset"]
# What is done about the pods left after a wrapper's objects were deleted.
LeftoverStep = Literal["gone", "wait", "force"]

# Reasons beyond dispatcher.api.conditions.Reason that only the lifecycle produces.
WRAPPED_OBJECT_FAILED = "WrappedObjectFailed"
REQUEUE_LIMIT_REACHED = "RequeueLimitReached"
PODS_NOT_CREATED = "PodsNotCreated"
PODS_LOST = "PodsLost"
PODS_UNPLACEABLE = "PodsUnplaceable"  # a pod fits neither its gang's hold nor free room
ITEMS_CHANGED = "ItemsChanged"  # requeued: the items were edited after dispatch
# v1beta2 (codeflare's reasons): the gang is being reset, and why it was unhealthy.
RESETTING = Reason.Resetting
RETRY_LIMIT_REACHED = "RetryLimitReached"
FAILED_PODS = "FoundFailedPods"
PODS_NOT_PENDING = "InsufficientPodsPending"
PODS_NOT_READY = "InsufficientPodsReady"
MISSING_COMPONENT = "MissingComponent"  # a wrapped object deleted by someone else
# A pod of the gang on a resource Autopilot flagged NoExecute: reset, not counted.
AUTOPILOT_NO_EXECUTE = "AutopilotNoExecute"

# Per-AppWrapper overrides of the installation's grace periods, in seconds.
ADMISSION_GRACE_ANNOTATION = "workload.codeflare.dev/admissionGracePeriodSeconds"
FAILURE_GRACE_ANNOTATION = "workload.codeflare.dev/failureGracePeriodSeconds"


@dataclass(frozen=True)
class Timing:
    """The installation's timing rules (``dispatcher run`` flags)."""

    admission_grace: float = 60.0  # no pod at all this long after dispatch: requeue
    failure_grace: float = 60.0  # running, below minAvailable this long: requeue
    requeue_floor: float = 30.0  # the least time a gang gets to start
    requeue_cap: float = 3600.0  # growth stops here unless maxTimeInSeconds says
    # A run dispatched past a reserved head ends (fails) this long after dispatch, unless
    # its own dispatchDuration.limit is shorter (the policy's backfillLimitSeconds).
    backfill_limit: float | None = None
    # The defaults (and the cap) of the fault-tolerance annotations of v1beta2 wrappers.
    fault_tolerance: FaultTolerance = DEFAULT_FAULT_TOLERANCE
    # Node health (Autopilot's labels): where no new pod goes, which gangs are reset.
    autopilot: Autopilot = DEFAULT_AUTOPILOT
    # Past that: "fail", or "requeue" (torn down and queued again).
    backfill_limit_action: BackfillLimitAction = "fail"


DEFAULT_TIMING = Timing()


def timing_for(aw: AppWrapper, base: Timing = DEFAULT_TIMING) -> tuple[Timing, list[str]]:
    """The installation's timing with this AppWrapper's annotations applied, and a
    warning for each annotation that is not a number of seconds (it is ignored)."""
    warnings: list[str] = []
    overrides: dict[str, Any] = {}
    annotations: Mapping[str, str] = aw.metadata.annotations
    for annotation, field_name in ((ADMISSION_GRACE_ANNOTATION, "admission_grace"),
                                   (FAILURE_GRACE_ANNOTATION, "failure_grace")):
        raw = annotations.get(annotation)
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if value < 0 or value != value:
            warnings.append(f"metadata.annotations[{annotation!r}]: {raw!r} is not a number "
                            f"of seconds ≥ 0; the installation's default "
                            f"{span(getattr(base, field_name))} applies")
            continue
        overrides[field_name] = value
    return replace(base, admission_grace=overrides.get("admission_grace", base.admission_grace),
                   failure_grace=overrides.get("failure_grace", base.failure_grace)), warnings


@dataclass(frozen=True)
class PodCounts:
    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0

    @property
    def active(self) -> int:
        return self.pending + self.running


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str = ""
    message: str = ""
    check_at: float | None = None  # look again then, even if nothing else happens


def min_available(aw: AppWrapper, expected_pods: int, floor: int | None = None) -> int:
    """Pods that must run for the gang to count as running (None: all of them; for an
    elastic gang, `floor`: the pods of its minimum, whatever size it has now)."""
    declared = aw.spec.schedulingSpec.minAvailable
    if declared is None:
        declared = floor
    return expected_pods if declared is None else min(declared, expected_pods)


def pods_allowed_seconds(requeuing: Requeuing, requeues: int,
                         timing: Timing = DEFAULT_TIMING) -> float:
    """How long a gang dispatched after `requeues` requeues may take to start."""
    base = max(float(requeuing.initialTimeInSeconds or requeuing.timeInSeconds),
               timing.requeue_floor)
    if requeuing.growth == "exponential":
        allowed = base * float(2 ** min(requeues, 30))
    elif requeuing.growth == "linear":
        allowed = base * (requeues + 1)
    else:
        allowed = base
    cap = float(requeuing.maxTimeInSeconds) if requeuing.maxTimeInSeconds > 0 \
        else timing.requeue_cap
    return max(min(allowed, cap), timing.requeue_floor)


def _limit(aw: AppWrapper, timing: Timing, status: AppWrapperStatus
           ) -> tuple[float | None, str, bool]:
    """How long this run may stay dispatched, what says so, and whether it is the
    policy's backfill limit."""
    own = float(aw.spec.schedulingSpec.dispatchDuration.limit or 0) or None
    backfill = backfill_limit(timing, _backfilled(status), own)
    if backfill is not None:
        return (backfill, "the policy's backfillLimitSeconds: it was dispatched as a backfill",
                True)
    return own, "spec.schedulingSpec.dispatchDuration.limit", False


def backfill_limit(timing: Timing, backfilled: bool, own: float | None = None) -> float | None:
    """How long a run may stay dispatched under the policy's backfillLimitSeconds: when it
    was dispatched as a backfill (``is_backfill``) and the limit is shorter than its own
    (`own`: dispatchDuration.limit, None: none); else None. Past it the run ends or is
    queued again, per ``timing.backfill_limit_action``."""
    limit = timing.backfill_limit
    if limit is None or not backfilled or (own is not None and own <= limit):
        return None
    return limit


def is_backfill(dispatch_message: str) -> bool:
    """Whether a dispatch's words (its Dispatched condition's message) say it went past a
    reservation: a backfill."""
    return dispatch_message.startswith(BACKFILLED)


def with_backfill_limit(timing: Timing, policy: Policy) -> Timing:
    """`timing` with a reserving policy's bound on its backfills (Timing.backfill_limit)."""
    if policy.backfill_limit_seconds is None:
        return timing
    return replace(timing, backfill_limit=policy.backfill_limit_seconds,
                   backfill_limit_action=policy.backfill_limit_action)


def _backfilled(status: AppWrapperStatus) -> bool:
    last = next((c for c in reversed(status.conditions) if c.type == "Dispatched"), None)
    return last is not None and is_backfill(last.message)


def judge(
    aw: AppWrapper,
    pods: PodCounts,
    expected_pods: int,
    outcome: Outcome | None,
    dispatched_at: float,
    running: bool,
    now: float,
    timing: Timing = DEFAULT_TIMING,
    below_min_since: float | None = None,
    items: str = "its objects",
    created_at: float | None = None,
    floor: int | None = None,
    unplaced: tuple[float, str] | None = None,
    status: AppWrapperStatus | None = None,
) -> Verdict:
    """The next step for a dispatched (or running, when `running`) AppWrapper.

    `below_min_since`: since when a running gang has had fewer than minAvailable pods
    up (None: it has enough). `items` names what was created, for messages;
    `created_at`: when the last of them was created (the admission grace counts from
    then: pods cannot appear before their object; None: not all created yet); `floor`:
    an elastic gang's pods at its minimum (see min_available); `unplaced`: since when,
    and why, a pod of it fits neither the room it holds nor free room (None: none);
    `status`: the dispatcher's own record of its status when newer than `aw`'s (its
    Dispatched condition says whether this run is a backfill)."""
    if outcome == "failed":
        return Verdict("failed", WRAPPED_OBJECT_FAILED,
                       "a wrapped object reports failure (see its status)")
    finished = _finished(aw, pods, expected_pods, outcome)
    if finished is not None:
        return finished

    limit, source, backfill = _limit(aw, timing, status if status is not None else aw.status)
    deadline = dispatched_at + limit if limit else None
    if limit and deadline is not None and now >= deadline:
        late = f"still not finished {span(limit)} after dispatch ({source})"
        if backfill and timing.backfill_limit_action == "requeue":
            return Verdict("requeue", "DispatchDeadlineExceeded",
                           f"{late}: torn down and queued again")
        return Verdict("failed", "DispatchDeadlineExceeded", late)

    need = min_available(aw, expected_pods, floor)
    up = pods.running + pods.succeeded
    # A gang with a pod that cannot be placed is not whole: it does not read Running (its
    # other pods may be up on room that pod's set was admitted with), it says why and is
    # requeued after the admission grace.
    if up >= need and unplaced is None:
        return _running(pods, expected_pods, deadline)
    requeues = aw.status.numberOfRequeueings
    if running:
        # Restarting a pod is the wrapped job's business (a Job or a PyTorchJob
        # recreates it); a gang that stays below minAvailable has lost its shape.
        since = now if below_min_since is None else below_min_since
        due = since + timing.failure_grace
        if now < due:
            return Verdict("wait", check_at=min(due, deadline) if deadline else due)
        short = (f"the running gang has had {up} of the {counted(need, 'pod')} it needs "
                 f"(minAvailable) up for {span(now - since)} (a node gone, an eviction?)")
        return _requeue_or_fail(aw, requeues, PODS_LOST, short, timing)

    unplaced_due = None
    if unplaced is not None and timing.admission_grace > 0:
        since, why = unplaced
        unplaced_due = since + timing.admission_grace
        if now >= unplaced_due:
            short = f"{why} (for {span(now - since)})"
            return _requeue_or_fail(aw, requeues, PODS_UNPLACEABLE, short, timing)
    seen = pods.active + pods.succeeded + pods.failed
    waiting_for_pods = bool(expected_pods and not seen and timing.admission_grace > 0
                            and created_at is not None)
    if waiting_for_pods:
        assert created_at is not None
        due = created_at + timing.admission_grace
        if now >= due:
            short = (f"{items} created, but no pod after {span(timing.admission_grace)}: "
                     "is its operator running, or do a ResourceQuota or an admission "
                     "webhook refuse its pods? (kubectl describe the object)")
            return _requeue_or_fail(aw, requeues, PODS_NOT_CREATED, short, timing)
    allowed = pods_allowed_seconds(aw.spec.schedulingSpec.requeuing, requeues, timing)
    if now < dispatched_at + allowed:
        due = dispatched_at + allowed
        if waiting_for_pods:
            assert created_at is not None
            due = min(due, created_at + timing.admission_grace)
        if unplaced_due is not None:
            due = min(due, unplaced_due)
        return Verdict("wait", check_at=min(due, deadline) if deadline else due)
    short = (f"{up} of the {counted(need, 'pod')} needed (minAvailable) running or succeeded "
             f"{span(allowed)} after dispatch ({pods.pending} pending, {pods.failed} failed)")
    return _requeue_or_fail(aw, requeues, "MinPodsNotRunning", short, timing)


def _requeue_or_fail(aw: AppWrapper, requeues: int, reason: str, short: str,
                     timing: Timing) -> Verdict:
    limit_n = aw.spec.schedulingSpec.requeuing.maxNumRequeuings
    if limit_n and requeues >= limit_n:
        return Verdict("failed", REQUEUE_LIMIT_REACHED,
                       f"{short}; already requeued {counted(requeues, 'time')} "
                       "(spec.schedulingSpec.requeuing.maxNumRequeuings)")
    next_allowed = pods_allowed_seconds(aw.spec.schedulingSpec.requeuing, requeues + 1, timing)
    return Verdict("requeue", reason,
                   f"{short}; torn down and requeued, {span(next_allowed)} allowed next time")


# --- v1beta2: reset instead of requeue ----------------------------------------------


def fault_tolerance_for(annotations: Mapping[str, str],
                        timing: Timing = DEFAULT_TIMING) -> FaultTolerance | None:
    """The fault-tolerance settings of a wrapper written as v1beta2 with these
    annotations (None: it was written as v1beta1, MCAD's rules apply)."""
    found = v1beta2_fault_tolerance(annotations, timing.fault_tolerance)
    return None if found is None else found[0]


def forceful_deletion_grace(annotations: Mapping[str, str],
                            timing: Timing = DEFAULT_TIMING) -> float | None:
    """How long pods of a v1beta2 wrapper's deleted objects may take to go before they are
    deleted at once (None: a v1beta1 wrapper, left to the garbage collector)."""
    ft = fault_tolerance_for(annotations, timing)
    return None if ft is None else ft.forceful_deletion_grace


def leftover_step(pods_left: int, deleted_at: float, now: float,
                  grace: float) -> tuple[LeftoverStep, float | None]:
    """Codeflare's progress guarantee for pods still there after their wrapper's objects
    were deleted at `deleted_at`: "gone" once none is left; "force" (deleted with
    gracePeriodSeconds 0) once `grace` has passed; else "wait", to look again then."""
    if pods_left <= 0:
        return "gone", None
    due = deleted_at + grace
    if now >= due:
        return "force", None
    return "wait", due


def judge_v1beta2(
    aw: AppWrapper,
    pods: PodCounts,
    expected_pods: int,
    outcome: Outcome | None,
    dispatched_at: float,
    running: bool,
    now: float,
    ft: FaultTolerance = DEFAULT_FAULT_TOLERANCE,
    created_at: float | None = None,
    failed_since: float | None = None,
    below_min_since: float | None = None,
    items: str = "its objects",
    floor: int | None = None,
    missing: Sequence[str] = (),
    evicted: Sequence[str] = (),
    unplaced: tuple[float, str] | None = None,
) -> Verdict:
    """The next step for a dispatched (or running) wrapper written as v1beta2, by
    codeflare's rules: once every object was made, one of them gone (`missing`: deleted
    by someone else) fails it at once, without retry; a pod of it on a resource Autopilot
    flagged NoExecute (on the nodes `evicted`) resets it at once — a reset not counted,
    but none past `ft.retry_limit`; it is unhealthy when a wrapped object reports failure (reset at
    once), when a pod of it failed (since `failed_since`), when a running gang has fewer
    than minAvailable pods up (since `below_min_since`), when its pods are not all
    created `ft.admission_grace` after its objects were (`created_at`), or not all running
    `ft.warmup_grace` after its dispatch, or while a pod of it can be placed nowhere (since
    when, and why: `unplaced`; it is not Running meanwhile); unhealthy for
    `ft.failure_grace`, it is reset —
    or, reset `ft.retry_limit` times already, failed. `aw.status.numberOfRequeueings`
    counts its resets."""
    resets = aw.status.numberOfRequeueings
    if missing:
        gone = ", ".join(missing)
        return Verdict("failed", MISSING_COMPONENT,
                       f"{gone} deleted while the wrapper ran (not by the dispatcher): a "
                       "wrapper written as v1beta2 then fails at once, without retry")
    if outcome == "failed":
        return _reset_or_fail(resets, ft, WRAPPED_OBJECT_FAILED,
                              "a wrapped object reports failure (see its status)")
    finished = _finished(aw, pods, expected_pods, outcome)
    if finished is not None:
        return finished
    if evicted:
        return _reset_or_fail(resets, ft, AUTOPILOT_NO_EXECUTE,
                                 f"a pod of it uses a resource Autopilot flagged NoExecute "
                                 f"on {', '.join(evicted)}", tallied=False)
    need = min_available(aw, expected_pods, floor)
    up = pods.running + pods.succeeded
    unhealthy: tuple[float, str, str] | None = None
    if pods.failed:
        unhealthy = (now if failed_since is None else failed_since, FAILED_PODS,
                     f"{counted(pods.failed, 'pod')} of it failed")
    elif up >= need and unplaced is None:
        return _running(pods, expected_pods)
    elif unplaced is not None and not running:
        unhealthy = (unplaced[0], PODS_UNPLACEABLE, unplaced[1])
    elif running:
        unhealthy = (now if below_min_since is None else below_min_since, PODS_LOST,
                     f"the running gang has {up} of the {counted(need, 'pod')} it needs "
                     "(minAvailable) up (a node gone, an eviction?)")
    else:
        unhealthy = _late(pods, expected_pods, need, dispatched_at, now, ft, created_at, items)
    if unhealthy is None:
        return Verdict("wait", check_at=_next_look(pods, expected_pods, dispatched_at, ft,
                                                   created_at))
    since, reason, short = unhealthy
    due = since + ft.failure_grace
    if now < due:
        return Verdict("wait", reason, f"{short}: unhealthy; reset in {span(due - now)} "
                       "unless it recovers", check_at=due)
    return _reset_or_fail(resets, ft, reason, f"{short}, unhealthy for {span(now - since)}")


def _finished(aw: AppWrapper, pods: PodCounts, expected_pods: int,
              outcome: Outcome | None) -> Verdict | None:
    """Completed (or holding) once its objects or every pod of it succeeded."""
    if outcome == "succeeded":
        declared = any(i.completionstatus for i in aw.spec.resources.GenericItems)
        if declared and pods.active:
            # MCAD's RunningHoldCompletion: done as far as completionstatus says, but
            # pods of its other items still run (or wait): they hold what they hold.
            return Verdict("holding", "SomeItemsCompleted",
                           "the items with completionstatus have completed; "
                           f"{counted(pods.running, 'pod')} still running, {pods.pending} pending")
        return Verdict("completed", "PodsCompleted", "every wrapped object has finished")
    if outcome is None and expected_pods and pods.succeeded >= expected_pods \
            and not pods.active:
        return Verdict("completed", "PodsCompleted",
                       f"{all_of(expected_pods, 'pod')} {plural(expected_pods, 'has', 'have')} "
                       "succeeded")
    return None


def _running(pods: PodCounts, expected_pods: int, check_at: float | None = None) -> Verdict:
    return Verdict("running", "PodsRunning",
                   f"{pods.running} of {counted(expected_pods, 'pod')} running"
                   + (f", {pods.succeeded} succeeded" if pods.succeeded else ""),
                   check_at=check_at)


def _late(pods: PodCounts, expected_pods: int, need: int, dispatched_at: float, now: float,
          ft: FaultTolerance, created_at: float | None,
          items: str) -> tuple[float, str, str] | None:
    """Since when a gang not running yet has been too slow, and how (None: it is not)."""
    created = pods.active + pods.succeeded
    if created_at is not None and created < expected_pods \
            and now >= created_at + ft.admission_grace:
        return (created_at + ft.admission_grace, PODS_NOT_PENDING,
                f"{created} of {counted(expected_pods, 'pod')} created "
                f"{span(ft.admission_grace)} after {items} (admission grace period)")
    if now >= dispatched_at + ft.warmup_grace:
        return (dispatched_at + ft.warmup_grace, PODS_NOT_READY,
                f"{pods.running + pods.succeeded} of the {counted(need, 'pod')} needed "
                f"running {span(ft.warmup_grace)} after dispatch (warmup grace period)")
    return None


def _next_look(pods: PodCounts, expected_pods: int, dispatched_at: float,
               ft: FaultTolerance, created_at: float | None) -> float:
    due = dispatched_at + ft.warmup_grace
    if created_at is not None and pods.active + pods.succeeded < expected_pods:
        due = min(due, created_at + ft.admission_grace)
    return due


def _reset_or_fail(resets: int, ft: FaultTolerance, reason: str, short: str,
                   tallied: bool = True) -> Verdict:
    """Reset, or failed once `ft.retry_limit` resets were counted; a reset not
    `tallied` (AUTOPILOT_NO_EXECUTE) leaves resettingCount as it is."""
    if resets >= ft.retry_limit:
        return Verdict("failed", RETRY_LIMIT_REACHED,
                       f"{short}; already reset {counted(resets, 'time')} "
                       f"({annotation_of('retry_limit')}: {ft.retry_limit})")
    which = f"reset {resets + 1} of {ft.retry_limit}" if tallied \
        else "reset (not counted against the retry limit)"
    return Verdict("reset", reason,
                   f"{short}; {which}: its objects are torn "
                   f"down and created again after {span(ft.retry_pause)}")
