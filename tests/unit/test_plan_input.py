"""`dispatcher plan` on input a newcomer gets wrong: a misspelt GenericItems gets a
did-you-mean, an empty file says so and fails; run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DISPATCHER = Path(sys.executable).parent / "dispatcher"
TYPO = """\
apiVersion: workload.codeflare.dev/v1beta1
kind: AppWrapper
metadata: {name: typo}
spec:
  resources:
    GenericItemz:
    - generictemplate: {apiVersion: v1, kind: ConfigMap, metadata: {name: c}}
"""


def plan(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(DISPATCHER), "plan", *map(str, argv)], capture_output=True,
                          text=True, timeout=120, check=False)


def test_a_misspelt_generic_items_is_named_with_the_field_meant(tmp_path: Path) -> None:
    (tmp_path / "typo.yaml").write_text(TYPO)
    done = plan("--cluster", EXAMPLES / "plan" / "cluster.yaml", tmp_path / "typo.yaml")
    assert done.returncode == 2
    assert ("spec.resources.GenericItems is empty: wrap at least one object "
            "(spec.resources.GenericItemz: did you mean GenericItems?)") in done.stdout


@pytest.mark.parametrize("text", ["", "# nothing yet\n", "---\n"])
def test_an_empty_file_is_said_to_be_empty_and_fails(tmp_path: Path, text: str) -> None:
    empty = tmp_path / "wrappers.yaml"
    empty.write_text(text)
    for argv in (("--cluster", EXAMPLES / "plan" / "cluster.yaml", empty),
                 ("--live", "-f", empty)):
        done = plan(*argv)
        assert done.returncode == 2, done
        assert done.stdout == ""
        assert done.stderr == (f"dispatcher plan: {empty}: no document in it (the file is "
                               "empty): give the file of the AppWrappers to plan\n")


@pytest.mark.parametrize("text", ["", "# nodes later\n", "---\n"])
@pytest.mark.parametrize("named", [False, True], ids=["one", "worker"])
def test_an_empty_cluster_file_is_said_to_be_empty_and_fails(tmp_path: Path, text: str,
                                                              named: bool) -> None:
    """Not a cluster of no nodes, where every AppWrapper would never fit."""
    empty = tmp_path / "cluster.yaml"
    empty.write_text(text)
    cluster = f"w1={empty}" if named else str(empty)
    done = plan("--cluster", cluster, EXAMPLES / "plan" / "appwrappers.yaml")
    assert done.returncode == 2, done
    assert done.stdout == ""
    assert done.stderr == (f"dispatcher plan: {empty}: no document in it (the file is "
                           "empty): give a cluster snapshot (kubectl get nodes,pods -A -o "
                           "yaml > FILE)\n")
