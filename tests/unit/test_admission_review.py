"""The admission webhook's decisions on AppWrappers, and the creator's re-check at dispatch:
who may have what created (RBAC per wrapped item, by discovery), creator annotations that
cannot be forged or edited, items that cannot change once dispatched, the core's own
messages at `kubectl apply`, messages of bounded size."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from dispatcher.api.conversion import to_v1beta1, to_v1beta2
from dispatcher.api.fault_tolerance import FaultTolerance
from dispatcher.api.models import MAX_ITEMS, parse_appwrapper
from dispatcher.controller.access.creator import (
    CREATOR,
    CREATOR_EXTRA,
    CREATOR_GROUPS,
    CREATOR_UID,
    LOOKUPS_AT_ONCE,
    MAX_UNSERVED,
    Access,
    UserInfo,
    creator_denials,
)
from dispatcher.controller.kube.client import ApiError, Kube
from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.controller.webhook.admission_review import (
    EDITABLE,
    MAX_MESSAGE,
    AppWrapperReview,
    ReviewAnswer,
)
from dispatcher.kinds.scope import DEFAULT_ALLOWED_KINDS
from dispatcher.queue import Policy

from .builders import nested
from .fake_authz import FakeApi, apply_json_patch
from .fake_kube import FakeKube

T = TypeVar("T")
ALICE = {"username": "alice", "uid": "u-alice", "groups": ["team-a", "system:authenticated"]}
BOB = {"username": "bob", "uid": "u-bob", "groups": ["system:authenticated"]}
RIGHTS = {"alice": {"jobs.batch", "appwrappers.workload.codeflare.dev"},
          "bob": {"appwrappers.workload.codeflare.dev"}}


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def job(name: str = "train") -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                {"name": "c", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}]}}}}


def deployment(name: str = "web") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [
                {"name": "c", "image": "nginx"}]}}}}


def privileged_pod(name: str = "root") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "busybox",
                                     "securityContext": {"privileged": True}}]}}


def appwrapper(*items: dict[str, Any], namespace: str = "team-a",
               status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": "aw", "namespace": namespace, **meta},
        "spec": {"resources": {"GenericItems": [{"generictemplate": i} for i in items]}}}
    if status is not None:
        obj["status"] = status
    return obj


def request(obj: dict[str, Any], user: dict[str, Any], operation: str = "CREATE",
            old: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"uid": "r1", "operation": operation, "userInfo": user,
            "kind": {"group": "workload.codeflare.dev", "version": "v1beta1",
                     "kind": "AppWrapper"},
            "namespace": obj["metadata"]["namespace"], "object": obj, "oldObject": old}


def admitted(review: AppWrapperReview, obj: dict[str, Any], user: dict[str, Any]
             ) -> tuple[dict[str, Any], ReviewAnswer]:
    """What `kubectl apply` of a new AppWrapper gets: mutation, then validation."""
    mutated = review.mutate(request(obj, user))
    obj = apply_json_patch(obj, mutated.patch or [])
    return obj, run(review.validate(request(obj, user)))


def reviewer(api: FakeApi | None = None) -> tuple[AppWrapperReview, FakeApi]:
    api = api or FakeApi(RIGHTS)
    return AppWrapperReview(Access(api)), api  # type: ignore[arg-type]


def with_status(obj: dict[str, Any], condition: str) -> dict[str, Any]:
    conditions = [{"type": "Init"}, {"type": condition}] if condition else []
    return {**obj, "status": {"conditions": conditions, "queuejobstate": condition}}


# --- creator annotations -------------------------------------------------------------

def test_the_creator_is_recorded_and_a_forged_one_overwritten() -> None:
    review, _ = reviewer()
    obj, verdict = admitted(review, appwrapper(job()), ALICE)
    assert verdict.allowed
    ann = obj["metadata"]["annotations"]
    assert ann[CREATOR] == "alice" and ann[CREATOR_UID] == "u-alice"
    assert json.loads(ann[CREATOR_GROUPS]) == ["team-a", "system:authenticated"]
    assert CREATOR_EXTRA not in ann

    forged = appwrapper(job(), annotations={CREATOR: "alice", CREATOR_UID: "u-alice",
                                            CREATOR_GROUPS: '["system:masters"]',
                                            CREATOR_EXTRA: '{"scopes": ["all"]}',
                                            "note": "mine"})
    obj, verdict = admitted(review, forged, BOB)
    ann = obj["metadata"]["annotations"]
    assert (ann[CREATOR], ann[CREATOR_UID], json.loads(ann[CREATOR_GROUPS])) == (
        "bob", "u-bob", ["system:authenticated"])
    assert CREATOR_EXTRA not in ann and ann["note"] == "mine"
    # bob may not create Jobs: his AppWrapper is refused whatever it claims.
    assert not verdict.allowed and "bob may not create jobs.batch" in verdict.message


def test_extra_user_attributes_are_recorded_and_reviewed() -> None:
    review, api = reviewer()
    user = {**ALICE, "extra": {"scopes.authorization.openshift.io": ["user:full"]}}
    obj, verdict = admitted(review, appwrapper(job()), user)
    assert verdict.allowed
    assert json.loads(obj["metadata"]["annotations"][CREATOR_EXTRA]) == {
        "scopes.authorization.openshift.io": ["user:full"]}
    assert api.reviews[-1]["spec"]["extra"] == {
        "scopes.authorization.openshift.io": ["user:full"]}


def test_without_the_mutating_webhook_a_create_is_refused() -> None:
    review, _ = reviewer()
    obj = appwrapper(job(), annotations={CREATOR: "bob"})
    verdict = run(review.validate(request(obj, ALICE)))
    assert not verdict.allowed
    assert "mutating webhook, which did not run" in verdict.message


@pytest.mark.parametrize("change", [
    {CREATOR: "mallory"}, {CREATOR_GROUPS: '["system:masters"]'}, {CREATOR_UID: "x"},
    {CREATOR_EXTRA: '{"a": ["b"]}'}])
def test_the_creator_annotations_cannot_be_edited(change: dict[str, str]) -> None:
    review, _ = reviewer()
    old, _ = admitted(review, appwrapper(job()), ALICE)
    new = json.loads(json.dumps(old))
    new["metadata"]["annotations"].update(change)
    verdict = run(review.validate(request(new, ALICE, "UPDATE", old)))
    assert not verdict.allowed and verdict.code == 403
    assert "records who created this AppWrapper and cannot be changed" in verdict.message
    removed = json.loads(json.dumps(old))
    del removed["metadata"]["annotations"][CREATOR]
    assert not run(review.validate(request(removed, ALICE, "UPDATE", old))).allowed


def test_an_appwrapper_from_before_the_webhook_cannot_be_given_a_creator() -> None:
    review, _ = reviewer()
    old = appwrapper(job())
    new = appwrapper(job(), annotations={CREATOR: "alice"})
    assert not run(review.validate(request(new, BOB, "UPDATE", old))).allowed


# --- RBAC per item -------------------------------------------------------------------

@pytest.mark.parametrize(("item", "resource"), [
    (deployment(), "deployments.apps"), (job(), "jobs.batch"), (privileged_pod(), "pods")])
def test_bob_may_not_wrap_what_he_may_not_create(item: dict[str, Any], resource: str) -> None:
    review, _ = reviewer()
    _, verdict = admitted(review, appwrapper(item, namespace="team-b"), BOB)
    assert not verdict.allowed and verdict.code == 403
    name = item["metadata"]["name"]
    assert verdict.message == (
        f"spec.resources.GenericItems[0] ({item['kind']} {name!r}): bob may not create "
        f"{resource} in namespace team-b")


def test_alice_may_wrap_a_job_and_each_resource_is_reviewed_once() -> None:
    review, api = reviewer()
    _, verdict = admitted(review, appwrapper(job("a"), job("b"), job("c")), ALICE)
    assert verdict.allowed
    assert len(api.reviews) == 1
    spec = api.reviews[0]["spec"]
    assert spec["user"] == "alice" and spec["uid"] == "u-alice"
    assert spec["groups"] == ["team-a", "system:authenticated"]
    assert spec["resourceAttributes"] == {"namespace": "team-a", "verb": "create",
                                          "group": "batch", "version": "v1",
                                          "resource": "jobs"}


def test_rights_through_a_group_count() -> None:
    review, _ = reviewer(FakeApi({"group:team-a": {"deployments.apps"}}))
    _, verdict = admitted(review, appwrapper(deployment(), status=None), ALICE)
    assert verdict.allowed


def test_every_item_the_user_may_not_create_is_named() -> None:
    review, _ = reviewer()
    _, verdict = admitted(review, appwrapper(job(), deployment(), privileged_pod()), ALICE)
    assert not verdict.allowed
    assert verdict.message == (
        "spec.resources.GenericItems[1] (Deployment 'web'): alice may not create "
        "deployments.apps in namespace team-a; spec.resources.GenericItems[2] (Pod 'root'): "
        "alice may not create pods in namespace team-a")


@pytest.mark.parametrize("item", [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "mine"}},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
     "metadata": {"name": "root"}, "rules": [{"apiGroups": ["*"], "resources": ["*"],
                                              "verbs": ["*"]}]}])
def test_cluster_scoped_items_are_refused_even_to_an_admin(item: dict[str, Any]) -> None:
    admin_rights = {"namespaces", "clusterroles.rbac.authorization.k8s.io"}
    # Even where the installation allows the kind: discovery says it is cluster-scoped.
    allowed = DEFAULT_ALLOWED_KINDS | {("", "Namespace"),
                                       ("rbac.authorization.k8s.io", "ClusterRole")}
    review = AppWrapperReview(Access(FakeApi({"admin": admin_rights})),  # type: ignore[arg-type]
                              allowed)
    wrapped = appwrapper(item)
    wrapped["spec"]["resources"]["GenericItems"][0]["custompodresources"] = [
        {"replicas": 1, "requests": {"cpu": "1"}}]
    _, verdict = admitted(review, wrapped, {"username": "admin", "groups": []})
    assert not verdict.allowed
    assert f"({item['kind']} " in verdict.message
    assert "is cluster-scoped; an AppWrapper wraps only objects of its own namespace" \
        in verdict.message


def test_a_kind_the_cluster_does_not_serve_is_refused_after_a_fresh_look() -> None:
    api = FakeApi(RIGHTS)
    review = AppWrapperReview(Access(api),  # type: ignore[arg-type]
                              DEFAULT_ALLOWED_KINDS | {("example.com", "Widget")})
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    wrapped = appwrapper(widget)
    wrapped["spec"]["resources"]["GenericItems"][0]["custompodresources"] = [{"replicas": 1}]
    _, verdict = admitted(review, wrapped, ALICE)
    assert not verdict.allowed
    assert "kind Widget (example.com/v1) is not served by this cluster" in verdict.message
    assert api.forgotten[0] == "example.com/v1"


def test_an_api_error_refuses_with_a_message_to_try_again() -> None:
    api = FakeApi(RIGHTS)
    api.fail[("POST", "/apis/authorization.k8s.io")] = ApiError(500, "InternalError", "boom")
    review, _ = reviewer(api)
    _, verdict = admitted(review, appwrapper(job()), ALICE)
    assert not verdict.allowed and verdict.code == 500
    assert "could not check the wrapped objects against alice's permissions" in verdict.message


# --- the core's rules, with the core's messages ----------------------------------------

def status_message(obj: dict[str, Any]) -> str:
    """The message the controller writes into the status of this AppWrapper."""
    d = Dispatcher(FakeKube(), Policy("fifo", order="arrival"))  # type: ignore[arg-type]
    d.on_appwrapper("ADDED", {**obj, "metadata": {**obj["metadata"], "uid": "u1"}})
    (tracked,) = d.tracked.values()
    assert tracked.status.state == "Failed"
    return tracked.status.message


@pytest.mark.parametrize("obj", [
    appwrapper(),  # no items
    appwrapper({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}),
    appwrapper({**job(), "metadata": {"name": "j", "namespace": "elsewhere"}}),
    {**appwrapper(job()), "spec": {"priority": "high", "resources": {"GenericItems": [
        {"generictemplate": job(), "replicas": -2}]}}},
])
def test_an_invalid_appwrapper_is_refused_with_the_message_its_status_would_show(
        obj: dict[str, Any]) -> None:
    review, _ = reviewer(FakeApi({"alice": {"jobs.batch"}}))
    _, verdict = admitted(review, obj, ALICE)
    assert not verdict.allowed and verdict.code == 422
    assert verdict.message.startswith(status_message(obj))


def test_messages_are_capped() -> None:
    review, _ = reviewer()
    items = [{"generictemplate": {**job(f"j{i}"), "spec": {}}, "replicas": -1}
             for i in range(2000)]
    obj = appwrapper()
    obj["spec"]["resources"]["GenericItems"] = items
    _, verdict = admitted(review, obj, BOB)
    assert not verdict.allowed
    assert len(verdict.message) <= MAX_MESSAGE
    assert verdict.message.endswith("more problems")
    assert "GenericItems[0]" in verdict.message


# --- GenericItems are frozen once past the queue ---------------------------------------

@pytest.mark.parametrize("condition", ["HeadOfLine", "Dispatched", "Running",
                                       "PreemptCandidate", "Completed", "Failed"])
def test_items_cannot_change_once_dispatched(condition: str) -> None:
    review, api = reviewer()
    api.rights["alice"].add("use workload.codeflare.dev appwrappers/priority 3")
    old, _ = admitted(review, appwrapper(job()), ALICE)
    old = with_status(old, condition)
    new = json.loads(json.dumps(old))
    new["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"]["parallelism"] = 8
    verdict = run(review.validate(request(new, ALICE, "UPDATE", old)))
    assert not verdict.allowed
    assert verdict.message.startswith("spec.resources.GenericItems cannot change once the "
                                      f"AppWrapper is past the queue (its latest condition "
                                      f"is {condition})")
    # Anything else may still change: labels, other spec fields (a priority she was
    # granted: tests/unit/test_grants.py).
    relabelled = json.loads(json.dumps(old))
    relabelled["metadata"]["labels"] = {"team": "a"}
    relabelled["spec"]["priority"] = 3
    assert run(review.validate(request(relabelled, ALICE, "UPDATE", old))).allowed


def v1beta2(*components: dict[str, Any]) -> dict[str, Any]:
    """A v1beta2 AppWrapper as the API server hands it to the webhook: in v1beta1 terms."""
    return to_v1beta1({"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
                       "metadata": {"name": "aw", "namespace": "team-a"},
                       "spec": {"components": list(components)}})


def test_pod_sets_of_a_v1beta2_wrapper_cannot_change_once_dispatched() -> None:
    review, _ = reviewer()
    declared = {"template": job(), "podSets": [{"path": "template.spec.template"}]}
    old, verdict = admitted(review, v1beta2(declared), ALICE)
    assert verdict.allowed
    old = with_status(old, "Dispatched")
    new = json.loads(json.dumps(old))
    fields = to_v1beta2(new)
    fields["spec"]["components"][0]["podSetInfos"] = [{"nodeSelector": {"pool": "b"}}]
    verdict = run(review.validate(request(to_v1beta1(fields), ALICE, "UPDATE", old)))
    assert not verdict.allowed
    assert "cannot change once the AppWrapper is past the queue" in verdict.message
    assert "spec.components (templates, podSets and podSetInfos)" in verdict.message


@pytest.mark.parametrize("edit", ["template", "more components", "more podSets", "path",
                                  "replicas"])
def test_templates_and_pod_sets_of_a_v1beta2_wrapper_cannot_change_even_while_queued(
        edit: str) -> None:
    # As codeflare's webhook: from creation on (its podSetInfos are Kueue's to set while
    # the wrapper waits).
    review, _ = reviewer()
    declared = {"template": job(), "podSets": [{"path": "template.spec.template",
                                                "replicas": 1}]}
    old, verdict = admitted(review, v1beta2(declared, {"template": job("second")}), ALICE)
    assert verdict.allowed
    old = with_status(old, "Queueing")
    shown = to_v1beta2(old)
    components = shown["spec"]["components"]
    if edit == "template":
        components[0]["template"] = components[1]["template"]
    elif edit == "more components":
        components.append(components[0])
    elif edit == "more podSets":
        components[0]["podSets"] = components[0]["podSets"] * 2
    elif edit == "path":
        components[0]["podSets"][0]["path"] = "bad"
    else:
        components[0]["podSets"][0]["replicas"] = 12
    verdict = run(review.validate(request(to_v1beta1(shown), ALICE, "UPDATE", old)))
    assert not verdict.allowed
    assert verdict.message.startswith("spec.components: the templates and podSets of an "
                                      "AppWrapper written as v1beta2 cannot change")
    # Its podSetInfos may, while it waits.
    components = to_v1beta2(old)["spec"]["components"]
    components[0]["podSetInfos"] = [{"nodeSelector": {"pool": "b"}}]
    edited = to_v1beta2(old)
    edited["spec"]["components"] = components
    assert run(review.validate(request(to_v1beta1(edited), ALICE, "UPDATE", old))).allowed


def test_a_v1beta2_wrapper_whose_pod_sets_are_wrong_is_refused_in_v1beta2_terms() -> None:
    review, _ = reviewer()
    wrong = {"template": job(), "podSets": [{"path": "template.spec.template", "replicas": 3}]}
    _, verdict = admitted(review, v1beta2(wrong), ALICE)
    assert not verdict.allowed
    assert "spec.components[0].podSets[0].replicas: is 3, but Job will create 1 pods" \
        in verdict.message


@pytest.mark.parametrize("condition", sorted(EDITABLE))
def test_items_of_a_queued_wrapper_may_change_within_the_editors_rights(condition: str
                                                                        ) -> None:
    review, _ = reviewer()
    old, _ = admitted(review, appwrapper(job()), ALICE)
    old = with_status(old, condition)
    new = json.loads(json.dumps(old))
    new["spec"]["resources"]["GenericItems"].append({"generictemplate": job("second")})
    assert run(review.validate(request(new, ALICE, "UPDATE", old))).allowed
    # Whoever edits is checked: bob may edit AppWrappers in team-a but not create Jobs.
    verdict = run(review.validate(request(new, BOB, "UPDATE", old)))
    assert not verdict.allowed and "bob may not create jobs.batch in namespace team-a" \
        in verdict.message


def test_an_invalid_edit_is_refused_and_deletion_is_never_held_up() -> None:
    review, _ = reviewer()
    old, _ = admitted(review, appwrapper(job()), ALICE)
    bad = json.loads(json.dumps(old))
    bad["spec"]["schedulingSpec"] = {"minAvailable": -1}
    verdict = run(review.validate(request(bad, ALICE, "UPDATE", old)))
    assert not verdict.allowed and "spec.schedulingSpec.minAvailable" in verdict.message
    old = with_status(old, "Running")
    old["metadata"].update(finalizers=["example.com/keep"],
                           deletionTimestamp="2027-01-01T00:00:00Z")
    going = json.loads(json.dumps(old))
    going["metadata"]["finalizers"] = []
    assert run(review.validate(request(going, ALICE, "UPDATE", old))).allowed


def test_other_resources_and_operations_pass() -> None:
    review, _ = reviewer()
    other = {**request(appwrapper(job()), BOB), "kind": {"group": "", "kind": "Pod"}}
    assert run(review.validate(other)).allowed and review.mutate(other).patch is None
    assert run(review.validate(request(appwrapper(job()), BOB, "DELETE"))).allowed


# --- what one review may cost the API server -----------------------------------------------

class CountingApiServer(Kube):
    """The real client, its discovery cache included, before an API server that serves
    Jobs in batch/v1 only, allows every SubjectAccessReview, and counts what it is asked
    and how many requests it has in flight at once."""

    def __init__(self) -> None:
        super().__init__(None)  # type: ignore[arg-type]  # _once is all it calls
        self.sent: list[tuple[str, str]] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def _once(self, method: str, path: str, body: Any, query: Any, content_type: str,
                    timeout: Any) -> Any:
        self.sent.append((method, path))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0)  # the answer takes a while: others may be sent meanwhile
            if (method, path) == ("GET", "/apis/batch/v1"):
                return {"resources": [{"name": "jobs", "kind": "Job", "namespaced": True},
                                      {"name": "jobs/status", "kind": "Job",
                                       "namespaced": True}]}
            if method == "POST" and path.endswith("/subjectaccessreviews"):
                return {"status": {"allowed": True}}
            raise ApiError(404, "NotFound", "404 page not found")
        finally:
            self.in_flight -= 1

    def discovery(self) -> list[str]:
        return [path for method, path in self.sent if method == "GET"]


def many(count: int, template: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    return appwrapper(*(template(i) for i in range(count)))


def widget_of_group(i: int) -> dict[str, Any]:
    """A kind of a group of its own, which no cluster serves and no installation allows."""
    return {"apiVersion": f"g{i}.example.com/v1", "kind": "Widget",
            "metadata": {"name": f"w{i}"}}


def job_of_version(i: int) -> dict[str, Any]:
    """A Job, a kind every installation allows, in a version of its own no cluster serves."""
    return {**job(f"j{i}"), "apiVersion": f"batch/v{i + 2}"}


def test_an_appwrapper_of_more_items_than_allowed_is_refused_without_a_lookup() -> None:
    api = CountingApiServer()
    _, verdict = admitted(AppWrapperReview(Access(api)), many(5000, widget_of_group), ALICE)
    assert not verdict.allowed and verdict.code == 422
    assert verdict.message.startswith(
        f"spec.resources.GenericItems: 5000 items, more than the {MAX_ITEMS} an AppWrapper "
        "may wrap")
    assert api.sent == []


def test_kinds_the_installation_does_not_allow_are_refused_without_a_lookup() -> None:
    api = CountingApiServer()
    obj = many(MAX_ITEMS, widget_of_group)
    for item in obj["spec"]["resources"]["GenericItems"]:
        item["custompodresources"] = [{"replicas": 1}]
    _, verdict = admitted(AppWrapperReview(Access(api)), obj, ALICE)
    assert not verdict.allowed
    assert "Widget.g0.example.com; it creates" in verdict.message
    assert api.sent == []


def test_unserved_versions_are_looked_up_once_each_a_few_at_a_time_and_only_until_refused(
        ) -> None:
    api = CountingApiServer()
    _, verdict = admitted(AppWrapperReview(Access(api)), many(MAX_ITEMS, job_of_version),
                          ALICE)
    assert not verdict.allowed and verdict.code == 403
    looked_up = api.discovery()
    assert len(looked_up) == len(set(looked_up))  # each version once
    # Enough to fill the refusal's message; the other versions are not looked up at all.
    assert len(looked_up) < MAX_UNSERVED + LOOKUPS_AT_ONCE
    assert api.most_in_flight <= LOOKUPS_AT_ONCE
    assert verdict.message.startswith(
        f"spec.resources.GenericItems: {MAX_ITEMS - len(looked_up)} wrapped objects were not "
        f"checked (from spec.resources.GenericItems[{len(looked_up)}] (Job "
        f"'j{len(looked_up)}') on): those before them already name {MAX_UNSERVED} kinds this "
        "cluster does not serve; correct those first; spec.resources.GenericItems[0] (Job "
        "'j0'): kind Job (batch/v2) is not served by this cluster")


def test_one_unserved_version_is_looked_up_once_however_many_items_name_it() -> None:
    api = CountingApiServer()
    obj = many(MAX_ITEMS, lambda i: {**job(f"j{i}"), "apiVersion": "batch/v2"})
    _, verdict = admitted(AppWrapperReview(Access(api)), obj, ALICE)
    assert not verdict.allowed
    assert api.discovery() == ["/apis/batch/v2"]
    assert verdict.message.count("is not served by this cluster") > 1  # every item named


def test_a_served_kind_is_looked_up_once_and_reviewed_once_per_appwrapper() -> None:
    api = CountingApiServer()
    review = AppWrapperReview(Access(api))
    for _ in range(2):
        _, verdict = admitted(review, many(MAX_ITEMS, lambda i: job(f"j{i}")), ALICE)
        assert verdict.allowed
    assert api.discovery() == ["/apis/batch/v1"]  # kept from the first review
    assert [p for m, p in api.sent if m == "POST"] == [
        "/apis/authorization.k8s.io/v1/subjectaccessreviews"] * 2


# --- the creator's rights again, at dispatch ----------------------------------------------

def recorded(*items: dict[str, Any], user: dict[str, Any] = ALICE) -> dict[str, Any]:
    return appwrapper(*items, annotations=UserInfo.from_request(user).annotations())


def test_creator_denials_follow_rbac_as_it_is_now() -> None:
    api = FakeApi(RIGHTS)
    aw = recorded(job(), job("other"))
    assert run(creator_denials(api, aw)) == []  # type: ignore[arg-type]
    assert run(creator_denials(api, parse_appwrapper(aw))) == []  # type: ignore[arg-type]
    api.rights["alice"].discard("jobs.batch")
    assert run(creator_denials(api, aw)) == [  # type: ignore[arg-type]
        "spec.resources.GenericItems[0] (Job 'train'): alice may not create jobs.batch in "
        "namespace team-a",
        "spec.resources.GenericItems[1] (Job 'other'): alice may not create jobs.batch in "
        "namespace team-a"]


def test_creator_denials_without_a_recorded_creator() -> None:
    api = FakeApi(RIGHTS)
    (denial,) = run(creator_denials(api, appwrapper(job())))  # type: ignore[arg-type]
    assert "no creator is recorded on this AppWrapper" in denial
    assert run(creator_denials(api, appwrapper(job()),  # type: ignore[arg-type]
                               require_creator=False)) == []
    broken = appwrapper(job(), annotations={CREATOR: "alice", CREATOR_GROUPS: "team-a"})
    (denial,) = run(creator_denials(api, broken))  # type: ignore[arg-type]
    assert "creator annotations are not readable" in denial


def test_creator_denials_refuse_cluster_scoped_items_and_leave_unserved_kinds_alone() -> None:
    api = FakeApi({"alice": {"namespaces"}})
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "mine"}}
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    assert run(creator_denials(api, recorded(namespace, widget))) == [  # type: ignore[arg-type]
        "spec.resources.GenericItems[0] (Namespace 'mine'): Namespace is cluster-scoped; an "
        "AppWrapper wraps only objects of its own namespace"]


def test_creator_denials_raise_when_the_api_cannot_answer() -> None:
    api = FakeApi(RIGHTS)
    api.fail[("POST", "/apis/authorization.k8s.io")] = ApiError(503, "", "unavailable")
    with pytest.raises(ApiError):
        run(creator_denials(api, recorded(job())))  # type: ignore[arg-type]


# --- fault-tolerance annotations -------------------------------------------------------

FT = "workload.codeflare.dev.appwrapper/"


def test_fault_tolerance_annotations_ignored_or_capped_are_warned_naming_them_and_the_cap(
) -> None:
    """As codeflare's webhook: kubectl shows a warning for each v1beta2 annotation that is
    not a duration (ignored) or above the installation's maximum (cut to it), on create and
    on `kubectl annotate`; the wrapper is admitted all the same."""
    review = AppWrapperReview(Access(FakeApi(RIGHTS)),  # type: ignore[arg-type]
                              faults=FaultTolerance(grace_period_maximum=3600.0))
    written = {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
               "metadata": {"name": "aw", "namespace": "team-a", "annotations": {
                   FT + "failureGracePeriodDuration": "2h",
                   FT + "retryPausePeriodDuration": "soon",
                   FT + "admissionGracePeriodDuration": "5m"}},
               "spec": {"components": [{"template": job()}]}}
    obj, verdict = admitted(review, to_v1beta1(written), ALICE)
    assert verdict.allowed
    assert verdict.response("r1")["warnings"] == [
        f"metadata.annotations['{FT}failureGracePeriodDuration']: 2h is above the "
        "installation's maximum 1h, which applies",
        f"metadata.annotations['{FT}retryPausePeriodDuration']: 'soon' is not a duration ≥ 0 "
        "such as 90s, 5m or 1h30m; the installation's 90s applies"]

    old = with_status(obj, "Running")
    annotated = json.loads(json.dumps(old))
    annotated["metadata"]["annotations"][FT + "warmupGracePeriodDuration"] = "48h"
    verdict = run(review.validate(request(annotated, ALICE, "UPDATE", old)))
    assert verdict.allowed
    assert f"metadata.annotations['{FT}warmupGracePeriodDuration']: 48h is above the " \
           "installation's maximum 1h, which applies" in verdict.warnings


def test_a_v1beta1_wrapper_is_not_warned_about_codeflares_annotations() -> None:
    review = AppWrapperReview(Access(FakeApi(RIGHTS)))  # type: ignore[arg-type]
    _, verdict = admitted(review, appwrapper(job(), annotations={
        FT + "failureGracePeriodDuration": "soon"}), ALICE)
    assert verdict.allowed and not verdict.warnings  # MCAD's rules: they mean nothing


# --- hostile tenants: a wrapper being deleted, the v1beta2 annotation, deep input ----------

def _terminating(review: AppWrapperReview) -> dict[str, Any]:
    """Alice's queued wrapper, kept alive by her own finalizer and deleted."""
    old, _ = admitted(review, appwrapper(job()), ALICE)
    old = with_status(old, "Queueing")
    old["metadata"].update(finalizers=["alice.example/keep"],
                           deletionTimestamp="2027-01-01T00:00:00Z")
    return old


