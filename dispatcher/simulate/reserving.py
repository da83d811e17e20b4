"""The expected durations a reserving policy plans with in a simulation.

``exact``: each job's real duration (the oracle: what perfect predictions would give).
``predicted``: as the controller predicts them -- the median duration of the jobs of the
same shape (namespace and demand) completed so far, else the installation default
(`DurationRule`); for a running job, what is left of that given its running time.
"""

from __future__ import annotations

from typing import Literal, Protocol

from dispatcher.api.durations import DeclaredDuration
from dispatcher.eta import DurationHistory, DurationRule, shape_of
from dispatcher.fit.gang import demand
from dispatcher.simulate.traces import TraceJob

DurationMode = Literal["exact", "predicted"]
DURATION_MODES: tuple[DurationMode, ...] = ("exact", "predicted")


class Durations(Protocol):
    def expected(self, job: TraceJob) -> float:
        """How long a job that has not started is expected to run."""

    def left(self, job: TraceJob, since: float, t: float) -> float:
        """How much longer a job running since `since` is expected to run at `t`."""

    def finished(self, job: TraceJob, seconds: float, t: float) -> None:
        """A job completed at `t` after running `seconds`."""


class ExactDurations:
    def expected(self, job: TraceJob) -> float:
        return job.duration

    def left(self, job: TraceJob, since: float, t: float) -> float:
        return max(since + job.duration - t, 0.0)

    def finished(self, job: TraceJob, seconds: float, t: float) -> None:
        return None


class PredictedDurations:
    def __init__(self, rule: DurationRule | None = None, per_shape: int = 32) -> None:
        self.rule = rule or DurationRule()
        self.history = DurationHistory(per_shape)
        self._none = DeclaredDuration()

    def _shape(self, job: TraceJob) -> tuple[str, tuple[tuple[str, int], ...]]:
        return job.wrapper.namespace, shape_of(demand(job.wrapper.gang))

    def expected(self, job: TraceJob) -> float:
        namespace, shape = self._shape(job)
        return self.rule.expected(self._none, namespace, shape, self.history).seconds

    def left(self, job: TraceJob, since: float, t: float) -> float:
        namespace, shape = self._shape(job)
        expected = self.rule.expected(self._none, namespace, shape, self.history)
        return self.rule.remaining(expected, t - since, namespace, shape, self.history)

    def finished(self, job: TraceJob, seconds: float, t: float) -> None:
        namespace, shape = self._shape(job)
        self.history.record(namespace, shape, seconds, t)


def durations_for(mode: DurationMode) -> Durations:
    return ExactDurations() if mode == "exact" else PredictedDurations()
