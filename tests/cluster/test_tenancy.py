"""Many tenants on one cluster: users act as themselves (client certificates of the local
cluster), and the dispatcher's admission webhook makes sure an AppWrapper never gets
created what its author may not create.

Every webhook test runs twice: against a `dispatcher webhook` process with admin
credentials whose configurations are registered by the tests ("local"), and against
deploy/ applied as it is, its webhook running as deploy/'s service account and the
controller as its own ("deployed"). Each test has a fresh namespace where ``alice`` may
create AppWrappers and Jobs and ``bob`` AppWrappers only.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dispatcher.controller.access.creator import CREATOR, CREATOR_GROUPS, creator_denials
from dispatcher.controller.kube.client import Kube
from dispatcher.controller.webhook.admission_review import core_problems
from localcluster import Cluster, Kubectl, users, wait_for
from localcluster.testing import container, outcome

from .dispatcher_process import QUOTA_CRD, DispatcherProcess, install_crd, wait_quiet
from .webhook_process import Installed, WebhookProcess, free_port, unregister_webhooks

LABEL = "workload.codeflare.dev/appwrapper"
LOCAL_WEBHOOK_NAMESPACE = "dispatcher-webhook-local"
APPWRAPPERS = "appwrappers.workload.codeflare.dev"
# The grants of a quota node and of a priority: (apiGroup, resource), as in a Role's rule.
QUOTA_NODES = ("quota.codeflare.dev", "quotasubtrees")
PRIORITIES = ("workload.codeflare.dev", "appwrappers/priority")


# --- builders ------------------------------------------------------------------------

def appwrapper(name: str, *items: dict[str, Any], custom: bool = False,
               annotations: dict[str, str] | None = None) -> dict[str, Any]:
    generic: list[dict[str, Any]] = [{"generictemplate": i} for i in items]
    if custom:
        for g in generic:
            g["custompodresources"] = [{"replicas": 1, "requests": {"cpu": "100m"}}]
    meta: dict[str, Any] = {"name": name}
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": meta, "spec": {"resources": {"GenericItems": generic}}}


def job(name: str = "train", pods: int = 1) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                     "template": {"metadata": {"annotations": outcome("run")},
                                  "spec": {"restartPolicy": "Never",
                                           "containers": [container(gpus=1)]}}}}


def deployment(name: str = "web") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [container()]}}}}


def privileged_pod(name: str = "root") -> dict[str, Any]:
    c = container()
    c["securityContext"] = {"privileged": True}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"hostPID": True, "containers": [c]}}


def refused(k: Kubectl, obj: dict[str, Any], *args: str) -> str:
    """`kubectl apply` of ``obj`` (or another command given by ``args``) must fail; its
    error output."""
    proc = k.run(*(args or ("apply", "-f", "-")), input=yaml.safe_dump(obj), check=False)
    assert proc.returncode != 0, f"expected a refusal, got: {proc.stdout}"
    return proc.stderr


def last_condition(k: Kubectl, name: str) -> str:
    conditions = (k.json("appwrapper", name).get("status") or {}).get("conditions") or []
    return str(conditions[-1]["type"]) if conditions else ""


def can_use(kubectl: Kubectl, namespace: str, user: str, rule: tuple[str, str],
            name: str) -> bool:
    """`kubectl auth can-i use` of one grant (docs/operations.md shows the command)."""
    group, resource = rule
    plural, _, sub = resource.partition("/")
    proc = kubectl.run("auth", "can-i", "use", f"{plural}.{group}/{name}", "-n", namespace,
                       "--as", user, *([f"--subresource={sub}"] if sub else []), check=False)
    return proc.stdout.strip() == "yes"


def grant_use(kubectl: Kubectl, namespace: str, user: str, rule: tuple[str, str],
              names: list[str]) -> str:
    """Grant ``user`` the verb ``use`` on ``rule`` (apiGroup, resource) named ``names`` in
    ``namespace`` (docs/operations.md, "Quota nodes and priorities"), once the API server
    answers so; the Role's name, for users.revoke."""
    group, resource = rule
    name = f"{user}-use-{resource.replace('/', '-')}"
    meta = {"name": name, "namespace": namespace}
    kubectl.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": [group], "resources": [resource], "resourceNames": names,
                    "verbs": ["use"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": user}]}])
    wait_for(lambda: all(can_use(kubectl, namespace, user, rule, n) for n in names),
             30, f"{user}'s grant of {resource} {names} to take effect")
    return name


# --- fixtures ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def crd(kubectl: Kubectl) -> None:
    install_crd(kubectl)


@pytest.fixture(scope="module", params=["local", "deployed"])
def webhook(request: pytest.FixtureRequest, local_cluster: Cluster, kubectl: Kubectl,
            crd: None) -> Iterator[Installed]:
    if request.param == "deployed":
        yield request.getfixturevalue("deployed")
        return
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": LOCAL_WEBHOOK_NAMESPACE}})
    process = WebhookProcess(local_cluster.kubeconfig, local_cluster.logs / "webhook-local",
                             LOCAL_WEBHOOK_NAMESPACE)
    try:
        process.serve(kubectl)
        yield Installed("local", process, local_cluster.kubeconfig)
    finally:
        process.stop()
        unregister_webhooks(kubectl)


@dataclass
class Tenants:
    namespace: str
    alice: Kubectl
    bob: Kubectl
    admin: Kubectl
    alice_jobs_role: str


@pytest.fixture
def tenants(webhook: Installed, namespace: str, kubectl: Kubectl,
            as_user: Callable[[str], Kubectl]) -> Tenants:
    users.grant(kubectl, "alice", namespace, [APPWRAPPERS])
    role = users.grant(kubectl, "alice", namespace, ["jobs.batch"])
    users.grant(kubectl, "bob", namespace, [APPWRAPPERS])
    alice, bob = as_user("alice").in_namespace(namespace), as_user("bob").in_namespace(namespace)
    wait_for(lambda: alice.run("auth", "can-i", "create", "jobs.batch").stdout.strip() == "yes"
             and bob.run("auth", "can-i", "create", APPWRAPPERS).stdout.strip() == "yes",
             30, "the grants to take effect")
    return Tenants(namespace, alice, bob, as_user("admin").in_namespace(namespace), role)


@pytest.fixture
def dispatcher(webhook: Installed, local_cluster: Cluster, kubectl: Kubectl
               ) -> Iterator[DispatcherProcess]:
    d = DispatcherProcess(webhook.controller_kubeconfig,
                          local_cluster.logs / f"tenancy-{webhook.mode}")
    wait_quiet(kubectl)
    yield d
    d.finish()


# --- users ---------------------------------------------------------------------------

def test_users_act_as_themselves_with_their_teams_rights(
        as_user: Callable[[str], Kubectl], crd: None) -> None:
    alice, bob, admin = as_user("alice"), as_user("bob"), as_user("admin")
    who = json.loads(alice("auth", "whoami", "-o", "json"))["status"]["userInfo"]
    assert who["username"] == "alice" and users.USERS_GROUP in who["groups"]
    assert alice.namespace == "team-a" and bob.namespace == "team-b"
    # A server-side dry run is authorized and admitted like the real thing.
    alice("create", "job", "probe", "--image=busybox", "--dry-run=server")
    denied = bob.run("create", "job", "probe", "--image=busybox", "--dry-run=server",
                     check=False)
    assert denied.returncode != 0
    assert 'User "bob" cannot create resource "jobs" in API group "batch" in the ' \
        'namespace "team-b"' in denied.stderr
    assert bob("auth", "can-i", "create", APPWRAPPERS).strip() == "yes"
    assert alice.run("auth", "can-i", "create", "jobs", "-n", "team-b",
                     check=False).stdout.strip() == "no"
    assert admin("auth", "can-i", "*", "*", "-A").strip() == "yes"


# --- the webhook ---------------------------------------------------------------------

@pytest.mark.parametrize(("item", "resource"), [
    (deployment(), "deployments.apps"), (job(), "jobs.batch"), (privileged_pod(), "pods")])
def test_bobs_appwrapper_of_what_he_may_not_create_is_refused_naming_the_item(
        tenants: Tenants, item: dict[str, Any], resource: str) -> None:
    error = refused(tenants.bob, appwrapper("sneaky", item))
    name = item["metadata"]["name"]
    assert (f"denied the request: spec.resources.GenericItems[0] ({item['kind']} {name!r}): "
            f"bob may not create {resource} in namespace {tenants.namespace}") in error
    assert tenants.admin.items("appwrappers") == []


def test_alices_appwrapper_of_a_job_is_admitted_recorded_and_dispatched(
        tenants: Tenants, dispatcher: DispatcherProcess) -> None:
    dispatcher.start("fifo")
    tenants.alice.apply(appwrapper("train", job("train", pods=2)))
    aw = tenants.alice.json("appwrapper", "train")
    annotations = aw["metadata"]["annotations"]
    assert annotations[CREATOR] == "alice"
    assert users.USERS_GROUP in json.loads(annotations[CREATOR_GROUPS])
    wait_for(lambda: last_condition(tenants.alice, "train") == "Running", 90,
             "alice's AppWrapper to run")
    assert len(tenants.admin.items("pods", "-l", f"{LABEL}=train")) == 2


def test_the_webhook_serves_how_long_its_answers_and_api_requests_take(
        tenants: Tenants, webhook: Installed) -> None:
    """`dispatcher webhook` has no metrics port: /metrics is on its HTTPS port (deploy/'s
    ServiceMonitor dispatcher-webhook scrapes it there)."""
    refused(tenants.bob, appwrapper("sneaky", deployment()))
    insecure = ssl.create_default_context()
    insecure.check_hostname = False
    insecure.verify_mode = ssl.CERT_NONE  # the webhook's own CA; what is read is counters
    with urllib.request.urlopen(f"https://127.0.0.1:{webhook.webhook.port}/metrics",
                                context=insecure, timeout=10) as answer:
        text = answer.read().decode()
    samples = {(s.name, frozenset(s.labels.items())): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    name = "dispatcher_webhook_request_duration_seconds_count"
    assert samples[(name, frozenset({("endpoint", "validate"), ("result", "denied")}))] >= 1
    assert samples[(name, frozenset({("endpoint", "mutate"), ("result", "allowed")}))] >= 1
    # Its SubjectAccessReviews, created as it asked whether bob may create the Deployment.
    assert samples[("dispatcher_api_requests_total",
                    frozenset({("verb", "POST"), ("code", "201")}))] >= 1


@pytest.mark.parametrize("item", [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "taken-over"}},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
     "metadata": {"name": "taken-over"},
     "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]}])
def test_cluster_scoped_items_are_refused_even_to_the_admin(
        tenants: Tenants, kubectl: Kubectl, item: dict[str, Any]) -> None:
    error = refused(tenants.admin, appwrapper("global", item, custom=True))
    # The spec's own check refuses it, before any lookup costs the API server anything.
    assert f"spec.resources.GenericItems[0]: {item['kind']} 'taken-over' is cluster-scoped" \
        in error
    assert "an AppWrapper creates objects only in its own namespace" in error
    assert kubectl.run("get", item["kind"].lower(), "taken-over", check=False).returncode != 0


def test_items_of_a_dispatched_appwrapper_cannot_be_edited(
        tenants: Tenants, kubectl: Kubectl) -> None:
    alice = tenants.alice
    alice.apply(appwrapper("frozen", job("frozen")))
    # Queued (no dispatcher here): its items may still change.
    alice("patch", "appwrapper", "frozen", "--type=json", "-p", json.dumps([
        {"op": "replace", "value": 2,
         "path": "/spec/resources/GenericItems/0/generictemplate/spec/parallelism"}]))
    # As the dispatcher records a dispatch (the status is its alone to write).
    kubectl.in_namespace(tenants.namespace)(
        "patch", "appwrapper", "frozen", "--subresource=status", "--type=merge", "-p",
        json.dumps({"status": {"state": "Running", "queuejobstate": "Dispatched",
                               "conditions": [{"type": "Init"}, {"type": "Dispatched"}]}}))
    proc = alice.run("patch", "appwrapper", "frozen", "--type=json", "-p", json.dumps([
        {"op": "replace", "value": 8,
         "path": "/spec/resources/GenericItems/0/generictemplate/spec/parallelism"}]),
        check=False)
    assert proc.returncode != 0
    assert "spec.resources.GenericItems cannot change once the AppWrapper is past the queue " \
        "(its latest condition is Dispatched)" in proc.stderr
    items = alice.json("appwrapper", "frozen")["spec"]["resources"]["GenericItems"]
    assert items[0]["generictemplate"]["spec"]["parallelism"] == 2
    # Anything but the items may still change (a priority within her grants).
    alice("label", "appwrapper", "frozen", "team=a")
    grant_use(kubectl, tenants.namespace, "alice", PRIORITIES, ["3"])
    alice("patch", "appwrapper", "frozen", "--type=merge", "-p", '{"spec": {"priority": 3}}')


def test_the_creator_cannot_be_forged_or_edited(tenants: Tenants) -> None:
    alice = tenants.alice
    alice.apply(appwrapper("forged", job("forged"), annotations={
        CREATOR: "bob", CREATOR_GROUPS: '["system:masters"]'}))
    annotations = alice.json("appwrapper", "forged")["metadata"]["annotations"]
    assert annotations[CREATOR] == "alice"
    assert "system:masters" not in json.loads(annotations[CREATOR_GROUPS])
    for change in (f"{CREATOR}=bob", f"{CREATOR}-", f'{CREATOR_GROUPS}=["system:masters"]'):
        proc = alice.run("annotate", "--overwrite", "appwrapper", "forged", change,
                         check=False)
        assert proc.returncode != 0, change
        assert "records who created this AppWrapper and cannot be changed" in proc.stderr
    # Not even the admin rewrites history.
    proc = tenants.admin.run("annotate", "--overwrite", "appwrapper", "forged",
                             f"{CREATOR}=admin", check=False)
    assert proc.returncode != 0


def test_an_invalid_appwrapper_is_refused_at_apply_with_the_cores_message(
        tenants: Tenants) -> None:
    stray = job("stray")
    stray["metadata"]["namespace"] = "elsewhere"
    obj = appwrapper("stray", stray)
    error = refused(tenants.alice, obj)
    (message,) = core_problems({**obj, "metadata": {**obj["metadata"],
                                                    "namespace": tenants.namespace}})
    assert message in error
    assert "must be in the AppWrapper's namespace" in message


def test_creator_denials_see_rbac_change_while_it_queues(
        tenants: Tenants, webhook: Installed, kubectl: Kubectl) -> None:
    """What the controller asks just before creating the items, with its own
    credentials (deploy/'s service account in the deployed run)."""
    tenants.alice.apply(appwrapper("waiting", job("waiting")))
    aw = tenants.alice.json("appwrapper", "waiting")

    async def denials() -> list[str]:
        kube = await Kube.connect(str(webhook.controller_kubeconfig))
        try:
            return await creator_denials(kube, aw)
        finally:
            await kube.close()

    assert asyncio.run(denials()) == []
    users.revoke(kubectl, tenants.namespace, tenants.alice_jobs_role)
    want = [f"spec.resources.GenericItems[0] (Job 'waiting'): alice may not create jobs.batch "
            f"in namespace {tenants.namespace}"]
    wait_for(lambda: asyncio.run(denials()) == want, 30,
             "the revoked right to show in creator_denials")


def test_metrics_can_require_a_token_allowed_to_get_them(
        tenants: Tenants, dispatcher: DispatcherProcess, kubectl: Kubectl) -> None:
    ns = kubectl.in_namespace(tenants.namespace)
    ns("create", "serviceaccount", "scraper")
    reader = f"{tenants.namespace}-metrics-reader"
    kubectl.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": reader},
         "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": reader},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": reader},
         "subjects": [{"kind": "ServiceAccount", "name": "scraper",
                       "namespace": tenants.namespace}]}])
    account = f"system:serviceaccount:{tenants.namespace}:scraper"
    try:
        # Refusals are remembered for a minute: ask only once the grant is in force.
        wait_for(lambda: kubectl.run("auth", "can-i", "get", "/metrics", "--as", account,
                                     check=False).stdout.strip() == "yes",
                 30, "the scraper's grant to take effect")
        port = free_port()
        dispatcher.start("fifo", extra_args=["--metrics-port", str(port), "--metrics-host",
                                             "127.0.0.1", "--metrics-auth", "kubernetes"])
        scraper = ns("create", "token", "scraper").strip()
        other = ns("create", "token", "default").strip()

        def status(token: str | None, path: str = "/metrics") -> int:
            req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
            if token:
                req.add_header("Authorization", f"Bearer {token}")
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return int(r.status)
            except urllib.error.HTTPError as e:
                return int(e.code)

        assert status(None) == 401
        assert status("not-a-token") == 401
        assert status(other) == 403
        assert status(scraper) == 200
        assert status(None, "/healthz") == 200
    finally:
        kubectl("delete", "clusterrole,clusterrolebinding", reader, "--ignore-not-found")


