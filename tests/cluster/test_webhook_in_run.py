"""A single-process install: `dispatcher run --webhook-port` serves the admission webhook
beside the controller, on the same event loop."""

from __future__ import annotations

from collections.abc import Callable

import yaml

from localcluster import Cluster, Kubectl, users, wait_for

from .dispatcher_process import DispatcherProcess, install_crd, wait_quiet
from .test_tenancy import APPWRAPPERS, appwrapper, deployment, job, last_condition
from .webhook_process import free_port, register_url_webhooks, unregister_webhooks

NAMESPACE = "dispatcher-run-webhook"


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
