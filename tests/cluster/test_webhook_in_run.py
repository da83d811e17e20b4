"""A single-process install: `dispatcher run --webhook-port` serves the admission webhook
beside the controller, on the same event loop."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from dispatcher.api.labels import APPWRAPPER_LABEL
from dispatcher.controller.pods.placement import PIN_TOKEN_ANNOTATION, let_onto
from localcluster import Cluster, Kubectl, users, wait_for

from .dispatcher_process import DispatcherProcess, install_crd, wait_quiet
from .test_tenancy import APPWRAPPERS, appwrapper, deployment, job, last_condition
from .webhook_process import (
    PODS_CONFIGURATION,
    free_port,
    register_pod_webhook,
    register_url_webhooks,
    unregister_pod_webhook,
    unregister_webhooks,
)

NAMESPACE = "dispatcher-run-webhook"
PODS_NS = "dispatcher-pod-webhook"  # the pod webhook's Secret


def test_dispatcher_run_serves_the_webhook_and_dispatches_what_it_admitted(
        local_cluster: Cluster, kubectl: Kubectl, namespace: str,
        as_user: Callable[[str], Kubectl]) -> None:
    install_crd(kubectl)
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    users.grant(kubectl, "alice", namespace, [APPWRAPPERS, "jobs.batch"])
    alice = as_user("alice").in_namespace(namespace)
    port = free_port()
    register_url_webhooks(kubectl, port)
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs / "run-webhook")
    try:
        wait_quiet(kubectl)
        d.start("fifo", extra_args=["--webhook-port", str(port), "--webhook-host", "127.0.0.1",
                                    "--webhook-cert-host", "127.0.0.1",
                                    "--namespace", NAMESPACE])
        assert "serving the AppWrapper admission webhook" in d.log_path.read_text()
        # The CA reaches the configurations; then the API server calls the webhook.
        error = wait_for(lambda: _refusal(alice), 60, "the webhook to refuse a Deployment")
        assert f"alice may not create deployments.apps in namespace {namespace}" in error
        alice.apply(appwrapper("train", job("train")))
        wait_for(lambda: last_condition(alice, "train") == "Running", 90,
                 "alice's AppWrapper to run")
        secret = kubectl.in_namespace(NAMESPACE).json("secret", "dispatcher-webhook-cert")
        assert set(secret["data"]) >= {"ca.crt", "tls.crt", "tls.key"}
        d.finish()
    finally:
        d.stop()
        unregister_webhooks(kubectl)
        kubectl("delete", "namespace", NAMESPACE, "--wait=false", "--ignore-not-found")


def _refusal(alice: Kubectl) -> str | None:
    proc = alice.run("apply", "--dry-run=server", "-f", "-", check=False,
                     input=yaml.safe_dump(appwrapper("web", deployment())))
    return proc.stderr if "denied the request" in proc.stderr else None


def test_dispatcher_run_pins_a_gangs_pods_as_they_are_created(
        local_cluster: Cluster, kubectl: Kubectl, namespace: str) -> None:
    """With the pod webhook (deploy/components/pod-webhook) each pod of a gang is created
    already let onto its node: no gate to lift, no PATCH. Without an answer from it
    (failurePolicy Ignore) pods are still created, at their gate, and let go by the loop."""
    install_crd(kubectl)
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PODS_NS}})
    port, metrics_port = free_port(), free_port()
    register_pod_webhook(kubectl, port)
    k = kubectl.in_namespace(namespace)
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs / "pod-webhook")
    try:
        wait_quiet(kubectl)
        d.start("fifo", extra_args=["--webhook-port", str(port), "--webhook-host", "127.0.0.1",
                                    "--webhook-cert-host", "127.0.0.1", "--namespace",
                                    PODS_NS, "--webhook-configuration", "",
                                    "--metrics-port", str(metrics_port),
                                    "--metrics-host", "127.0.0.1"])
        wait_for(lambda: kubectl.json("mutatingwebhookconfiguration", PODS_CONFIGURATION)[
            "webhooks"][0]["clientConfig"].get("caBundle"), 60, "the CA patched in")
        k.apply(appwrapper("pinned", job("pinned", pods=3)))
        wait_for(lambda: last_condition(k, "pinned") == "Running", 90, "the gang to run")
        pods = _pods_of(k, "pinned")
        assert len(pods) == 3
        for pod in pods:
            assert PIN_TOKEN_ANNOTATION in pod["metadata"]["annotations"]
            assert not pod["spec"].get("schedulingGates")
            assert pod["spec"]["nodeName"] == let_onto(pod["spec"])
            # The node rule came with the pod's creation, from the Job controller's
            # request; nobody wrote the pod's spec after that.
            assert _spec_writers(pod) == ["kube-controller-manager"]
        # The pod webhook's answers are timed in the dispatcher's own /metrics.
        metrics = _scrape(metrics_port)
        assert metrics[("dispatcher_webhook_request_duration_seconds_count",
                        frozenset({("endpoint", "pin-pods"), ("result", "allowed")}))] >= 3
        assert metrics[("dispatcher_api_requests_total",
                        frozenset({("verb", "POST"), ("code", "201")}))] >= 1  # the Job
        d.stop()
        # The configuration stays, nothing answers at its URL: the API server creates the
        # pods all the same and the loop lifts their gate.
        d.start("fifo")
        k.apply(appwrapper("gated", job("gated", pods=2)))
        wait_for(lambda: last_condition(k, "gated") == "Running", 90, "the gang to run")
        for pod in _pods_of(k, "gated"):
            assert PIN_TOKEN_ANNOTATION not in (pod["metadata"].get("annotations") or {})
            assert pod["spec"]["nodeName"] == let_onto(pod["spec"])
            assert len(_spec_writers(pod)) == 2  # the creator, then the gate lifted
        d.finish()
    finally:
        d.stop()
        unregister_pod_webhook(kubectl)
        kubectl("delete", "namespace", PODS_NS, "--wait=false", "--ignore-not-found")


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _pods_of(k: Kubectl, name: str) -> list[dict[str, Any]]:
    return [p for p in k.items("pods", "-l", f"{APPWRAPPER_LABEL}={name}",
                               "--show-managed-fields")
            if p["spec"].get("nodeName")]


def _spec_writers(pod: dict[str, Any]) -> list[str]:
    """The field managers that set the pod's spec (not its status)."""
    return [str(m["manager"]) for m in pod["metadata"].get("managedFields") or []
            if "f:spec" in (m.get("fieldsV1") or {}) and m.get("subresource") != "status"]
