"""However large the AppWrapper, the message written back stays small (issue 11)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.admission import queued_from_appwrapper
from dispatcher.api import (
    MAX_ITEMS,
    MAX_MESSAGE_CHARS,
    MAX_PROBLEM_CHARS,
    InvalidSpec,
    cap_problems,
    parse_appwrapper,
)
from dispatcher.cli import main


def aw(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": "big", "namespace": "team"},
            "spec": {"resources": {"GenericItems": items}}}


def huge_invalid_appwrapper(items: int = 5000) -> dict[str, Any]:
    """About 1 MB: 5,000 items, each invalid twice over, and a kind of 100,000 characters."""
    wrapped: list[dict[str, Any]] = [
        {"replicas": -1, "generictemplate": {"apiVersion": "v1", "kind": "Pod",
                                             "metadata": {"name": f"Pod_{i}" + "x" * 150}}}
        for i in range(items)]
    wrapped.append({"generictemplate": {"apiVersion": "v1", "kind": "K" * 100_000,
                                        "metadata": {"name": "k"}}})
    return aw(wrapped)


def test_a_megabyte_of_problems_makes_a_short_message() -> None:
    doc = huge_invalid_appwrapper()
    assert len(json.dumps(doc)) > 1_000_000
    with pytest.raises(InvalidSpec) as info:
        parse_appwrapper(doc)
    error = info.value
    assert error.count == 10_001  # twice per item, and once for their number
    assert len(str(error)) <= MAX_MESSAGE_CHARS
    assert len("; ".join(error.problems)) <= MAX_MESSAGE_CHARS  # as the controller joins them
    assert error.problems[0].startswith(
        f"spec.resources.GenericItems: 5001 items, more than the {MAX_ITEMS} an AppWrapper "
        "may wrap")
    assert error.problems[1].startswith("spec.resources.GenericItems[0].replicas: must be ≥ 0")
    assert error.problems[-1].startswith("… and ")
    assert error.problems[-1].endswith(" more problems")
    shown = len(error.problems) - 1
    assert error.problems[-1] == f"… and {error.count - shown} more problems"


def test_an_enormous_value_is_cut_in_its_line() -> None:
    kind = "K" * 100_000
    queued = queued_from_appwrapper(parse_appwrapper(aw([
        {"generictemplate": {"apiVersion": "example.com/v1", "kind": kind,
                             "metadata": {"name": "k"}}}])), 0.0)
    assert queued.invalid is not None
    assert len(queued.invalid) <= MAX_PROBLEM_CHARS
    assert queued.invalid.startswith("spec.resources.GenericItems[0]: kind KKK")
    assert queued.invalid.endswith("…")


def test_plan_prints_the_capped_message(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    cluster, wrappers = tmp_path / "c.yaml", tmp_path / "a.yaml"
    cluster.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Node",
                                       "metadata": {"name": "n"},
                                       "status": {"allocatable": {"cpu": "8"}}}))
    wrappers.write_text(json.dumps(huge_invalid_appwrapper(500)))  # YAML reads slowly
    assert main(["plan", "-o", "json", "--cluster", str(cluster), str(wrappers)]) == 2
    (decision,) = json.loads(capsys.readouterr().out)["decisions"]
    assert decision["decision"] == "invalid"
    assert len(decision["message"]) <= MAX_MESSAGE_CHARS
    assert decision["message"].endswith(" more problems")


@given(st.lists(st.text(max_size=900), max_size=60),
       st.integers(min_value=100, max_value=4000), st.integers(min_value=40, max_value=600))
def test_capped_lines_fit_and_count_the_rest(lines: list[str], total: int, each: int) -> None:
    capped = cap_problems(lines, total=total, each=each)
    assert len("; ".join(capped)) <= total
    assert all(len(line) <= each for line in capped if not line.startswith("… and "))
    more = re.fullmatch(r"… and (\d+) more problems?", capped[-1]) if capped else None
    if more and len(capped) <= len(lines) and capped[-1] != lines[len(capped) - 1]:
        assert len(capped) - 1 + int(more.group(1)) == len(lines)
    else:
        assert len(capped) == len(lines)
