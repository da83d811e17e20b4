"""The worker's fence against a lost manager (pure): must this copy stop here?

The manager renews a heartbeat (a Lease) in each worker it reaches, every pass, and writes
in it how long the worker may go without a renewal: the fence's grace, half the manager's
own requeue grace (`fence_grace`). The worker's dispatcher never compares the Lease's
timestamps with its own clock: it notes, on its own monotonic clock, when it first saw
each renewal (a record it had not seen before) and holds the manager lost once it has seen
no new one for longer than that grace (`hear`, `stale`). Only clock rates need agree, not
clock values.

A copy (labelled with its manager's wrapper uid) whose manager is lost is torn down and
held; it stays held once stopped for that reason (`fenced`), so it never runs here again:
the manager takes it back (`stopped`) or, past its own grace, has sent it elsewhere and
deletes the copy as a stray. A worker with no Lease (no manager) fences nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dispatcher.api.labels import MANAGER_UID_LABEL

#: The reason of the conditions of a copy stopped because its manager was lost.
MANAGER_LOST = "ManagerLost"
#: The heartbeat the manager renews in each worker (namespace, name).
LEASE_NAMESPACE = "dispatcher-system"
LEASE_NAME = "dispatcher-manager"
#: What such a copy's status says.
LOST_MESSAGE = (f"its manager was not heard from within the grace its heartbeat names (Lease "
                f"{LEASE_NAMESPACE}/{LEASE_NAME}): what it created is deleted; it does not "
                "run here again, its manager takes it back")
#: The fence's grace, as a share of the manager's requeue grace: the rest is the margin
#: within which the worker notices (it reads the Lease every second) and tears down.
FENCE_SHARE = 0.5
#: The least requeue grace. The margin (half of it) must cover a renewal that lands late —
#: sent after a pass that waited for the slowest worker (up to the worker requests' retry
#: budget and timeout, 7 s, and the pass itself), then itself retried and timed out (7 s
#: more) — and the worker's look (1 s) and its teardown.
MIN_GRACE = 45.0


def fence_grace(grace: float) -> float:
    """The fence's grace in the workers, from the manager's requeue grace."""
    return grace * FENCE_SHARE


def check_grace(grace: float) -> None:
    """Raise ValueError, saying what to fix, for a requeue grace too short to fence."""
    if grace < MIN_GRACE:
        raise ValueError(
            f"--worker-grace must be at least {MIN_GRACE:.0f} seconds (got {grace:g}): a "
            f"worker stops the copies of a manager it has not heard from for half of it, "
            "and the other half is the margin that lets it do so before the manager sends "
            "them elsewhere")


def handover_warning(grace: float, lease_seconds: float) -> str | None:
    """With replicas on a Lease, what to fix when the fence's window leaves a hand-over
    (the Lease expiring, then the new leader's first look at every worker) too little time,
    or None. Too short, a killed leader makes every worker stop every copy: nothing runs
    twice, but everything that ran starts again."""
    if fence_grace(grace) >= 2 * lease_seconds:
        return None
    least = math.ceil(2 * lease_seconds / FENCE_SHARE)
    return (f"--worker-grace {grace:g} with --leader-elect: workers stop the copies of a "
            f"manager unheard for {fence_grace(grace):g} s, and a new leader takes over "
            f"{lease_seconds:g} s after the last renewal at the soonest, then looks at every "
            f"worker; a slower hand-over restarts every copy in every worker. Use "
            f"--worker-grace {least} or more")


@dataclass(frozen=True)
class Heard:
    """The last renewal seen of the manager's heartbeat, on the worker's clock."""

    record: str | None  # the renewal (the Lease's resourceVersion); None: no Lease
    at: float  # when the worker first saw it (its monotonic clock)
    grace: float | None  # the fence's grace the manager wrote (None: no Lease)


def hear(last: Heard | None, record: str | None, grace: float | None, now: float) -> Heard:
    """What the worker knows after reading the heartbeat at `now`: a renewal it had not
    seen restarts the clock; the same one (or a failed read: `record` None with `last`)
    leaves it running."""
    if last is None:
        return Heard(record, now, grace)
    if record is None or record == last.record:
        return last
    return Heard(record, now, grace)


def stale(heard: Heard | None, now: float) -> bool:
    """The manager has not renewed its heartbeat for longer than the grace it wrote. No
    heartbeat ever seen (no manager, or one that writes none): never stale."""
    if heard is None or heard.record is None or heard.grace is None:
        return False
    return now - heard.at > heard.grace


def is_copy(labels: Mapping[str, str]) -> bool:
    """Labelled as a manager's copy."""
    return MANAGER_UID_LABEL in labels


def fenced(copy: bool, reasons: Iterable[str | None], manager_stale: bool) -> bool:
    """A wrapper that must not run here: a manager's copy (`copy`: labelled so, now or
    when first seen) whose manager is lost, or one stopped for that already (`reasons`:
    those of its conditions); it waits for its manager to take it back. Once stopped it
    stays so whatever its labels say now: its labels are its users' to edit, its status is
    the dispatcher's alone."""
    return MANAGER_LOST in reasons or (copy and manager_stale)


def stopped(status: Mapping[str, Any]) -> bool:
    """The copy's status says its worker stopped it because its manager was lost."""
    return MANAGER_LOST in ((c or {}).get("reason") for c in status.get("conditions") or [])


def grace_of(lease: Mapping[str, Any]) -> float | None:
    """The fence's grace the manager wrote in its Lease (None: none, or not a number)."""
    value = (lease.get("spec") or {}).get("leaseDurationSeconds")
    return float(value) if isinstance(value, int | float) and value > 0 else None
