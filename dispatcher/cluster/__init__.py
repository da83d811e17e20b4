"""The cluster as the dispatcher sees it: nodes, bound pods, reservations."""

from dispatcher.cluster.model import (
    BoundPod,
    Node,
    Taint,
    bound_pod_from_object,
    is_terminal,
    node_from_object,
)
from dispatcher.cluster.state import AppWrapperKey, ClusterState, PlannedPod

__all__ = [
    "AppWrapperKey",
    "BoundPod",
    "ClusterState",
    "Node",
    "PlannedPod",
    "Taint",
    "bound_pod_from_object",
    "is_terminal",
    "node_from_object",
]
