"""MCAD's own AppWrappers: every manifest of ../shared/conformance/mcad-v1beta1 (or
$MCAD_V1BETA1) reaches the decision its expected.tsv gives.

The corpus is other projects' files, read where it lies, never copied here. As its
README says, each file is planned on its own (`dispatcher plan --cluster cluster.yaml
-o json FILE`) against the snapshot cluster, with the default policy and allow-list.
"""

from __future__ import annotations

import csv
import json
from typing import Any

import pytest

from dispatcher.api import MAX_MESSAGE_CHARS
from dispatcher.cli import main
from tests.shared_files import MCAD_V1BETA1, require

CORPUS = MCAD_V1BETA1
require(CORPUS / "expected.tsv", "MCAD's AppWrappers (expected.tsv, cluster.yaml, manifests/)",
        "MCAD_V1BETA1")


def _expected() -> list[dict[str, str]]:
    with (CORPUS / "expected.tsv").open(newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


ROWS = _expected()

# The corpus README's reasons MCAD itself refuses or fails its four invalid manifests for.
MCAD_REFUSALS = (
    "spec.resources.GenericItems: must be a list",  # a mapping where the list belongs
    "spec.resources.Items: MCAD's old list of items",  # the field MCAD removed
    "must be in the AppWrapper's namespace",  # an item in another namespace
)


def test_the_corpus_is_all_there() -> None:
    assert len(ROWS) == 51
    listed = {row["file"] for row in ROWS}
    assert listed == {p.name for p in (CORPUS / "manifests").iterdir()}
    assert {row["decision"] for row in ROWS} == {"dispatch", "wait", "invalid"}


@pytest.mark.parametrize("row", ROWS, ids=[row["file"] for row in ROWS])
def test_each_mcad_manifest_gets_its_expected_decision(
        row: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    # A file whose one AppWrapper is invalid: nothing can be dispatched, exit status 2.
    assert main(["plan", "-o", "json", "--cluster", str(CORPUS / "cluster.yaml"),
                 str(CORPUS / "manifests" / row["file"])]) == (
        2 if row["decision"] == "invalid" else 0)
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    (decision,) = out["decisions"]
    assert (decision["namespace"], decision["name"]) == (row["namespace"], row["name"])
    assert decision["decision"] == row["decision"], decision["message"]
    assert 0 < len(decision["message"]) <= MAX_MESSAGE_CHARS
    if row["decision"] == "dispatch":
        assert decision["reason"] == "Dispatch"
        assert all(p["node"] for p in decision["placements"])
    elif row["decision"] == "invalid":
        assert any(reason in decision["message"] for reason in MCAD_REFUSALS), \
            decision["message"]
    elif row["decision"] == "wait":
        # Every wait of the corpus needs more than a node has, or a label no node has:
        # never room that is merely taken (the snapshot cluster runs nothing).
        assert decision["reason"] == "NeverFits", decision["message"]
