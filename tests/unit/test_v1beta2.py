"""The v1beta2 AppWrapper as written: what is refused, and why, in v1beta2 terms."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.api.models import InvalidSpec
from dispatcher.api.v1beta2 import parse_appwrapper_v1beta2


def wrapper(*components: dict[str, Any], namespace: str = "team") -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": {"name": "aw", "namespace": namespace},
            "spec": {"components": list(components)}}


def job(name: str = "job", **meta: Any) -> dict[str, Any]:
    return {"template": {"apiVersion": "batch/v1", "kind": "Job",
                         "metadata": {"name": name, **meta}}}


def problems(obj: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidSpec) as caught:
        parse_appwrapper_v1beta2(obj)
    return caught.value.problems


def test_a_wrapper_without_components_is_refused() -> None:
    assert problems(wrapper()) == ["spec.components is empty: wrap at least one object"]


def test_a_component_in_another_namespace_is_refused() -> None:
    (problem,) = problems(wrapper(job(namespace="elsewhere")))
    assert problem.startswith("spec.components[0].template.metadata.namespace: is 'elsewhere'")


def test_a_nested_appwrapper_is_refused() -> None:
    nested = {"template": {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
                           "metadata": {"name": "inner"}}}
    (problem,) = problems(wrapper(nested))
    assert "AppWrappers cannot be nested" in problem


def test_schema_faults_name_the_v1beta2_field() -> None:
    bad = {**job(), "podSets": [{"replicas": -1}]}
    found = problems({**wrapper(bad), "spec": {"components": [bad], "suspend": "yes"}})
    assert "spec.components[0].podSets[0].path: is required" in found
    assert "spec.components[0].podSets[0].replicas: must be ≥ 0, got -1" in found
    assert "spec.suspend: must be true or false, got 'yes'" in found


def test_a_v1beta1_wrapper_is_not_taken_for_v1beta2() -> None:
    found = problems({**wrapper(job()), "apiVersion": "workload.codeflare.dev/v1beta1"})
    assert found[0].startswith("apiVersion: must be workload.codeflare.dev/v1beta2")
