"""The admission webhook on the local cluster, and deploy/ applied to it.

The local cluster has no pod network: kube-apiserver cannot reach a webhook behind a
Service. So `dispatcher webhook` runs as a local process on loopback, and its
Mutating/ValidatingWebhookConfigurations — those of deploy/, rules and all — are
registered with a URL client config, ``https://127.0.0.1:PORT/...``. The process then
does what it does in a cluster: makes its certificates (valid for 127.0.0.1), keeps them
in its Secret and patches the CA into the configurations.

With deploy/ applied, the webhook runs with a token of deploy/'s service account
``dispatcher-webhook`` and the controller with one of ``dispatcher``: what the
Deployments' pods would have.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster import Kubectl, wait_for
from localcluster.ports import free_port

from .dispatcher_process import REPO, DispatcherProcess

DEPLOY = REPO / "deploy"
SYSTEM_NAMESPACE = "dispatcher-system"
CONTROLLER_SA = "dispatcher"
WEBHOOK_SA = "dispatcher-webhook"
CONFIGURATION = "dispatcher-appwrappers"
SECRET = "dispatcher-webhook-cert"
KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def webhook_configurations(port: int, manifest: Sequence[dict[str, Any]] | None = None
                           ) -> list[dict[str, Any]]:
    """The two webhook configurations of deploy/ (or of a rendered ``manifest``), calling
    https://127.0.0.1:PORT instead of the Service."""
    if manifest is None:
        manifest = list(yaml.safe_load_all((DEPLOY / "base" / "webhook.yaml").read_text()))
    docs = [copy.deepcopy(d) for d in manifest
            if d and d["kind"] in KINDS and d["metadata"]["name"] == CONFIGURATION]
    for doc in docs:
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}"}
    return docs


POD_WEBHOOK = DEPLOY / "components" / "pod-webhook" / "webhook.yaml"
PODS_CONFIGURATION = "dispatcher-pods"


def pod_webhook_configuration(port: int) -> dict[str, Any]:
    """deploy/components/pod-webhook's MutatingWebhookConfiguration, calling
    https://127.0.0.1:PORT (`dispatcher run --webhook-port PORT`) instead of the Service."""
    (doc,) = [d for d in yaml.safe_load_all(POD_WEBHOOK.read_text())
              if d and d["kind"] == "MutatingWebhookConfiguration"]
    for hook in doc["webhooks"]:
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}"
                                f"{hook['clientConfig']['service']['path']}"}
    return dict(doc)


def register_pod_webhook(kubectl: Kubectl, port: int) -> None:
    unregister_pod_webhook(kubectl)
    kubectl.create(yaml.safe_dump(pod_webhook_configuration(port)))


def unregister_pod_webhook(kubectl: Kubectl) -> None:
    kubectl("delete", "mutatingwebhookconfiguration", PODS_CONFIGURATION,
            "--ignore-not-found")


def register_url_webhooks(kubectl: Kubectl, port: int,
                          manifest: Sequence[dict[str, Any]] | None = None) -> None:
    """(Re)register the webhook configurations with a loopback URL (replacing deploy/'s
    Service-based ones, if applied). The webhook patches in its CA when it starts."""
    unregister_webhooks(kubectl)
    kubectl.create(yaml.safe_dump_all(webhook_configurations(port, manifest)))


def unregister_webhooks(kubectl: Kubectl) -> None:
    kubectl("delete", "mutatingwebhookconfiguration,validatingwebhookconfiguration",
            CONFIGURATION, "--ignore-not-found")