# --- quota nodes and priorities, only as granted -------------------------------------------

@pytest.fixture
def quota_tree(tenants: Tenants, kubectl: Kubectl) -> Iterator[str]:
    """A quota tree of this test (its name): gold, a hard leaf of 1 GPU; default, the
    rest. Removed after the test, so no other test's AppWrapper counts against it."""
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(QUOTA_CRD))
    kubectl("wait", "--for=condition=Established", "--timeout=60s",
            "crd/quotasubtrees.quota.codeflare.dev")
    tree = f"quota_{tenants.namespace.rsplit('-', 1)[-1]}"

    def subtree(name: str, children: list[dict[str, Any]], parent: str | None = None
                ) -> dict[str, Any]:
        return {"apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
                "metadata": {"name": name, "labels": {"tree": tree}},
                "spec": {"children": children, **({"parent": parent} if parent else {})}}

    def gpus(n: int, hard: bool = False) -> dict[str, Any]:
        return {"hardLimit": hard, "requests": {"nvidia.com/gpu": n}}

    ns = kubectl.in_namespace(tenants.namespace)
    ns.apply([subtree("root", [{"name": "root", "quotas": gpus(32)}]),
              subtree("teams", [{"name": "gold", "quotas": gpus(1, hard=True)},
                                {"name": "bronze", "quotas": gpus(1, hard=True)},
                                {"name": "default", "quotas": gpus(30)}], parent="root")])
    yield tree
    ns("delete", "quotasubtrees", "--all")


