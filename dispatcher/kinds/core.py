"""Pods, the workload controllers that keep N of them, and kinds that create no pods."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.kinds.base import Handler, Template, child_map, count


def pod(obj: Mapping[str, Any]) -> list[Template]:
    return [Template("pod", 1, (), obj)]  # a Pod is its own template: {metadata, spec}


def replicated(obj: Mapping[str, Any]) -> list[Template]:
    spec = child_map(obj, "spec", ())
    pods = count(spec, "replicas", ("spec",), 1)
    return [Template("pod", pods, ("spec", "template"), spec.get("template"))]


def no_pods(obj: Mapping[str, Any]) -> list[Template]:
    return []


# They wrap fine beside a job: configuration, networking, access and policy objects.
NO_POD_KINDS: frozenset[tuple[str, str]] = frozenset({
    ("", "ConfigMap"),
    ("", "Endpoints"),
    ("", "LimitRange"),
    ("", "PersistentVolumeClaim"),
    ("", "PodTemplate"),
    ("", "ResourceQuota"),
    ("", "Secret"),
    ("", "Service"),
    ("", "ServiceAccount"),
    ("discovery.k8s.io", "EndpointSlice"),
    ("networking.k8s.io", "Ingress"),
    ("networking.k8s.io", "NetworkPolicy"),
    ("policy", "PodDisruptionBudget"),
    ("rbac.authorization.k8s.io", "Role"),
    ("rbac.authorization.k8s.io", "RoleBinding"),
    ("route.openshift.io", "Route"),
    ("scheduling.x-k8s.io", "PodGroup"),
    ("scheduling.sigs.k8s.io", "PodGroup"),
})

HANDLERS: dict[tuple[str, str], Handler] = {
    ("", "Pod"): pod,
    ("", "ReplicationController"): replicated,
    ("apps", "Deployment"): replicated,
    ("apps", "ReplicaSet"): replicated,
    ("apps", "StatefulSet"): replicated,
    **{gk: no_pods for gk in NO_POD_KINDS},
}
