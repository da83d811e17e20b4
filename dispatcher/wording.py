"""How numbers are written in what users read: a count with its noun ("1 pod", "3 pods")
and a duration, one way everywhere (kubectl's: "45s", "5m3s", "12m", "2h10m", "4h", "3d4h");
and text a tenant wrote, made safe to print on a terminal (`printable`).
"""

from __future__ import annotations

import math
import re
import unicodedata

MINUTE, HOUR, DAY = 60, 3600, 86400


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`noun` for one, else `nouns` (default: `noun` + "s")."""
    return noun if count == 1 else (nouns or f"{noun}s")


def counted(count: int, noun: str, nouns: str | None = None) -> str:
    """ "1 pod", "0 pods"."""
    return f"{count} {plural(count, noun, nouns)}"


def all_of(count: int, noun: str) -> str:
    """A whole gang: "all 3 pods", but "its pod" for one."""
    return f"its {noun}" if count == 1 else f"all {count} {noun}s"


def span(seconds: float) -> str:
    """A duration to the second, then cut to its two largest units, seconds shown only
    under ten minutes, as kubectl writes ages; a unit of 0 is left out ("4h"). Negative
    is 0s; NaN (no value) is "-"."""
    if math.isnan(seconds):
        return "-"
    s = max(0, round(seconds))
    if s < MINUTE:
        return f"{s}s"
    if s < 10 * MINUTE:
        return _two(s // MINUTE, "m", s % MINUTE, "s")
    if s < HOUR:
        return f"{s // MINUTE}m"
    if s < DAY:
        return _two(s // HOUR, "h", s % HOUR // MINUTE, "m")
    return _two(s // DAY, "d", s % DAY // HOUR, "h")


def _two(big: int, big_unit: str, small: int, small_unit: str) -> str:
    return f"{big}{big_unit}{small}{small_unit}" if small else f"{big}{big_unit}"


# An ANSI/VT escape sequence (CSI, OSC, or a single-character one), removed whole.
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-_])")


def printable(text: str) -> str:
    """`text` without what a terminal would act on: escape sequences are removed, other
    control and format characters (a bidi override, a carriage return) are too, and line
    breaks and tabs become spaces, so a message or an annotation a tenant wrote prints as
    the words it holds, on its own line. Every printer of a tenant's text uses it."""
    text = _ESCAPE.sub("", text)
    return "".join(" " if c in "\t\n\r\v\f" else c for c in text
                   if c in "\t\n\r\v\f" or unicodedata.category(c) not in ("Cc", "Cf"))
