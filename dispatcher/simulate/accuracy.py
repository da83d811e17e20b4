"""How good are start estimates? Measured inside a simulation of a trace.

At sampled moments of a run (evenly spaced over the trace's submissions), every queued job's
start is estimated by the controller's own estimator (`dispatcher.eta.replay`) from the
simulated cluster as it is at that moment, in one or both of two modes:

- ``exact``: every job's duration is known exactly (the trace's). Left over is only what
  the estimator cannot know: jobs that arrive later (under backfill they can take a gap
  first; under fifo they never pass anyone, so the error must be zero).
- ``history``: durations estimated as the controller does -- from the durations of the
  jobs of the same shape (namespace and GPUs) completed before that moment, else the
  default -- with the same `DurationRule`; for a running job, from its running time so far.

After the run each estimate is compared with the job's actual start in the same
simulation. Jobs that were preempted before a sample are left out (their "start" would be
a restart). Only per-node fit: under the aggregate rule a dispatched gang may wait for
nodes, and the estimator's "start" is its dispatch.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from dispatcher.api.durations import DeclaredDuration
from dispatcher.eta import (
    DurationHistory,
    DurationRule,
    Estimate,
    Limits,
    RunningWrapper,
    forecast,
    shape_of,
)
from dispatcher.eta.reserve import planner
from dispatcher.queue.queue import WrapperKey
from dispatcher.simulate.engine import JobRun, Simulation
from dispatcher.wording import span

Mode = Literal["exact", "history"]
MODES: tuple[Mode, ...] = ("exact", "history")


@dataclass(frozen=True)
class Sample:
    at: float
    mode: Mode
    queued: int
    seconds: float  # computing the estimates
    stopped: str
    estimates: tuple[tuple[int, Estimate], ...]  # (job index, estimate)


@dataclass
class Probe:
    """Pass as `observe` to a Simulation; it estimates at about `samples` moments."""

    first: float
    last: float
    samples: int = 40
    modes: Sequence[Mode] = MODES
    rule: DurationRule = field(default_factory=DurationRule)
    limits: Limits = field(default_factory=Limits)
    history_per_shape: int = 32
    taken: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.every = max((self.last - self.first) / max(self.samples, 1), 1.0)
        self.next_at = self.first + self.every / 2
        self.history = DurationHistory(self.history_per_shape)
        self._recorded: set[int] = set()

    def __call__(self, t: float, sim: Simulation) -> None:
        if t < self.next_at or t > self.last:
            return
        while self.next_at <= t:
            self.next_at += self.every
        if not len(sim.queue):
            return
        if sim.fit != "per-node":
            raise ValueError("start estimates are measured with per-node fit only")
        self._learn(sim)
        for mode in self.modes:
            self.taken.append(self._sample(t, sim, mode))

    def _learn(self, sim: Simulation) -> None:
        for i, run in enumerate(sim.runs):
            if run.finished is not None and i not in self._recorded:
                self._recorded.add(i)
                w = run.job.wrapper
                self.history.record(w.namespace, shape_of(w.demand), run.job.duration,
                                    run.finished, w.uid)

    def _expected(self, run: JobRun, mode: Mode) -> float:
        if mode == "exact":
            return run.job.duration
        w = run.job.wrapper
        return self.rule.expected(DeclaredDuration(), w.namespace, shape_of(w.demand),
                                  self.history).seconds

    def _sample(self, t: float, sim: Simulation, mode: Mode) -> Sample:
        index = {r.job.wrapper.key: i for i, r in enumerate(sim.runs)}
        queued = list(sim.queue.ordered(t))
        running: list[RunningWrapper] = []
        for record in sim.admitted():
            run = sim.runs[index[record.key]]
            assert run.running_since is not None
            w = run.job.wrapper
            if mode == "exact":
                ends = run.running_since + run.job.duration
            else:
                shape = shape_of(w.demand)
                expected = self.rule.expected(DeclaredDuration(), w.namespace, shape,
                                              self.history)
                ends = t + self.rule.remaining(expected, t - run.running_since, w.namespace,
                                               shape, self.history)
            running.append(RunningWrapper(record.key, record.holdings, ends, record, w,
                                          self._expected(run, mode)))
        durations: dict[WrapperKey, float] = {
            w.key: self._expected(sim.runs[index[w.key]], mode) for w in queued}
        started = time.perf_counter()
        result = forecast(queued, running, sim.cluster.copy(), sim.policy, t, durations,
                          fit=sim.fit, forest=sim.forest, holds=sim.holds, limits=self.limits,
                          planner=planner(sim.policy, sim.fit, limits=self.limits))
        seconds = time.perf_counter() - started
        return Sample(t, mode, len(queued), seconds, result.stopped,
                      tuple((index[k], e) for k, e in result.estimates.items()))


@dataclass(frozen=True)
class Accuracy:
    """Estimates against actual starts, for one mode."""

    mode: Mode
    samples: int
    estimates: int  # estimates of a start that could be compared
    median_error: float  # absolute, seconds
    p90_error: float
    median_relative: float  # absolute error / the actual wait from the sample on
    p90_relative: float
    beyond: int  # "not within the horizon"
    beyond_wrong: int  # of those, jobs that did start within it
    late_starts: int  # started after the horizon although a start within it was estimated
    other: int  # budget, stuck, never
    median_seconds: float  # computing one estimate round
    max_seconds: float


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0-1), nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def compare(probe: Probe, runs: Sequence[JobRun], mode: Mode) -> Accuracy:
    errors: list[float] = []
    relative: list[float] = []
    beyond = beyond_wrong = late = other = 0
    samples = [s for s in probe.taken if s.mode == mode]
    for s in samples:
        horizon = s.at + probe.limits.horizon_seconds
        for i, e in s.estimates:
            run = runs[i]
            if run.preemptions or run.started is None or run.started < s.at:
                continue
            actual = run.started
            if e.outcome == "start" and e.at is not None:
                if actual > horizon:
                    late += 1
                error = abs(e.at - actual)
                errors.append(error)
                relative.append(error / max(actual - s.at, 1.0))
            elif e.outcome == "beyond":
                beyond += 1
                beyond_wrong += actual <= horizon
            else:
                other += 1
    times = [s.seconds for s in samples]
    return Accuracy(mode, len(samples), len(errors), percentile(errors, 0.5),
                    percentile(errors, 0.9), percentile(relative, 0.5),
                    percentile(relative, 0.9), beyond, beyond_wrong, late, other,
                    statistics.median(times) if times else math.nan,
                    max(times) if times else math.nan)


ACCURACY_HEADER = ("durations", "samples", "estimates", "median |err|", "p90 |err|",
                   "median rel", "p90 rel", "beyond horizon (wrong)", "s/round (max)")


def accuracy_cells(a: Accuracy) -> tuple[str, ...]:
    def rel(x: float) -> str:
        return "-" if math.isnan(x) else f"{x:.0%}"

    times = "-" if math.isnan(a.median_seconds) else \
        f"{a.median_seconds:.2f} ({a.max_seconds:.2f})"
    return (a.mode, str(a.samples), f"{a.estimates:,}", span(a.median_error),
            span(a.p90_error), rel(a.median_relative), rel(a.p90_relative),
            f"{a.beyond:,} ({a.beyond_wrong:,})", times)


def accuracy_dict(a: Accuracy) -> dict[str, object]:
    def num(x: float) -> float | None:
        return None if math.isnan(x) else round(x, 3)

    return {"durations": a.mode, "samples": a.samples, "estimates": a.estimates,
            "medianErrorSeconds": num(a.median_error), "p90ErrorSeconds": num(a.p90_error),
            "medianRelativeError": num(a.median_relative),
            "p90RelativeError": num(a.p90_relative), "beyondHorizon": a.beyond,
            "beyondHorizonButStarted": a.beyond_wrong, "otherOutcomes": a.other,
            "medianRoundSeconds": num(a.median_seconds), "maxRoundSeconds": num(a.max_seconds)}


def render(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[c]) for r in [header, *rows]) for c in range(len(header))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
                     for r in [header, *rows])
