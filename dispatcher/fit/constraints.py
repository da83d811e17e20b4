"""Whether a node may take a pod, by the rules kube-scheduler filters on.

Taints with effect NoSchedule or NoExecute must be tolerated (PreferNoSchedule is a
preference, not a filter); every nodeSelector label must match; at least one term of
the required node affinity must match in full.
"""

from __future__ import annotations

from collections.abc import Mapping

from dispatcher.cluster.autopilot import uses
from dispatcher.cluster.model import Node, Taint
from dispatcher.kinds.podset import PodConstraints, Requirement, Toleration
from dispatcher.wording import counted

FILTERING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def tolerates(toleration: Toleration, taint: Taint) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        return not toleration.key or toleration.key == taint.key
    return toleration.key == taint.key and toleration.value == taint.value


def untolerated_taints(node: Node, tolerations: tuple[Toleration, ...]) -> list[Taint]:
    return [
        t for t in node.taints
        if t.effect in FILTERING_EFFECTS and not any(tolerates(tol, t) for tol in tolerations)
    ]


def _label(node: Node, key: str) -> str | None:
    if key == "metadata.name":  # matchFields on the node's name
        return node.name
    return node.labels.get(key)


def requirement_matches(node: Node, req: Requirement) -> bool:
    value = _label(node, req.key)
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(req.values) == 1:
        try:
            have, bound = int(value), int(req.values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def affinity_matches(node: Node, terms: tuple[tuple[Requirement, ...], ...]) -> bool:
    if not terms:
        return True
    # A term without requirements selects no node, as in kube-scheduler.
    return any(term and all(requirement_matches(node, r) for r in term) for term in terms)


def node_admits(node: Node, constraints: PodConstraints) -> bool:
    """Everything but capacity: cordon, taints, selector, affinity."""
    if node.unschedulable:
        return False
    if any(node.labels.get(k) != v for k, v in constraints.node_selector):
        return False
    if untolerated_taints(node, constraints.tolerations):
        return False
    return affinity_matches(node, constraints.affinity_terms)


def node_takes(node: Node, constraints: PodConstraints, request: Mapping[str, int]) -> bool:
    """node_admits, and none of what the pod asks for is flagged unhealthy there
    (Autopilot): where a pod may be let onto now."""
    return node_admits(node, constraints) and not uses(request, node.withheld)


def describe(constraints: PodConstraints) -> str:
    """The pod's node rules, in words, for a waiting message."""
    parts: list[str] = []
    if constraints.node_selector:
        parts.append("nodeSelector " + ",".join(f"{k}={v}" for k, v in constraints.node_selector))
    if constraints.affinity_terms:
        parts.append("required node affinity")
    if constraints.tolerations:
        parts.append(counted(len(constraints.tolerations), "toleration"))
    return " and ".join(parts) if parts else "no node rules"
