"""KubeRay: RayCluster and RayJob (group ray.io, any version).

Counts follow KubeRay's own desired-replicas rule, with the CRD defaults applied by
hand (wrapped objects get no API defaulting): replicas missing -> minReplicas,
minReplicas 0, maxReplicas unbounded, numOfHosts 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.kinds.base import (
    Handler,
    InvalidItem,
    Path,
    Template,
    as_map,
    child_list,
    child_map,
    count,
    optional_count,
)

GROUP = "ray.io"
UNBOUNDED = 2**31 - 1  # KubeRay's default maxReplicas
DEFAULT_SUBMISSION_MODE = "K8sJobMode"
# KubeRay's default submitter pod when the RayJob gives no submitterPodTemplate.
DEFAULT_SUBMITTER_TEMPLATE: Mapping[str, Any] = {
    "spec": {
        "containers": [
            {"name": "ray-job-submitter",
             "resources": {"requests": {"cpu": "500m", "memory": "200Mi"}}},
        ],
    },
}


def worker_count(group: Mapping[str, Any], path: Path) -> int:
    """clamp(replicas, minReplicas, maxReplicas) x numOfHosts; 0 for a suspended group."""
    low = count(group, "minReplicas", path, 0)
    high = count(group, "maxReplicas", path, UNBOUNDED)
    replicas = optional_count(group, "replicas", path)
    hosts = count(group, "numOfHosts", path, 1)
    if group.get("suspend") is True:
        return 0
    # KubeRay lets maxReplicas win when the bounds cross.
    wanted = low if replicas is None else replicas
    return min(max(wanted, low), high) * hosts


def cluster_templates(spec: Mapping[str, Any], path: Path) -> list[Template]:
    """The head and every worker group of a RayClusterSpec at `path`."""
    head = child_map(spec, "headGroupSpec", path)
    out = [Template("head", 1, (*path, "headGroupSpec", "template"), head.get("template"))]
    for i, raw in enumerate(child_list(spec, "workerGroupSpecs", path)):
        gpath: Path = (*path, "workerGroupSpecs", i)
        group = as_map(raw, gpath)
        name = group.get("groupName") or str(i)
        out.append(Template(
            f"worker/{name}", worker_count(group, gpath), (*gpath, "template"),
            group.get("template"),
        ))
    return out


def ray_cluster(obj: Mapping[str, Any]) -> list[Template]:
    return cluster_templates(child_map(obj, "spec", ()), ("spec",))


def ray_job(obj: Mapping[str, Any]) -> list[Template]:
    """The cluster it creates (none with only a clusterSelector) and, in K8sJobMode,
    the submitter pod. Other modes submit over HTTP or from the head: no extra pod."""
    spec = child_map(obj, "spec", ())
    out: list[Template] = []
    if spec.get("rayClusterSpec") is not None:
        cluster = child_map(spec, "rayClusterSpec", ("spec",))
        out.extend(cluster_templates(cluster, ("spec", "rayClusterSpec")))
    elif not spec.get("clusterSelector"):
        raise InvalidItem(
            "spec has neither rayClusterSpec nor clusterSelector: a RayJob needs a cluster "
            "to create (rayClusterSpec) or one to use (clusterSelector)"
        )
    if (spec.get("submissionMode") or DEFAULT_SUBMISSION_MODE) == DEFAULT_SUBMISSION_MODE:
        if spec.get("submitterPodTemplate") is not None:
            out.append(Template(
                "submitter", 1, ("spec", "submitterPodTemplate"), spec["submitterPodTemplate"]
            ))
        else:
            out.append(Template("submitter", 1, None, DEFAULT_SUBMITTER_TEMPLATE))
    return out


HANDLERS: dict[tuple[str, str], Handler] = {
    (GROUP, "RayCluster"): ray_cluster,
    (GROUP, "RayJob"): ray_job,
}
