"""Node profiles: YAML files in ``localcluster/profiles`` that describe the fake nodes.

A profile is ``{description, nodes: [{name, count, capacity, labels?, taints?, names?}]}``;
each group makes ``count`` nodes named ``<profile>-<name>-<i>``, or, with ``names``, one node
per name given (for suites that assert a node by name, as MCAD's do: ``test-worker``). kwok
plays the kubelet of every node (heartbeats, Ready condition, and the pods bound to it):
kwokctl runs it with ``--manage-all-nodes``. The nodes also carry kwok's
``kwok.x-k8s.io/node: fake`` annotation so the same nodes work with a kwok that only
manages annotated nodes (e.g. one installed in a user's kind cluster). All profile nodes
are labelled ``dispatcher.local/profile=<profile>`` so applying another profile replaces them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from . import config
from .kube import Kubectl, wait_for

PROFILE_LABEL = "dispatcher.local/profile"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"


def profile_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    candidate = config.PROFILES_DIR / f"{name_or_path}.yaml"
    if not candidate.exists():
        known = ", ".join(sorted(x.stem for x in config.PROFILES_DIR.glob("*.yaml")))
        raise FileNotFoundError(f"no node profile {name_or_path!r} (known: {known})")
    return candidate


def available() -> list[str]:
    return sorted(p.stem for p in config.PROFILES_DIR.glob("*.yaml"))


def load(name_or_path: str) -> dict[str, Any]:
    path = profile_path(name_or_path)
    data: dict[str, Any] = yaml.safe_load(path.read_text()) or {}
    data.setdefault("name", path.stem)
    if not isinstance(data.get("nodes"), list) or not data["nodes"]:
        raise ValueError(f"{path}: a profile needs a non-empty `nodes` list")
    return data


def nodes(name_or_path: str) -> list[dict[str, Any]]:
    """The Node objects of a profile."""
    prof = load(name_or_path)
    pname = str(prof["name"])
    out: list[dict[str, Any]] = []
    for group in prof["nodes"]:
        capacity = {str(k): str(v) for k, v in group["capacity"].items()}
        capacity.setdefault("pods", "110")
        given = [str(n) for n in group.get("names") or []]
        count = len(given) if given else int(group.get("count", 1))
        for i in range(count):
            name = given[i] if given else f"{pname}-{group['name']}-{i}"
            labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                PROFILE_LABEL: pname,
                **{str(k): str(v) for k, v in (group.get("labels") or {}).items()},
            }
            out.append({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                },
                "spec": {"taints": list(group.get("taints") or [])},
                "status": {
                    "capacity": capacity,
                    "allocatable": dict(capacity),
                    "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux"},
                },
            })
    return out


def current_nodes(kubectl: Kubectl) -> list[dict[str, Any]]:
    return kubectl.items("nodes", "-l", PROFILE_LABEL)


def apply(kubectl: Kubectl, name_or_path: str, timeout: float = 60) -> list[str]:
    """Make the cluster's fake nodes exactly those of the profile; wait until Ready."""
    wanted = nodes(name_or_path)
    names = {n["metadata"]["name"] for n in wanted}
    existing = {n["metadata"]["name"] for n in current_nodes(kubectl)}
    stale = sorted(existing - names)
    if stale:
        kubectl("delete", "node", "--wait=false", *stale)
        # kwok stops managing a deleted node's pods, so nothing would ever finish deleting
        # them until the pod garbage collector force-deletes orphans (tens of seconds later);
        # and if a node of the same name came back first they would hold its GPUs again. Do
        # the garbage collector's job now.
        for node in stale:
            kubectl("delete", "pods", "--all-namespaces", "--field-selector",
                    f"spec.nodeName={node}", "--grace-period=0", "--force", "--wait=false",
                    "--ignore-not-found")
    new = [n for n in wanted if n["metadata"]["name"] not in existing]
    if new:
        # `create`, not `apply`: a Node's status (its capacity) is only taken on create.
        kubectl.create(yaml.safe_dump_all(new))

    def ready() -> bool:
        got = {n["metadata"]["name"]: n for n in current_nodes(kubectl)}
        if set(got) != names:
            return False
        for n in got.values():
            conds = {c["type"]: c["status"] for c in n.get("status", {}).get("conditions", [])}
            if conds.get("Ready") != "True":
                return False
        return True

    wait_for(ready, timeout, f"nodes of profile {name_or_path!r} to be Ready")
    return sorted(names)
