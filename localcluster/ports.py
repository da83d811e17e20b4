"""Each local cluster's own block of TCP ports, so several run side by side on one machine.

Left to themselves, kwokctl picks its components' ports by probing downwards from 32767 and
the operators took ports the kernel handed out; a cluster whose API server restarted, or a
second cluster starting meanwhile, could then find its port taken ("address already in use").
Here a cluster gets a block of ``BLOCK_SIZE`` consecutive ports, below the kernel's ephemeral
range (so no client connection takes one), first chosen from a hash of its name (the same
cluster name gets the same ports run after run) and recorded in the cluster's state
directory, so no other cluster takes it while it exists. ``down`` removes the record with
the state.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import config

BLOCK_SIZE = 32
#: Blocks lie in [FIRST_PORT, LAST_PORT): under the Linux ephemeral range (32768-60999) and
#: under kwokctl's own picks (downwards from 32767), which clusters made by other tools use.
FIRST_PORT = 20000
LAST_PORT = 32000
SLOTS = (LAST_PORT - FIRST_PORT) // BLOCK_SIZE
RECORD = "ports.json"

#: Offsets in a block, one per listening socket of a cluster.
ROLES = (
    "kube-apiserver", "etcd", "etcd-peer", "kube-controller-manager", "kube-scheduler",
    "kwok-controller", "kuberay-probe", "training-probe", "training-webhook", "mxjob-probe",
    "mxjob-webhook", "jobset-probe", "jobset-webhook", "lws-probe", "lws-webhook",
    # A real node's (localcluster/node.py).
    "kubelet", "kubelet-healthz", "kube-proxy-healthz", "kube-proxy-metrics", "dns-health",
    "dns-ready",
)


class PortsError(RuntimeError):
    pass


@dataclass(frozen=True)
class PortBlock:
    first: int

    def port(self, role: str) -> int:
        return self.first + ROLES.index(role)


def preferred_slot(name: str) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest(), 16) % SLOTS


def block_of(name: str) -> PortBlock:
    """The cluster's block: the one recorded for it, else a free one, now recorded."""
    with _locked():
        recorded = _read(config.cluster_dir(name))
        if recorded is not None:
            return recorded
        taken = {b.first for other, b in _records().items() if other != name}
        block = _first_free(name, taken)
        directory = config.cluster_dir(name)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / RECORD).write_text(json.dumps({"first": block.first}) + "\n")
        return block


def _first_free(name: str, taken: set[int]) -> PortBlock:
    start = preferred_slot(name)
    for i in range(SLOTS):
        first = FIRST_PORT + ((start + i) % SLOTS) * BLOCK_SIZE
        # A block recorded by an older layout (other sizes) may start between two of ours.
        clear = all(abs(first - other) >= BLOCK_SIZE for other in taken)
        if clear and all(_bindable(first + k) for k in range(len(ROLES))):
            return PortBlock(first)
    raise PortsError(f"no free block of {BLOCK_SIZE} ports in {FIRST_PORT}-{LAST_PORT} for "
                     f"cluster {name!r}; stop clusters you no longer use "
                     "(python -m localcluster down)")


def _records() -> dict[str, PortBlock]:
    root = config.state_root() / "clusters"
    out: dict[str, PortBlock] = {}
    for d in root.iterdir() if root.is_dir() else []:
        block = _read(d)
        if block is not None:
            out[d.name] = block
    return out


def _read(directory: Path) -> PortBlock | None:
    try:
        return PortBlock(int(json.loads((directory / RECORD).read_text())["first"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One allocation at a time across processes (two `up`s started together)."""
    config.state_root().mkdir(parents=True, exist_ok=True)
    with (config.state_root() / "ports.lock").open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def free_port() -> int:
    """A loopback port free now (for a process started on demand, beside the blocks)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
