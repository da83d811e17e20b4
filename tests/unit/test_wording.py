"""Counts and durations, written one way in every message, table and log."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.wording import all_of, counted, span

DISPATCHER = Path(__file__).resolve().parents[2] / "dispatcher"


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (-5, "0s"), (59.4, "59s"), (59.6, "1m"), (61, "1m1s"), (120, "2m"),
    (601, "10m"), (3599, "59m"), (3600, "1h"), (3 * 3600 + 120, "3h2m"),
    (5280, "1h28m"), (4 * 3600, "4h"), (86400, "1d"), (2 * 86400 + 3600, "2d1h"),
    (math.nan, "-"),
])
def test_span(seconds: float, text: str) -> None:
    assert span(seconds) == text


@given(st.floats(min_value=0, max_value=400 * 86400))
def test_a_span_is_at_most_two_units_in_kubectls_order(seconds: float) -> None:
    assert re.fullmatch(r"\d+s|\d+m(\d+s)?|\d+h(\d+m)?|\d+d(\d+h)?", span(seconds))


def test_counts_agree_with_their_noun() -> None:
    assert [counted(n, "pod") for n in (0, 1, 2)] == ["0 pods", "1 pod", "2 pods"]
    assert counted(1, "replica set", "replica sets") == "1 replica set"
    assert [all_of(n, "pod") for n in (1, 3)] == ["its pod", "all 3 pods"]


def test_no_message_writes_a_duration_another_way() -> None:
    """"1 h 28 m", "about 2 h 10 m" and "60 s" were three more ways: every duration in
    words goes through span (a count of seconds with a space, e.g. in --help, is a value
    to type, not a duration read back)."""
    spaced = re.compile(r"""\{[^{}]*\}\s?(h|m|d)\s\{|\{[^{}]*:[^{}]*f\}\s(s|h|m)\b""")
    found = [f"{path.relative_to(DISPATCHER)}:{n}: {line.strip()}"
             for path in sorted(DISPATCHER.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), start=1)
             if spaced.search(line)]
    assert found == []