class WebhookProcess(DispatcherProcess):
    """`dispatcher webhook` on 127.0.0.1:``port``, its Secret in ``namespace``; the
    configurations it serves are deploy/'s, or those of a rendered ``manifest``."""

    LOG = "webhook.log"
    READY = "serving the AppWrapper admission webhook"

    def __init__(self, kubeconfig: Path, log_dir: Path, namespace: str,
                 port: int | None = None,
                 manifest: Sequence[dict[str, Any]] | None = None) -> None:
        super().__init__(kubeconfig, log_dir)
        self.namespace = namespace
        self.port = port or free_port()
        self.manifest = manifest

    def arguments(self, fit: str, extra_args: Sequence[str]) -> list[str]:
        return ["webhook", "--kubeconfig", str(self.kubeconfig), "--port", str(self.port),
                "--host", "127.0.0.1", "--cert-host", "127.0.0.1",
                "--namespace", self.namespace, "-v", *extra_args]

    def serve(self, kubectl: Kubectl) -> None:
        """Register the configurations, start, and wait until the API server calls it."""
        register_url_webhooks(kubectl, self.port, self.manifest)
        self.start()

        def answered() -> bool:
            bundles = [h["clientConfig"].get("caBundle")
                       for kind in KINDS
                       for h in kubectl.json(kind.lower(), CONFIGURATION)["webhooks"]]
            if not all(bundles):
                return False
            probe = {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                     "metadata": {"name": "webhook-probe", "namespace": "default"},
                     "spec": {"resources": {"GenericItems": [{"generictemplate": {
                         "apiVersion": "v1", "kind": "ConfigMap",
                         "metadata": {"name": "probe"}}}]}}}
            out = kubectl("create", "--dry-run=server", "-o", "yaml", "-f", "-",
                          input=yaml.safe_dump(probe))
            return "workload.codeflare.dev/creator" in out

        wait_for(answered, 60, "kube-apiserver to call the webhook (CA bundle patched in, a "
                 f"dry-run create annotated); webhook log: {self.log_path}")


def service_account_kubeconfig(kubectl: Kubectl, cluster_kubeconfig: Path, account: str,
                               path: Path, namespace: str = SYSTEM_NAMESPACE) -> Path:
    """The cluster's kubeconfig with a token of a service account: what a pod running as
    it gets mounted."""
    token = kubectl("create", "token", account, "-n", namespace, "--duration=2h").strip()
    config = yaml.safe_load(cluster_kubeconfig.read_text())
    context = next(c for c in config["contexts"]
                   if c["name"] == config["current-context"])["context"]
    cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": account,
        "clusters": [cluster],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account,
                      "context": {"cluster": cluster["name"], "user": account}}],
    }))
    return path


#: What deploy/ (or the chart, or install.yaml) makes outside its namespace, but the CRDs.
CLUSTER_KINDS = ("clusterrole,clusterrolebinding,mutatingwebhookconfiguration,"
                 "validatingwebhookconfiguration")
PART_OF = "app.kubernetes.io/part-of=dispatcher"


#: Filled in by the API server's aggregation controller, which re-creates it (unlabelled)
#: when it is deleted while the controller re-aggregates it for a source that went.
AGGREGATED = "clusterrole/dispatcher-wrapped-kinds"


def delete_deploy(kubectl: Kubectl) -> None:
    """Everything deploy/ made except the CRD (deleting it would delete every
    AppWrapper in the cluster)."""
    unregister_webhooks(kubectl)
    kubectl("delete", "namespace", SYSTEM_NAMESPACE, "--ignore-not-found", "--wait=false")
    kubectl("delete", AGGREGATED, "--ignore-not-found")
    kubectl("delete", CLUSTER_KINDS, "-l", PART_OF, "--ignore-not-found")
    kubectl("delete", AGGREGATED, "--ignore-not-found")


def apply_deploy(kubectl: Kubectl, manifest: str | None = None) -> None:
    """deploy/ (or a rendered ``manifest`` of it) applied for real, after a server-side
    dry run."""
    delete_deploy(kubectl)
    wait_for(lambda: kubectl.run("get", "namespace", SYSTEM_NAMESPACE,
                                 check=False).returncode,
             120, f"namespace {SYSTEM_NAMESPACE} of an earlier run to be gone")
    kubectl("apply", "--server-side", "-f", str(DEPLOY / "base" / "namespace.yaml"))
    source = ["-k", str(DEPLOY)] if manifest is None else ["-f", "-"]
    for dry_run in (["--dry-run=server"], []):
        kubectl("apply", *source, "--server-side", "--force-conflicts", *dry_run,
                input=manifest)


@dataclass
class Installed:
    """A webhook the API server calls, and the kubeconfig the controller should use."""

    mode: str  # "local": admin credentials; "deployed": deploy/'s service accounts
    webhook: WebhookProcess
    controller_kubeconfig: Path
