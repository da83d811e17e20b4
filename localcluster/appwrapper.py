"""codeflare's AppWrapper controller (v1.2.1, built from its published module), MCAD's
successor, as a local process: a peer in bench/peers.py, run with Kueue as its users run it.

It queues nothing itself: Kueue's AppWrapper integration (the framework
``workload.codeflare.dev/appwrapper``) admits an AppWrapper by quota and unsuspends it; this
controller then creates its components and watches them. Its webhooks are off (they need a
certificate for a Service name; none is reachable here): an AppWrapper is queued by creating
it suspended with its LocalQueue's label, which is what Kueue's webhook would make of it.

Its AppWrapper CRD (v1beta2 only) has the name of the dispatcher's, which stores v1beta1: it
replaces the dispatcher's for as long as it runs, and ``restore_crd`` puts that back. Each
deletes the other's AppWrappers. It reads its configuration from a ConfigMap in its
namespace, written here with its webhooks, metrics server and leader election off.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from . import build
from .cluster import Cluster
from .kube import Kubectl, wait_for
from .peer_process import PeerProcess
from .ports import free_port

HOST = "127.0.0.1"
MODULE = "github.com/project-codeflare/appwrapper"
NAME = "appwrapper-controller"
NAMESPACE = "appwrapper-system"
CONFIG_MAP = "appwrapper-operator-config"
API = "workload.codeflare.dev/v1beta2"
CRD_FILE = "config/crd/bases/workload.codeflare.dev_appwrappers.yaml"
CRD = "customresourcedefinition/appwrappers.workload.codeflare.dev"
REPO = Path(__file__).resolve().parents[1]
DISPATCHER_CRD = REPO / "crds" / "appwrappers.workload.codeflare.dev.yaml"
#: Kueue's name for the AppWrapper integration (its Configuration's ``integrations``).
KUEUE_FRAMEWORK = "workload.codeflare.dev/appwrapper"


class AppWrapperController:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.dir = cluster.dir / NAME
        self.process = PeerProcess(cluster, NAME, "the AppWrapper controller")

    def start(self, timeout: float = 180) -> None:
        kubectl = self.cluster.kubectl()
        self.install_crd(kubectl)
        probe_port = free_port()
        kubectl.apply([
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
             "data": {"config.yaml": yaml.safe_dump(self._config(probe_port))}},
        ])
        self.dir.mkdir(parents=True, exist_ok=True)
        # Its /readyz would start the webhook server (on port 9443, without certificates)
        # even with webhooks off: /healthz says it runs.
        self.process.start(
            # The kubeconfig on its command line: the cluster's `down` stops the processes
            # whose command line names the cluster's directory.
            [str(build.binary("appwrapper", "cmd")), "--config", CONFIG_MAP,
             "--kubeconfig", str(self.cluster.kubeconfig)],
            f"http://{HOST}:{probe_port}/healthz", cwd=self.dir, timeout=timeout,
            env={**os.environ, "NAMESPACE": NAMESPACE})

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def stop(self) -> None:
        self.process.stop()

    @staticmethod
    def _config(probe_port: int) -> dict[str, Any]:
        return {
            "webhooksEnabled": False,
            "controllerManager": {"metrics": {"bindAddress": "0"},
                                  "health": {"bindAddress": f"{HOST}:{probe_port}"},
                                  "leaderElection": False},
        }

    @staticmethod
    def install_crd(kubectl: Kubectl) -> None:
        """Its CRD in place of the dispatcher's (which it cannot update: that stores a
        version this one does not serve)."""
        path = Path(build.module_dirs("appwrapper")[MODULE]) / CRD_FILE
        _replace_crd(kubectl, path)

    @staticmethod
    def restore_crd(kubectl: Kubectl) -> None:
        """The dispatcher's AppWrapper CRD again."""
        _replace_crd(kubectl, DISPATCHER_CRD)


def _replace_crd(kubectl: Kubectl, path: Path) -> None:
    kubectl("delete", CRD, "--ignore-not-found", "--wait=true", timeout=300)
    wait_for(lambda: kubectl.run("get", CRD, check=False).returncode != 0, 120,
             "the old AppWrapper CRD to go")
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    kubectl("wait", "--for=condition=Established", "--timeout=60s", CRD)
