"""How long an AppWrapper says it will run, once dispatched.

Two places, in this order: MCAD's ``spec.schedulingSpec.dispatchDuration.expected``
(seconds), then the annotation ``workload.codeflare.dev/expectedDurationSeconds`` (for
tools that cannot set the spec field). ``dispatchDuration.limit`` is an upper bound: past
it the dispatcher fails the wrapper (DispatchDeadlineExceeded), so it never runs longer.
Start estimates (dispatcher.eta) use these before anything learnt from history.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from dispatcher.api.models import AppWrapper

EXPECTED_DURATION_ANNOTATION = "workload.codeflare.dev/expectedDurationSeconds"

Source = Literal["spec", "annotation"]


@dataclass(frozen=True)
class DeclaredDuration:
    """What the AppWrapper declares: its expected run time (None: it does not say), where
    that came from, its limit (None: none), and a problem with the annotation, if any
    (it is then ignored)."""

    expected: float | None = None
    source: Source | None = None
    limit: float | None = None
    problem: str | None = None


def declared_duration(aw: AppWrapper,
                      annotations: Mapping[str, str] | None = None) -> DeclaredDuration:
    """`annotations`: newer ones than `aw`'s, if known (an edit of its annotations alone
    does not change its generation, so a controller may hold an older spec)."""
    dd = aw.spec.schedulingSpec.dispatchDuration
    limit = float(dd.limit) if dd.limit else None  # MCAD reads 0 as no limit
    if dd.expected is not None:
        return DeclaredDuration(float(dd.expected), "spec", limit)
    raw = (aw.metadata.annotations if annotations is None else annotations).get(
        EXPECTED_DURATION_ANNOTATION)
    if raw is None:
        return DeclaredDuration(limit=limit)
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        return DeclaredDuration(limit=limit, problem=(
            f"metadata.annotations[{EXPECTED_DURATION_ANNOTATION!r}]: {raw!r} is not a "
            "number of seconds ≥ 0; it is ignored, and start estimates use the durations of "
            "similar completed AppWrappers instead"))
    return DeclaredDuration(value, "annotation", limit)
