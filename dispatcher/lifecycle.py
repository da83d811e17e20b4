"""What happens to a dispatched AppWrapper: running, completed, failed or requeued.

Pure rules over what the controller observed (pod counts, the wrapped objects'
outcome, the clock); the controller carries out the verdict. Keeping them here means
every timing rule is unit-tested without a cluster and the simulator could reuse them.

- A gang is running once `minAvailable` pods (default: every pod of the gang) are
  running or have succeeded.
- A gang that is not running `pods_allowed_seconds` after its dispatch is torn down and
  requeued; the time allowed grows with each requeue (exponential by default), capped by
  `maxTimeInSeconds`; after `maxNumRequeuings` requeues (0: no limit) it fails instead.
- `dispatchDuration.limit`: a wrapper dispatched longer than that, and not finished,
  fails and is torn down.
- It completes when its wrapped objects report success (or, if none of them can
  finish on its own, when every pod of the gang has succeeded), and fails when one of
  them reports failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dispatcher.api.models import AppWrapper, Requeuing
from dispatcher.kinds.completion import Outcome

Action = Literal["wait", "running", "completed", "failed", "requeue"]

# Reasons beyond dispatcher.api.conditions.Reason that only the lifecycle produces.
WRAPPED_OBJECT_FAILED = "WrappedObjectFailed"
REQUEUE_LIMIT_REACHED = "RequeueLimitReached"


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


def min_available(aw: AppWrapper, expected_pods: int) -> int:
    """Pods that must run for the gang to count as running (None: all of them)."""
    declared = aw.spec.schedulingSpec.minAvailable
    return expected_pods if declared is None else min(declared, expected_pods)


def pods_allowed_seconds(requeuing: Requeuing, requeues: int) -> float:
    """How long a gang dispatched after `requeues` requeues may take to start."""
    base = float(requeuing.initialTimeInSeconds or requeuing.timeInSeconds)
    if requeuing.growth == "exponential":
        allowed = base * float(2 ** min(requeues, 30))
    elif requeuing.growth == "linear":
        allowed = base * (requeues + 1)
    else:
        allowed = base
    if requeuing.maxTimeInSeconds > 0:
        allowed = min(allowed, float(requeuing.maxTimeInSeconds))
    return allowed


def judge(
    aw: AppWrapper,
    pods: PodCounts,
    expected_pods: int,
    outcome: Outcome | None,
    dispatched_at: float,
    running: bool,
    now: float,
) -> Verdict:
    """The next step for a dispatched (or running, when `running`) AppWrapper."""
    if outcome == "failed":
        return Verdict("failed", WRAPPED_OBJECT_FAILED,
                       "a wrapped object reports failure (see its status)")
    if outcome == "succeeded":
        return Verdict("completed", "PodsCompleted", "every wrapped object has finished")
    if outcome is None and expected_pods and pods.succeeded >= expected_pods \
            and not pods.active:
        return Verdict("completed", "PodsCompleted",
                       f"all {expected_pods} pods have succeeded")

    limit = aw.spec.schedulingSpec.dispatchDuration.limit
    deadline = dispatched_at + limit if limit else None
    if deadline is not None and now >= deadline:
        return Verdict("failed", "DispatchDeadlineExceeded",
                       f"still not finished {limit} s after dispatch "
                       "(spec.schedulingSpec.dispatchDuration.limit)")

    need = min_available(aw, expected_pods)
    up = pods.running + pods.succeeded
    if up >= need:
        return Verdict("running", "PodsRunning",
                       f"{pods.running} of {expected_pods} pods running"
                       + (f", {pods.succeeded} succeeded" if pods.succeeded else ""),
                       check_at=deadline)
    if running:
        # Once running, restarting pods is the wrapped job's business (a Job or a
        # PyTorchJob recreates them); only its outcome or the deadline ends it here.
        return Verdict("wait", check_at=deadline)

    requeues = aw.status.numberOfRequeueings
    allowed = pods_allowed_seconds(aw.spec.schedulingSpec.requeuing, requeues)
    if now < dispatched_at + allowed:
        due = dispatched_at + allowed
        return Verdict("wait", check_at=min(due, deadline) if deadline else due)
    short = (f"{up} of the {need} pods needed (minAvailable) running or succeeded "
             f"{allowed:.0f} s after dispatch ({pods.pending} pending, {pods.failed} failed)")
    limit_n = aw.spec.schedulingSpec.requeuing.maxNumRequeuings
    if limit_n and requeues >= limit_n:
        return Verdict("failed", REQUEUE_LIMIT_REACHED,
                       f"{short}; already requeued {requeues} times "
                       "(spec.schedulingSpec.requeuing.maxNumRequeuings)")
    next_allowed = pods_allowed_seconds(aw.spec.schedulingSpec.requeuing, requeues + 1)
    return Verdict("requeue", "MinPodsNotRunning",
                   f"{short}; torn down and requeued, {next_allowed:.0f} s allowed next time")
