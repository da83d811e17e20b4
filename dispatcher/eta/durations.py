"""Expected durations: how long a wrapper will hold what it is given.

For a wrapper, in order:

1. what it declares (``dispatchDuration.expected``, else the annotation
   ``workload.codeflare.dev/expectedDurationSeconds``; see dispatcher.api.durations);
2. the median duration of the last completed wrappers of the same namespace and shape
   (the gang's total requests), from a bounded :class:`DurationHistory`;
3. a default (``DurationRule.default_seconds``, 1 h unless configured).

``dispatchDuration.limit`` caps all three: the dispatcher fails a wrapper past it.

For a running wrapper, the time it has left is the expected duration minus the time it has
run; when that duration comes from the history, the median of what the wrappers of its kind
that ran longer than it has took beyond that point (the running time so far says something
about which of them it is like). A wrapper past that (or past a declared or default duration)
is expected to run what the recent wrappers of any kind that ran at least as long took
beyond that point; past all of those, to end within another ``overdue_fraction`` of the
time it has run (at least ``min_remaining``).
"""

from __future__ import annotations

import bisect
import statistics
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from dispatcher.api.durations import DeclaredDuration

Shape = tuple[tuple[str, int], ...]
Basis = Literal["spec", "annotation", "history", "default", "given"]


def shape_of(demand: Mapping[str, int]) -> Shape:
    """The shape of a gang, for the history: its total requests."""
    return tuple(sorted(demand.items()))


@dataclass(frozen=True)
class _Completion:
    uid: str
    seconds: float
    finished_at: float


class DurationHistory:
    """How long the last completed wrappers ran, per (namespace, shape), and of any kind.

    Bounded: the `per_shape` most recent completions (by completion time) of each pair,
    for the `max_shapes` pairs fed most recently, and the `pooled` most recent ones of any
    pair. The same completion (by uid) is counted once, so a listing that offers every
    completed wrapper again changes nothing.
    """

    def __init__(self, per_shape: int = 32, max_shapes: int = 4096,
                 pooled: int = 1024) -> None:
        if per_shape < 1 or max_shapes < 1 or pooled < 1:
            raise ValueError("a duration history keeps at least one completion of one shape")
        self.per_shape = per_shape
        self.max_shapes = max_shapes
        self.pooled = pooled
        self._runs: OrderedDict[tuple[str, Shape], list[_Completion]] = OrderedDict()
        self._recent: deque[float] = deque()  # the pooled durations, by completion
        self._sorted: list[float] = []  # the same, by duration

    def __len__(self) -> int:
        return sum(len(v) for v in self._runs.values())

    def copy(self) -> DurationHistory:
        """One to read in another thread while this one is fed."""
        other = DurationHistory(self.per_shape, self.max_shapes)
        other._runs = OrderedDict((k, list(v)) for k, v in self._runs.items())
        other._recent, other._sorted = deque(self._recent), list(self._sorted)
        return other

    def record(self, namespace: str, shape: Shape, seconds: float, finished_at: float,
               uid: str = "") -> bool:
        """Add one completion; False if it was known already or is older than every one
        kept for a full shape."""
        if seconds < 0:
            return False
        key = (namespace, shape)
        runs = self._runs.get(key)
        if runs is None:
            runs = self._runs[key] = []
            while len(self._runs) > self.max_shapes:
                self._runs.popitem(last=False)
        self._runs.move_to_end(key)
        if uid and any(r.uid == uid for r in runs):
            return False
        if len(runs) >= self.per_shape and finished_at <= runs[0].finished_at:
            return False
        runs.append(_Completion(uid, seconds, finished_at))
        runs.sort(key=lambda r: r.finished_at)
        del runs[:-self.per_shape]
        self._recent.append(seconds)
        bisect.insort(self._sorted, seconds)
        if len(self._recent) > self.pooled:
            del self._sorted[bisect.bisect_left(self._sorted, self._recent.popleft())]
        return True

    def durations(self, namespace: str, shape: Shape) -> list[float]:
        return sorted(r.seconds for r in self._runs.get((namespace, shape), ()))

    def median(self, namespace: str, shape: Shape) -> float | None:
        ds = self.durations(namespace, shape)
        return statistics.median(ds) if ds else None

    def beyond(self, namespace: str, shape: Shape, elapsed: float) -> float | None:
        """The median of what those that ran longer than `elapsed` took beyond it."""
        longer = [d - elapsed for d in self.durations(namespace, shape) if d > elapsed]
        return statistics.median(longer) if longer else None

    def beyond_any(self, elapsed: float) -> float | None:
        """The same over the recent completions of every kind."""
        longer = self._sorted[bisect.bisect_right(self._sorted, elapsed):]
        return statistics.median(longer) - elapsed if longer else None


@dataclass(frozen=True)
class Expected:
    seconds: float
    basis: Basis
    limit: float | None = None


@dataclass(frozen=True)
class DurationRule:
    """The installation's assumptions where nothing better is known."""

    default_seconds: float = 3600.0
    overdue_fraction: float = 0.1
    min_remaining: float = 60.0

    def __post_init__(self) -> None:
        if not self.default_seconds > 0:
            raise ValueError(f"the default duration must be above 0 s, got "
                             f"{self.default_seconds}")
        if self.overdue_fraction < 0 or self.min_remaining < 0:
            raise ValueError("overdue_fraction and min_remaining must be ≥ 0")

    def expected(self, declared: DeclaredDuration, namespace: str, shape: Shape,
                 history: DurationHistory | None = None) -> Expected:
        """How long a wrapper that has not started yet will run."""
        limit = declared.limit
        if declared.expected is not None and declared.source is not None:
            found = Expected(declared.expected, declared.source, limit)
        else:
            median = history.median(namespace, shape) if history is not None else None
            found = Expected(median, "history", limit) if median is not None \
                else Expected(self.default_seconds, "default", limit)
        if limit is not None and found.seconds > limit:
            return Expected(limit, found.basis, limit)
        return found

    def remaining(self, expected: Expected, elapsed: float, namespace: str, shape: Shape,
                  history: DurationHistory | None = None) -> float:
        """How much longer a wrapper that has run for `elapsed` seconds will run."""
        elapsed = max(elapsed, 0.0)
        left = expected.seconds - elapsed
        if expected.basis == "history" and history is not None:
            # Those of its kind that ran at least this long: what they took beyond it.
            beyond = history.beyond(namespace, shape, elapsed)
            left = beyond if beyond is not None else 0.0
        if left <= 0 and history is not None:
            # Past what its own kind took: what the wrappers of any kind that ran at least
            # this long took beyond it (long runs tend to go on), not a small constant.
            left = history.beyond_any(elapsed) or 0.0
        if left <= 0:
            left = max(self.min_remaining, self.overdue_fraction * elapsed)
        if expected.limit is not None:
            left = min(left, max(expected.limit - elapsed, 0.0))
        return left