def claiming(name: str, tree: str, node: str, priority: int = 0) -> dict[str, Any]:
    obj = appwrapper(name, job(name))
    obj["metadata"]["labels"] = {tree: node}
    if priority:
        obj["spec"]["priority"] = priority
    return obj


def test_a_tenant_cannot_use_another_teams_quota_node_or_a_priority_not_granted(
        tenants: Tenants, quota_tree: str, kubectl: Kubectl) -> None:
    """The issue's attack at `kubectl apply`, as alice with her own credentials: gold's hard
    leaf and priority 10^9. Refused naming each grant; accepted once granted, and from the
    admin always; an edit to another node or priority is refused."""
    tree, ns = quota_tree, tenants.namespace
    error = refused(tenants.alice, claiming("grab", tree, "gold", 1000000000))
    assert (f"metadata.labels.{tree}: alice may not use quota node gold of tree {tree} in "
            f"namespace {ns}: no RBAC grant of verb use on quotasubtrees (apiGroup "
            f"quota.codeflare.dev), resourceName '{tree}:gold'") in error
    assert (f"spec.priority: alice may not use priority 1000000000 in namespace {ns}: no "
            "RBAC grant of verb use on appwrappers/priority (apiGroup workload.codeflare.dev), "
            "resourceName '1000000000'") in error
    assert tenants.admin.items("appwrappers") == []
    # What needs no grant: the tree's default leaf, priority 0.
    tenants.alice.apply(claiming("plain", tree, "default"))
    # The administrator may; and grants alice gold and priority 1000.
    tenants.admin.apply(claiming("admins", tree, "gold", 1000000000))
    grant_use(kubectl, ns, "alice", QUOTA_NODES, [f"{tree}:gold"])
    grant_use(kubectl, ns, "alice", PRIORITIES, ["1000"])
    tenants.alice.apply(claiming("mine", tree, "gold", 1000))
    assert tenants.alice.json("appwrapper", "mine")["metadata"]["labels"] == {tree: "gold"}
    # Edits: another node, a higher priority — refused; the labels stay.
    proc = tenants.alice.run("label", "--overwrite", "appwrapper", "mine", f"{tree}=bronze",
                             check=False)
    assert proc.returncode != 0
    assert f"alice may not use quota node bronze of tree {tree}" in proc.stderr
    proc = tenants.alice.run("patch", "appwrapper", "plain", "--type=merge", "-p",
                             '{"spec": {"priority": 2000}}', check=False)
    assert proc.returncode != 0 and "alice may not use priority 2000" in proc.stderr
    # bob may edit AppWrappers here but holds no grant: he cannot move plain to gold, nor
    # lend alice's gold to his own.
    proc = tenants.bob.run("label", "--overwrite", "appwrapper", "plain", f"{tree}=gold",
                           check=False)
    assert proc.returncode != 0 and "bob may not use quota node gold" in proc.stderr
    assert tenants.alice.json("appwrapper", "plain")["metadata"]["labels"] == {
        tree: "default"}


