"""What the real node's programs read (localcluster/node.py): containerd's config, the CNI
network, the kubelet's configuration and CoreDNS's Corefile, and where each lives."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import node_images

NAME = "real-0"
#: Label and taint of the real node: a pod lands there only if it tolerates the taint.
LABEL = "dispatcher.local/real-node"
TAINT = {"key": LABEL, "value": "true", "effect": "NoSchedule"}
#: The API server's default Service range is 10.0.0.0/24: `kubernetes` is its first address.
API_SERVICE_IP = "10.0.0.1"
POD_SUBNET = "10.244.0.0/24"
CLUSTER_CIDR = "10.244.0.0/16"
#: The pods' bridge and its address: the node's address too (the API server's endpoint,
#: the kubelet's, CoreDNS's), which only the machine and its pods reach.
BRIDGE = "dispatcher0"
GATEWAY = "10.244.0.1"
NETWORK = "dispatcher"  # the CNI network's name: its NAT rules carry it in their comments
CNI_BIN = Path("/usr/lib/cni")
#: containerd's namespace for the CRI (the kubelet's images and containers).
CRI_NAMESPACE = "k8s.io"
#: Where the kubelet puts pods' cgroups, in every hierarchy (the machine's, not the cluster's).
CGROUP_ROOT = "/dispatcher-real-node"


@dataclass(frozen=True)
class Identity:
    """Who a program of the node is to the API server (a client certificate's user and
    groups), so that it gets what such a program gets in a real cluster and no more."""

    program: str
    user: str
    groups: tuple[str, ...] = ()


#: The kubelet as the Node authorizer knows nodes: it reads only the Secrets, ConfigMaps and
#: tokens of pods bound to it. kube-proxy as the user Kubernetes binds to
#: system:node-proxier. CoreDNS as a user of its own, bound to COREDNS_RULES.
IDENTITIES = (
    Identity("kubelet", f"system:node:{NAME}", ("system:nodes",)),
    Identity("kube-proxy", "system:kube-proxy"),
    Identity("coredns", "dispatcher-local:coredns"),
)
COREDNS_ROLE = "dispatcher-local:coredns"
#: What CoreDNS's kubernetes plugin watches, and nothing more.
COREDNS_RULES = [
    # Pods only with `pods verified` (the Corefile says `pods insecure`); no Endpoints.
    {"apiGroups": [""], "resources": ["services", "namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
     "verbs": ["list", "watch"]},
]


def coredns_rbac() -> list[dict[str, Any]]:
    """CoreDNS's ClusterRole and its binding to CoreDNS's user."""
    meta = {"name": COREDNS_ROLE}
    user = next(i.user for i in IDENTITIES if i.program == "coredns")
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": meta, "rules": COREDNS_RULES},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": COREDNS_ROLE},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                       "name": user}]},
    ]


@dataclass(frozen=True)
class Ports:
    kubelet: int
    kubelet_healthz: int
    proxy_healthz: int
    proxy_metrics: int
    dns_health: int
    dns_ready: int


@dataclass(frozen=True)
class Paths:
    """The node's files, under its cluster's directory."""

    root: Path

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd-state"

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

    def kubeconfig(self, program: str) -> Path:
        """The kubeconfig `program` acts with (its Identity)."""
        return self.root / "kubeconfigs" / f"{program}.yaml"


def containerd_config(paths: Paths) -> str:
    """containerd's v2 config: its state under the node's directory, runc with cgroupfs
    (no systemd here), the sandbox image imported beside the others, Debian's CNI plugins."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    lines = [
        "version = 2",
        f'root = "{paths.root / "containerd"}"',
        f'state = "{paths.containerd_state}"',
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
        # CAP_SYS_RESOURCE: a VM or a container may not grant it.
        "  restrict_oom_score_adj = true",
        # The pods' network namespaces are the node's, not the machine's /run/netns.
        "  netns_mounts_under_state_dir = true",
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
        "name": NETWORK,
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True,
             # A pod reaches itself through its own Service.
             "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET,
                                                         "gateway": GATEWAY}]],
                      "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": str(paths.root / "ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(paths: Paths, ports: Ports, ca: Path) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # Without systemd, cgroupfs; 1.34 still runs on cgroup v1, and says so.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "oomScoreAdj": 0,  # see containerd_config: a negative score may be refused
        "cgroupRoot": CGROUP_ROOT,
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        "address": GATEWAY,
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.kubelet_healthz,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook"},
        "registerWithTaints": [TAINT],
        "clusterDomain": "cluster.local",
        "clusterDNS": [GATEWAY],
        "resolvConf": "/etc/resolv.conf",
        "maxPods": 30,
        "podLogsDir": str(paths.root / "pod-logs"),
        "serializeImagePulls": False,
        # Every image is imported: none may be garbage-collected from under a test.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # The disk is shared with the build cache: only a nearly full disk evicts.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "2%",
                         "imagefs.available": "2%", "nodefs.inodesFree": "2%"},
        "nodeStatusReportFrequency": "10s",
    }


def corefile(kubeconfig: Path, ports: Ports) -> str:
    """CoreDNS answers the cluster's names (Services, and pods of headless Services by
    hostname and subdomain, as training operators' workers find their master) on the
    bridge's address only; other names go upstream."""
    return f"""\
.:53 {{
    bind {GATEWAY}
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
