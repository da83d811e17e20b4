"""A real node in the local cluster: kubelet, containerd, runc, the CNI bridge and kube-proxy.

kwok plays the kubelet of the profiles' fake nodes, which run no container. The real node
runs the pods bound to it: containerd (Debian's package) starts them with runc, the CNI
bridge and host-local plugins give each an address on ``POD_SUBNET``, kube-proxy routes
Service addresses to them (also for the API server, which calls webhooks through their
Service). Images come from OCI archives imported into containerd; nothing is pulled.

The node is tainted ``TAINT`` so only pods that say so land on it: the tests' fake GPU
nodes keep their workloads. Its network (the ``cni0`` bridge, kube-proxy's iptables rules,
the containers' network namespaces) is the machine's, so one cluster per machine may have a
real node.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import node_images
from .kube import Kubectl, answers, wait_for
from .profiles import PROFILE_LABEL

NAME = "real-0"
#: Label and taint of the real node: a pod lands there only if it tolerates the taint.
LABEL = "dispatcher.local/real-node"
TAINT = {"key": LABEL, "value": "true", "effect": "NoSchedule"}
#: The API server's default Service range is 10.0.0.0/24: `kubernetes` is its first address.
API_SERVICE_IP = "10.0.0.1"
POD_SUBNET = "10.244.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
BRIDGE = "cni0"
CNI_BIN = Path("/usr/lib/cni")
#: containerd's namespace for the CRI (the kubelet's images and containers).
CRI_NAMESPACE = "k8s.io"
#: Debian's packages the node runs (apt-get install, ``make real-node-packages``).
PACKAGES = ("containerd", "runc", "containernetworking-plugins", "iptables", "conntrack",
            "busybox-static", "gcc", "libc6-dev")
#: Commands from them, and where each comes from.
COMMANDS = {"containerd": "containerd", "containerd-shim-runc-v2": "containerd",
            "ctr": "containerd", "runc": "runc", "iptables": "iptables",
            "conntrack": "conntrack", "gcc": "gcc"}
CGROUP_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer",
                      "blkio", "hugetlb", "net_cls", "perf_event", "systemd")


class NodeError(RuntimeError):
    pass


def host_ip() -> str:
    """The machine's address on its default route (where pods reach the host)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # no packet is sent: this only picks a route
            addr: str = s.getsockname()[0]
        except OSError:
            return "127.0.0.1"
    return addr


def missing() -> list[str]:
    """What this machine lacks to run a real node, each as a sentence that says the fix."""
    out = []
    if os.geteuid() != 0:
        out.append("a real node needs root (containers, mounts, network namespaces)")
    absent = sorted({pkg for cmd, pkg in COMMANDS.items() if shutil.which(cmd) is None}
                    | _absent_files())
    if absent:
        out.append(f"missing Debian packages {', '.join(absent)}: "
                   f"apt-get install -y {' '.join(PACKAGES)} (make node-packages)")
    if not Path("/sys/fs/cgroup/memory").is_dir() and \
            not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        out.append("no cgroup hierarchy is mounted at /sys/fs/cgroup")
    return out


def _absent_files() -> set[str]:
    out = set()
    if not all((CNI_BIN / p).exists() for p in ("bridge", "host-local", "loopback", "portmap")):
        out.add("containernetworking-plugins")
    if not node_images.is_static(node_images.BUSYBOX_BINARY):
        out.add("busybox-static")
    return out


@dataclass(frozen=True)
class Ports:
    kubelet: int
    kubelet_healthz: int
    proxy_healthz: int
    proxy_metrics: int
    dns_health: int
    dns_ready: int


@dataclass(frozen=True)
class Binaries:
    kubelet: Path
    kube_proxy: Path
    coredns: Path


@dataclass(frozen=True)
class Paths:
    """Everything of the node lives under the cluster's directory."""

    root: Path

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def runc_root(self) -> Path:
        return self.root / "runc"

    @property
    def cni_conf(self) -> Path:
        return self.root / "cni"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.yaml"

    @property
    def corefile(self) -> Path:
        return self.root / "Corefile"

    @property
    def cgroup_root(self) -> str:
        return "/dispatcher-real-node"


