"""The shipped examples are valid AppWrappers with the pods their comments promise."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dispatcher.admission import queued_from_appwrapper
from dispatcher.api import parse_appwrapper

DEMO = Path(__file__).parents[2] / "examples" / "demo"
GPU = "nvidia.com/gpu"

# name -> (pods, GPUs) as each file's comment states
EXPECTED = {
    "ray-tune": (3, 8), "pytorch-bert": (4, 16), "tf-resnet": (2, 16), "xgboost-higgs": (2, 4),
    "mxnet-mnist": (4, 4), "jax-gemma": (2, 8), "batch-eval": (4, 8),
}


@pytest.mark.parametrize("path", sorted(DEMO.glob("*.yaml")), ids=lambda p: p.name)
def test_demo_example(path: Path) -> None:
    aw = parse_appwrapper(yaml.safe_load(path.read_text()))
    queued = queued_from_appwrapper(aw, 0.0)
    assert queued.invalid is None
    pods = sum(g.pod_set.count for g in queued.gang)
    gpus = sum(g.pod_set.count * g.pod_set.request.get(GPU, 0) for g in queued.gang)
    assert (pods, gpus) == EXPECTED[aw.metadata.name]


def test_one_example_per_wrapped_kind() -> None:
    kinds = {yaml.safe_load(p.read_text())["spec"]["resources"]["GenericItems"][0]
             ["generictemplate"]["kind"] for p in DEMO.glob("*.yaml")}
    assert kinds == {"RayCluster", "PyTorchJob", "TFJob", "XGBoostJob", "MXJob", "JAXJob", "Job"}