@pytest.mark.parametrize("edit", ["creator", "priority", "quota-label", "items", "finalizer"])
def test_a_wrapper_being_deleted_cannot_be_edited_past_the_checks(edit: str) -> None:
    review, _ = reviewer()
    old = _terminating(review)
    new = json.loads(json.dumps(old))
    meta = new["metadata"]
    if edit == "creator":
        meta["annotations"][CREATOR] = "admin"
        meta["annotations"][CREATOR_GROUPS] = json.dumps(["system:masters"])
    elif edit == "priority":
        new["spec"]["priority"] = 1000
    elif edit == "quota-label":
        meta["labels"] = {"quota_context": "team-b"}
    elif edit == "items":
        new["spec"]["resources"]["GenericItems"].append({"generictemplate": privileged_pod()})
    else:
        meta["finalizers"] = [*meta["finalizers"], "alice.example/another"]
    verdict = run(review.validate(request(new, ALICE, "UPDATE", old)))
    assert not verdict.allowed and verdict.code == 403
    assert "being deleted: only its finalizers may be removed" in verdict.message


def test_the_v1beta2_annotation_is_reviewed_like_the_spec_it_carries() -> None:
    review, _ = reviewer()
    old, _ = admitted(review, appwrapper(job()), ALICE)
    old = with_status(old, "Queueing")
    for text in ("{not json", json.dumps({"components": [{"podSets": 5}]})):
        new = json.loads(json.dumps(old))
        new["metadata"]["annotations"]["workload.codeflare.dev/v1beta2"] = text
        verdict = run(review.validate(request(new, ALICE, "UPDATE", old)))
        assert not verdict.allowed, text
        assert "annotation workload.codeflare.dev/v1beta2" in verdict.message


