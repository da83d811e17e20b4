"""Names the API server would refuse are refused before dispatch, with a fix-it message."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.api import InvalidSpec, parse_appwrapper


def aw(name: str = "a", namespace: str = "team", *items: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"resources": {"GenericItems": [
                {"generictemplate": t} for t in (items or (obj("batch/v1", "Job", "j"),))]}}}


def obj(api_version: str, kind: str, name: str | None = None, generate: str | None = None,
        **spec: Any) -> dict[str, Any]:
    meta = {"name": name} if name is not None else {"generateName": generate}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spec}


def problems(doc: dict[str, Any]) -> list[str]:
    try:
        parse_appwrapper(doc)
    except InvalidSpec as e:
        return e.problems
    return []


def test_an_appwrapper_name_with_capitals_is_refused_with_a_suggestion() -> None:
    (problem,) = problems(aw("myGangScheduledApp"))
    assert problem.startswith("metadata.name: 'myGangScheduledApp' is not valid: an AppWrapper "
                              "name is a DNS-1123 subdomain")
    assert "e.g. 'mygangscheduledapp'" in problem


def test_an_appwrapper_name_must_fit_a_label_value() -> None:
    assert problems(aw("a" * 63)) == []
    (problem,) = problems(aw("a" * 64))
    assert problem == ("metadata.name: is 64 characters long; an AppWrapper name has at most 63 "
                       "(the objects it creates, and their pods, carry it as a label value), "
                       f"e.g. '{'a' * 63}'")


def test_a_namespace_is_a_dns_label() -> None:
    (problem,) = problems(aw("a", "Team.A"))
    assert problem.startswith("metadata.namespace: 'Team.A' is not valid")


@pytest.mark.parametrize(("item", "field", "fragment"), [
    (obj("apps/v1", "StatefulSet", "Web_1"), "name", "a StatefulSet name is a DNS-1123 subdomain"),
    (obj("v1", "Service", "1st-svc"), "name", "a Service name is a DNS-1035 label"),
    (obj("v1", "Service", "svc.internal"), "name", "a Service name is a DNS-1035 label"),
    (obj("batch/v1", "Job", "j" * 64), "name",
     "a Job name has at most 63 (the Job's pods carry its name as a label value)"),
    (obj("apps/v1", "Deployment", "d" * 254), "name", "a Deployment name has at most 253"),
    (obj("v1", "Pod", generate="Worker-"), "generateName",
     "(+ 5 generated characters) 'Worker-00000' is not valid: a Pod name"),
    (obj("ray.io/v1", "RayCluster", "ray-"), "name", "a RayCluster name is a DNS-1123 subdomain"),
])
def test_an_item_name_the_api_server_refuses_is_named_with_its_rule(
        item: dict[str, Any], field: str, fragment: str) -> None:
    (problem,) = problems(aw("a", "team", item))
    assert problem.startswith(f"spec.resources.GenericItems[0].generictemplate.metadata.{field}: ")
    assert fragment in problem
    assert problem.endswith("the API server would refuse this object")


@pytest.mark.parametrize("item", [
    obj("apps/v1", "Deployment", "d" * 253),
    obj("apps/v1", "Deployment", "web.v2"),
    obj("batch/v1", "Job", "j" * 64, manualSelector=True),
    obj("v1", "Service", "s" * 63),
    obj("v1", "Pod", generate="worker-"),
    obj("example.com/v1", "Widget", "w.1"),
])
def test_valid_names_pass(item: dict[str, Any]) -> None:
    assert problems(aw("a", "team", item)) == []


_LABEL = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?", fullmatch=True)


@given(st.lists(_LABEL, min_size=1, max_size=4).map(".".join))
def test_any_dns_subdomain_is_a_valid_deployment_name(name: str) -> None:
    assert problems(aw("a", "team", obj("apps/v1", "Deployment", name))) == []


@given(st.text(min_size=1, max_size=40).filter(lambda s: re.search(r"[^a-z0-9.-]", s)))
def test_names_outside_the_alphabet_are_refused(name: str) -> None:
    (problem,) = problems(aw("a", "team", obj("apps/v1", "Deployment", name)))
    assert "DNS-1123 subdomain" in problem
