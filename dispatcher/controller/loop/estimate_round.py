"""A round of start estimates: what it is given (taken from memory on the event loop,
estimates.py), the expected duration of each wrapper, and the replay run in its thread;
and the reservations an admission cycle plans from the same round under a reserving
policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dispatcher.admission import NO_TOPOLOGY, EmptyClusterAnswers, Fit
from dispatcher.api.durations import DeclaredDuration, declared_duration
from dispatcher.api.models import AppWrapper
from dispatcher.controller.record.tracked import Key
from dispatcher.eta import (
    DurationHistory,
    DurationRule,
    Forecast,
    Limits,
    RunningWrapper,
    forecast,
    shape_of,
)
from dispatcher.eta.reserve import planner, reservations
from dispatcher.fit import Capacity
from dispatcher.fit.topology import Topology
from dispatcher.preemption import AdmittedWrapper, Hold
from dispatcher.queue import Policy, QueuedWrapper
from dispatcher.queue.reservation import Reservations
from dispatcher.quota import QuotaForest

# What a cycle's reservation pass may take of its admission cycle's time, in seconds.
RESERVE_BUDGET = 0.5


@dataclass(frozen=True)
class EstimateSettings:
    """`dispatcher run --estimate-interval / --default-duration / --estimate-horizon`."""

    interval: float = 10.0  # 0: no estimates
    rule: DurationRule = field(default_factory=DurationRule)
    limits: Limits = field(default_factory=Limits)
    min_change_seconds: float = 60.0
    min_change_fraction: float = 0.1
    max_writes: int = 100
    history_per_shape: int = 32

    @property
    def enabled(self) -> bool:
        return self.interval > 0


# An AppWrapper as read on the event loop (specs are replaced, never changed in place) and
# the newer annotations seen of it, if any.
Spec = tuple[AppWrapper, Mapping[str, str] | None] | None


@dataclass(frozen=True)
class EstimateRound:
    queued: list[QueuedWrapper]
    specs: dict[Key, Spec]
    admitted: list[tuple[AdmittedWrapper, QueuedWrapper, float, Spec]]  # with dispatched_at
    leaving: list[RunningWrapper]
    capacity: Capacity
    forest: QuotaForest | None
    holds: dict[Key, Hold]
    history: DurationHistory


def replay_round(r: EstimateRound, policy: Policy, fit: Fit, s: EstimateSettings, now: float,
           answers: EmptyClusterAnswers, topology: Topology) -> Forecast:
    """One round of estimates, in the round's thread: expected durations, then the replay."""
    durations, running = expected(r, s, now)
    return forecast(r.queued, running, r.capacity, policy, now, durations, fit=fit,
                    forest=r.forest, holds=r.holds, empty_answers=answers, limits=s.limits,
                    topology=topology, planner=planner(policy, fit, limits=s.limits))


def expected(r: EstimateRound, s: EstimateSettings, now: float
             ) -> tuple[dict[Key, float], list[RunningWrapper]]:
    """The expected duration of each queued wrapper, and what runs with when it ends."""
    rule, history = s.rule, r.history

    def declared(spec: Spec) -> DeclaredDuration:
        return DeclaredDuration() if spec is None else declared_duration(*spec)

    durations = {w.key: rule.expected(declared(r.specs[w.key]), w.namespace,
                                      shape_of(w.demand), history).seconds for w in r.queued}
    running = list(r.leaving)
    for record, gang, dispatched_at, spec in r.admitted:
        shape = shape_of(gang.demand)
        expected = rule.expected(declared(spec), record.namespace, shape, history)
        left = rule.remaining(expected, now - dispatched_at, record.namespace, shape, history)
        running.append(RunningWrapper(record.key, record.holdings, now + left, record, gang,
                                      expected.seconds))
    return durations, running


def cycle_reservations(r: EstimateRound | None, s: EstimateSettings, ordered: list[QueuedWrapper],
                       capacity: Capacity, policy: Policy, now: float, fit: Fit,
                       holds: Mapping[Key, Hold], topology: Topology = NO_TOPOLOGY
                       ) -> Reservations | None:
    """An admission cycle's reservations (off the loop) under a policy that reserves,
    planned from `r` (`Estimates.taken`) with the estimates' durations."""
    if r is None or not policy.reserve:
        return None
    durations, running = expected(r, s, now)
    return reservations(ordered, running, capacity, policy, now, durations, fit=fit,
                        holds=holds, limits=Limits(s.limits.horizon_seconds,
                                                   s.limits.max_cycles, RESERVE_BUDGET),
                        topology=topology)
