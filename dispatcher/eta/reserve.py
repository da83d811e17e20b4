"""Reservations for one admission cycle: where the head of the line is expected to start,
and the next wrappers that wait (the policy's `reserve_first`).

The head is the first wrapper, in the policy's order, that would wait for capacity under
strict head-of-line (the policy without backfill). Its reservation is the moment and the
nodes at which the replay of expected durations (`forecast`, the same replay and the same
durations as start estimates) dispatches it when nothing passes it. The wrappers before
it dispatch now in that replay, as they do in the cycle; those behind it cannot change
its start under strict head-of-line, so only the line up to the head is replayed. Under
`reserve_first: K` the line goes on to the K-1 next wrappers behind the head that do not
fit now, and each of those is reserved where the replay of that line starts it
(conservative backfilling, limited to K): each reservation assumes that the wrappers
before it in the line start as replayed, those that fit now included.

Not reserved: a head that waits for quota (not capacity), one that never fits, and one
the replay does not start within its limits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence

from dispatcher.admission import (
    NO_TOPOLOGY,
    CycleStats,
    EmptyClusterAnswers,
    Fit,
    admit,
    fit_rules,
)
from dispatcher.eta.replay import Limits, Planner, RunningWrapper, forecast
from dispatcher.fit.capacity import Capacity
from dispatcher.fit.gang import NEVER_FITS, Shortfall
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
    left = capacity.copy()
    line = _line_to_head(ordered, left, strict, now, fit, holds, empty_answers, topology)
    if not line:
        return Reservations((), durations)
    behind, next_heads = _behind_head(ordered, line[-1], left, policy.reserve_first - 1, fit,
                                      topology)
    heads = [line[-1], *next_heads]
    found = forecast([*line, *behind], running, capacity.copy(), strict, now, durations,
                     fit=fit, holds=holds, empty_answers=empty_answers,
                     limits=limits or Limits(), topology=topology)
    held = []
    for head in heads:
        estimate = found.estimates.get(head.key)
        if estimate is not None and estimate.outcome == "start" and estimate.at is not None:
            held.append(Reservation(head.key, estimate.at, frozenset(estimate.nodes)))
    return Reservations(tuple(held), durations)


def _line_to_head(ordered: Sequence[QueuedWrapper], capacity: Capacity, strict: Policy,
                  now: float, fit: Fit, holds: Mapping[WrapperKey, Hold] | None,
                  answers: EmptyClusterAnswers | None, topology: Topology
                  ) -> list[QueuedWrapper]:
    """The wrappers up to and including the head that waits for capacity; [] if none
    waits for capacity. `capacity` is left with the dispatches before the head taken."""
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


# Under reserve_first > 1, how many wrappers behind the head are replayed at most to find
# the next ones to reserve: the replay's cost grows with them.
MAX_BEHIND = 500


def _behind_head(ordered: Sequence[QueuedWrapper], head: QueuedWrapper, capacity: Capacity,
                 wanted: int, fit: Fit, topology: Topology
                 ) -> tuple[list[QueuedWrapper], list[QueuedWrapper]]:
    """The wrappers behind `head`, in order, up to the `wanted`-th that does not fit in
    `capacity` (what the head leaves free now) but would on the empty cluster; and those
    that do not fit, the next to be reserved. All of them are replayed: a wrapper that fits
    now but is not let through waits ahead of the next reserved one."""
    if wanted <= 0:
        return [], []
    fit_gang, hopeless = fit_rules(fit, topology)
    empty = Capacity.empty(capacity.nodes.values())
    waits: dict[tuple[object, ...], bool | None] = {}  # by gang shape; None: never fits
    line: list[QueuedWrapper] = []
    heads: list[QueuedWrapper] = []
    behind = False
    for w in ordered:
        if not behind:
            behind = w.key == head.key
            continue
        if w.invalid is not None or topology.problem(w.gang) is not None:
            continue
        key = w.gang_key
        if key not in waits:
            waits[key] = (None if hopeless(w.gang, empty) is not None
                          else isinstance(fit_gang(w.gang, capacity), Shortfall))
        if waits[key] is None:
            continue
        line.append(w)
        if waits[key]:
            heads.append(w)
            if len(heads) == wanted:
                break
        if len(line) == MAX_BEHIND:
            break
    return line[:line.index(heads[-1]) + 1] if heads else [], heads


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

