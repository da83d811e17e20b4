"""`dispatcher plan` and `dispatcher simulate` read AppWrappers written as v1beta2 as the
API server would store them: checked in v1beta2 terms, then planned like any other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.api.conversion import to_v1beta2
from dispatcher.simulate.traces import TraceError, read_trace

from .test_plan import aw, node, plan_json, write


def v1beta2(name: str, pods: int, gpus: int, **extra: Any) -> dict[str, Any]:
    written = to_v1beta2(aw(name, pods, gpus))
    del written["metadata"]["annotations"]  # written as v1beta2 (no v1beta1 fields)
    written["metadata"].update(extra)
    return written


def test_plan_takes_v1beta2_and_v1beta1_wrappers_in_one_queue(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "cluster.yaml", node("n1", 8))
    files = write(tmp_path, "aws.yaml", v1beta2("codeflare", 2, 2,
                                                creationTimestamp="2027-01-01T00:00:00Z"),
                  aw("mcad", 2, 4, created="2027-01-01T00:00:01Z"))
    result = plan_json(capsys, "--cluster", cluster, files)
    decisions = {d["name"]: d["decision"] for d in result["decisions"]}
    assert decisions == {"codeflare": "dispatch", "mcad": "wait"}


def test_plan_says_what_is_wrong_with_a_v1beta2_file_in_v1beta2_terms(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = v1beta2("bad", 1, 1)
    bad["spec"]["components"] = []
    cluster = write(tmp_path, "cluster.yaml", node("n1", 8))
    result = plan_json(capsys, "--cluster", cluster, write(tmp_path, "aws.yaml", bad),
                       status=2)
    (decision,) = result["decisions"]
    assert decision["decision"] == "invalid"
    assert "spec.components is empty" in decision["message"]


def test_simulate_traces_take_v1beta2_wrappers(tmp_path: Path) -> None:
    path = tmp_path / "trace.yaml"
    path.write_text(yaml.safe_dump([{"submitTime": 5, "duration": 60,
                                     "appwrapper": v1beta2("codeflare", 3, 2)}]))
    (job,) = read_trace(path).jobs
    assert (job.name, job.pods, job.gpus) == ("team/codeflare", 3, 6)
    bad = v1beta2("bad", 1, 1)
    bad["spec"]["components"][0]["podSets"] = [{"path": "template.spec.template",
                                                "replicas": "many"}]
    path.write_text(yaml.safe_dump([{"submitTime": 5, "duration": 60, "appwrapper": bad}]))
    with pytest.raises(TraceError, match=r"spec\.components\[0\]\.podSets\[0\]\.replicas: "
                                         "must be an integer"):
        read_trace(path)
