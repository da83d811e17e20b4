"""One call says everything about an AppWrapper before it is queued, so plan, the
controller and the webhook refuse and warn alike."""

from __future__ import annotations

from typing import Any

from dispatcher.kinds.scope import DEFAULT_ALLOWED_KINDS
from dispatcher.review import review


def aw(*items: dict[str, Any], name: str = "a") -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": "team",
                         "creationTimestamp": "2026-11-01T10:00:00Z"},
            "spec": {"resources": {"GenericItems": list(items)}}}


def job(pods: int = 1) -> dict[str, Any]:
    return {"generictemplate": {"apiVersion": "batch/v1", "kind": "Job",
                                "metadata": {"name": "j"}, "spec": {"parallelism": pods}}}


WIDGET = {"generictemplate": {"apiVersion": "example.com/v1", "kind": "Widget",
                              "metadata": {"name": "w"}}}


def test_a_valid_appwrapper_is_queued_with_its_warnings() -> None:
    item = {**job(3), "custompodresources": [{"replicas": 1, "requests": {"cpu": 1}}]}
    checked = review(aw(item), 99.0)
    assert checked.valid and checked.problems == [] and checked.message == ""
    assert checked.queued is not None
    assert checked.queued.first_seen == 1793527200.0  # its creationTimestamp, not 99
    assert [g.pod_set.count for g in checked.queued.gang] == [1]
    (warning,) = checked.warnings
    assert "declares 1 pod, but Job 'j' will create 3 pods" in warning


def test_schema_problems_stop_before_the_kinds() -> None:
    checked = review(aw(job(), name="Bad_Name"), 0.0)
    assert not checked.valid and checked.appwrapper is None and checked.warnings == []
    (problem,) = checked.problems
    assert problem.startswith("metadata.name: 'Bad_Name' is not valid")


def test_a_refused_kind_and_its_counting_problem_are_both_said() -> None:
    checked = review(aw(job(), WIDGET), 0.0)
    assert not checked.valid and checked.appwrapper is not None
    refused, counting = checked.problems
    assert refused.startswith("spec.resources.GenericItems[1]: Widget 'w' is of a kind this "
                              "dispatcher does not create")
    assert counting.startswith("spec.resources.GenericItems[1]: kind Widget (example.com/v1) "
                               "is not one the dispatcher knows how to count pods for")
    assert checked.message == f"{refused}; {counting}"


def test_the_installation_list_and_discovery_are_used() -> None:
    custom = {**WIDGET, "custompodresources": [{"replicas": 1, "requests": {"cpu": 1}}]}
    allowed = DEFAULT_ALLOWED_KINDS | {("example.com", "Widget")}
    assert review(aw(custom), 0.0, allowed).valid
    scoped = review(aw(custom), 0.0, allowed, {("example.com", "Widget")})
    assert not scoped.valid and "is cluster-scoped" in scoped.message
