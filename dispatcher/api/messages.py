"""Bounded messages: whatever a user sends, what we write back stays small.

Problems and warnings end up in a status condition, an Event, a webhook answer and
`dispatcher plan`'s output. A huge AppWrapper (thousands of items, a megabyte string
where a kind belongs) must not become a huge status: each line is cut to
MAX_PROBLEM_CHARS and the lines kept fit in MAX_MESSAGE_CHARS, the rest counted.
"""

from __future__ import annotations

from collections.abc import Sequence

from dispatcher.wording import plural

MAX_MESSAGE_CHARS = 2048
MAX_PROBLEM_CHARS = 512
# The widest separator callers join lines with ("; ").
_SEPARATOR = 2
_ELLIPSIS = "…"


def cap_line(line: str, limit: int = MAX_PROBLEM_CHARS) -> str:
    return line if len(line) <= limit else line[: limit - len(_ELLIPSIS)] + _ELLIPSIS


def cap_problems(problems: Sequence[str], total: int = MAX_MESSAGE_CHARS,
                 each: int = MAX_PROBLEM_CHARS, noun: str = "problem") -> list[str]:
    """`problems`, each cut to `each` characters, as many as fit in `total` when joined
    by a separator of up to two characters; a last line says how many `noun`s were left
    out."""
    lines = [cap_line(p, each) for p in problems]
    kept: list[str] = []
    used = 0
    for i, line in enumerate(lines):
        rest = len(lines) - i - 1
        # Room for this line, and for the "and N more" line should a later one not fit.
        tail = len(_more(rest, noun)) + _SEPARATOR if rest else 0
        if used + len(line) + tail > total:
            kept.append(_more(len(lines) - i, noun))
            return kept
        kept.append(line)
        used += len(line) + _SEPARATOR
    return kept


def problems_message(problems: Sequence[str], separator: str = "; ") -> str:
    """One bounded message of all `problems`."""
    return separator.join(cap_problems(problems))


def _more(count: int, noun: str) -> str:
    return f"{_ELLIPSIS} and {count} more {plural(count, noun)}"
