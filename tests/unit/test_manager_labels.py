"""Only the manager's accounts may set, change or remove the labels a manager writes:
`workload.codeflare.dev/cluster` (the worker a wrapper is sent to, in the manager cluster)
and `workload.codeflare.dev/manager-uid` (a manager's copy, in a worker). A tenant who sets
the first skips the manager's queue, fit and quota checks; one who removes the second hides
its copy from the worker's fence."""

from __future__ import annotations

from typing import Any

import pytest

from dispatcher.api.labels import CLUSTER_LABEL, MANAGER_UID_LABEL
from dispatcher.cli import build_parser
from dispatcher.controller.webhook.manager_labels import default_managers

from .test_admission_review import ALICE, admitted, appwrapper, job, request, reviewer, run

MANAGER = {"username": "system:serviceaccount:dispatcher-system:dispatcher-manager",
           "uid": "u-m", "groups": ["system:serviceaccounts"]}
ACCESS = {"username": "system:serviceaccount:dispatcher-system:dispatcher-manager-access",
          "uid": "u-a", "groups": ["system:serviceaccounts"]}


@pytest.mark.parametrize("label", [CLUSTER_LABEL, MANAGER_UID_LABEL])
def test_a_tenant_cannot_create_a_wrapper_with_a_managers_label(label: str) -> None:
    review, _ = reviewer()
    _, verdict = admitted(review, appwrapper(job(), labels={label: "w1"}), ALICE)
    assert not verdict.allowed and verdict.code == 403
    assert verdict.message.startswith(
        f"metadata.labels[{label}]: set only by the dispatcher's manager")
    assert "not by alice; it cannot be set: leave it out of the AppWrapper" in verdict.message


def stored(labels: dict[str, str]) -> dict[str, Any]:
    review, _ = reviewer()
    obj, verdict = admitted(review, appwrapper(job()), ALICE)
    assert verdict.allowed
    obj["metadata"]["labels"] = labels
    return obj


@pytest.mark.parametrize(("before", "after", "what"), [
    ({}, {CLUSTER_LABEL: "w1"}, "set"),
    ({CLUSTER_LABEL: "w1"}, {CLUSTER_LABEL: "w2"}, "changed"),
    ({MANAGER_UID_LABEL: "u1"}, {}, "removed"),
    ({MANAGER_UID_LABEL: "u1"}, {MANAGER_UID_LABEL: "u2", "team": "a"}, "changed"),
])
def test_a_tenant_cannot_set_change_or_remove_them(before: dict[str, str],
                                                   after: dict[str, str], what: str) -> None:
    review, _ = reviewer()
    old = stored(before)
    new = {**old, "metadata": {**old["metadata"], "labels": after}}
    verdict = run(review.validate(request(new, ALICE, "UPDATE", old)))
    assert not verdict.allowed and verdict.code == 403
    assert f"it cannot be {what}: keep the labels as they are" in verdict.message
    # ... not even on a wrapper being deleted (its finalizer the tenant's own)
    deleting = {**new, "metadata": {**new["metadata"],
                                    "deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert not run(review.validate(request(deleting, ALICE, "UPDATE", old))).allowed


def test_the_managers_accounts_may_and_other_labels_stay_the_tenants() -> None:
    review, _ = reviewer()
    old = stored({"team": "a"})
    sent = {**old, "metadata": {**old["metadata"], "labels": {CLUSTER_LABEL: "w1"}}}
    assert run(review.validate(request(sent, MANAGER, "UPDATE", old))).allowed
    back = {**sent, "metadata": {**sent["metadata"], "labels": {}}}
    assert run(review.validate(request(back, MANAGER, "UPDATE", sent))).allowed
    relabelled = {**sent, "metadata": {**sent["metadata"],
                                       "labels": {CLUSTER_LABEL: "w1", "team": "b"}}}
    assert run(review.validate(request(relabelled, ALICE, "UPDATE", sent))).allowed
    copy = appwrapper(job(), labels={MANAGER_UID_LABEL: "u1"})
    assert run(review.validate(request(copy, ACCESS))).message.find("manager-uid") < 0


def test_the_managers_accounts_follow_the_namespace_or_the_setting() -> None:
    assert default_managers("ops") == frozenset({
        "system:serviceaccount:ops:dispatcher-manager",
        "system:serviceaccount:ops:dispatcher-manager-access"})
    args = build_parser().parse_args(["webhook", "--manager-user", "fleet-bot",
                                      "--manager-user", "other"])
    assert args.manager_user == ["fleet-bot", "other"]
