"""Operating the dispatcher on a real control plane: its metrics against what happened,
the queue command and kubectl plugin, and deploy/ applied as it is, with the dispatcher
and its admission webhook running as their own service accounts under the least-privilege
RBAC of deploy/.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dispatcher.cli import build_parser
from dispatcher.controller.kube.leader_pod import LEADER_LABEL
from dispatcher.controller.webhook.server import PIN_PODS_PATH
from dispatcher.kinds.elastic import RESIZABLE
from localcluster import Cluster, Kubectl, wait_for
from localcluster.testing import container, fake_gpu_nodes, outcome

from .dispatcher_process import REPO, DispatcherProcess, free_port, install_crd, wait_quiet
from .webhook_process import (
    CONTROLLER_SA,
    DEPLOY,
    SECRET,
    SYSTEM_NAMESPACE,
    WEBHOOK_SA,
    Installed,
)

SA_NAMESPACE = SYSTEM_NAMESPACE
SA = CONTROLLER_SA
SA_USER = f"system:serviceaccount:{SA_NAMESPACE}:{SA}"
LABEL = "workload.codeflare.dev/appwrapper"
GPU = "nvidia.com/gpu"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


# --- builders and observers ----------------------------------------------------------

def appwrapper(name: str, *items: dict[str, Any], custom: list[dict[str, Any]] | None = None
               ) -> dict[str, Any]:
    generic: list[dict[str, Any]] = [{"generictemplate": i} for i in items]
    if custom is not None:
        generic[0]["custompodresources"] = custom
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name}, "spec": {"resources": {"GenericItems": generic}}}


def job(name: str, pods: int, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                     "template": {"metadata": {"annotations": outcome("run")},
                                  "spec": {"restartPolicy": "Never",
                                           "containers": [container(gpus=gpus)]}}}}


def last_condition(k: Kubectl, name: str) -> dict[str, Any]:
    aw = k.json("appwrapper", name)
    return dict((aw.get("status", {}).get("conditions") or [{}])[-1])


def wait_condition(k: Kubectl, name: str, ctype: str, timeout: float = 60) -> dict[str, Any]:
    try:
        return wait_for(lambda: (c := last_condition(k, name)).get("type") == ctype and c,
                        timeout, f"AppWrapper {name} to reach {ctype}")
    except TimeoutError as e:
        status = k.json("appwrapper", name).get("status")
        raise TimeoutError(f"{e}; status now: {status}") from None


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(port: int) -> Samples:
    status, text = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200, text
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def wait_metrics(port: int, want: dict[tuple[str, frozenset[tuple[str, str]]], float],
                 timeout: float = 30) -> Samples:
    """Scrape until every sample in `want` has its value (the loop may lag an event)."""
    last: Samples = {}

    def check() -> Samples | None:
        nonlocal last
        last = scrape(port)
        return last if all(last.get(k) == v for k, v in want.items()) else None

    try:
        return wait_for(check, timeout, "metrics to match")
    except TimeoutError:
        diff = {f"{n}{dict(lbl)}": (last.get((n, lbl)), v)
                for (n, lbl), v in want.items() if last.get((n, lbl)) != v}
        raise AssertionError(f"metrics (got, want): {diff}") from None


def m(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return (name, frozenset(labels.items()))


def wait_alone(kubectl: Kubectl, namespace: str) -> None:
    """No AppWrapper of another test left anywhere (it would count in the metrics), and
    no pod of one holding GPUs."""
    wait_for(lambda: all(a["metadata"]["namespace"] == namespace
                         for a in kubectl.items("appwrappers", "-A")),
             180, "AppWrappers of earlier tests to be deleted")
    wait_quiet(kubectl, 180)


def uniform_gpu_nodes(kubectl: Kubectl) -> tuple[int, int]:
    gpus = fake_gpu_nodes(kubectl)
    assert gpus and len(set(gpus.values())) == 1, f"expected uniform GPU nodes, got {gpus}"
    return len(gpus), next(iter(gpus.values()))


# --- fixtures ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def crd(kubectl: Kubectl) -> None:
    install_crd(kubectl)


@pytest.fixture
def dispatcher(local_cluster: Cluster, crd: None) -> Iterator[DispatcherProcess]:
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs)
    yield d
    d.finish()


# --- metrics ----------------------------------------------------------------------------

def test_metrics_follow_appwrappers_through_the_queue(
        dispatcher: DispatcherProcess, kubectl: Kubectl, k: Kubectl, namespace: str) -> None:
    wait_alone(kubectl, namespace)
    nodes, per_node = uniform_gpu_nodes(kubectl)
    schedulable = [n for n in kubectl.items("nodes") if not n["spec"].get("unschedulable")]
    port = free_port()
    dispatcher.start("fifo", extra_args=["--metrics-port", str(port),
                                         "--metrics-host", "127.0.0.1"])
    assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200

    # One gang takes every GPU; the second, the same size, must wait.
    k.apply(appwrapper("first", job("first", nodes, per_node)))
    wait_condition(k, "first", "Running", timeout=90)
    k.apply(appwrapper("second", job("second", nodes, per_node)))
    message = wait_condition(k, "second", "Backoff")["message"]
    assert GPU in message
    samples = wait_metrics(port, {
        m("dispatcher_dispatches_total"): 1,
        m("dispatcher_pending_appwrappers"): 1,
        m("dispatcher_appwrappers", state="Running", condition="Running"): 1,
        m("dispatcher_appwrappers", state="Pending", condition="Backoff"): 1,
        m("dispatcher_admission_wait_time_seconds_count"): 1,
        m("dispatcher_cluster_capacity", resource=GPU): nodes * per_node,
        m("dispatcher_cluster_free_capacity", resource=GPU): 0,
        m("dispatcher_cluster_largest_free_capacity", resource=GPU): 0,
        m("dispatcher_cluster_nodes", schedulable="true"): len(schedulable),
        m("dispatcher_failures_total", reason="InvalidSpec"): 0,
        m("dispatcher_requeues_total", reason="MinPodsNotRunning"): 0,
        m("dispatcher_policy_info", policy="fifo", fit="per-node"): 1,
    })
    assert samples[m("dispatcher_admission_cycle_duration_seconds_count")] >= 1
    assert samples[m("dispatcher_admission_cycle_last_timestamp_seconds")] > 0
    assert [v for (n, _), v in samples.items() if n == "dispatcher_build_info"] == [1]
    # No sample names an AppWrapper: labels stay bounded.
    assert not any(dict(lbl).get(key) in ("first", "second", namespace)
                   for (_, lbl) in samples for key in dict(lbl))

    # An AppWrapper the dispatcher cannot count pods for fails alone.
    k.apply(appwrapper("odd", {"apiVersion": "example.com/v1", "kind": "Widget",
                               "metadata": {"name": "w"}}))
    wait_condition(k, "odd", "Failed")
    wait_metrics(port, {
        m("dispatcher_failures_total", reason="InvalidSpec"): 1,
        m("dispatcher_appwrappers", state="Failed", condition="Failed"): 1,
        m("dispatcher_pending_appwrappers"): 1,
    })

    # The first one goes: the second dispatches into its GPUs.
    k("delete", "appwrapper", "first")
    wait_condition(k, "second", "Running", timeout=120)
    samples = wait_metrics(port, {
        m("dispatcher_dispatches_total"): 2,
        m("dispatcher_pending_appwrappers"): 0,
        m("dispatcher_admission_wait_time_seconds_count"): 2,
        m("dispatcher_appwrappers", state="Running", condition="Running"): 1,
        m("dispatcher_appwrappers", state="Pending", condition="Backoff"): 0,
        m("dispatcher_cluster_free_capacity", resource=GPU): 0,
    }, timeout=60)
    # The second waited at least as long as it was Backoff: more than nothing.
    assert samples[m("dispatcher_admission_wait_time_seconds_sum")] > 0


# --- queue visibility --------------------------------------------------------------------

def hog_every_gpu(dispatcher: DispatcherProcess, kubectl: Kubectl, k: Kubectl,
                  namespace: str) -> tuple[int, int]:
    """Under fifo, `hog` runs on every GPU and is expected to for two hours; the nodes
    and their GPUs each."""
    wait_alone(kubectl, namespace)
    nodes, per_node = uniform_gpu_nodes(kubectl)
    dispatcher.start("fifo")
    hog = appwrapper("hog", job("hog", nodes, per_node))
    hog["spec"]["schedulingSpec"] = {"dispatchDuration": {"expected": 7200}}
    k.apply(hog)
    wait_condition(k, "hog", "Running", timeout=90)
    return nodes, per_node


def test_queue_command_and_kubectl_plugin_show_the_waiting_gang(
        dispatcher: DispatcherProcess, local_cluster: Cluster, kubectl: Kubectl, k: Kubectl,
        namespace: str, tmp_path: Path) -> None:
    nodes, per_node = hog_every_gpu(dispatcher, kubectl, k, namespace)
    k.apply(appwrapper("big", job("big", nodes, per_node)))
    k.apply(appwrapper("small", job("small", 1, 1)))
    wait_condition(k, "big", "Backoff")
    # While big backs off, small may come up to the head and back off too (as in MCAD).
    wait_for(lambda: last_condition(k, "small").get("type") in ("Queueing", "Backoff"), 60,
             "small to be queued")
    # Start estimates (every 10 s, written as a status detail): big once hog has run its
    # two hours, small an hour (the default duration of big) after that.
    wait_for(lambda: all(k.json("appwrapper", n).get("status", {}).get("estimatedStart")
                         for n in ("big", "small")), 90, "start estimates in status")

    out = subprocess.run(
        [sys.executable, "-m", "dispatcher.cli", "queue", "--kubeconfig",
         str(local_cluster.kubeconfig), "-n", namespace, "-o", "json"],
        capture_output=True, text=True, check=True, cwd=REPO).stdout
    data = json.loads(out)
    assert data["scope"] == "cluster" and data["namespace"] == namespace
    rows = [(e["position"], e["name"], e["condition"]) for e in data["pending"]]
    assert rows[0] == (1, "big", "Backoff")
    assert rows[1][:2] == (2, "small") and rows[1][2] in ("Queueing", "Backoff")
    big = data["pending"][0]
    assert big["pods"] == nodes and big["requests"][GPU] == str(nodes * per_node)
    assert big["reason"] == "AppWrapperNotRunnable" and GPU in big["message"]
    assert "; estimated start in about " in big["message"]
    assert 7000 < big["estimatedStartInSeconds"] <= 7200
    small = data["pending"][1]
    assert small["estimatedStartInSeconds"] - big["estimatedStartInSeconds"] == pytest.approx(3600)

    # As a kubectl plugin: kubectl finds kubectl-appwrapper on the PATH.
    env = plugin_on_path(tmp_path, local_cluster)
    table = subprocess.run([kubectl.binary, "appwrapper", "queue", "-n", namespace],
                           capture_output=True, text=True, env=env, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith(f"policy fifo: 2 pending in namespace {namespace}; ")
    assert lines[1].split()[8] == "ETA"
    assert lines[2].split()[:5] == ["1", f"{namespace}/big", "0", str(nodes),
                                    str(nodes * per_node)]
    eta = lines[2].split()[8:10]
    assert eta[0] == "in" and eta[1].startswith("1h5"), eta  # hog's two hours, less a minute
    assert lines[3].split()[:2] == ["2", f"{namespace}/small"]
    eta = lines[3].split()[8:10]
    assert eta[0] == "in" and eta[1].startswith("2h5"), eta


def plugin_on_path(tmp_path: Path, local_cluster: Cluster) -> dict[str, str]:
    """The environment of a kubectl that finds kubectl-appwrapper on its PATH, as installing
    the package puts it, and reads the local cluster's kubeconfig."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    plugin = bin_dir / "kubectl-appwrapper"
    plugin.write_text(f"#!{sys.executable}\nimport sys\nfrom dispatcher.cli import "
                      "kubectl_plugin\nsys.exit(kubectl_plugin())\n")
    plugin.chmod(plugin.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "KUBECONFIG": str(local_cluster.kubeconfig), "PYTHONPATH": str(REPO)}