class RealNode:
    """The real node of the cluster whose directory is ``cluster_dir``."""

    def __init__(self, cluster_dir: Path, kubeconfig: Path, ports: Ports,
                 binaries: Binaries, kubectl: Kubectl) -> None:
        self.paths = Paths(cluster_dir / "node")
        self.cluster_dir = cluster_dir
        self.kubeconfig = kubeconfig
        self.ports = ports
        self.binaries = binaries
        self.kubectl = kubectl
        self.logs = cluster_dir / "logs"
        self.pids = cluster_dir / "dispatcher-pids"

    # ------------------------------------------------------------------ start
    def start(self, timeout: float = 180) -> None:
        """Start the node, its own images imported; wait until it is Ready."""
        problems = missing() + self._machine_taken()
        if problems:
            raise NodeError("cannot start a real node: " + "; ".join(problems))
        self._write_configs()
        _prepare_host(self.paths.cgroup_root)
        self._spawn("containerd", ["containerd", "--config", str(self.paths.containerd_config)])
        wait_for(self._containerd_ready, timeout, f"containerd ({self.paths.socket})")
        self.import_image(node_images.pause())
        self.import_image(node_images.busybox())
        self._ctr("images", "tag", "--force", node_images.BUSYBOX,
                  node_images.CODEFLARE_BUSYBOX)
        self._spawn("coredns", [str(self.binaries.coredns), "-conf", str(self.paths.corefile)])
        self._spawn("kubelet", self._kubelet_args())
        self._spawn("kube-proxy", self._proxy_args())
        wait_for(self._ready, timeout, f"node {NAME} to be Ready (log {self.logs}/kubelet.log)")

    def _machine_taken(self) -> list[str]:
        """The machine's network (bridge, kube-proxy's rules) is one real node's."""
        taken = []
        for other in self.cluster_dir.parent.iterdir():
            pid_file = other / "dispatcher-pids" / "real-node-kubelet.pid"
            if other == self.cluster_dir or not pid_file.exists():
                continue
            with contextlib.suppress(OSError, ValueError):
                pid = int(pid_file.read_text())
                if _alive(pid) and str(other).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    taken.append(f"cluster {other.name!r} runs this machine's real node: stop "
                                 f"it first (DISPATCHER_CLUSTER={other.name} "
                                 "python -m localcluster down)")
        return taken

    def import_image(self, archive: Path) -> None:
        """Put an OCI archive's image into the node's containerd (named by its index)."""
        self._ctr("images", "import", "--all-platforms", str(archive))

    def _write_configs(self) -> None:
        for d in (self.paths.root, self.paths.cni_conf, self.paths.kubelet_dir, self.logs,
                  self.pids):
            d.mkdir(parents=True, exist_ok=True)
        self.paths.containerd_config.write_text(containerd_config(self.paths))
        (self.paths.cni_conf / "10-dispatcher.conflist").write_text(
            json.dumps(cni_config(self.paths), indent=2))
        self.paths.kubelet_config.write_text(
            yaml.safe_dump(kubelet_config(self.paths, self.ports, self._ca())))
        self.paths.corefile.write_text(corefile(self.kubeconfig, self.ports))

    def _ca(self) -> Path:
        return self.cluster_dir / "pki" / "ca.crt"

    def _kubelet_args(self) -> list[str]:
        return [str(self.binaries.kubelet), "--config", str(self.paths.kubelet_config),
                "--kubeconfig", str(self.kubeconfig), "--hostname-override", NAME,
                "--node-ip", host_ip(), "--root-dir", str(self.paths.kubelet_dir),
                "--cert-dir", str(self.paths.kubelet_dir / "pki"),
                "--node-labels", f"{LABEL}=true", "--v", "1"]

    def _proxy_args(self) -> list[str]:
        return [str(self.binaries.kube_proxy), "--kubeconfig", str(self.kubeconfig),
                "--hostname-override", NAME, "--proxy-mode", "iptables",
                "--cluster-cidr", CLUSTER_CIDR,
                "--healthz-bind-address", f"127.0.0.1:{self.ports.proxy_healthz}",
                "--metrics-bind-address", f"127.0.0.1:{self.ports.proxy_metrics}",
                # The machine's conntrack table is left as it is (a read-only /proc/sys here).
                "--conntrack-max-per-core", "0", "--oom-score-adj", "0"]

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = self.logs / f"real-node-{name}.log"
        with log.open("ab") as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    cwd=self.paths.root)
        (self.pids / f"real-node-{name}.pid").write_text(f"{proc.pid}\n")

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
        pid = int((self.pids / f"real-node-{name}.pid").read_text())
        if not _alive(pid):
            log = self.logs / f"real-node-{name}.log"
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise NodeError(f"{name} of the real node exited; log {log}:\n{tail}")

    # ------------------------------------------------------------------ images
    def images(self) -> list[str]:
        return self._ctr("images", "list", "--quiet").split()


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


# ---------------------------------------------------------------------- stop
def clean_up(cluster_dir: Path) -> None:
    """Undo what a real node left on the machine, once its processes are stopped: its
    containers, mounts, network and cgroups. Safe to call when it never ran."""
    paths = Paths(cluster_dir / "node")
    if not paths.root.exists():
        return
    _delete_containers(paths.runc_root)
    _kill_shims(paths.root)
    _unmount_under(paths.root)
    _remove_network()
    _remove_cgroups(paths.cgroup_root)


def _delete_containers(runc_root: Path) -> None:
    for ns_root in runc_root.iterdir() if runc_root.is_dir() else []:
        listed = subprocess.run(["runc", "--root", str(ns_root), "list", "--quiet"],
                                capture_output=True, text=True, check=False)
        for cid in listed.stdout.split():
            subprocess.run(["runc", "--root", str(ns_root), "delete", "--force", cid],
                           capture_output=True, check=False)


def _kill_shims(root: Path) -> None:
    """The shims outlive containerd (they keep its containers): ours name its socket."""
    needle = str(root).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if needle in (proc / "cmdline").read_bytes():
                os.kill(int(proc.name), 9)


