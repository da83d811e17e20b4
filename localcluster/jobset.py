"""The JobSet controller as a local process: its configuration, certificate and webhooks.

JobSet relies on its webhooks: the mutating one defaults every JobSet (success policy,
startup policy, network), and the controller dereferences those fields unchecked. In a
cluster the API server reaches the webhooks through a Service in front of the controller's
pod, with a certificate from the controller's own rotator (a Secret the kubelet mounts).
Here there is no pod network and no kubelet: the controller's webhook server listens on
loopback with a certificate signed by the cluster's CA (pki.py), its certificate management
is off, and the upstream webhook configurations (``config/components/webhook`` of the module,
with their kustomize patches) are registered with a ``url`` to it instead of a Service.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from . import build, pki
from .kube import Kubectl

NAME = "jobset-controller"
MODULE = "sigs.k8s.io/jobset"
WEBHOOK_DIR = "config/components/webhook"
# kustomize's namePrefix in the module's config/default.
NAME_PREFIX = "jobset-"
HOST = "127.0.0.1"


def arguments(cluster_dir: Path, kubeconfig: Path, probe_port: int,
              webhook_port: int) -> list[str]:
    """Write the controller's configuration file and serving certificate; its command line."""
    d = cluster_dir / "jobset"
    certs = d / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    cert, key = pki.issue(cluster_dir, f"{NAME}.local", hosts=(HOST,))
    (certs / "tls.crt").write_bytes(cert)
    (certs / "tls.key").write_bytes(key)
    config = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "health": {"healthProbeBindAddress": f"{HOST}:{probe_port}"},
        "webhook": {"host": HOST, "port": webhook_port, "certDir": str(certs)},
        "internalCertManagement": {"enable": False},
    }
    (d / "config.yaml").write_text(yaml.safe_dump(config))
    return ["--kubeconfig", str(kubeconfig), "--config", str(d / "config.yaml"),
            "--metrics-bind-address", "0"]


def webhook_configurations(webhook_port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The upstream Mutating/ValidatingWebhookConfigurations, calling ``webhook_port``."""
    d = Path(build.module_dirs("jobset")[MODULE]) / WEBHOOK_DIR
    patches = {"MutatingWebhookConfiguration": "mutating-patch.yaml",
               "ValidatingWebhookConfiguration": "validating-patch.yaml"}
    docs = [doc for doc in yaml.safe_load_all((d / "manifests.yaml").read_text()) if doc]
    for doc in docs:
        # The patches replace whole webhooks: the pod webhooks get their objectSelector
        # (only pods of a JobSet), without which they would be called for every pod.
        for op in yaml.safe_load((d / "patches" / patches[doc["kind"]]).read_text()):
            _, field, index = op["path"].split("/")
            if op["op"] != "replace" or field != "webhooks":
                raise ValueError(f"unexpected kustomize patch in {d}: {op}")
            doc["webhooks"][int(index)] = op["value"]
        doc["metadata"]["name"] = NAME_PREFIX + doc["metadata"]["name"]
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://{HOST}:{webhook_port}{path}",
                                    "caBundle": base64.b64encode(ca_bundle).decode()}
    return docs


def register_webhooks(kubectl: Kubectl, cluster_dir: Path) -> None:
    """Point the API server at the webhook server that :func:`arguments` configured."""
    config = yaml.safe_load((cluster_dir / "jobset" / "config.yaml").read_text())
    port = int(config["webhook"]["port"])
    kubectl.apply(webhook_configurations(port, pki.ca_cert(cluster_dir)))