def test_the_dispatcher_charges_a_quota_node_and_gives_a_priority_only_as_granted(
        tenants: Tenants, quota_tree: str, kubectl: Kubectl,
        dispatcher: DispatcherProcess) -> None:
    """At dispatch, as the recorded creator: alice's AppWrapper, accepted while she held
    the grant, waits naming it once it is revoked, and preempts nobody; the admin's
    AppWrapper of the same quota node runs."""
    tree, ns = quota_tree, tenants.namespace
    role = grant_use(kubectl, ns, "alice", QUOTA_NODES, [f"{tree}:gold"])
    priority = grant_use(kubectl, ns, "alice", PRIORITIES, ["1000000000"])
    tenants.alice.apply(claiming("mine", tree, "gold", 1000000000))
    users.revoke(kubectl, ns, role)
    users.revoke(kubectl, ns, priority)
    wait_for(lambda: not can_use(kubectl, ns, "alice", QUOTA_NODES, f"{tree}:gold"), 30,
             "the revocation")
    dispatcher.start("priority-preemption", extra_args=["--require-creator"])
    tenants.admin.apply(claiming("admins", tree, "gold"))
    wait_for(lambda: last_condition(tenants.admin, "admins") == "Running", 90,
             "the admin's AppWrapper to run")

    def message() -> str:
        return str((tenants.alice.json("appwrapper", "mine").get("status") or {}).get(
            "message", ""))

    wait_for(lambda: message().startswith(f"NotGranted: metadata.labels.{tree}: alice may "
                                          "not use quota node gold"), 60,
             "alice's AppWrapper to wait for its grant")
    assert f"alice may not use priority 1000000000 in namespace {ns}" in message()
    assert last_condition(tenants.alice, "mine") == "Backoff"
    assert tenants.admin.items("pods", "-l", f"{LABEL}=mine") == []
    assert "PreemptCandidate" not in [
        c["type"] for c in tenants.admin.json("appwrapper", "admins")["status"]["conditions"]]


