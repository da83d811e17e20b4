"""A real node in the local cluster: kubelet, containerd, runc, the CNI bridge and kube-proxy.

kwok plays the kubelet of the profiles' fake nodes, which run no container. The real node
runs the pods bound to it: containerd (Debian's package) starts them with runc, the CNI
bridge and host-local plugins give each an address on ``POD_SUBNET``, kube-proxy routes
Service addresses to them (also for the API server, which calls webhooks through their
Service), and CoreDNS answers the cluster's names. Images come from OCI archives imported
into containerd; nothing is pulled. Its files are in localcluster/node_config.py, what it
does to the machine in localcluster/node_host.py.

The node is tainted ``TAINT`` so only pods that say so land on it: the tests' fake GPU
nodes keep their workloads. Its network (the bridge, kube-proxy's iptables rules) is the
machine's, so one cluster per machine may have a real node.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import node_images
from .kube import Kubectl, answers, wait_for
from .node_config import (
    API_SERVICE_IP,
    CLUSTER_CIDR,
    CRI_NAMESPACE,
    GATEWAY,
    IDENTITIES,
    LABEL,
    NAME,
    TAINT,
    Paths,
    Ports,
    cni_config,
    containerd_config,
    coredns_rbac,
    corefile,
    kubelet_config,
)
from .node_host import clean_up, missing, prepare
from .procs import alive, runs_in, spawn, tail
from .profiles import PROFILE_LABEL
from .users import client_kubeconfig

__all__ = ["API_SERVICE_IP", "GATEWAY", "LABEL", "NAME", "TAINT", "Binaries", "NodeError",
           "Paths", "Ports", "RealNode", "alone", "clean_up", "missing"]


class NodeError(RuntimeError):
    pass


@dataclass(frozen=True)
class Binaries:
    kubelet: Path
    kube_proxy: Path
    coredns: Path


class RealNode:
    """The real node of the cluster whose directory is ``cluster_dir``."""

    def __init__(self, cluster_dir: Path, ports: Ports, binaries: Binaries,
                 kubectl: Kubectl) -> None:
        """`kubectl`: the admin's, to set the node up; its programs act as themselves."""
        self.paths = Paths(cluster_dir / "node")
        self.cluster_dir = cluster_dir
        self.ports = ports
        self.binaries = binaries
        self.kubectl = kubectl

    # ------------------------------------------------------------------ start
    def start(self, timeout: float = 180) -> None:
        """Start the node, its own images imported; wait until it is Ready."""
        problems = missing() + self._machine_taken()
        if problems:
            raise NodeError("cannot start a real node: " + "; ".join(problems))
        self._write_configs()
        prepare(self.paths)
        self._spawn("containerd", ["containerd", "--config", str(self.paths.containerd_config)])
        wait_for(self._containerd_ready, timeout, f"containerd ({self.paths.socket})")
        self.import_image(node_images.pause())
        self.import_image(node_images.busybox())
        self._ctr("images", "tag", "--force", node_images.BUSYBOX,
                  node_images.CODEFLARE_BUSYBOX)
        self._spawn("coredns", [str(self.binaries.coredns), "-conf", str(self.paths.corefile)])
        self._spawn("kubelet", self._kubelet_args())
        self._spawn("kube-proxy", self._proxy_args())
        wait_for(self._ready, timeout,
                 f"node {NAME} to be Ready (log {self.log_file('kubelet')})")

    def _machine_taken(self) -> list[str]:
        """The machine's network (bridge, kube-proxy's rules) is one real node's."""
        taken = []
        for other in self.cluster_dir.parent.iterdir():
            pid_file = _pid_file(other, "kubelet")
            if other == self.cluster_dir or not pid_file.exists():
                continue
            with contextlib.suppress(OSError, ValueError):
                if runs_in(int(pid_file.read_text()), other):
                    taken.append(f"cluster {other.name!r} runs this machine's real node: stop "
                                 f"it first (DISPATCHER_CLUSTER={other.name} "
                                 "python -m localcluster down)")
        return taken

    def import_image(self, archive: Path) -> None:
        """Put an OCI archive's image into the node's containerd (named by its index)."""
        self._ctr("images", "import", "--all-platforms", str(archive))

    def _write_configs(self) -> None:
        for d in (self.paths.root, self.paths.cni_conf, self.paths.kubelet_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.paths.containerd_config.write_text(containerd_config(self.paths))
        (self.paths.cni_conf / "10-dispatcher.conflist").write_text(
            json.dumps(cni_config(self.paths), indent=2))
        self.paths.kubelet_config.write_text(
            yaml.safe_dump(kubelet_config(self.paths, self.ports, self._ca())))
        self.paths.corefile.write_text(corefile(self.paths.kubeconfig("coredns"), self.ports))
        self._write_identities()

    def _write_identities(self) -> None:
        """A kubeconfig per program, each acting as its own Identity (never the admin)."""
        self.kubectl.apply(coredns_rbac())
        for identity in IDENTITIES:
            client_kubeconfig(self.cluster_dir, self.kubectl,
                              self.paths.kubeconfig(identity.program), identity.user,
                              identity.groups)

    def _ca(self) -> Path:
        return self.cluster_dir / "pki" / "ca.crt"

    def _kubelet_args(self) -> list[str]:
        return [str(self.binaries.kubelet), "--config", str(self.paths.kubelet_config),
                "--kubeconfig", str(self.paths.kubeconfig("kubelet")),
                "--hostname-override", NAME,
                "--node-ip", GATEWAY, "--root-dir", str(self.paths.kubelet_dir),
                "--cert-dir", str(self.paths.kubelet_dir / "pki"),
                "--node-labels", f"{LABEL}=true", "--v", "1"]

    def _proxy_args(self) -> list[str]:
        return [str(self.binaries.kube_proxy),
                "--kubeconfig", str(self.paths.kubeconfig("kube-proxy")),
                "--hostname-override", NAME, "--proxy-mode", "iptables",
                "--cluster-cidr", CLUSTER_CIDR,
                "--healthz-bind-address", f"127.0.0.1:{self.ports.proxy_healthz}",
                "--metrics-bind-address", f"127.0.0.1:{self.ports.proxy_metrics}",
                # The machine's conntrack table is left as it is.
                "--conntrack-max-per-core", "0", "--oom-score-adj", "0"]

    def _spawn(self, name: str, argv: list[str]) -> None:
        spawn(argv, self.log_file(name), self.pid_file(name), self.paths.root)

    def pid_file(self, name: str) -> Path:
        """The pid file of the node's program `name` (containerd, kubelet, ...)."""
        return _pid_file(self.cluster_dir, name)

    def log_file(self, name: str) -> Path:
        return self.cluster_dir / "logs" / f"real-node-{name}.log"

    def _ctr(self, *args: str) -> str:
        done = subprocess.run(["ctr", "--address", str(self.paths.socket), "--namespace",
                               CRI_NAMESPACE, *args], capture_output=True, text=True,
                              check=False, timeout=300)
        if done.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def _containerd_ready(self) -> bool:
        self._check_alive("containerd")
        if not self.paths.socket.exists():
            return False
        try:
            self._ctr("version")
        except NodeError:
            return False
        return True

    def _ready(self) -> bool:
        for name in ("containerd", "coredns", "kubelet", "kube-proxy"):
            self._check_alive(name)
        if not answers(f"http://127.0.0.1:{self.ports.dns_ready}/ready"):
            return False
        node = self.kubectl.run("get", "node", NAME, "-o", "json", check=False)
        if node.returncode != 0:
            return False
        conditions = json.loads(node.stdout).get("status", {}).get("conditions") or []
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def _check_alive(self, name: str) -> None:
        if not alive(int(self.pid_file(name).read_text())):
            log = self.log_file(name)
            raise NodeError(f"{name} of the real node exited; log {log}:\n{tail(log, 15)}")


def _pid_file(cluster_dir: Path, name: str) -> Path:
    # Among the operators' pid files: the cluster's `down` stops them with the rest.
    return cluster_dir / "dispatcher-pids" / f"real-node-{name}.pid"


@contextlib.contextmanager
def alone(kubectl: Kubectl) -> Iterator[None]:
    """Pods that tolerate nothing and select no node land on the real node: its taint lifted
    and the fake nodes cordoned, until the block ends."""
    taint = f"{TAINT['key']}={TAINT['value']}:{TAINT['effect']}"
    fake = f"-l{PROFILE_LABEL}"
    kubectl("taint", "node", NAME, f"{TAINT['key']}-")
    kubectl("cordon", fake)
    try:
        yield
    finally:
        kubectl("uncordon", fake)
        kubectl("taint", "node", NAME, taint, "--overwrite")
