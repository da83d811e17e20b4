"""The machine under the real node (localcluster/node.py): what it needs, what the node
changes on it (the pods' bridge, forwarding, cgroups) and how that is undone once the
node's processes are stopped: its containers, mounts, NAT rules, bridge and cgroups."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from . import node_images
from .node_config import BRIDGE, CGROUP_ROOT, CNI_BIN, GATEWAY, NETWORK, POD_SUBNET, Paths

#: Debian's packages the node runs (apt-get install, ``make node-packages``).
PACKAGES = ("containerd", "runc", "containernetworking-plugins", "iptables", "conntrack",
            "busybox-static", "gcc", "libc6-dev")
#: Commands from them, and where each comes from.
COMMANDS = {"containerd": "containerd", "containerd-shim-runc-v2": "containerd",
            "ctr": "containerd", "runc": "runc", "iptables": "iptables",
            "conntrack": "conntrack", "gcc": "gcc"}
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
#: The cgroup v1 controllers the kubelet needs (it also uses the others it finds).
NEEDED_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids")
CGROUPS = Path("/sys/fs/cgroup")
FORWARDING = Path("/proc/sys/net/ipv4/ip_forward")


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
    lacking = [c for c in NEEDED_CONTROLLERS if c not in _hierarchies()]
    if lacking:
        out.append(f"no cgroup v1 hierarchy for {', '.join(lacking)} under {CGROUPS}: the "
                   "real node runs on cgroup v1 (a cgroup v2 machine is not supported yet)")
    return out


def _absent_files() -> set[str]:
    out = set()
    if not all((CNI_BIN / p).exists() for p in CNI_PLUGINS):
        out.add("containernetworking-plugins")
    if not node_images.is_static(node_images.BUSYBOX_BINARY):
        out.add("busybox-static")
    return out


def _hierarchies() -> dict[str, Path]:
    """Each v1 controller -> its hierarchy's directory (joined ones, e.g. cpu,cpuacct,
    share one; their names are links to it)."""
    out: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        if fields[separator + 1] != "cgroup":
            continue
        options = fields[separator + 3].split(",")
        for controller in options:
            if controller in NEEDED_CONTROLLERS or controller.startswith("name="):
                out[controller] = Path(fields[4])
    return out


def prepare(paths: Paths) -> None:
    """Forwarding on (remembered, to restore), the pods' bridge with the node's address,
    and the kubelet's cgroup root in every hierarchy."""
    saved = paths.root / "ip_forward.before"
    if not saved.exists():
        saved.write_text(FORWARDING.read_text())
    FORWARDING.write_text("1\n")
    _bridge()
    for hierarchy in set(_hierarchies().values()):
        _cgroup_root_in(hierarchy)


def _bridge() -> None:
    """The bridge the CNI plugin puts pods on, made first: the kubelet, CoreDNS and the API
    server's endpoint use its address, which exists before the first pod."""
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode == 0:
        return
    prefix = POD_SUBNET.split("/")[1]
    for cmd in (["ip", "link", "add", BRIDGE, "type", "bridge"],
                ["ip", "addr", "add", f"{GATEWAY}/{prefix}", "dev", BRIDGE],
                ["ip", "link", "set", BRIDGE, "up"]):
        subprocess.run(cmd, capture_output=True, text=True, check=True)


def _cgroup_root_in(hierarchy: Path) -> None:
    d = hierarchy / CGROUP_ROOT.lstrip("/")
    d.mkdir(exist_ok=True)
    if (hierarchy / "cpuset.cpus").exists():
        # A new cpuset is empty: its tasks could run nowhere until it gets its parent's.
        for f in ("cpuset.cpus", "cpuset.mems"):
            if not (d / f).read_text().strip():
                (d / f).write_text((hierarchy / f).read_text())


# ---------------------------------------------------------------------- undo
def clean_up(paths: Paths, kube_proxy: Path | None) -> None:
    """Undo what a real node left on the machine, once its processes are stopped. Safe to
    call when it never ran. `kube_proxy`: the binary that removes its own rules."""
    if not paths.root.exists():
        return
    _delete_containers(paths.runc_root)
    _kill_shims(paths.root)
    _unmount_under(paths.root)
    if kube_proxy is not None:
        subprocess.run([str(kube_proxy), "--cleanup"], capture_output=True, check=False)
    _remove_nat_rules()
    _remove_kubelet_chains()
    subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
    _restore_forwarding(paths.root / "ip_forward.before")
    _remove_cgroups()


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
    """Mounts the kubelet and containerd made (volumes, root filesystems, shm, the pods'
    network namespaces), deepest first."""
    for point in sorted(_mount_points(root), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)


def _mount_points(root: Path) -> Iterable[str]:
    prefix = str(root) + "/"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point.startswith(prefix):
            yield point


def _remove_nat_rules() -> None:
    """The bridge plugin's masquerading: a POSTROUTING jump per pod, commented with the
    network's name, to a chain of its own."""
    listed = subprocess.run(["iptables", "-t", "nat", "-S", "POSTROUTING"],
                            capture_output=True, text=True, check=False).stdout
    for rule in listed.splitlines():
        if f'name: \\"{NETWORK}\\"' not in rule and f'name: "{NETWORK}"' not in rule:
            continue
        args = rule.split()
        chain = args[args.index("-j") + 1] if "-j" in args else None
        subprocess.run(["sh", "-c", f"iptables -t nat {rule.replace('-A ', '-D ', 1)}"],
                       capture_output=True, check=False)
        if chain and chain.startswith("CNI-"):
            for op in ("-F", "-X"):
                subprocess.run(["iptables", "-t", "nat", op, chain], capture_output=True,
                               check=False)


#: The kubelet's own chains (kube-proxy --cleanup removes kube-proxy's): its canaries, which
#: tell it the firewall was reset, its guard of 127.0.0.0/8, and its hint for kube-proxy.
KUBELET_CHAINS = (("mangle", "KUBE-KUBELET-CANARY"), ("nat", "KUBE-KUBELET-CANARY"),
                  ("filter", "KUBE-KUBELET-CANARY"), ("filter", "KUBE-FIREWALL"),
                  ("mangle", "KUBE-IPTABLES-HINT"))


def _remove_kubelet_chains() -> None:
    for table, chain in KUBELET_CHAINS:
        listed = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True,
                                text=True, check=False).stdout
        for rule in listed.splitlines():
            if rule.startswith("-A ") and rule.endswith(f"-j {chain}"):
                subprocess.run(["iptables", "-t", table, "-D", *rule.split()[1:]],
                               capture_output=True, check=False)
        for op in ("-F", "-X"):
            subprocess.run(["iptables", "-t", table, op, chain], capture_output=True,
                           check=False)


def _restore_forwarding(saved: Path) -> None:
    with contextlib.suppress(OSError):
        FORWARDING.write_text(saved.read_text())


def _remove_cgroups() -> None:
    for hierarchy in set(_hierarchies().values()):
        top = hierarchy / CGROUP_ROOT.lstrip("/")
        if not top.is_dir():
            continue
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts),
                      reverse=True)
        for d in [*dirs, top]:
            with contextlib.suppress(OSError):
                d.rmdir()
