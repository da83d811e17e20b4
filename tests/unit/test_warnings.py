"""What MCAD accepts silently and the dispatcher accepts too, but tells the user about."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.admission import queued_from_appwrapper
from dispatcher.api import parse_appwrapper
from dispatcher.kinds.checks import warnings


def aw(items: list[dict[str, Any]], **scheduling: Any) -> Any:
    return parse_appwrapper({
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": "a", "namespace": "team"},
        "spec": {"schedulingSpec": scheduling, "resources": {"GenericItems": items}}})


def job(parallelism: int, name: str = "train") -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": parallelism, "template": {"spec": {"containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": 8}}}]}}}}


def declared(pods: int) -> list[dict[str, Any]]:
    return [{"replicas": pods, "requests": {"nvidia.com/gpu": 8}}]


@pytest.mark.parametrize("growth", ["Exponential", "quadratic", ""])
def test_an_unknown_growth_type_is_accepted_as_no_growth_with_a_warning(growth: str) -> None:
    wrapper = aw([{"generictemplate": job(1)}], requeuing={"growthType": growth})
    assert wrapper.spec.schedulingSpec.requeuing.growth == "none"
    (warning,) = warnings(wrapper)
    assert warning == (f"spec.schedulingSpec.requeuing.growthType: {growth!r} is not "
                       "exponential, linear or none; the wait before a requeue will not grow "
                       "(as in MCAD, which reads any other value as no growth)")


@pytest.mark.parametrize("growth", ["exponential", "linear", "none"])
def test_known_growth_types_say_nothing(growth: str) -> None:
    assert warnings(aw([{"generictemplate": job(1)}], requeuing={"growthType": growth})) == []


def test_custompodresources_fewer_than_the_job_runs_is_admitted_as_declared() -> None:
    # Fewer pods, as many GPUs: MCAD's own suites declare so (less cpu, fewer pods).
    wrapper = aw([{"generictemplate": job(3), "custompodresources": [
        {"replicas": 1, "requests": {"nvidia.com/gpu": 24}}]}])
    (warning,) = warnings(wrapper)
    assert warning == (
        "spec.resources.GenericItems[0].custompodresources: declares 1 pod, but Job 'train' "
        "will create 3 pods; the dispatcher reserves room for the 1 declared, as MCAD does, "
        "and charges the quota what the pods really take: correct custompodresources, or "
        "remove it to let the dispatcher count the pods")
    # MCAD's semantics: the declaration is what is admitted.
    assert queued_from_appwrapper(wrapper, 0).invalid is None
    assert sum(g.pod_set.count for g in queued_from_appwrapper(wrapper, 0).gang) == 1


def test_a_multi_template_mismatch_shows_each_set() -> None:
    ray = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "r"},
           "spec": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "h"}]}}},
                    "workerGroupSpecs": [{"groupName": "gpu", "replicas": 4, "template": {
                        "spec": {"containers": [{"name": "w"}]}}}]}}
    (warning,) = warnings(aw([{"generictemplate": ray, "custompodresources": declared(2)}]))
    assert "declares 2 pods, but RayCluster 'r' will create 5 pods (head 1 + worker/gpu 4)" \
        in warning


def test_a_matching_declaration_and_an_uncountable_kind_say_nothing() -> None:
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert warnings(aw([{"generictemplate": job(3), "custompodresources": declared(3)},
                        {"generictemplate": job(2, "other")},
                        {"generictemplate": widget, "custompodresources": declared(5)}])) == []


def test_a_pod_less_kind_with_declared_pods_is_noted() -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}}
    (warning,) = warnings(aw([{"generictemplate": service, "custompodresources": declared(1)}]))
    assert "declares 1 pod, but Service 'svc' will create 0 pods" in warning


def test_a_name_too_long_for_mcads_label_is_noted() -> None:
    long_job = job(1, "t" * 63)
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"generateName": "d" * 60}}
    found = warnings(aw([{"generictemplate": long_job}, {"generictemplate": deployment}]))
    assert found == [
        "spec.resources.GenericItems[1].generictemplate.metadata: the name has 65 characters, "
        "more than a label value's 63: the object is created without MCAD's label "
        "resourceName (tools that select MCAD's objects by it will not find it)"]


def test_many_warnings_are_bounded() -> None:
    one_pod = [{"replicas": 1, "requests": {"nvidia.com/gpu": 24}}]  # as many GPUs, fewer pods
    items = [{"generictemplate": job(3, f"j{i}"), "custompodresources": one_pod}
             for i in range(200)]
    found = warnings(aw(items))
    assert len("; ".join(found)) <= 2048
    assert found[-1].endswith(" more warnings")
