"""Names and label values shared by every registry of the process.

Labels are bounded: values outside a known set (a status written by another controller,
a verb made up by a client) are counted as ``Other``, never as themselves.
"""

from __future__ import annotations

from collections.abc import Iterable

PREFIX = "dispatcher"
OTHER = "Other"
NONE = "None"  # an AppWrapper with no state or no condition yet


def bounded(value: str, known: Iterable[str], empty: str = NONE) -> str:
    if not value:
        return empty
    return value if value in known else OTHER