# --- the manager's labels -------------------------------------------------------------

CLUSTER_LABEL = "workload.codeflare.dev/cluster"
MANAGER_UID_LABEL = "workload.codeflare.dev/manager-uid"


def manager_account(webhook: Installed, tenants: Tenants, kubectl: Kubectl) -> str:
    """The manager's service account of the webhook's namespace (its name), allowed to edit
    AppWrappers in the tenants' namespace; the admin acts as it."""
    namespace = LOCAL_WEBHOOK_NAMESPACE if webhook.mode == "local" else "dispatcher-system"
    account = f"system:serviceaccount:{namespace}:dispatcher-manager"
    meta = {"name": "manager-edits", "namespace": tenants.namespace}
    kubectl.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"],
                    "verbs": ["get", "list", "patch", "update"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "manager-edits"},
         "subjects": [{"kind": "ServiceAccount", "name": "dispatcher-manager",
                       "namespace": namespace}]}])
    wait_for(lambda: tenants.admin.run("auth", "can-i", "patch", APPWRAPPERS, "--as", account
                                       ).stdout.strip() == "yes", 30, "the manager's grant")
    return account


def test_a_tenant_cannot_set_or_remove_the_managers_labels(
        tenants: Tenants, webhook: Installed, kubectl: Kubectl) -> None:
    alice = tenants.alice
    sent = appwrapper("sent", job("sent"))
    sent["metadata"]["labels"] = {CLUSTER_LABEL: "w1"}
    stderr = refused(alice, sent)
    assert f"metadata.labels[{CLUSTER_LABEL}]: set only by the dispatcher's manager" in stderr
    assert "not by alice" in stderr
    alice.apply(appwrapper("mine", job("mine")))
    for change in (f"{CLUSTER_LABEL}=w1", f"{MANAGER_UID_LABEL}=u1"):
        proc = alice.run("label", "appwrapper", "mine", change, check=False)
        assert proc.returncode != 0, change
        assert "set only by the dispatcher's manager" in proc.stderr
    # The manager's own account may; then the tenant cannot take the label away.
    account = manager_account(webhook, tenants, kubectl)
    tenants.admin("label", "appwrapper", "mine", f"{MANAGER_UID_LABEL}=u1", "--as", account)
    proc = alice.run("label", "appwrapper", "mine", f"{MANAGER_UID_LABEL}-", check=False)
    assert proc.returncode != 0 and "it cannot be removed" in proc.stderr
    labels = alice.json("appwrapper", "mine")["metadata"]["labels"]
    assert labels[MANAGER_UID_LABEL] == "u1"


