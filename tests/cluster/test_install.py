"""Installing like the anchors: the Helm chart (charts/dispatcher) and the release's single
install.yaml (`make release`), rendered with the pinned helm and kubectl.

The chart renders deploy/'s own objects, and the components its values switch on; every
value changes what it names and the schema refuses what it does not know. Both the packaged
chart and install.yaml are applied to the local cluster (a server-side dry run, then for
real), and the dispatcher comes up from them: its Deployments become available under the
namespace's restricted Pod Security Standard, and `dispatcher run` and `dispatcher webhook`
started with the rendered Deployments' args, as their service accounts, admit and dispatch
a tenant's AppWrapper. Then everything but the CRDs is removed.
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.cli import build_parser
from dispatcher.controller.access.creator import CREATOR
from dispatcher.policy_files import builtin_names
from localcluster import Cluster, Kubectl, build, users, wait_for
from localcluster.testing import self_contained

from .dispatcher_process import REPO, DispatcherProcess, install_crd
from .test_operations import appwrapper, job, wait_condition
from .test_tenancy import APPWRAPPERS
from .webhook_process import (
    AGGREGATED,
    CLUSTER_KINDS,
    CONTROLLER_SA,
    DEPLOY,
    PART_OF,
    SYSTEM_NAMESPACE,
    WEBHOOK_SA,
    WebhookProcess,
    apply_deploy,
    delete_deploy,
    service_account_kubeconfig,
)

CHART = REPO / "charts" / "dispatcher"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
COMPONENTS = DEPLOY / "components"
#: Every value set to something else than its default (chart-lint lints with it too).
EVERYTHING = CHART / "ci" / "everything-values.yaml"

Docs = dict[tuple[str, str], dict[str, Any]]


# --- rendering ------------------------------------------------------------------------

def helm(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(build.binary("helm")), *map(str, args)], capture_output=True,
                          text=True, check=False)


def render(*args: str | Path, chart: Path = CHART) -> list[dict[str, Any]]:
    """`helm template` into the dispatcher's namespace, the CRDs included."""
    done = helm("template", "dispatcher", chart, "-n", SYSTEM_NAMESPACE, "--include-crds",
                *args)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def by_name(docs: Sequence[dict[str, Any]]) -> Docs:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def kustomize(*components: str, tmp: Path) -> Docs:
    """deploy/ with some of its components, as `kubectl kustomize` renders it."""
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY, tmp)],
        "components": [os.path.relpath(COMPONENTS / c, tmp) for c in components]}))
    kubectl = build.binary("kubernetes", "kubectl")
    out = subprocess.run([str(kubectl), "kustomize", str(tmp)], capture_output=True,
                         text=True, check=True).stdout
    return by_name([d for d in yaml.safe_load_all(out) if d])


def container(docs: Docs, deployment: str) -> dict[str, Any]:
    return dict(docs[("Deployment", deployment)]["spec"]["template"]["spec"]["containers"][0])


def args_of(docs: Docs, deployment: str) -> Any:
    """What `dispatcher` makes of a Deployment's args."""
    return build_parser().parse_args(container(docs, deployment)["args"])


HELM_LABELS = {"app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
               "app.kubernetes.io/version", "helm.sh/chart"}


@pytest.mark.parametrize("values, components", [
    ((), ()),
    (("--set", "podWebhook.enabled=true", "--set", "monitoring.serviceMonitor.enabled=true",
      "--set", "monitoring.prometheusRule.enabled=true", "--set", "certManager.enabled=true"),
     ("pod-webhook", "monitoring", "cert-manager", "cert-manager-pod-webhook")),
    (("--set", "manager.enabled=true"), ("manager",)),
], ids=["defaults", "every-component", "manager"])
def test_the_chart_renders_the_objects_of_deploy(
        values: tuple[str, ...], components: tuple[str, ...], tmp_path: Path) -> None:
    chart = by_name(render("--set", "namespace.create=true", *values))
    deploy = kustomize(*components, tmp=tmp_path)
    assert sorted(chart) == sorted(deploy)
    for key, want in deploy.items():
        got = chart[key]
        labels = got["metadata"].pop("labels", {})
        wanted = want["metadata"].pop("labels")
        if key[0] != "CustomResourceDefinition":  # Helm installs crds/ as they are
            assert labels.items() >= wanted.items(), key
            assert set(labels) - set(wanted) == HELM_LABELS
        if key[0] == "Deployment":
            for doc in (got, want):
                image = doc["spec"]["template"]["spec"]["containers"][0].pop("image")
                assert image == f"dispatcher:{VERSION}"
        assert got == want, key