def _unmount_under(root: Path) -> None:
    """Mounts the kubelet and containerd made (volumes, rootfs, shm), deepest first."""
    for point in sorted(_mount_points(root), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)


def _mount_points(root: Path) -> Iterable[str]:
    prefix = str(root) + "/"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            yield point


def _remove_network() -> None:
    subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
    netns = Path("/var/run/netns")
    for ns in netns.glob("cni-*") if netns.is_dir() else []:
        subprocess.run(["ip", "netns", "delete", ns.name], capture_output=True, check=False)
    for chain_table in _kube_proxy_chains():
        subprocess.run(["iptables", "-t", chain_table[0], "-F", chain_table[1]],
                       capture_output=True, check=False)


def _kube_proxy_chains() -> list[tuple[str, str]]:
    """kube-proxy's jump rules stay harmless without its chains' rules: flushed."""
    out = []
    for table in ("filter", "nat"):
        listed = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True,
                                text=True, check=False).stdout
        out += [(table, line.split()[1]) for line in listed.splitlines()
                if line.startswith("-N KUBE-")]
    return out


def _prepare_host(cgroup_root: str) -> None:
    # Pods' traffic leaves through the host (the bridge plugin's masquerade needs it).
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
    for controller in _cgroup_dirs():
        d = controller / cgroup_root.lstrip("/")
        d.mkdir(exist_ok=True)
        if controller.name == "cpuset":
            # A new cpuset is empty: its tasks could run nowhere until it gets its parent's.
            for f in ("cpuset.cpus", "cpuset.mems"):
                if not (d / f).read_text().strip():
                    (d / f).write_text((controller / f).read_text())


def _cgroup_dirs() -> list[Path]:
    base = Path("/sys/fs/cgroup")
    return [base / c for c in CGROUP_CONTROLLERS if (base / c).is_dir()
            and not (base / c).is_symlink()]


def _remove_cgroups(cgroup_root: str) -> None:
    for controller in _cgroup_dirs():
        top = controller / cgroup_root.lstrip("/")
        if not top.is_dir():
            continue
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                      reverse=True)
        for d in [*dirs, top]:
            with contextlib.suppress(OSError):
                d.rmdir()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------------- configs
def containerd_config(paths: Paths) -> str:
    """containerd's v2 config: its state under the node's directory, runc with cgroupfs
    (no systemd here), the sandbox image imported beside the others, Debian's CNI plugins."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    lines = [
        "version = 2",
        f'root = "{paths.root / "containerd"}"',
        f'state = "{paths.root / "containerd-state"}"',
        'disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", '
        '"io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", '
        '"io.containerd.snapshotter.v1.aufs", "io.containerd.internal.v1.opt"]',
        "[grpc]",
        f'  address = "{paths.socket}"',
        "[ttrpc]",
        f'  address = "{paths.socket}.ttrpc"',
        f"[{cri}]",
        f'  sandbox_image = "{node_images.PAUSE}"',
        # The kubelet asks for negative OOM scores (-998 for sandboxes), which need
        # CAP_SYS_RESOURCE: a machine may not grant it (a container, this CI's VMs).
        "  restrict_oom_score_adj = true",
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.runc.options]",
        "  SystemdCgroup = false",
        f'  Root = "{paths.runc_root}"',
        f"[{cri}.cni]",
        f'  bin_dir = "{CNI_BIN}"',
        f'  conf_dir = "{paths.cni_conf}"',
        "  max_conf_num = 1",
    ]
    return "\n".join(lines) + "\n"


def cni_config(paths: Paths) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": "dispatcher",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
             # A pod reaches itself through its own Service.
             "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                      "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": str(paths.root / "ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(paths: Paths, ports: Ports, ca: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # No systemd here; cgroup v1 is what this machine has, and 1.34 still runs on it.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "oomScoreAdj": 0,  # see containerd_config: a negative score may be refused
        "cgroupRoot": paths.cgroup_root,
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        "address": "0.0.0.0",
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.kubelet_healthz,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook"},
        "registerWithTaints": [TAINT],
        "clusterDomain": "cluster.local",
        "clusterDNS": [host_ip()],
        "resolvConf": "/etc/resolv.conf",
        "maxPods": 30,
        "podLogsDir": str(paths.root / "pod-logs"),
        "serializeImagePulls": False,
        # Every image is imported: none may be garbage-collected from under a test.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # The machine's disk is shared with the build cache: only a nearly full disk evicts.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%",
                         "imagefs.available": "2%", "nodefs.inodesFree": "2%"},
        "nodeStatusReportFrequency": "10s",
    }


def corefile(kubeconfig: Path, ports: Ports) -> str:
    """CoreDNS answers the cluster's names (Services, and pods of headless Services by
    hostname and subdomain, as training operators' workers find their master) on the
    host's address, which pods reach through their bridge; other names go upstream."""
    return f"""\
.:53 {{
    bind {host_ip()}
    errors
    health 127.0.0.1:{ports.dns_health}
    ready 127.0.0.1:{ports.dns_ready}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    forward . /etc/resolv.conf
    cache 5
    loop
}}
"""
