"""Quota nodes and priorities only as granted, at `kubectl apply` (the validating webhook):
a tenant cannot label an AppWrapper with another team's quota node or give it a priority
the administrator did not grant, neither on CREATE nor by an edit; cluster-admins and
granted tenants are not held up, and what needs no grant asks nothing."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.controller.access.creator import Access
from dispatcher.controller.kube.client import ApiError
from dispatcher.controller.webhook.admission_review import AppWrapperReview

from .fake_authz import FakeApi
from .test_admission_review import ALICE, BOB, admitted, appwrapper, job, request, run

QUOTA = "use quota.codeflare.dev quotasubtrees"
PRIORITY = "use workload.codeflare.dev appwrappers/priority"
ADMIN = {"username": "admin", "groups": ["system:masters", "system:authenticated"]}
SUBTREE = ("quota.codeflare.dev/v1alpha1", "QuotaSubtree")


def subtree(name: str, tree: str, *nodes: str) -> dict[str, Any]:
    return {"apiVersion": SUBTREE[0], "kind": SUBTREE[1],
            "metadata": {"name": name, "namespace": "kube-system", "labels": {"tree": tree}},
            "spec": {"children": [{"name": n, "quotas": {"requests": {"cpu": "1"}}}
                                  for n in nodes]}}


def cluster(**rights: set[str]) -> FakeApi:
    """MCAD's two trees: quota_context (gold, silver, default) and quota_service (gold,
    default); alice and bob may create AppWrappers and Jobs; the admin everything."""
    api = FakeApi({"alice": {"jobs.batch"}, "bob": {"jobs.batch"}, "admin": {"*"}})
    for user, extra in rights.items():
        api.rights.setdefault(user, set()).update(extra)
    api.served[SUBTREE] = ("quotasubtrees", True)
    for obj in (subtree("context-root", "quota_context", "gold", "silver", "default"),
                subtree("service-root", "quota_service", "gold", "default")):
        api.put(f"/apis/quota.codeflare.dev/v1alpha1/namespaces/kube-system/quotasubtrees/"
                f"{obj['metadata']['name']}", obj)
    return api


def claiming(namespace: str = "team-a", priority: Any = None, slope: Any = None,
             **labels: str) -> dict[str, Any]:
    obj = appwrapper(job(), namespace=namespace, labels=labels)
    if priority is not None:
        obj["spec"]["priority"] = priority
    if slope is not None:
        obj["spec"]["priorityslope"] = slope
    return obj


def apply(api: FakeApi, obj: dict[str, Any], user: dict[str, Any]) -> tuple[bool, str]:
    _, verdict = admitted(AppWrapperReview(Access(api)), obj, user)  # type: ignore[arg-type]
    return verdict.allowed, verdict.message


def edit(api: FakeApi, old: dict[str, Any], user: dict[str, Any], *, labels: Any = None,
         spec: dict[str, Any] | None = None) -> tuple[bool, str]:
    new = json.loads(json.dumps(old))
    if labels is not None:
        new["metadata"]["labels"] = labels
    new["spec"].update(spec or {})
    verdict = run(AppWrapperReview(Access(api)).validate(  # type: ignore[arg-type]
        request(new, user, "UPDATE", old)))
    return verdict.allowed, verdict.message


def created(api: FakeApi, obj: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    out, verdict = admitted(AppWrapperReview(Access(api)), obj, user)  # type: ignore[arg-type]
    assert verdict.allowed, verdict.message
    return out


def grant_reviews(api: FakeApi) -> list[dict[str, Any]]:
    return [r["spec"]["resourceAttributes"] for r in api.reviews
            if r["spec"]["resourceAttributes"]["verb"] == "use"]


# --- at kubectl apply ------------------------------------------------------------------

def test_another_teams_quota_node_and_a_huge_priority_are_refused_naming_each_grant() -> None:
    """The issue's attack: namespace evil, gold's hard leaf, priority 10^9."""
    api = cluster()
    allowed, message = apply(api, claiming("evil", priority=1000000000,
                                           quota_context="gold"), BOB)
    assert not allowed
    assert message == (
        "metadata.labels.quota_context: bob may not use quota node gold of tree "
        "quota_context in namespace evil: no RBAC grant of verb use on quotasubtrees "
        "(apiGroup quota.codeflare.dev), resourceName 'quota_context:gold'; "
        "spec.priority: bob may not use priority 1000000000 in namespace evil: no RBAC grant "
        "of verb use on appwrappers/priority (apiGroup workload.codeflare.dev), resourceName "
        "'1000000000'")
    assert grant_reviews(api) == [
        {"namespace": "evil", "verb": "use", "group": "quota.codeflare.dev",
         "version": "v1alpha1", "resource": "quotasubtrees", "name": "quota_context:gold"},
        {"namespace": "evil", "verb": "use", "group": "workload.codeflare.dev",
         "version": "v1beta1", "resource": "appwrappers", "name": "1000000000",
         "subresource": "priority"}]


def test_a_priority_slope_needs_its_own_grant() -> None:
    api = cluster(alice={f"{PRIORITY} 10"})
    allowed, message = apply(api, claiming(priority=10, slope=0.5), ALICE)
    assert not allowed
    assert message == (
        "spec.priorityslope: alice may not use priority slope 0.5 in namespace team-a: no RBAC "
        "grant of verb use on appwrappers/priority (apiGroup workload.codeflare.dev), "
        "resourceName 'slope'")
    api.rights["alice"].add(f"{PRIORITY} slope")
    assert apply(api, claiming(priority=10, slope=0.5), ALICE) == (True, "")


def test_the_granted_node_and_priority_are_accepted_and_only_those() -> None:
    api = cluster(alice={f"{QUOTA} quota_context:gold", f"{PRIORITY} 1000"})
    assert apply(api, claiming(priority=1000, quota_context="gold"), ALICE) == (True, "")
    # The same node name in another tree is another grant; another value another one.
    allowed, message = apply(api, claiming(priority=999, quota_context="gold",
                                           quota_service="gold"), ALICE)
    assert not allowed
    assert "quota node gold of tree quota_service" in message
    assert "priority 999 " in message and "quota_context" not in message


def test_grants_through_a_group_count_and_the_admin_holds_every_grant() -> None:
    api = cluster(**{"group:team-a": {f"{QUOTA} quota_context:silver"}})
    assert apply(api, claiming(quota_context="silver"), ALICE) == (True, "")
    assert apply(api, claiming("anywhere", priority=1000000000, slope=2.0,
                               quota_context="gold", quota_service="gold"), ADMIN) == (True, "")


def test_what_needs_no_grant_asks_nothing() -> None:
    """The default leaf, priority 0 or less, labels that name no tree, no trees at all."""
    api = cluster()
    for obj in (claiming(), claiming(priority=0, slope=0.0),
                claiming(priority=-5, slope=-1.0, quota_context="default"),
                claiming(app="web", team="gold", **{"example.com/quota_context": "gold"})):
        assert apply(api, obj, BOB) == (True, "")
    assert grant_reviews(api) == []
    assert [r for r in api.requests if "quotasubtrees" in r[1]] == [
        ("GET", "/apis/quota.codeflare.dev/v1alpha1/quotasubtrees")]  # the last one only
    no_crd = FakeApi({"bob": {"jobs.batch"}})
    assert apply(no_crd, claiming(quota_context="gold"), BOB) == (True, "")
    assert grant_reviews(no_crd) == []


def test_an_api_error_refuses_with_a_message_to_try_again() -> None:
    api = cluster()
    api.fail[("GET", "/apis/quota.codeflare.dev")] = ApiError(503, "", "unavailable")
    allowed, message = apply(api, claiming(quota_context="gold"), ALICE)
    assert not allowed
    assert message.startswith("could not check the quota node and priority against alice's "
                              "grants: ")


# --- edits ---------------------------------------------------------------------------

def test_an_edit_adding_a_foreign_quota_label_or_priority_is_refused_at_any_stage() -> None:
    api = cluster()
    old = created(api, claiming(app="web"), BOB)
    for status in ({}, {"status": {"state": "Running", "conditions": [{"type": "Running"}]}}):
        current = {**old, **status}
        allowed, message = edit(api, current, BOB,
                                labels={"app": "web", "quota_context": "gold"})
        assert not allowed and message.startswith(
            "metadata.labels.quota_context: bob may not use quota node gold")
        allowed, message = edit(api, current, BOB, spec={"priority": 100})
        assert not allowed and message.startswith("spec.priority: bob may not use priority "
                                                  "100")
        # Other label edits and lowering the priority pass, asking nothing.
        assert edit(api, current, BOB, labels={"app": "db", "quota_context": "default"}) \
            == (True, "")
        assert edit(api, current, BOB, spec={"priority": -1}) == (True, "")
    assert len(grant_reviews(api)) == 4  # the refused ones alone


def test_an_edit_asks_only_for_what_is_new() -> None:
    api = cluster(alice={f"{QUOTA} quota_context:gold", f"{PRIORITY} 5"})
    old = created(api, claiming(priority=5, quota_context="gold"), ALICE)
    api.reviews.clear()
    # Her gold grant was revoked since: a change of something else does not take it away
    # (the dispatcher asks again before it admits the AppWrapper).
    api.rights["alice"].discard(f"{QUOTA} quota_context:gold")
    assert edit(api, old, ALICE, labels={"quota_context": "gold", "app": "x"}) == (True, "")
    assert edit(api, old, ALICE, spec={"priority": 5, "schedulingSpec": {}}) == (True, "")
    assert grant_reviews(api) == []


def test_an_editor_cannot_lend_a_grant_the_creator_lacks() -> None:
    """The dispatcher asks for the creator's grants: an edit by someone who holds them
    would otherwise pass here and only wait later."""
    api = cluster(alice={f"{QUOTA} quota_context:gold"})
    old = created(api, claiming(), BOB)
    allowed, message = edit(api, old, ALICE, labels={"quota_context": "gold"})
    assert not allowed
    assert message.startswith("metadata.labels.quota_context: bob may not use quota node "
                              "gold of tree quota_context in namespace team-a")
    assert "alice may not" not in message
    # And the creator cannot borrow an editor's grant either way round.
    old = created(api, claiming(), ALICE)
    allowed, message = edit(api, old, BOB, labels={"quota_context": "gold"})
    assert not allowed and message.startswith("metadata.labels.quota_context: bob may not")


# --- the rule, over many cases ------------------------------------------------------------

CLAIMS = {"quota_context": "quota_context:gold", "quota_service": "quota_service:gold"}


@settings(max_examples=60, deadline=None)
@given(labels=st.dictionaries(st.sampled_from(["quota_context", "quota_service", "app"]),
                              st.sampled_from(["gold", "default"])),
       priority=st.integers(-3, 3), slope=st.sampled_from([-1.0, 0.0, 0.5]),
       held=st.sets(st.sampled_from([f"{QUOTA} quota_context:gold",
                                     f"{QUOTA} quota_service:gold", f"{PRIORITY} 1",
                                     f"{PRIORITY} 2", f"{PRIORITY} slope"])))
def test_an_appwrapper_is_accepted_exactly_when_its_creator_holds_every_claim(
        labels: dict[str, str], priority: int, slope: float, held: set[str]) -> None:
    api = cluster(alice=held)
    wanted = {f"{QUOTA} {CLAIMS[k]}" for k, v in labels.items() if k in CLAIMS and v != "default"}
    if priority > 0:
        wanted.add(f"{PRIORITY} {priority}")
    if slope > 0:
        wanted.add(f"{PRIORITY} slope")
    allowed, message = apply(api, claiming(priority=priority, slope=slope, **labels), ALICE)
    assert allowed == (wanted <= held), message
    assert message.count("alice may not use") == len(wanted - held)