def test_the_chart_values_change_what_they_name() -> None:
    values = yaml.safe_load(EVERYTHING.read_text())
    docs = by_name(render("-f", EVERYTHING))
    run = args_of(docs, "dispatcher")
    controller = docs[("Deployment", "dispatcher")]
    assert controller["spec"]["replicas"] == values["controller"]["replicas"]
    assert container(docs, "dispatcher")["image"] == "registry.example.com/dispatcher:9.9.9"
    assert run.fit == "aggregate" and run.kube_qps == 100
    # A policy of its own, mounted from its ConfigMap: `dispatcher run` reads that file.
    policy = yaml.safe_load(docs[("ConfigMap", "dispatcher-policy")]["data"]["policy.yaml"])
    assert policy == values["customPolicy"]
    mount = next(m for m in container(docs, "dispatcher")["volumeMounts"]
                 if m["name"] == "policy")
    assert run.policy == f"{mount['mountPath']}/policy.yaml"
    # No AppWrapper webhook: nothing of it, and no creator required at dispatch.
    assert not run.require_creator
    webhook_objects = [
        k for k, d in docs.items() if k[1] == "dispatcher-appwrappers"
        or d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "webhook"]
    assert webhook_objects == []
    # cert-manager with an issuer of one's own: no self-signed Issuer; the pod webhook
    # serves the Certificate's Secret.
    assert ("Issuer", "dispatcher-selfsigned") not in docs
    certificate = docs[("Certificate", "dispatcher-pods")]["spec"]
    assert certificate["issuerRef"] == values["certManager"]["issuerRef"]
    assert run.webhook_port == 9443
    volumes = {v["name"]: v for v in controller["spec"]["template"]["spec"]["volumes"]}
    served = next(v for v in volumes.values()
                  if v.get("secret", {}).get("secretName") == certificate["secretName"])
    assert any(m["name"] == served["name"] and m["mountPath"] == run.webhook_cert_dir
               for m in container(docs, "dispatcher")["volumeMounts"])
    assert docs[("ServiceMonitor", "dispatcher")]["metadata"]["labels"]["release"] == "kps"
    dashboard = docs[("ConfigMap", "dispatcher-dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"]["dispatcher-dashboard.json"] == (
        DEPLOY / "grafana" / "dispatcher-dashboard.json").read_text()


def test_with_cert_manager_the_webhook_serves_the_certificate_the_ca_injector_trusts() -> None:
    docs = by_name(render("--set", "certManager.enabled=true"))
    webhook = args_of(docs, "dispatcher-webhook")
    certificate = docs[("Certificate", "dispatcher-webhook")]
    spec = certificate["spec"]
    pod = docs[("Deployment", "dispatcher-webhook")]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    assert volume["secret"]["secretName"] == spec["secretName"]
    assert {"name": volume["name"], "mountPath": webhook.webhook_cert_dir, "readOnly": True} in \
        container(docs, "dispatcher-webhook")["volumeMounts"]
    assert f"dispatcher-webhook.{SYSTEM_NAMESPACE}.svc" in spec["dnsNames"]
    assert spec["issuerRef"] == {"kind": "Issuer", "name": "dispatcher-selfsigned"}
    assert docs[("Issuer", "dispatcher-selfsigned")]["spec"] == {"selfSigned": {}}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        annotations = docs[(kind, "dispatcher-appwrappers")]["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == \
            f"{SYSTEM_NAMESPACE}/{certificate['metadata']['name']}"
    # It keeps no certificate itself: no Secret of its own, no rights on any, nor on the
    # webhook configurations (it still asks SubjectAccessReviews and lists the quota trees
    # a label may name).
    assert ("Secret", "dispatcher-webhook-cert") not in docs
    assert ("Role", "dispatcher-webhook") not in docs
    rules = docs[("ClusterRole", "dispatcher-webhook")]["rules"]
    assert rules == [{"apiGroups": ["authorization.k8s.io"],
                      "resources": ["subjectaccessreviews"], "verbs": ["create"]},
                     {"apiGroups": ["quota.codeflare.dev"],
                      "resources": ["quotasubtrees"], "verbs": ["list"]}]


def test_a_manager_runs_two_replicas_one_leading_with_the_grace_it_is_given() -> None:
    docs = by_name(render("--set", "manager.enabled=true", "--set", "manager.workerGrace=60",
                          "--set", "controller.replicas=3"))
    assert ("Deployment", "dispatcher") not in docs  # it would run the gangs here
    run = args_of(docs, "dispatcher-manager")
    assert run.manager and run.worker_grace == 60 and run.metrics_port == 8080
    assert run.leader_elect  # one replica sends, the other waits for the Lease
    manager = docs[("Deployment", "dispatcher-manager")]
    assert manager["spec"]["replicas"] == 2
    assert manager["spec"]["template"]["spec"]["serviceAccountName"] == "dispatcher-manager"
    assert container(docs, "dispatcher-manager")["image"] == f"dispatcher:{VERSION}"
    # In its own namespace only: Secrets, no more than get; its own Lease.
    secrets, *leases = docs[("Role", "dispatcher-manager")]["rules"]
    assert secrets == {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
    assert all(r["apiGroups"] == ["coordination.k8s.io"] and r["resources"] == ["leases"]
               for r in leases)
    assert [r.get("resourceNames") for r in leases if "update" in r["verbs"]] == [
        ["dispatcher-manager-leader"]]
    assert not any("secrets" in r["resources"]
                   for r in docs[("ClusterRole", "dispatcher-manager")]["rules"])


def test_the_chart_switches_the_alerts_apart_from_the_service_monitors() -> None:
    def kinds(*values: str) -> set[str]:
        return {kind for kind, _ in by_name(render(*values))}

    monitors = kinds("--set", "monitoring.serviceMonitor.enabled=true")
    assert "ServiceMonitor" in monitors and "PrometheusRule" not in monitors
    rules = by_name(render("--set", "monitoring.prometheusRule.enabled=true"))
    assert ("PrometheusRule", "dispatcher") in rules
    assert "ServiceMonitor" not in {kind for kind, _ in rules}
    assert not {"ServiceMonitor", "PrometheusRule"} & kinds()


def test_the_chart_network_policies_admit_the_api_servers_addresses_only(
        tmp_path: Path) -> None:
    docs = by_name(render("--set", "networkPolicy.enabled=true",
                          "--set", "networkPolicy.apiServerCIDRs={10.0.0.0/28,10.0.1.0/28}"))
    deploy = kustomize("network-policy", tmp=tmp_path)
    policies = [k for k in deploy if k[0] == "NetworkPolicy"]
    assert policies and sorted(policies) == sorted(k for k in docs if k[0] == "NetworkPolicy")
    for key in policies:
        ingress = docs[key]["spec"]["ingress"]
        assert ingress[0]["from"] == [{"ipBlock": {"cidr": "10.0.0.0/28"}},
                                      {"ipBlock": {"cidr": "10.0.1.0/28"}}], key
        # The rest as deploy/'s component has it.
        assert ingress[0]["ports"] == deploy[key]["spec"]["ingress"][0]["ports"]
        assert ingress[1:] == deploy[key]["spec"]["ingress"][1:]
    done = helm("template", "dispatcher", CHART, "--set", "networkPolicy.enabled=true")
    assert done.returncode != 0
    assert "set networkPolicy.apiServerCIDRs to the addresses kube-apiserver" in done.stderr


def test_the_chart_log_format_reaches_every_pod() -> None:
    docs = by_name(render("--set", "logFormat=json"))
    manager = by_name(render("--set", "logFormat=json", "--set", "manager.enabled=true"))
    for deployment in ("dispatcher", "dispatcher-webhook"):
        assert args_of(docs, deployment).log_format == "json", deployment
    assert args_of(manager, "dispatcher-manager").log_format == "json"
    defaults = by_name(render())
    assert args_of(defaults, "dispatcher").log_format == "text"
    assert "--log-format" not in container(defaults, "dispatcher")["args"]


@pytest.mark.parametrize("value, error", [
    ("logFormat=yaml", "value must be one of 'text', 'json'"),
    ("networkPolicy.apiServerCIDRs={10.0.0.0}", "does not match pattern"),
    ("policy=priorty", "value must be one of 'backfill', 'fifo', 'priority'"),
    ("controller.replica=3", "additional properties 'replica' not allowed"),
    ("fit=best", "value must be one of 'per-node', 'aggregate'"),
])
def test_the_chart_refuses_values_it_does_not_know(value: str, error: str) -> None:
    done = helm("template", "dispatcher", CHART, "--set", value)
    assert done.returncode != 0
    assert error in done.stderr


def test_the_chart_offers_the_policies_the_image_has() -> None:
    schema = yaml.safe_load((CHART / "values.schema.json").read_text())
    assert schema["properties"]["policy"]["enum"] == builtin_names()


def test_helm_lint_passes_with_the_defaults_and_every_value() -> None:
    for values in ((), ("-f", EVERYTHING)):
        done = helm("lint", "--strict", CHART, *values)
        assert done.returncode == 0, done.stdout + done.stderr


# --- the release ------------------------------------------------------------------------

@dataclass
class Release:
    install_yaml: Path
    chart: Path


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """`make release`'s artefacts."""
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "localcluster.release", "--dist", str(dist)],
                   cwd=REPO, check=True, capture_output=True)
    return Release(dist / "install.yaml", dist / f"dispatcher-{VERSION}.tgz")


def test_the_release_is_versioned_with_the_package(released: Release) -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION
    install = by_name(list(yaml.safe_load_all(released.install_yaml.read_text())))
    for name in ("dispatcher", "dispatcher-webhook"):
        assert container(install, name)["image"] == f"dispatcher:{VERSION}"
    assert ("CustomResourceDefinition", "appwrappers.workload.codeflare.dev") in install
    # The packaged chart holds copies of what the source links to, and renders the same.
    assert render(chart=released.chart) == render()


# --- on the cluster ---------------------------------------------------------------------

class Rendered:
    """`dispatcher run` and `dispatcher webhook` with a rendered Deployment's args, plus
    what a local process needs instead of a pod's: its service account's kubeconfig, the
    namespace (the pod's POD_NAMESPACE), loopback addresses, no metrics port."""

    @staticmethod
    def controller(args: list[str], kubeconfig: Path, log_dir: Path) -> DispatcherProcess:
        class Controller(DispatcherProcess):
            def arguments(self, fit: str, extra_args: Sequence[str]) -> list[str]:
                return [*args, "--kubeconfig", str(self.kubeconfig), "--lease-namespace",
                        SYSTEM_NAMESPACE, "--metrics-port", "0", "-v"]

        return Controller(kubeconfig, log_dir, "rendered-dispatcher")

    @staticmethod
    def webhook(args: list[str], kubeconfig: Path, log_dir: Path,
                manifest: list[dict[str, Any]]) -> WebhookProcess:
        class Webhook(WebhookProcess):
            def arguments(self, fit: str, extra_args: Sequence[str]) -> list[str]:
                return [*args, "--kubeconfig", str(self.kubeconfig), "--port", str(self.port),
                        "--host", "127.0.0.1", "--cert-host", "127.0.0.1",
                        "--namespace", self.namespace, "-v"]

        return Webhook(kubeconfig, log_dir, SYSTEM_NAMESPACE, manifest=manifest)


@pytest.fixture
def removed_after(kubectl: Kubectl) -> Iterator[None]:
    yield
    delete_deploy(kubectl)
    assert kubectl("get", CLUSTER_KINDS, "-l", PART_OF, "-o", "name").strip() == ""
    assert not kubectl.run("get", AGGREGATED, check=False).stdout
    wait_for(lambda: kubectl.run("get", "namespace", SYSTEM_NAMESPACE,
                                 check=False).returncode, 120,
             f"namespace {SYSTEM_NAMESPACE} to be gone")


@pytest.mark.parametrize("artefact", ["chart", "install.yaml"])
def test_the_dispatcher_comes_up_from_the_chart_and_from_install_yaml(
        artefact: str, released: Release, removed_after: None, local_cluster: Cluster,
        kubectl: Kubectl, namespace: str, as_user: Callable[[str], Kubectl],
        tmp_path: Path) -> None:
    if artefact == "chart":
        manifest = yaml.safe_dump_all(render("--set", "namespace.create=true",
                                             chart=released.chart))
    else:
        manifest = released.install_yaml.read_text()
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    rendered = by_name(docs)
    install_crd(kubectl)
    apply_deploy(kubectl, manifest)
    system = kubectl.in_namespace(SYSTEM_NAMESPACE)
    # kwok plays the kubelet: the pods exist, so they met the restricted standard.
    for name in ("dispatcher", "dispatcher-webhook"):
        wait_for(lambda name=name: (system.json("deployment", name).get("status") or {}).get(
            "availableReplicas") == rendered[("Deployment", name)]["spec"]["replicas"],
            90, f"the {name} Deployment to be available")
    wait_for(lambda: kubectl.json("clusterrole", "dispatcher-wrapped-kinds").get("rules"),
             60, "the aggregated ClusterRole dispatcher-wrapped-kinds to be filled in")
    logs = local_cluster.logs / f"install-{artefact}"
    kubeconfigs = {sa: service_account_kubeconfig(kubectl, local_cluster.kubeconfig, sa,
                                                  tmp_path / f"{sa}.kubeconfig")
                   for sa in (WEBHOOK_SA, CONTROLLER_SA)}
    webhook = Rendered.webhook(container(rendered, "dispatcher-webhook")["args"],
                               kubeconfigs[WEBHOOK_SA], logs, docs)
    controller = Rendered.controller(container(rendered, "dispatcher")["args"],
                                     kubeconfigs[CONTROLLER_SA], logs)
    try:
        webhook.serve(kubectl)
        controller.start()
        users.grant(kubectl, "alice", namespace, [APPWRAPPERS, "jobs.batch"])
        alice = as_user("alice").in_namespace(namespace)
        alice("create", "-f", "-", input=yaml.safe_dump(appwrapper("job", job("job", 2, 1))))
        k = kubectl.in_namespace(namespace)
        assert k.json("appwrapper", "job")["metadata"]["annotations"][CREATOR] == "alice"
        wait_condition(k, "job", "Running", timeout=90)
        assert len(k.items("pods", "-l", "workload.codeflare.dev/appwrapper=job")) == 2
        k("delete", "appwrapper", "job", "--wait=false")
    finally:
        controller.finish()
        webhook.finish()


MANAGER_SA = "dispatcher-manager"


def test_a_manager_comes_up_from_the_chart_with_only_the_rights_it_needs(
        removed_after: None, local_cluster: Cluster, kubectl: Kubectl, tmp_path: Path
        ) -> None:
    manifest = yaml.safe_dump_all(render("--set", "namespace.create=true",
                                         "--set", "manager.enabled=true"))
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    rendered = by_name(docs)
    install_crd(kubectl)
    kubectl("apply", "--server-side", "-f",
            str(REPO / "crds" / "workerclusters.workload.codeflare.dev.yaml"))
    apply_deploy(kubectl, manifest)
    system = kubectl.in_namespace(SYSTEM_NAMESPACE)
    wait_for(lambda: (system.json("deployment", "dispatcher-manager").get("status") or {}).get(
        "availableReplicas") == 2, 90, "the dispatcher-manager Deployment to be available")
    assert system.run("get", "deployment", "dispatcher", check=False).returncode != 0
    who = f"--as=system:serviceaccount:{SYSTEM_NAMESPACE}:{MANAGER_SA}"

    def can(*what: str) -> bool:
        return kubectl.run("auth", "can-i", who, *what, check=False).stdout.strip() == "yes"

    assert can("get", "secrets", "-n", SYSTEM_NAMESPACE)
    assert not can("get", "secrets", "-n", "default")
    assert not can("list", "secrets", "-n", SYSTEM_NAMESPACE)
    assert can("patch", "workerclusters.workload.codeflare.dev", "--subresource=status")
    assert not can("create", "workerclusters.workload.codeflare.dev")
    assert can("patch", "appwrappers.workload.codeflare.dev", "--subresource=status", "-A")
    assert can("watch", "appwrappers.workload.codeflare.dev", "-A")
    assert not can("patch", "appwrappers.workload.codeflare.dev", "-A")  # status is its record
    assert not can("create", "pods", "-n", "default")
    # Run as its service account, with the rendered args: it reads a worker's kubeconfig
    # from its namespace and reports the worker on the WorkerCluster's status; one whose
    # Secret is in another namespace is refused.
    for name, namespace in (("here", SYSTEM_NAMESPACE), ("elsewhere", "default")):
        kubectl.in_namespace(namespace).apply({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{name}-kubeconfig"},
            "data": {"kubeconfig": base64.b64encode(
                self_contained(local_cluster.kubeconfig)).decode()}})
        kubectl.apply({"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "WorkerCluster",
                       "metadata": {"name": name},
                       "spec": {"kubeconfigSecret": {"name": f"{name}-kubeconfig",
                                                     "namespace": namespace}}})
    kubeconfig = service_account_kubeconfig(kubectl, local_cluster.kubeconfig, MANAGER_SA,
                                            tmp_path / "manager.kubeconfig")
    manager = Rendered.controller(container(rendered, "dispatcher-manager")["args"],
                                  kubeconfig, local_cluster.logs / "install-manager")
    try:
        manager.start()
        wait_for(lambda: (kubectl.json("workercluster", "here").get("status") or {}).get(
            "reachable") == "True", 60, "the WorkerCluster here to be reported reachable")
        wait_for(lambda: "worker cluster elsewhere cannot be used" in manager.this_run(), 30,
                 "the WorkerCluster elsewhere to be refused")
        assert "forbidden" in manager.this_run().lower()
    finally:
        manager.finish()
        kubectl("delete", "workercluster", "here", "elsewhere", "--ignore-not-found")
        kubectl.in_namespace("default")("delete", "secret", "elsewhere-kubeconfig",
                                        "--ignore-not-found")