# --- a wrapper being deleted, deep input, managedBy -------------------------------------------

KEEP = "alice.example/keep"
V1BETA2_FIELDS = "workload.codeflare.dev/v1beta2"


def _deleting(k: Kubectl, name: str) -> bool:
    return bool(k.json("appwrapper", name)["metadata"].get("deletionTimestamp"))


def test_a_wrapper_kept_alive_by_its_own_finalizer_is_neither_editable_nor_dispatched(
        tenants: Tenants, quota_tree: str, dispatcher: DispatcherProcess) -> None:
    """Alice keeps her wrapper with her own finalizer and deletes it, then tries to become
    system:masters, take priority 1000 and the gold team's quota: each edit is refused. The
    dispatcher, started afterwards, never dispatches it (the wrapper behind it runs);
    removing her finalizer still lets it go."""
    alice, tree = tenants.alice, quota_tree
    alice.apply(appwrapper("doomed", job("doomed")))
    alice("patch", "appwrapper", "doomed", "--type=merge", "-p",
          json.dumps({"metadata": {"finalizers": [KEEP]}}))
    alice("delete", "appwrapper", "doomed", "--wait=false")
    wait_for(lambda: _deleting(alice, "doomed"), 30, "doomed to be marked for deletion")
    for edit in (["annotate", "--overwrite", "appwrapper", "doomed",
                  f'{CREATOR_GROUPS}=["system:masters"]'],
                 ["patch", "appwrapper", "doomed", "--type=merge", "-p",
                  '{"spec": {"priority": 1000}}'],
                 ["label", "--overwrite", "appwrapper", "doomed", f"{tree}=gold"]):
        proc = alice.run(*edit, check=False)
        assert proc.returncode != 0, edit
        assert "being deleted: only its finalizers may be removed" in proc.stderr, edit
    shown = alice.json("appwrapper", "doomed")
    assert "system:masters" not in shown["metadata"]["annotations"][CREATOR_GROUPS]
    assert shown["spec"].get("priority", 0) == 0 and tree not in (
        shown["metadata"].get("labels") or {})
    alice.apply(appwrapper("behind", job("behind")))
    dispatcher.start("fifo")
    wait_for(lambda: last_condition(alice, "behind") == "Running", 90, "behind to run")
    assert tenants.admin.items("jobs", "-l", f"{LABEL}=doomed") == []
    assert alice.run("get", "job", "doomed", check=False).returncode != 0
    assert last_condition(alice, "doomed") not in ("Dispatched", "Running")
    alice("patch", "appwrapper", "doomed", "--type=json", "-p",
          json.dumps([{"op": "remove", "path": "/metadata/finalizers"}]))
    wait_for(lambda: alice.run("get", "appwrapper", "doomed", check=False).returncode != 0,
             30, "doomed to be gone once its finalizer is removed")


