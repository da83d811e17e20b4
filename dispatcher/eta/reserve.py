"""Reservations for one admission cycle: where the head of the line is expected to start.

The head is the first wrapper, in the policy's order, that would wait for capacity under
strict head-of-line (the policy without backfill). Its reservation is the moment and the
nodes at which the replay of expected durations (`forecast`, the same replay and the same
durations as start estimates) dispatches it when nothing passes it. The wrappers before
it dispatch now in that replay, as they do in the cycle; those behind it cannot change
its start under strict head-of-line, so only the line up to the head is replayed.

Not reserved: a head that waits for quota (not capacity), one that never fits, and one
the replay does not start within its limits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence

from dispatcher.admission import NO_TOPOLOGY, CycleStats, EmptyClusterAnswers, Fit, admit
from dispatcher.eta.replay import Limits, Planner, RunningWrapper, forecast
from dispatcher.fit.capacity import Capacity
from dispatcher.fit.gang import NEVER_FITS
from dispatcher.fit.topology import Topology
from dispatcher.preemption import Hold
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import QueuedWrapper, WrapperKey
from dispatcher.queue.reservation import Reservation, Reservations


def reservations(ordered: Sequence[QueuedWrapper], running: Iterable[RunningWrapper],
                 capacity: Capacity, policy: Policy, now: float,
                 durations: Mapping[WrapperKey, float], *, fit: Fit = "per-node",
                 holds: Mapping[WrapperKey, Hold] | None = None,
                 empty_answers: EmptyClusterAnswers | None = None,
                 limits: Limits | None = None,
                 topology: Topology = NO_TOPOLOGY) -> Reservations:
    """The reservations of a cycle over `ordered` (the queue in the policy's order) on
    the free `capacity` now (not changed); `durations` and `topology` as for `forecast`."""
    strict = dataclasses.replace(policy, backfill=False, reserve=False)
    line = _line_to_head(ordered, capacity.copy(), strict, now, fit, holds, empty_answers,
                         topology)
    if not line:
        return Reservations((), durations)
    head = line[-1]
    found = forecast(line, running, capacity.copy(), strict, now, durations, fit=fit,
                     holds=holds, empty_answers=empty_answers, limits=limits or Limits(),
                     topology=topology)
    estimate = found.estimates.get(head.key)
    if estimate is None or estimate.outcome != "start" or estimate.at is None:
        return Reservations((), durations)
    return Reservations((Reservation(head.key, estimate.at, frozenset(estimate.nodes)),),
                        durations)


def _line_to_head(ordered: Sequence[QueuedWrapper], capacity: Capacity, strict: Policy,
                  now: float, fit: Fit, holds: Mapping[WrapperKey, Hold] | None,
                  answers: EmptyClusterAnswers | None, topology: Topology
                  ) -> list[QueuedWrapper]:
    """The wrappers up to and including the head that waits for capacity; [] if none
    waits for capacity."""
    stats = CycleStats()

    def until_blocked() -> Iterator[QueuedWrapper]:
        for w in ordered:
            if stats.blocked_by is not None:
                return
            yield w

    decisions = admit(until_blocked(), capacity, strict, now, fit, stats,
                      empty_answers=answers, holds=holds, topology=topology)
    by_key = {w.key: w for w in ordered[:len(decisions)]}
    line: list[QueuedWrapper] = []
    for d in decisions:
        if d.decision == "invalid" or d.reason == NEVER_FITS:
            continue
        line.append(by_key[d.key])
        if d.head_of_line:
            return line if d.decision == "wait" else []
    return []


# Of the budget of a replay with reservations, what each reservation pass inside it may
# take: a pass that runs out leaves that cycle without reservation (plain backfill).
PASS_SHARE = 0.05


def planner(policy: Policy, fit: Fit = "per-node",
            empty_answers: EmptyClusterAnswers | None = None,
            limits: Limits | None = None,
            topology: Topology = NO_TOPOLOGY) -> Planner | None:
    """The reservations of each cycle of a replay (`forecast(planner=...)`) under `policy`;
    None for a policy that does not reserve."""
    if not policy.reserve:
        return None
    outer = limits or Limits()
    inner = Limits(outer.horizon_seconds, outer.max_cycles, outer.budget_seconds * PASS_SHARE)

    def plan(ordered: Sequence[QueuedWrapper], running: Sequence[RunningWrapper],
             capacity: Capacity, now: float, durations: Mapping[WrapperKey, float]
             ) -> Reservations:
        return reservations(ordered, running, capacity, policy, now, durations, fit=fit,
                            empty_answers=empty_answers, limits=inner, topology=topology)

    return plan

