"""An estimate in words, for status messages: "estimated start in about 2h10m (at
14:32 UTC)"."""

from __future__ import annotations

from dispatcher.eta.replay import Estimate, Outcome
from dispatcher.queue.reservation import clock_time
from dispatcher.wording import DAY, HOUR, MINUTE, span

# An estimate this close is "now": the next admission cycle dispatches it.
SOON_SECONDS = 30.0


def about(seconds: float) -> str:
    """A span rounded to the minute, to the hour beyond a day: "less than a minute",
    "25m", "2h10m", "3d4h"."""
    if seconds < MINUTE:
        return "less than a minute"
    if seconds < DAY - MINUTE / 2:
        return span(round(seconds / MINUTE) * MINUTE)
    return span(round(seconds / HOUR) * HOUR)


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
