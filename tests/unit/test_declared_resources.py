"""custompodresources may declare fewer pods or less cpu than an object of a known kind
will ask (MCAD's own suites do), but never less of a GPU or another extended resource: the
gang is charged to its quota and held room for what is declared."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.review import review

from .fake_kube import FakeKube
from .test_runtime import Clock, aw_status, node, run, started


def pod(gpus: int, cpu: str = "1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "big"},
            "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {
                "requests": {"cpu": cpu, "nvidia.com/gpu": str(gpus)},
                "limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def job(pods: int, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
            "spec": {"parallelism": pods, "completions": pods, "template": pod(gpus)}}


def wrapper(template: dict[str, Any], custom: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": "aw", "namespace": "team"},
            "spec": {"resources": {"GenericItems": [
                {"generictemplate": template, "custompodresources": custom}]}}}


def test_a_pod_asking_4_gpus_declared_as_1_cpu_is_refused_naming_both_counts() -> None:
    verdict = review(wrapper(pod(4), [{"replicas": 1, "requests": {"cpu": "1"}}]), 0.0)
    assert not verdict.valid
    assert verdict.message == (
        "spec.resources.GenericItems[0]: custompodresources: declares 0 nvidia.com/gpu in "
        "all, but Pod big will create 1 pod asking 4 nvidia.com/gpu in all: correct "
        "custompodresources (replicas and requests of every pod), or remove it to let the "
        "dispatcher count the pods")
    assert verdict.warnings == []  # the refusal says it; no warning repeats it


def test_fewer_pods_with_as_many_gpus_and_less_cpu_is_accepted_as_mcad_does() -> None:
    custom = [{"replicas": 1, "requests": {"cpu": "500m", "nvidia.com/gpu": "6"}}]
    verdict = review(wrapper(job(3, 2), custom), 0.0)
    assert verdict.valid, verdict.message
    assert verdict.queued is not None
    assert [(g.pod_set.count, g.pod_set.request["nvidia.com/gpu"])
            for g in verdict.queued.gang] == [(1, 6)]


def test_an_uncountable_kind_is_taken_at_its_declaration() -> None:
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    allowed = {("example.com", "Widget")}
    assert review(wrapper(widget, [{"replicas": 1, "requests": {"cpu": "1"}}]), 0.0,
                  allowed=allowed).valid


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "example.com/fpga"])
@given(pods=st.integers(1, 4), each=st.integers(1, 8),
       declared_pods=st.integers(0, 4), declared_each=st.integers(0, 8))
def test_a_declaration_is_refused_exactly_when_it_says_less_of_an_extended_resource(
        resource: str, pods: int, each: int, declared_pods: int, declared_each: int) -> None:
    template = job(pods, 0)
    container = template["spec"]["template"]["spec"]["containers"][0]["resources"]
    container["requests"][resource] = container["limits"][resource] = str(each)
    custom = [{"replicas": declared_pods, "requests": {resource: str(declared_each)}}]
    verdict = review(wrapper(template, custom), 0.0)
    short = declared_pods * declared_each < pods * each
    assert verdict.valid is not short
    if short:
        assert (f"declares {declared_pods * declared_each} {resource} in all, but Job train "
                f"will create {pods} pod{'s' if pods > 1 else ''} asking {pods * each} "
                f"{resource} in all") in verdict.message


def test_without_the_webhook_the_controller_fails_it_with_the_same_message() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        obj = wrapper(pod(4), [{"replicas": 1, "requests": {"cpu": "1"}}])
        kube.put(obj)
        d = await started(kube, clock)
        await d.cycle()
        status = aw_status(kube, "aw")
        assert status["state"] == "Failed"
        assert review(obj, 0.0).message in status["message"]
        assert kube.of_kind("Pod") == []

    run(scenario)
