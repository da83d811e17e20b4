"""Queue policies: the order wrappers are considered in and what a waiting head blocks.

Built-in policies are YAML files in `dispatcher/policies/` (shipped in the package and
read by dispatcher.policy_files); a user can write their own in the same shape and pass
its path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Order = Literal["arrival", "priority"]
Preemption = Literal["never", "reclaim", "lowerPriority"]
PREEMPTION_MODES: tuple[Preemption, ...] = ("never", "reclaim", "lowerPriority")
BackfillLimitAction = Literal["fail", "requeue"]
BACKFILL_LIMIT_ACTIONS: tuple[BackfillLimitAction, ...] = ("fail", "requeue")


# Long enough for pods to finish their termination grace period (30 s by default) and
# their controllers to notice; a victim still there after that is not going soon.
DEFAULT_MAX_HOLD_SECONDS = 300.0


class PolicyError(ValueError):
    pass


@dataclass(frozen=True)
class Policy:
    """How one admission cycle walks the queue.

    order: "arrival" (first seen first) or "priority" (effective priority, then arrival).
    backfill: when the head does not fit, wrappers behind it that do fit may dispatch.
    max_head_wait_seconds: the starvation guard of backfill (an age guard). A wrapper
        that has waited longer than this and does not fit blocks everything behind it,
        as under strict head-of-line, until the capacity it needs drains free.
        None: no guard (backfill may pass a large gang over forever).
    preemption: what a wrapper that does not fit may tear down to fit (whole gangs only,
        see dispatcher.preemption): "never"; "reclaim": a wrapper within its quota takes
        back quota lent to borrowers; "lowerPriority": that, and a wrapper preempts
        wrappers of lower priority within its quota scope (the whole cluster without
        quota trees).
    min_running_seconds: a wrapper admitted less than this long ago is never preempted
        (the preemptionGuard), so that no gang is torn down just after it started.
    reserve: ``backfill: reserve``: backfill, but the head of the line gets a reservation
        (dispatcher.queue.reservation) that no wrapper passing it may delay; no age
        guard is needed then.
    backfill_limit_seconds: under `reserve`, how long a wrapper that passed a reserved head
        may stay dispatched unless its own dispatchDuration.limit is shorter: past it, it
        fails as past that limit, so that a backfill that overruns its expected time does
        not delay the reservation for ever. None: only its own limit.
    backfill_limit_action: what happens to a backfill past `backfill_limit_seconds`
        (``backfillLimitAction``): "fail" (the default, as past its own limit), or
        "requeue": torn down and queued again, as a preempted wrapper is (the requeue
        counts against its requeuing.maxNumRequeuings).
    reserve_first: under `reserve`, how many wrappers get a reservation: the head and the
        next ones, in the policy's order, that do not fit now (``reserveFirst``, 1 by
        default). A wrapper passing them may delay none of them.
    max_hold_seconds: how long room stays held for a preemptor whose victims have not
        gone (or shrunk) yet; then it gives that plan up and competes again, so that a
        victim that never goes cannot stop the queue for ever.
    """

    name: str
    order: Order = "priority"
    backfill: bool = False
    max_head_wait_seconds: float | None = None
    description: str = ""
    preemption: Preemption = "never"
    min_running_seconds: float = 0.0
    max_hold_seconds: float = DEFAULT_MAX_HOLD_SECONDS
    reserve: bool = False
    backfill_limit_seconds: float | None = None
    reserve_first: int = 1
    backfill_limit_action: BackfillLimitAction = "fail"


def policy_from_mapping(data: Mapping[str, Any], source: str = "policy") -> Policy:
    known = {"name", "order", "backfill", "starvationGuard", "description", "preemption",
             "preemptionGuard", "backfillLimitSeconds", "reserveFirst",
             "backfillLimitAction"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise PolicyError(f"{source}: unknown field(s) {', '.join(unknown)}; "
                          f"a policy has {', '.join(sorted(known))}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise PolicyError(f"{source}: 'name' must be a non-empty string")
    order = data.get("order", "priority")
    if order not in ("arrival", "priority"):
        raise PolicyError(f"{source}: 'order' must be 'arrival' or 'priority', got {order!r}")
    backfill = data.get("backfill", False)
    reserve = backfill == "reserve"
    if not isinstance(backfill, bool) and not reserve:
        raise PolicyError(f"{source}: 'backfill' must be true, false or reserve, got "
                          f"{backfill!r}")
    guard = data.get("starvationGuard") or {}
    if not isinstance(guard, Mapping) or set(guard) - {"maxHeadWaitSeconds"}:
        raise PolicyError(f"{source}: 'starvationGuard' takes only maxHeadWaitSeconds")
    wait = guard.get("maxHeadWaitSeconds")
    if wait is not None and (
        isinstance(wait, bool) or not isinstance(wait, int | float) or wait < 0
    ):
        raise PolicyError(f"{source}: starvationGuard.maxHeadWaitSeconds must be a number ≥ 0")
    preemption = data.get("preemption", "never")
    if preemption not in PREEMPTION_MODES:
        raise PolicyError(f"{source}: 'preemption' must be one of {', '.join(PREEMPTION_MODES)}, "
                          f"got {preemption!r}")
    pguard = data.get("preemptionGuard") or {}
    if not isinstance(pguard, Mapping) or set(pguard) - {"minRunningSeconds", "maxHoldSeconds"}:
        raise PolicyError(f"{source}: 'preemptionGuard' takes only minRunningSeconds and "
                          "maxHoldSeconds")
    running = pguard.get("minRunningSeconds", 0)
    if isinstance(running, bool) or not isinstance(running, int | float) or running < 0:
        raise PolicyError(f"{source}: preemptionGuard.minRunningSeconds must be a number ≥ 0")
    hold = pguard.get("maxHoldSeconds", DEFAULT_MAX_HOLD_SECONDS)
    if isinstance(hold, bool) or not isinstance(hold, int | float) or hold <= 0:
        raise PolicyError(f"{source}: preemptionGuard.maxHoldSeconds must be a number > 0")
    backfill_limit = data.get("backfillLimitSeconds")
    if backfill_limit is not None and (
        isinstance(backfill_limit, bool) or not isinstance(backfill_limit, int | float)
        or backfill_limit <= 0 or not reserve
    ):
        raise PolicyError(f"{source}: backfillLimitSeconds must be a number > 0, with "
                          "backfill: reserve")
    action = data.get("backfillLimitAction", "fail")
    if action not in BACKFILL_LIMIT_ACTIONS or (action != "fail" and backfill_limit is None):
        raise PolicyError(f"{source}: backfillLimitAction must be fail or requeue, with "
                          f"backfillLimitSeconds; got {action!r}")
    first = data.get("reserveFirst", 1)
    if isinstance(first, bool) or not isinstance(first, int) or first < 1 or (
            first != 1 and not reserve):
        raise PolicyError(f"{source}: reserveFirst must be a whole number >= 1, with "
                          "backfill: reserve")
    return Policy(
        name=name,
        order=order,
        backfill=reserve or backfill,
        max_head_wait_seconds=None if wait is None else float(wait),
        description=str(data.get("description", "")),
        preemption=preemption,
        min_running_seconds=float(running),
        max_hold_seconds=float(hold),
        reserve=reserve,
        backfill_limit_seconds=None if backfill_limit is None else float(backfill_limit),
        reserve_first=first,
        backfill_limit_action=action,
    )
