"""Several clusters seen from outside: `dispatcher plan --cluster NAME=FILE ...` says which
worker a manager would send each AppWrapper to, or why none can; `dispatcher queue` in a
manager cluster shows where each went and, for the rest, the manager's reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher import visibility
from dispatcher.cli import main
from dispatcher.fleet import CLUSTER_SELECTOR_ANNOTATION

from .quota_world import subtree
from .test_plan import aw, node, plan_json, pod, write


def test_plan_over_worker_snapshots_sends_each_to_a_worker_or_names_each_workers_best(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    w1 = write(tmp_path, "w1.yaml", node("a1"), node("a2"), pod("busy", "a2", 6))
    w2 = write(tmp_path, "w2.yaml", node("b1", gpu=4))
    eu = aw("eu", 1, 4, created="2027-01-01T00:00:03Z")
    eu["metadata"]["annotations"] = {CLUSTER_SELECTOR_ANNOTATION: "region=eu"}
    wrappers = write(tmp_path, "aws.yaml", aw("big", 1, 8, created="2027-01-01T00:00:00Z"),
                     aw("small", 1, 2, created="2027-01-01T00:00:01Z"),
                     aw("huge", 2, 8, created="2027-01-01T00:00:02Z"), eu)
    result = plan_json(capsys, "--cluster", f"w1={w1}", "--cluster", f"w2={w2}",
                       "--worker-labels", "w2=region=eu", "--now", "2027-01-02T00:00:00Z",
                       wrappers)
    sent = {a["name"]: a for a in result["appwrappers"]}
    assert sent["big"]["cluster"] == "w1" and sent["big"]["nodes"] == ["a1"]
    assert sent["small"]["cluster"] == "w1"  # best fit: w1's a2 has 2 left, w2 has 4
    assert sent["huge"]["cluster"] is None
    # Each worker's best once big and small took theirs: w1 none, w2 its 4.
    assert "w1: 0 of 8 nvidia.com/gpu free on one node" in sent["huge"]["message"]
    assert "w2: 4 of 8 nvidia.com/gpu free on one node" in sent["huge"]["message"]
    assert sent["eu"]["cluster"] == "w2"
    assert main(["plan", "--cluster", f"w1={w1}", "--cluster", f"w2={w2}", "--now",
                 "2027-01-02T00:00:00Z", wrappers]) == 0
    table = capsys.readouterr().out
    # Without w2's labels, eu matches no worker.
    assert table.splitlines()[0] == "2 worker clusters (w1, w2): 2 sent, 2 wait"
    assert "w2: its labels do not match region=eu" in table
    assert "team/huge" in table and "CLUSTER" in table


def gold(name: str, gpus: int, created: str) -> dict[str, Any]:
    wrapper = aw(name, 1, gpus, created=created)
    wrapper["metadata"]["labels"] = {"team": "gold"}
    return wrapper


def test_plan_over_worker_snapshots_honours_each_workers_quota_and_what_is_admitted_there(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trees = [subtree("root", "team", [("root", {"nvidia.com/gpu": 16}, False)]),
             subtree("kids", "team", [("gold", {"nvidia.com/gpu": 8}, True)], parent="root")]
    running = gold("local", 8, "2027-01-01T00:00:00Z")
    running["status"] = {"state": "Running"}
    queued_there = gold("queued-there", 8, "2027-01-01T00:00:00Z")  # counts for nothing
    w1 = write(tmp_path, "w1.yaml", node("a1"), node("a2"), *trees, running, queued_there)
    w2 = write(tmp_path, "w2.yaml", node("b1"), node("b2"), *trees)
    wrappers = write(tmp_path, "aws.yaml", gold("a", 8, "2027-01-01T00:00:01Z"),
                     gold("b", 8, "2027-01-01T00:00:02Z"))
    result = plan_json(capsys, "--cluster", f"w1={w1}", "--cluster", f"w2={w2}", "--now",
                       "2027-01-02T00:00:00Z", wrappers)
    sent = {a["name"]: a for a in result["appwrappers"]}
    assert sent["a"]["cluster"] == "w2"  # w1 has the room, its gold is used by local
    assert sent["b"]["cluster"] is None
    for w in ("w1", "w2"):
        assert (f"{w}: its quota: gold (tree team) would use 16 of its 8 nvidia.com/gpu"
                in sent["b"]["message"])


@pytest.mark.parametrize("argv, error", [
    (["--cluster", "w1={f}", "--cluster", "{f}"], "name every --cluster"),
    (["--cluster", "w1={f}", "--cluster", "w1={f}"], "each worker cluster is named once"),
    (["--cluster", "w1={f}", "--worker-labels", "w9=a=b"], "names w9, not given"),
    (["--cluster", "w1={f}", "--worker-labels", "w1=region"], "is not key=value"),
    (["--cluster", "{f}", "--worker-labels", "w1=a=b"], "goes with --cluster NAME=FILE"),
])
def test_plan_over_worker_snapshots_says_what_to_fix(
        argv: list[str], error: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
        ) -> None:
    f = write(tmp_path, "w.yaml", node("n1"))
    wrappers = write(tmp_path, "aws.yaml", aw("a", 1, 1))
    assert main(["plan", *[a.format(f=f) for a in argv], wrappers]) == 2
    assert error in capsys.readouterr().err


def test_queue_in_a_manager_shows_each_wrappers_cluster_and_the_managers_reason() -> None:
    sent = aw("sent", 1, 8)
    sent["status"] = {"state": "Pending", "workerCluster": "w1"}
    waiting = aw("waiting", 1, 16)
    message = ("no worker cluster can take the whole gang now: w1: 8 of 16 nvidia.com/gpu "
               "free on one node; w2: 8 of 16 nvidia.com/gpu free on one node")
    waiting["status"] = {"message": message}
    rows = visibility.pending_queue([sent, waiting], 0.0)
    table = visibility.to_table(rows).splitlines()
    header = table[1].split()
    assert "CLUSTER" in header
    by_name = {line.split()[1]: line for line in table[2:]}
    assert by_name["team/sent"].split()[header.index("CLUSTER")] == "w1"
    assert message in by_name["team/waiting"]


def test_a_worker_snapshot_with_an_unreadable_appwrapper_says_which(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = aw("bad", 1, 8)
    bad["spec"]["resources"] = "not a list"
    w1 = write(tmp_path, "w1.yaml", node("a1"), bad)
    wrappers = write(tmp_path, "aws.yaml", aw("a", 1, 1))
    assert main(["plan", "--cluster", f"w1={w1}", wrappers]) == 2
    err = capsys.readouterr().err
    assert f"{w1}, document 2: not a usable AppWrapper" in err
