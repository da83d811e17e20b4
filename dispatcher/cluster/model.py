"""Nodes and pods as the admission core sees them, parsed from Kubernetes objects."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatcher.api.labels import APPWRAPPER_LABEL
from dispatcher.cluster.autopilot import DEFAULT_AUTOPILOT, Autopilot, uses
from dispatcher.resources import pod_request, resource_list

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
DEFAULT_MAX_PODS = 110


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass
class Node:
    name: str
    allocatable: dict[str, int]
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    # Resources Autopilot flagged (autopilot.py): no new pod asking for one goes here;
    # a v1beta2 gang with a pod here asking for an evicting one is reset.
    withheld: frozenset[str] = frozenset()
    evicting: frozenset[str] = frozenset()


@dataclass(frozen=True)
class BoundPod:
    """A non-terminal pod that holds capacity on a node."""

    namespace: str
    name: str
    node: str
    request: Mapping[str, int]
    appwrapper: str | None = None  # name of the owning AppWrapper (same namespace)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def node_from_object(obj: Mapping[str, Any], autopilot: Autopilot = DEFAULT_AUTOPILOT) -> Node:
    """A Node as `kubectl get node -o yaml` prints it; `autopilot` reads its health labels."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    # kube-scheduler uses allocatable; capacity is the fallback for hand-written nodes.
    alloc = status.get("allocatable") or status.get("capacity") or {}
    taints = tuple(
        Taint(key=str(t.get("key", "")), value=str(t.get("value", "")),
              effect=str(t.get("effect", "NoSchedule")))
        for t in spec.get("taints") or []
    )
    allocatable = resource_list(alloc)
    # kubelet's default pod limit, for nodes written by hand without one.
    allocatable.setdefault("pods", DEFAULT_MAX_PODS)
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    return Node(
        name=str(meta["name"]),
        allocatable=allocatable,
        labels=labels,
        taints=taints,
        unschedulable=bool(spec.get("unschedulable", False)),
        withheld=autopilot.withheld(labels),
        evicting=autopilot.evicting(labels),
    )


def evicting_nodes(pods: Iterable[BoundPod], nodes: Mapping[str, Node]) -> list[str]:
    """The nodes where one of `pods` uses a resource Autopilot flagged NoExecute."""
    return sorted({p.node for p in pods
                   if p.node in nodes and uses(p.request, nodes[p.node].evicting)})


def is_terminal(obj: Mapping[str, Any]) -> bool:
    return (obj.get("status") or {}).get("phase") in TERMINAL_PHASES


def bound_pod_from_object(obj: Mapping[str, Any]) -> BoundPod | None:
    """The capacity a pod holds, or None when it holds none (unbound or terminal)."""
    spec = obj.get("spec") or {}
    node = spec.get("nodeName")
    if not node or is_terminal(obj):
        return None
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    owner = labels.get(APPWRAPPER_LABEL)
    return BoundPod(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta["name"]),
        node=str(node),
        request=pod_request(spec),
        appwrapper=str(owner) if owner else None,
    )
