"""A kubebuilder operator that needs its webhooks, as a local process (JobSet, LeaderWorkerSet).

Such an operator relies on its webhooks: a mutating one defaults every object it owns (and
labels its pods), and the controller dereferences those fields unchecked. In a cluster the
API server reaches the webhooks through a Service in front of the controller's pod, with a
certificate from the controller's own rotator (a Secret the kubelet mounts). Here there is
no pod network and no kubelet: the controller's webhook server listens on loopback with a
certificate signed by the cluster's CA (pki.py), its certificate management is off, and the
upstream webhook configurations (the module's kustomize directory, with its patches) are
registered with a ``url`` to it instead of a Service.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import build, pki
from .kube import Kubectl

HOST = "127.0.0.1"
_PATCHES = {"MutatingWebhookConfiguration": "mutating-patch.yaml",
            "ValidatingWebhookConfiguration": "validating-patch.yaml"}


@dataclass(frozen=True)
class WebhookedOperator:
    name: str  # the process (its log)
    wrapper: str  # the wrapper module that builds it (its state directory's name)
    module: str  # the Go module whose webhook manifests are registered
    config_api_version: str  # of its Configuration file
    webhook_dir: str  # the kustomize directory of its webhooks, in the module
    patches_dir: str  # where that directory keeps its patches ("": beside manifests.yaml)
    name_prefix: str  # kustomize's namePrefix in the module's config/default

    def arguments(self, cluster_dir: Path, kubeconfig: Path, probe_port: int,
                  webhook_port: int) -> list[str]:
        """Write the controller's configuration file and serving certificate; its command
        line."""
        d = cluster_dir / self.wrapper
        certs = d / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        cert, key = pki.issue(cluster_dir, f"{self.name}.local", hosts=(HOST,))
        (certs / "tls.crt").write_bytes(cert)
        (certs / "tls.key").write_bytes(key)
        config = {
            "apiVersion": self.config_api_version,
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "health": {"healthProbeBindAddress": f"{HOST}:{probe_port}"},
            "webhook": {"host": HOST, "port": webhook_port, "certDir": str(certs)},
            "internalCertManagement": {"enable": False},
        }
        (d / "config.yaml").write_text(yaml.safe_dump(config))
        return ["--kubeconfig", str(kubeconfig), "--config", str(d / "config.yaml"),
                "--metrics-bind-address", "0"]

    def webhook_configurations(self, webhook_port: int,
                               ca_bundle: bytes) -> list[dict[str, Any]]:
        """The upstream Mutating/ValidatingWebhookConfigurations, calling
        ``webhook_port``."""
        d = Path(build.module_dirs(self.wrapper)[self.module]) / self.webhook_dir
        patches = d / self.patches_dir
        docs = [doc for doc in yaml.safe_load_all((d / "manifests.yaml").read_text()) if doc]
        for doc in docs:
            # The patches replace whole webhooks: the pod webhooks get their objectSelector
            # (only the operator's own pods), without which they would be called for every
            # pod.
            for op in yaml.safe_load((patches / _PATCHES[doc["kind"]]).read_text()):
                _, field, index = op["path"].split("/")
                if op["op"] != "replace" or field != "webhooks":
                    raise ValueError(f"unexpected kustomize patch in {patches}: {op}")
                doc["webhooks"][int(index)] = op["value"]
            doc["metadata"]["name"] = self.name_prefix + doc["metadata"]["name"]
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://{HOST}:{webhook_port}{path}",
                                        "caBundle": base64.b64encode(ca_bundle).decode()}
        return docs

    def register_webhooks(self, kubectl: Kubectl, cluster_dir: Path) -> None:
        """Point the API server at the webhook server that :meth:`arguments` configured."""
        config = yaml.safe_load((cluster_dir / self.wrapper / "config.yaml").read_text())
        port = int(config["webhook"]["port"])
        kubectl.apply(self.webhook_configurations(port, pki.ca_cert(cluster_dir)))
