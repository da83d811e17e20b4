"""The fault-tolerance settings of an AppWrapper written as v1beta2.

Codeflare's AppWrapper controller reads them from annotations
``workload.codeflare.dev.appwrapper/<name>``, each a Go duration (``90s``, ``5m``,
``1h30m``) but ``retryLimit`` (a count), over the installation's defaults; no grace period
may exceed the installation's maximum (``gracePeriodMaximum``), nor the success TTL the
installation's own: a larger one is cut to it.
An annotation that cannot be read is ignored (its default applies) with a warning saying
which and why.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dispatcher.api.conversion import ConversionError, v1beta2_fields

PREFIX = "workload.codeflare.dev.appwrapper/"
_ANNOTATIONS = {
    "admission_grace": "admissionGracePeriodDuration",
    "warmup_grace": "warmupGracePeriodDuration",
    "failure_grace": "failureGracePeriodDuration",
    "retry_pause": "retryPausePeriodDuration",
    "retry_limit": "retryLimit",
    "deletion_on_failure_grace": "deletionOnFailureGracePeriodDuration",
    "forceful_deletion_grace": "forcefulDeletionGracePeriodDuration",
    "success_ttl": "successTTLDuration",
}


@dataclass(frozen=True)
class FaultTolerance:
    """How a wrapper written as v1beta2 is watched and reset, in seconds (the
    installation's defaults are codeflare's)."""

    admission_grace: float = 60.0  # its pods not all created (Pending) this long: unhealthy
    warmup_grace: float = 300.0  # its pods not all running this long: unhealthy
    failure_grace: float = 60.0  # unhealthy this long: reset (or Failed)
    retry_pause: float = 90.0  # between the teardown of a reset and the new items
    retry_limit: int = 3  # resets before Failed
    deletion_on_failure_grace: float = 0.0  # Failed this long before its items go
    forceful_deletion_grace: float = 600.0  # items still there this long: deleted at once
    success_ttl: float = 7 * 86400.0  # Succeeded this long: the wrapper is deleted
    grace_period_maximum: float = 86400.0  # no grace period above this


DEFAULT_FAULT_TOLERANCE = FaultTolerance()


def annotation_of(setting: str) -> str:
    """The annotation that sets `setting` (a field of FaultTolerance)."""
    return PREFIX + _ANNOTATIONS[setting]


def fault_tolerance(annotations: Mapping[str, str],
                    base: FaultTolerance = DEFAULT_FAULT_TOLERANCE
                    ) -> tuple[FaultTolerance, list[str]]:
    """`base` with the wrapper's annotations applied, each grace period capped by
    ``base.grace_period_maximum``, and a warning for each annotation that is ignored."""
    warnings: list[str] = []
    overrides: dict[str, Any] = {}
    for setting, name in _ANNOTATIONS.items():
        raw = annotations.get(PREFIX + name)
        if raw is None:
            continue
        where = f"metadata.annotations[{PREFIX + name!r}]"
        if setting == "retry_limit":
            if re.fullmatch(r"\s*\d+\s*", raw):
                overrides[setting] = int(raw)
            else:
                warnings.append(f"{where}: {raw!r} is not a whole number ≥ 0; the "
                                f"installation's {base.retry_limit} applies")
            continue
        seconds = go_duration(raw)
        if seconds is None or seconds < 0:
            warnings.append(f"{where}: {raw!r} is not a duration ≥ 0 such as 90s, 5m or "
                            f"1h30m; the installation's {_go(getattr(base, setting))} applies")
            continue
        # The success TTL is the installation's at most; any other, its maximum.
        cap = base.success_ttl if setting == "success_ttl" else base.grace_period_maximum
        if seconds > cap:
            warnings.append(f"{where}: {raw} is above the installation's maximum "
                            f"{_go(cap)}, which applies")
            seconds = cap
        overrides[setting] = seconds
    return replace(base, **overrides), warnings


def v1beta2_fault_tolerance(annotations: Mapping[str, str],
                            base: FaultTolerance = DEFAULT_FAULT_TOLERANCE
                            ) -> tuple[FaultTolerance, list[str]] | None:
    """:func:`fault_tolerance` for a wrapper written as v1beta2 with these annotations
    (None: written as v1beta1, MCAD's rules apply)."""
    try:
        written_as_v1beta2 = v1beta2_fields(annotations).written_as_v1beta2
    except ConversionError:
        return None
    return fault_tolerance(annotations, base) if written_as_v1beta2 else None


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0,
          "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def go_duration(text: str) -> float | None:
    """Seconds in a Go duration (``time.ParseDuration``: ``1h30m``, ``-2s``, ``0``), or
    None when `text` is not one."""
    text = text.strip()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text[1:] if text[:1] in ("+", "-") else text
    if body == "0":
        return 0.0
    if not body:
        return None
    total, at = 0.0, 0
    for part in _PART.finditer(body):
        if part.start() != at:
            return None
        total += float(part.group(1)) * _UNITS[part.group(2)]
        at = part.end()
    if at != len(body) or not math.isfinite(total):
        return None
    return sign * total


def _go(seconds: float) -> str:
    """`seconds` as a short Go duration (``90s``, ``5m0s`` is said ``5m``)."""
    if seconds and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"
