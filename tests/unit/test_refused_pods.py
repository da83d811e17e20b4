"""A pod Kubernetes would refuse (a fractional GPU, a GPU request other than its limit or
without one, a CPU request above its limit) makes its AppWrapper invalid, with the API
server's reason: in `dispatcher plan`, in the webhook and in the controller, which all
review through dispatcher.review."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.controller.webhook.admission_review import core_problems
from dispatcher.review import review

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

REFUSED = {
    "fractional-gpu": ({"limits": {"nvidia.com/gpu": 1.5}},
                       "resources.limits[nvidia.com/gpu]: Invalid value: '1.5': must be an "
                       "integer"),
    "fractional-gpu-request": ({"requests": {"nvidia.com/gpu": "500m"},
                                "limits": {"nvidia.com/gpu": "500m"}},
                               "resources.requests[nvidia.com/gpu]: Invalid value: '500m': "
                               "must be an integer"),
    "gpu-request-not-limit": ({"requests": {"nvidia.com/gpu": 1},
                               "limits": {"nvidia.com/gpu": 2}},
                              "resources.requests[nvidia.com/gpu]: Invalid value: '1': must be "
                              "equal to nvidia.com/gpu limit of 2"),
    "gpu-request-no-limit": ({"requests": {"nvidia.com/gpu": 1}},
                             "resources.limits[nvidia.com/gpu]: Required value: Limit must be "
                             "set for non overcommitable resources"),
    "cpu-above-limit": ({"requests": {"cpu": "2"}, "limits": {"cpu": "1"}},
                        "resources.requests[cpu]: Invalid value: '2': must be less than or "
                        "equal to cpu limit of 1"),
}

ACCEPTED = {
    "gpu-limit-only": {"limits": {"nvidia.com/gpu": 2}},
    "gpu-equal": {"requests": {"nvidia.com/gpu": 2}, "limits": {"nvidia.com/gpu": 2}},
    "cpu-below-limit": {"requests": {"cpu": "500m", "memory": "1Gi"},
                        "limits": {"cpu": "1", "memory": "2Gi"}},
    "fractional-cpu": {"requests": {"cpu": "1.5"}},
}


def wrapper(name: str, resources: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": "team-a"},
            "spec": {"resources": {"GenericItems": [{"generictemplate": {
                "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
                "spec": {"template": {"spec": {"containers": [
                    {"name": "main", "resources": resources}]}}}}}]}}}


@pytest.mark.parametrize("case", REFUSED)
def test_the_controller_and_the_webhook_refuse_with_the_api_servers_reason(case: str) -> None:
    resources, reason = REFUSED[case]
    aw = wrapper(case, resources)
    for problems in (review(aw, 0.0).problems, core_problems(aw)):
        assert any(reason in p and "containers[0] (main)" in p for p in problems), problems


@pytest.mark.parametrize("case", ACCEPTED)
def test_what_kubernetes_accepts_stays_valid(case: str) -> None:
    assert review(wrapper(case, ACCEPTED[case]), 0.0).problems == []


def test_plan_calls_each_such_appwrapper_invalid_and_says_why(tmp_path: Path) -> None:
    wrappers = tmp_path / "refused.yaml"
    wrappers.write_text(yaml.safe_dump_all([wrapper(c, r) for c, (r, _) in REFUSED.items()]))
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dispatcher"), "plan", "-o", "json",
         "--cluster", str(EXAMPLES / "plan" / "cluster.yaml"), str(wrappers)],
        capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    decisions = {d["name"]: d for d in yaml.safe_load(done.stdout)["decisions"]}
    for case, (_, reason) in REFUSED.items():
        assert decisions[case]["decision"] == "invalid"
        assert reason in decisions[case]["message"], decisions[case]["message"]
