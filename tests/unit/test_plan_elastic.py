"""`dispatcher plan` with elastic gangs: queued ones at their minimum, admitted ones grown
or shrunk at the size their status records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher.api.labels import APPWRAPPER_LABEL
from dispatcher.cli import main

from .elastic_world import pytorchjob
from .test_plan import node, plan_json, write


def running(name: str, workers: int, *, low: int, high: int) -> dict[str, Any]:
    aw = pytorchjob(name, low=low, high=high)
    aw["status"] = {"state": "Running", "queuejobstate": "Running", "elasticPods": [workers]}
    return aw


def job_pod(aw: str, name: str, node_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "test", "labels": {APPWRAPPER_LABEL: aw}},
            "spec": {"nodeName": node_name, "containers": [{"name": "pytorch", "resources": {
                "limits": {"nvidia.com/gpu": 8, "cpu": "1", "memory": "1Gi"}}}]},
            "status": {"phase": "Running"}}


def test_plan_grows_an_admitted_elastic_gang_into_free_nodes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "c.yaml", *(node(f"n{i}") for i in range(4)),
                    job_pod("e", "e-master-0", "n0"), job_pod("e", "e-worker-0", "n1"))
    wrappers = write(tmp_path, "a.yaml", running("e", 1, low=1, high=4))
    out = plan_json(capsys, "--cluster", cluster, wrappers)
    (scale,) = out["scaling"]
    assert (scale["name"], scale["reason"], scale["after"]) == ("e", "ScaledOut", [3])
    assert scale["message"].startswith("scaled out to 3 workers (from 1 worker)")


def test_plan_admits_a_queued_elastic_gang_at_its_minimum_and_shrinks_for_priority(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "c.yaml", *(node(f"n{i}") for i in range(4)),
                    job_pod("e", "e-master-0", "n0"),
                    *(job_pod("e", f"e-worker-{i}", f"n{i + 1}") for i in range(3)))
    urgent = pytorchjob("urgent", low=1, high=1, priority=10, replicas=1)
    wrappers = write(tmp_path, "a.yaml", running("e", 3, low=1, high=3), urgent)
    assert main(["plan", "--policy", "priority", "--cluster", cluster, wrappers]) == 0
    table = capsys.readouterr().out
    assert "dispatch after scaling in test/e to 1 worker" in table
    assert "test/e: scaled in to 1 worker (from 3 workers) to make room for test/urgent" in table
    out = plan_json(capsys, "--policy", "priority", "--cluster", cluster, wrappers)
    (d,) = out["decisions"]
    # The operator removes the highest indexes: workers 2 and 1, on n3 and n2.
    assert {p["node"] for p in d["placements"]} == {"n2", "n3"}
    assert d["scalesIn"][0]["after"] == [1]
    assert d["scalesIn"][0]["removes"] == ["e-worker-2", "e-worker-1"]
