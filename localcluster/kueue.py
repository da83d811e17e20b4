"""Kueue, the queue most users run today, as a local process beside the dispatcher: what the
side-by-side bench (bench/peers.py) measures against, and what its cluster test starts.

It is not part of ``up``: ``Kueue(cluster).start()`` installs its CRDs (server-side: the
Workload CRD is larger than client-side apply can record), writes its configuration and
certificates, starts it and waits for its /readyz; the cluster's ``down`` stops it with the
rest. Configured as its manifests install it (their client QPS and workers), but as one
replica outside the cluster: no leader election, no certificate management of its own (it
serves on loopback with a certificate of the cluster's CA), no visibility server (an
aggregated API with certificates from a fixed path), no metrics server. Its webhooks are
not registered: a Job is queued by creating it suspended with its LocalQueue's label, which
is all Kueue's Job webhook adds; ClusterQueues and LocalQueues get their defaults from the
CRDs' schemas.

Kueue reads the certificate of its metrics server from a fixed directory, even when that
server is off: ``/etc/kueue/metrics/certs``, written here (it needs root, as the real node
does).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from . import build, pki
from .cluster import Cluster, ClusterError
from .kube import Kubectl
from .peer_process import PeerProcess
from .ports import free_port

HOST = "127.0.0.1"
MODULE = "sigs.k8s.io/kueue"
NAME = "kueue"
NAMESPACE = "kueue-system"
API = "kueue.x-k8s.io/v1beta2"
#: The label that puts a Job in a LocalQueue.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
SHIPPED_CONFIG = "config/components/manager/controller_manager_config.yaml"
CRDS = tuple(f"config/components/crd/bases/kueue.x-k8s.io_{k}.yaml" for k in (
    "admissionchecks", "clusterqueues", "cohorts", "localqueues", "multikueueclusters",
    "multikueueconfigs", "provisioningrequestconfigs", "resourceflavors", "topologies",
    "workloadpriorityclasses", "workloads"))


class Kueue:
    def __init__(self, cluster: Cluster, settings: Mapping[str, Any] | None = None) -> None:
        """`settings`: more of Kueue's Configuration (e.g. ``waitForPodsReady``)."""
        self.cluster = cluster
        self.settings = dict(settings or {})
        self.dir = cluster.dir / NAME
        self.process = PeerProcess(cluster, NAME, "Kueue")
        self.probe_port = 0

    def start(self, timeout: float = 180) -> None:
        kubectl = self.cluster.kubectl()
        self.install_crds(kubectl)
        kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        config = self._configure()
        self.process.start(
            [str(build.binary("kueue")), "--config", str(config),
             "--kubeconfig", str(self.cluster.kubeconfig)],
            f"http://{HOST}:{self.probe_port}/readyz", cwd=self.dir, timeout=timeout)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def stop(self) -> None:
        self.process.stop()

    @staticmethod
    def _as_shipped() -> dict[str, Any]:
        """The Configuration its manifests and Helm chart install (client QPS 50, burst 100;
        5 workers for Jobs and Workloads), which its code's own defaults (QPS 20, burst 30)
        are not: what its users run."""
        base = Path(build.module_dirs("kueue")[MODULE])
        shipped: dict[str, Any] = yaml.safe_load((base / SHIPPED_CONFIG).read_text())
        return {key: shipped[key] for key in ("apiVersion", "kind", "controller",
                                              "clientConnection")}

    @staticmethod
    def install_crds(kubectl: Kubectl) -> None:
        base = Path(build.module_dirs("kueue")[MODULE])
        for crd in CRDS:
            kubectl("apply", "--server-side", "--force-conflicts", "-f", str(base / crd))
        for crd in CRDS:
            name = yaml.safe_load((base / crd).read_text())["metadata"]["name"]
            kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{name}")

    def _configure(self) -> Path:
        """Its configuration file and serving certificate (and the metrics one it reads
        from a fixed path); the path of the configuration."""
        certs = self.dir / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        cert, key = pki.issue(self.cluster.dir, f"{NAME}.local", hosts=(HOST,))
        for d in (certs, METRICS_CERTS):
            try:
                d.mkdir(parents=True, exist_ok=True)
                (d / "tls.crt").write_bytes(cert)
                (d / "tls.key").write_bytes(key)
            except PermissionError as e:
                raise ClusterError(f"Kueue reads its metrics certificate from {METRICS_CERTS}, "
                                   f"which this user cannot write ({e}): run as root, or "
                                   "make that directory writable") from e
        self.probe_port = free_port()
        config = {
            **self._as_shipped(),
            "namespace": NAMESPACE,
            "leaderElection": {"leaderElect": False},
            "health": {"healthProbeBindAddress": f"{HOST}:{self.probe_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"host": HOST, "port": free_port(), "certDir": str(certs)},
            "internalCertManagement": {"enable": False},
            "featureGates": {"VisibilityOnDemand": False},
            "integrations": {"frameworks": ["batch/job"]},
            **self.settings,
        }
        path = self.dir / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        os.chmod(path, 0o600)
        return path


def queue(kubectl: Kubectl, namespace: str, quota: Mapping[str, str],
          name: str = "bench", flavor: Mapping[str, Any] | None = None) -> None:
    """A ResourceFlavor, a ClusterQueue of `quota` (resource -> nominal quota) open to every
    namespace, and a LocalQueue `name` in `namespace` pointing at it."""
    kubectl.apply([
        {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": name},
         "spec": dict(flavor or {})},
        {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": name},
         "spec": {"namespaceSelector": {},
                  "resourceGroups": [{
                      "coveredResources": sorted(quota),
                      "flavors": [{"name": name, "resources": [
                          {"name": r, "nominalQuota": q} for r, q in sorted(quota.items())]}],
                  }]}},
        {"apiVersion": API, "kind": "LocalQueue",
         "metadata": {"name": name, "namespace": namespace},
         "spec": {"clusterQueue": name}},
    ])