def _nested_job(name: str, depth: int) -> dict[str, Any]:
    item = job(name)
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"x": value}
    item["spec"]["template"]["spec"]["containers"][0]["x"] = value
    return item


def test_a_template_nested_hundreds_deep_is_refused_at_apply(tenants: Tenants) -> None:
    obj = appwrapper("deep", _nested_job("deep", 300))
    proc = tenants.alice.run("create", "-f", "-", input=json.dumps(obj), check=False)
    assert proc.returncode != 0
    assert "nests more than 100 levels deep" in proc.stderr and "flatten it" in proc.stderr
    assert tenants.admin.items("appwrappers") == []


def test_managed_by_cannot_be_flipped_on_a_wrapper(tenants: Tenants) -> None:
    alice = tenants.alice
    alice.apply(appwrapper("mine", job("mine")))
    for text in (json.dumps({"managedBy": "kueue.x-k8s.io/multikueue"}), "{not json"):
        proc = alice.run("annotate", "--overwrite", "appwrapper", "mine",
                         f"{V1BETA2_FIELDS}={text}", check=False)
        assert proc.returncode != 0, text
        assert ("spec.managedBy cannot change" in proc.stderr
                or f"annotation {V1BETA2_FIELDS}" in proc.stderr), proc.stderr
    annotations = alice.json("appwrapper", "mine")["metadata"]["annotations"]
    assert V1BETA2_FIELDS not in annotations