def test_plan_live_answers_from_the_cluster_and_creates_nothing(
        dispatcher: DispatcherProcess, local_cluster: Cluster, kubectl: Kubectl, k: Kubectl,
        namespace: str, tmp_path: Path) -> None:
    nodes, per_node = hog_every_gpu(dispatcher, kubectl, k, namespace)
    k.apply(appwrapper("waiting", job("waiting", 1, per_node)))
    wait_for(lambda: last_condition(k, "waiting").get("type") in ("Queueing", "Backoff"), 60,
             "waiting to be queued")
    hog_ends = next(c for c in k.json("appwrapper", "hog")["status"]["conditions"]
                    if c["type"] == "Dispatched")["lastTransitionMicroTime"]
    ends = datetime.fromisoformat(hog_ends.replace("Z", "+00:00")).timestamp() + 7200
    big = appwrapper("big", job("big", nodes, per_node))
    big["metadata"]["namespace"] = namespace
    big["spec"]["priority"] = 10
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(big))

    def ask(policy: str) -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, "-m", "dispatcher.cli", "plan", "--live", "-f", str(path),
             "--kubeconfig", str(local_cluster.kubeconfig), "--policy", policy, "-o", "json"],
            capture_output=True, text=True, check=True, cwd=REPO).stdout
        (answer,) = json.loads(out)["answers"]
        assert answer["decision"] == "wait" and len(answer["nodes"]) == nodes
        return dict(answer)

    def at(iso: str) -> float:
        return datetime.fromisoformat(iso).timestamp()

    # Under fifo it starts after `waiting` (an hour by default) after hog's two hours.
    fifo = ask("fifo")
    assert at(fifo["startsAt"]) == pytest.approx(ends + 3600, abs=1)
    assert fifo["delays"] == []
    # With its priority first, it starts when hog ends and delays `waiting` by its hour.
    first = ask("priority")
    assert at(first["startsAt"]) == pytest.approx(ends, abs=1)
    (delay,) = first["delays"]
    assert (delay["namespace"], delay["name"]) == (namespace, "waiting")
    assert at(delay["after"]) - at(delay["before"]) == pytest.approx(3600, abs=1)
    # The same through the kubectl plugin, which kubectl finds on the PATH.
    env = plugin_on_path(tmp_path, local_cluster)
    out = subprocess.run([kubectl.binary, "appwrapper", "plan", "-f", str(path), "--policy",
                          "priority", "-o", "json"],
                         capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    (through_kubectl,) = json.loads(out.stdout)["answers"]
    assert through_kubectl["startsAt"] == first["startsAt"]
    assert through_kubectl["delays"] == first["delays"]
    assert sorted(a["metadata"]["name"] for a in k.items("appwrappers")) == ["hog", "waiting"]


def test_reserve_keeps_the_big_gangs_room_and_backfills_only_what_ends_before(
        dispatcher: DispatcherProcess, kubectl: Kubectl, k: Kubectl, namespace: str) -> None:
    wait_alone(kubectl, namespace)
    nodes, per_node = uniform_gpu_nodes(kubectl)
    assert nodes >= 2
    dispatcher.start("reserve")

    def timed(name: str, pods: int, seconds: int, run_for: str | None = None
              ) -> dict[str, Any]:
        j = job(name, pods, per_node)
        if run_for is not None:
            j["spec"]["template"]["metadata"]["annotations"] = outcome("succeed",
                                                                       run_for=run_for)
        aw = appwrapper(name, j)
        aw["spec"]["schedulingSpec"] = {"dispatchDuration": {"expected": seconds}}
        return aw

    # hog holds one node for about 40 s; big needs every node.
    k.apply(timed("hog", 1, 40, run_for="40s"))
    wait_condition(k, "hog", "Running", timeout=90)
    k.apply(timed("big", nodes, 600))
    message = wait_condition(k, "big", "Backoff")["message"]
    assert "reserved: starts at " in message
    # long (2 h) would still run when big is to start: it waits, though it fits now.
    k.apply(timed("long", 1, 7200))
    waits = wait_condition(k, "long", "Backoff")["message"]
    assert waits.startswith(f"WaitingForReservation: fits now only on nodes reserved for "
                            f"{namespace}/big")
    # short (5 s) ends before: it backfills.
    k.apply(timed("short", 1, 5, run_for="5s"))
    dispatched = wait_for(lambda: next((c for c in k.json("appwrapper", "short").get(
        "status", {}).get("conditions") or [] if c["type"] == "Dispatched"), None), 60,
        "short to be dispatched")
    assert dispatched["message"].startswith(
        f"backfilled: expected to end before the reservation of {namespace}/big at ")
    # When hog ends, big starts in its reserved room, before long.
    wait_condition(k, "big", "Running", timeout=180)
    assert not any(c["type"] == "Dispatched" for c in k.json("appwrapper", "long").get(
        "status", {}).get("conditions") or [])


# --- deploy/ on the cluster ---------------------------------------------------------------

def test_deploy_applies_and_its_pods_meet_the_restricted_standard(
        deployed: Installed, kubectl: Kubectl) -> None:
    ns = kubectl.in_namespace(SA_NAMESPACE)
    labels = kubectl.json("namespace", SA_NAMESPACE)["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    # The API server's Pod Security admission would refuse a pod that does not meet the
    # restricted standard; kwok plays its kubelet, so the Deployments become available.
    for name, replicas, component, account in (
            ("dispatcher", 2, "controller", SA), ("dispatcher-webhook", 2, "webhook",
                                                  WEBHOOK_SA)):
        wait_for(lambda name=name, replicas=replicas: (
            ns.json("deployment", name).get("status") or {}).get(
            "availableReplicas") == replicas, 90, f"the {name} Deployment to be available")
        pods = ns.items("pods", "-l", f"app.kubernetes.io/component={component}")
        assert len(pods) == replicas
        for pod in pods:
            assert pod["spec"]["serviceAccountName"] == account
            sc = pod["spec"]["containers"][0]["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["capabilities"]["drop"] == ["ALL"]
    warnings = [e for e in ns.items("events") if e.get("type") == "Warning"
                and e["involvedObject"].get("kind") == "ReplicaSet"]
    assert not warnings, warnings
    service = ns.json("service", "dispatcher-metrics")
    assert service["spec"]["ports"][0]["name"] == "metrics"
    # The ServiceMonitor is only in the monitoring overlay, which this cluster lacks the
    # CRD for; the base must not need it.
    base = subprocess.run([kubectl.binary, "kustomize", str(DEPLOY)], capture_output=True,
                          text=True, check=True).stdout
    assert "ServiceMonitor" not in base
    overlay = subprocess.run([kubectl.binary, "kustomize", str(DEPLOY / "monitoring")],
                             capture_output=True, text=True, check=True).stdout
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(overlay) if d}
    monitoring = sorted(k for k in docs if k[0] in ("ServiceMonitor", "PrometheusRule"))
    assert monitoring == [("PrometheusRule", "dispatcher"), ("ServiceMonitor", "dispatcher"),
                          ("ServiceMonitor", "dispatcher-webhook")]
    # The rule renders as written, in the dispatcher's namespace.
    rule = docs[("PrometheusRule", "dispatcher")]
    written = yaml.safe_load((DEPLOY / "components" / "monitoring" / "prometheusrule.yaml")
                             .read_text())
    assert rule["metadata"]["namespace"] == SA_NAMESPACE
    assert rule["spec"] == written["spec"]
    # The webhook's ServiceMonitor names a port of the webhook's Service as deployed.
    webhook = ns.json("service", "dispatcher-webhook")
    endpoint = docs[("ServiceMonitor", "dispatcher-webhook")]["spec"]["endpoints"][0]
    assert endpoint["port"] in {p["name"] for p in webhook["spec"]["ports"]}


def test_the_pod_webhook_component_adds_its_flags_service_and_rights(
        deployed: Installed, kubectl: Kubectl, tmp_path: Path) -> None:
    """deploy/components/pod-webhook in an overlay of deploy/: the controller serves the pod
    webhook with its own certificate, behind a Service that reaches the leader only."""
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    component = DEPLOY / "components" / "pod-webhook"
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY, overlay)],
        "components": [os.path.relpath(component, overlay)]}))
    rendered = subprocess.run([kubectl.binary, "kustomize", str(overlay)], capture_output=True,
                              text=True, check=True).stdout
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered) if d}
    container = docs[("Deployment", "dispatcher")]["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[-4:] == ["--webhook-port=9443", "--webhook-service=dispatcher-pods",
                         "--webhook-secret=dispatcher-pods-cert", "--webhook-configuration="]
    parsed = build_parser().parse_args(args)  # what `dispatcher run` makes of them
    assert (parsed.webhook_port, parsed.webhook_service, parsed.webhook_secret,
            parsed.webhook_configuration) == (9443, "dispatcher-pods", "dispatcher-pods-cert", "")
    assert {"name": "pod-webhook", "containerPort": 9443, "protocol": "TCP"} in \
        container["ports"]
    service = docs[("Service", "dispatcher-pods")]["spec"]
    assert service["selector"][LEADER_LABEL] == "true"
    assert service["ports"][0]["targetPort"] == "pod-webhook"
    hook = docs[("MutatingWebhookConfiguration", "dispatcher-pods")]["webhooks"][0]
    assert hook["clientConfig"]["service"]["path"] == PIN_PODS_PATH
    assert hook["failurePolicy"] == "Ignore"
    rbac = [d for d in yaml.safe_load_all((component / "rbac.yaml").read_text()) if d]
    kubectl.apply(rbac)
    try:
        pods_config = "mutatingwebhookconfigurations.admissionregistration.k8s.io"
        assert _can(kubectl, "patch", f"{pods_config}:dispatcher-pods")
        assert not _can(kubectl, "patch", f"{pods_config}:another")
        assert _can(kubectl, "update", "secrets:dispatcher-pods-cert", namespace=SA_NAMESPACE)
        assert not _can(kubectl, "get", "secrets:dispatcher-webhook-cert",
                        namespace=SA_NAMESPACE)
        assert _can(kubectl, "patch", "pods", namespace=SA_NAMESPACE)  # its leader label
    finally:
        kubectl("delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all(rbac))


def test_the_network_policy_component_admits_only_the_addresses_it_is_given(
        deployed: Installed, kubectl: Kubectl, tmp_path: Path) -> None:
    """deploy/components/network-policy in an overlay of deploy/ (with the pod webhook): its
    policies select the webhook's and the controller's pods and their webhook ports, and
    the API server refuses them until the administrator sets the addresses. (The local
    cluster has no network plugin: this checks what is applied, not that it is enforced.)"""
    component = DEPLOY / "components" / "network-policy"

    def render(patches: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
        overlay = tmp_path / f"overlay-{len(patches)}"
        overlay.mkdir()
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(DEPLOY, overlay)],
            "components": [os.path.relpath(component, overlay),
                           os.path.relpath(DEPLOY / "components" / "pod-webhook", overlay)],
            "patches": patches}))
        rendered = subprocess.run([kubectl.binary, "kustomize", str(overlay)],
                                  capture_output=True, text=True, check=True).stdout
        return {(d["kind"], d["metadata"]["name"]): d
                for d in yaml.safe_load_all(rendered) if d}

    def dry_run(docs: dict[tuple[str, str], Any]) -> subprocess.CompletedProcess[str]:
        policies = [d for (kind, _), d in docs.items() if kind == "NetworkPolicy"]
        return kubectl.run("apply", "--dry-run=server", "-f", "-",
                           input=yaml.safe_dump_all(policies), check=False)

    unset = dry_run(render([]))
    assert unset.returncode != 0
    assert 'spec.ingress[0].from[0].ipBlock.cidr: Invalid value: "SET-THE-API-SERVER-CIDR"' \
        in unset.stderr
    # The patch the component's kustomization.yaml shows.
    docs = render([{"target": {"kind": "NetworkPolicy"}, "patch": yaml.safe_dump([
        {"op": "replace", "path": "/spec/ingress/0/from/0/ipBlock/cidr",
         "value": "10.0.0.0/28"}])}])
    applied = dry_run(docs)
    assert applied.returncode == 0, applied.stderr
    for policy, deployment in (("dispatcher-webhook", "dispatcher-webhook"),
                               ("dispatcher", "dispatcher")):
        spec = docs[("NetworkPolicy", policy)]["spec"]
        pod = docs[("Deployment", deployment)]["spec"]["template"]
        assert spec["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert spec["policyTypes"] == ["Ingress"]
        api_server, *others = spec["ingress"]
        assert api_server["from"] == [{"ipBlock": {"cidr": "10.0.0.0/28"}}]
        ports = {p["name"]: p["containerPort"]
                 for p in pod["spec"]["containers"][0]["ports"]}
        (port,) = [p["port"] for p in api_server["ports"]]
        assert ports.get(port, port) == 9443  # the webhook's own port, by name or number
        # Nothing else is admitted from anywhere but the metrics port.
        assert [p["port"] for rule in others for p in rule["ports"]] == (
            ["metrics"] if policy == "dispatcher" else [])
        assert all("from" not in rule for rule in others)


def _can(kubectl: Kubectl, verb: str, resource: str, user: str = SA_USER,
         namespace: str = "default") -> bool:
    resource, _, sub = resource.partition("/")
    resource = resource.replace(":", "/")  # "kind:name" asks about one object
    proc = kubectl.run("auth", "can-i", verb, resource, "--as", user, "-n", namespace,
                       *([f"--subresource={sub}"] if sub else []), check=False)
    return proc.stdout.strip() == "yes"


def test_rbac_grants_what_the_dispatcher_needs_and_no_more(
        deployed: Installed, kubectl: Kubectl) -> None:
    wait_for(lambda: kubectl.json("clusterrole", "dispatcher-wrapped-kinds").get("rules"),
             60, "the aggregated ClusterRole dispatcher-wrapped-kinds to be filled in")
    allowed = [("watch", "appwrappers.workload.codeflare.dev"),
               ("patch", "appwrappers.workload.codeflare.dev/status"),
               ("list", "nodes"), ("watch", "pods"), ("create", "events"),
               # one AppWrapper's Events, for its dashboard page
               ("list", "events"),
               ("create", "jobs.batch"), ("delete", "jobs.batch"), ("get", "jobs.batch"),
               ("create", "pods"), ("create", "services"), ("create", "configmaps"),
               ("create", "deployments.apps"), ("create", "statefulsets.apps"),
               ("create", "rayclusters.ray.io"), ("create", "rayjobs.ray.io"),
               ("create", "pytorchjobs.kubeflow.org"), ("create", "mpijobs.kubeflow.org"),
               ("create", "jobsets.jobset.x-k8s.io"),
               # blockOwnerDeletion on what it creates, under OwnerReferencesPermissionEnforcement
               ("update", "appwrappers.workload.codeflare.dev/finalizers"),
               ("create", "subjectaccessreviews.authorization.k8s.io"),
               ("create", "tokenreviews.authentication.k8s.io"),
               # owner chains of gang pods; the pod-less kinds of the allow-list
               ("get", "replicasets.apps"), ("create", "networkpolicies.networking.k8s.io"),
               ("create", "serviceaccounts"), ("create", "ingresses.networking.k8s.io"),
               # the placement gate lifted from a gang's pod onto its node (--pin-pods)
               ("patch", "pods"),
               # the replicas of every kind an elastic gang can be made of
               *(("patch", f"{kind.lower()}s.{group}") for group, kind in sorted(RESIZABLE))]
    refused = [("create", "secrets"), ("get", "secrets"), ("create", "endpoints"),
               ("create", "roles.rbac.authorization.k8s.io"),
               ("create", "rolebindings.rbac.authorization.k8s.io"),
               ("create", "resourcequotas"), ("patch", "appwrappers.workload.codeflare.dev"),
               ("delete", "appwrappers.workload.codeflare.dev"), ("update", "nodes"),
               ("create", "pods/binding"), ("list", "customresourcedefinitions"),
               ("update", "leases.coordination.k8s.io:dispatcher"), ("*", "*"),
               # no patch on a kind whose size it never changes
               ("patch", "jobs.batch"), ("patch", "rayjobs.ray.io"),
               ("patch", "tfjobs.kubeflow.org"), ("patch", "services"),
               # Events: posted and listed, never followed or changed
               ("watch", "events"), ("delete", "events")]
    assert [a for a in allowed if not _can(kubectl, *a)] == []
    assert [r for r in refused if _can(kubectl, *r)] == []
    # Leader election: its own Lease, in its own namespace, and nothing else.
    lease = "leases.coordination.k8s.io:dispatcher"
    assert _can(kubectl, "update", lease, namespace=SA_NAMESPACE)
    assert _can(kubectl, "create", "leases.coordination.k8s.io", namespace=SA_NAMESPACE)
    assert not _can(kubectl, "update", "leases.coordination.k8s.io:other",
                    namespace=SA_NAMESPACE)
    # The controller keeps no certificates; the webhook creates nothing for AppWrappers.
    assert not _can(kubectl, "get", "secrets", namespace=SA_NAMESPACE)
    webhook = f"system:serviceaccount:{SA_NAMESPACE}:{WEBHOOK_SA}"
    config = "dispatcher-appwrappers"
    webhook_allowed = [
        ("create", "subjectaccessreviews.authorization.k8s.io"),
        ("list", "quotasubtrees.quota.codeflare.dev"),  # which labels name a quota tree
        ("get", f"secrets:{SECRET}"), ("update", f"secrets:{SECRET}"),
        ("patch", f"mutatingwebhookconfigurations:{config}"),
        ("patch", f"validatingwebhookconfigurations:{config}")]
    webhook_refused = [
        ("get", "secrets:other"), ("list", "secrets"), ("create", "secrets"),
        ("patch", "validatingwebhookconfigurations:someone-elses"),
        ("create", "validatingwebhookconfigurations"), ("create", "jobs.batch"),
        ("create", "pods"), ("list", "appwrappers.workload.codeflare.dev"),
        ("create", "quotasubtrees.quota.codeflare.dev"), ("*", "*")]
    assert [a for a in webhook_allowed
            if not _can(kubectl, *a, user=webhook, namespace=SA_NAMESPACE)] == []
    assert [r for r in webhook_refused
            if _can(kubectl, *r, user=webhook, namespace=SA_NAMESPACE)] == []


def test_the_webhook_keeps_its_certificate_in_its_secret_as_its_service_account(
        deployed: Installed, kubectl: Kubectl) -> None:
    secret = kubectl.in_namespace(SA_NAMESPACE).json("secret", SECRET)
    data = secret.get("data") or {}
    assert set(data) >= {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        (hook,) = kubectl.json(kind, "dispatcher-appwrappers")["webhooks"]
        assert hook["clientConfig"]["caBundle"] == data["ca.crt"]
        assert hook["failurePolicy"] == "Fail"
        assert hook["rules"][0]["resources"] == ["appwrappers"]
    # A restart reuses the certificate: same Secret, nothing renewed.
    version = secret["metadata"]["resourceVersion"]
    deployed.webhook.start()
    assert kubectl.in_namespace(SA_NAMESPACE).json("secret", SECRET)["metadata"][
        "resourceVersion"] == version


def test_dispatcher_runs_as_its_service_account_and_is_refused_other_kinds(
        deployed: Installed, local_cluster: Cluster, kubectl: Kubectl, k: Kubectl,
        namespace: str) -> None:
    wait_for(lambda: kubectl.json("clusterrole", "dispatcher-wrapped-kinds").get("rules"),
             60, "the aggregated ClusterRole dispatcher-wrapped-kinds to be filled in")
    wait_alone(kubectl, namespace)
    sa_config = deployed.controller_kubeconfig
    whoami = Kubectl(kubectl.binary, sa_config).run("auth", "whoami", "-o", "json",
                                                    check=False)
    if whoami.returncode == 0:
        assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == SA_USER
    d = DispatcherProcess(sa_config, local_cluster.logs / "as-service-account")
    port = free_port()
    try:
        # As deploy/ runs it: leader election on its Lease, creators required.
        d.start("fifo", extra_args=["--metrics-port", str(port), "--metrics-host",
                                    "127.0.0.1", "--leader-elect", "--lease-namespace",
                                    SA_NAMESPACE, "--require-creator"])
        k.apply(appwrapper("job", job("job", 2, 1)))
        wait_condition(k, "job", "Running", timeout=90)
        assert len(k.items("pods", "-l", f"{LABEL}=job")) == 2
        # Its Events were posted as the service account.
        events = [e for e in k.items("events") if e["involvedObject"].get("name") == "job"
                  and e.get("source", {}).get("component") == "dispatcher"]
        assert {e["reason"] for e in events} >= {"AppWrapperRunnable"}

        # A kind outside the allow-list (deploy/ grants it no rights either): refused at
        # kubectl apply by the webhook, with the fix; nothing is created.
        secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
                  "stringData": {"token": "x"}}
        refused = k.run("apply", "-f", "-", input=yaml.safe_dump(appwrapper(
            "secret", secret, custom=[{"replicas": 1, "requests": {"cpu": "100m"}}])),
            check=False)
        assert refused.returncode != 0
        assert "Secret" in refused.stderr and "allowedKinds" in refused.stderr
        assert not k.items("appwrappers", "--field-selector=metadata.name=secret")
        wait_metrics(port, {m("dispatcher_dispatches_total"): 1})
        assert d.alive()
        log = d.log_path.read_text(errors="replace")
        assert "Not enough permissions" not in log, d.tail()
    finally:
        d.stop()