def _with_managed_by(obj: dict[str, Any], managed_by: str | None) -> dict[str, Any]:
    out = json.loads(json.dumps(obj))
    stash = json.loads(out["metadata"]["annotations"].get(
        "workload.codeflare.dev/v1beta2", "{}"))
    stash.pop("managedBy", None)
    if managed_by is not None:
        stash["managedBy"] = managed_by
    out["metadata"]["annotations"]["workload.codeflare.dev/v1beta2"] = json.dumps(stash)
    return out


def test_managed_by_cannot_change_once_the_wrapper_exists() -> None:
    review, _ = reviewer()
    written = to_v1beta1(to_v1beta2(appwrapper(job())))  # a wrapper written as v1beta2
    old, verdict = admitted(review, written, ALICE)
    assert verdict.allowed
    old = with_status(old, "Running")
    for before, after in ((None, "kueue.x-k8s.io/multikueue"),
                          ("workload.codeflare.dev/appwrapper-controller", None),
                          ("workload.codeflare.dev/appwrapper-controller", "other.example/x")):
        was = _with_managed_by(old, before)
        verdict = run(review.validate(request(_with_managed_by(old, after), ALICE, "UPDATE",
                                              was)))
        assert not verdict.allowed and "spec.managedBy cannot change" in verdict.message
    # An MCAD wrapper (no annotation) cannot be handed to another controller either.
    mcad, _ = admitted(review, appwrapper(job()), ALICE)
    verdict = run(review.validate(request(_with_managed_by(mcad, "other.example/x"), ALICE,
                                          "UPDATE", mcad)))
    assert not verdict.allowed and "spec.managedBy cannot change" in verdict.message
    # suspend may still change, as codeflare's.
    suspended = _with_managed_by(old, None)
    annotations = suspended["metadata"]["annotations"]
    annotations["workload.codeflare.dev/v1beta2"] = json.dumps(
        {**json.loads(annotations["workload.codeflare.dev/v1beta2"]), "suspend": True})
    assert run(review.validate(request(suspended, ALICE, "UPDATE",
                                       _with_managed_by(old, None)))).allowed



