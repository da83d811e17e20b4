"""An estimate in words, for status messages: "estimated start in about 2 h 10 m (at
14:32 UTC)"."""

from __future__ import annotations

from dispatcher.eta.replay import Estimate, Outcome
from dispatcher.queue.reservation import clock_time

# An estimate this close is "now": the next admission cycle dispatches it.
SOON_SECONDS = 30.0


def about(seconds: float) -> str:
    """A rounded span: "less than a minute", "25 m", "2 h 10 m", "3 d 4 h"."""
    if seconds < 60:
        return "less than a minute"
    if seconds < 86400 - 30:
        m = round(seconds / 60)
        if m < 60:
            return f"{m} m"
        return f"{m // 60} h {m % 60} m" if m % 60 else f"{m // 60} h"
    h = round(seconds / 3600)
    return f"{h // 24} d {h % 24} h" if h % 24 else f"{h // 24} d"


def describe(estimate: Estimate, now: float) -> str:
    """The words for a status message; "" when the wait's own reason says it all (it
    never fits, or it is invalid)."""
    at = estimate.at
    if estimate.outcome == "start" and at is not None:
        if at - now <= SOON_SECONDS:
            return "estimated start: at the next admission cycle"
        span = about(at - now)
        return (f"estimated start in {'' if span.startswith('less') else 'about '}{span} "
                f"(at {clock_time(at, now)})")
    if estimate.outcome == "beyond" and at is not None:
        return f"no start estimated within {about(at - now)}"
    if estimate.outcome == "budget" and at is not None:
        return f"estimated start: not before {clock_time(at, now)}"
    if estimate.outcome == "stuck":
        return f"no start foreseen: {estimate.reason}"
    return ""


# How each kind of estimate begins, in `describe`'s words.
_OPENINGS: tuple[tuple[str, Outcome], ...] = (
    ("estimated start in ", "start"), ("estimated start: at the next", "start"),
    ("no start estimated within ", "beyond"), ("estimated start: not before ", "budget"),
    ("no start foreseen: ", "stuck"),
)


def outcome_of(words: str) -> Outcome | None:
    """Which kind of estimate `describe` put in these words (None: not an estimate)."""
    return next((outcome for opening, outcome in _OPENINGS if words.startswith(opening)), None)