@pytest.mark.parametrize("depth", [260, 590, 1000])
def test_a_template_nested_deep_is_refused_at_apply(depth: int) -> None:
    review, _ = reviewer()
    deep = job()
    deep["spec"]["template"]["spec"]["containers"][0]["x"] = nested(depth)
    old, _ = admitted(review, appwrapper(job()), ALICE)
    new = {**old, "spec": {"resources": {"GenericItems": [{"generictemplate": deep}]}}}
    verdict = run(review.validate(request(new, ALICE)))
    assert not verdict.allowed and verdict.code == 422
    assert "nests more than 100 levels deep" in verdict.message
    verdict = run(review.validate(request(new, ALICE, "UPDATE", with_status(old, "Queueing"))))
    assert not verdict.allowed and "nests more than 100 levels deep" in verdict.message
    stash = json.loads(json.dumps(old))
    stash["metadata"]["annotations"]["workload.codeflare.dev/v1beta2"] = \
        '{"components":[{"podSets":[' + '{"x":' * depth + '{}' + '}' * depth + ']}]}'
    verdict = run(review.validate(request(stash, ALICE, "UPDATE", old)))
    assert not verdict.allowed and "nests more than 100 levels deep" in verdict.message


def test_an_unclosed_deep_v1beta2_annotation_is_refused_not_a_crash() -> None:
    """The stash written with its brackets opened and never closed: not JSON, but its
    parser recurses before it finds that out. It is refused as too deep, as the closed
    one is, and the webhook answers instead of raising."""
    review, _ = reviewer()
    old, _ = admitted(review, appwrapper(job()), ALICE)
    for text in ("[" * 200_000, '{"components":[{"podSets":[' + '{"x":' * 200_000):
        stash = json.loads(json.dumps(old))
        stash["metadata"]["annotations"]["workload.codeflare.dev/v1beta2"] = text
        verdict = run(review.validate(request(stash, ALICE, "UPDATE", old)))
        assert not verdict.allowed and "nests more than 100 levels deep" in verdict.message


def test_what_a_v1beta2_reader_was_shown_of_an_unconvertible_wrapper_is_never_written() -> None:
    """Written back through v1beta2, the shown form (no components) would replace the stored
    spec: refused, even when only a label seems to change."""
    review, _ = reviewer()
    old, _ = admitted(review, appwrapper(job()), ALICE)
    shown = json.loads(json.dumps(old))
    shown["metadata"].setdefault("annotations", {})[
        "workload.codeflare.dev/unconverted"] = "it nests too deep to be converted; flatten it"
    shown["metadata"]["labels"] = {"team": "a"}
    verdict = run(review.validate(request(shown, ALICE, "UPDATE", old)))
    assert not verdict.allowed
    assert "this is not the stored AppWrapper" in verdict.message
