"""Elastic pod sets: the range of pods a wrapped object can run with, and where its size
is written in the object.

A wrapper declares a range in one of three ways:

- a RayCluster worker group with ``minReplicas < maxReplicas`` (both given: KubeRay's
  default maximum is unbounded, which names no size to grow to): ``minReplicas`` to
  ``maxReplicas`` replicas, each ``numOfHosts`` pods;
- a PyTorchJob with ``spec.elasticPolicy`` whose ``minReplicas < maxReplicas``: that many
  Worker pods (a missing bound is the Worker's ``replicas``);
- ``schedulingSpec.minAvailable`` below the gang's pod count, when exactly one pod set of
  the wrapper belongs to a kind that runs on fewer pods as they come and go (a
  Deployment, StatefulSet or ReplicaSet; a RayCluster worker group; a PyTorchJob Worker
  with an elasticPolicy): that set may shrink to what minAvailable leaves it (at least
  one pod) and grow to its declared count. Other kinds (a TFJob's fixed world, a Job's
  immutable completions) do not tolerate it: their minAvailable keeps its MCAD meaning,
  the pods that must run for the gang to count as running.

A RayCluster with ``enableInTreeAutoscaling`` is not elastic here: the Ray autoscaler owns
its replicas, and two owners would fight over them. A RayJob's cluster is not elastic
either: the RayJob owns it and its spec would not carry a new size to it. Items with
``custompodresources`` are never elastic (their pod sets do not map to the object's
fields).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dispatcher.kinds.base import Path, as_map, child_list, child_map, count, optional_count
from dispatcher.kinds.kubeflow import REPLICA_SPECS
from dispatcher.kinds.podset import PodSet

# Kinds whose pod count is `spec.replicas` and whose pods come and go freely.
REPLICATED = frozenset({("apps", "Deployment"), ("apps", "StatefulSet"),
                        ("apps", "ReplicaSet")})
RAY_CLUSTER = ("ray.io", "RayCluster")
PYTORCH_JOB = ("kubeflow.org", "PyTorchJob")
# Every kind an elastic set can belong to: the dispatcher patches the replicas of these
# (and no other kind), so deploy/ grants it `patch` on exactly these.
RESIZABLE: frozenset[tuple[str, str]] = REPLICATED | {RAY_CLUSTER, PYTORCH_JOB}


@dataclass(frozen=True)
class ElasticSet:
    """One pod set of a gang that may run with `low` to `high` pods.

    position: its index in the wrapper's gang; item: the GenericItem it comes from;
    path: the field of the wrapped object holding its replicas; unit: pods per replica
    (a Ray group's numOfHosts): sizes are whole replicas, multiples of `unit`.
    """

    position: int
    item: int
    name: str
    low: int
    high: int
    path: Path
    unit: int = 1

    def replicas(self, pods: int) -> int:
        return pods // self.unit


def _group_kind(obj: Mapping[str, Any]) -> tuple[str, str]:
    api_version = str(obj.get("apiVersion") or "")
    return api_version.rpartition("/")[0], str(obj.get("kind") or "")


def _ray_groups(obj: Mapping[str, Any], only_declared: bool) -> list[tuple[int, int, int, int,
                                                                            Path]]:
    """(group index, low, high, numOfHosts, replicas path) of each worker group that may
    change size: declared ranges only, or (for minAvailable) every unsuspended group."""
    spec = child_map(obj, "spec", ())
    out: list[tuple[int, int, int, int, Path]] = []
    if spec.get("enableInTreeAutoscaling") is True:
        return out
    for i, raw in enumerate(child_list(spec, "workerGroupSpecs", ("spec",))):
        path: Path = ("spec", "workerGroupSpecs", i)
        group = as_map(raw, path)
        if group.get("suspend") is True:
            continue
        low = count(group, "minReplicas", path, 0)
        high = optional_count(group, "maxReplicas", path)
        hosts = max(count(group, "numOfHosts", path, 1), 1)
        if only_declared and (high is None or low >= high):
            continue
        out.append((i, low, high if high is not None else 2**31 - 1, hosts,
                    (*path, "replicas")))
    return out


def _pytorch_worker(obj: Mapping[str, Any]) -> tuple[str, int, int, int] | None:
    """(Worker replica type key, low, high, declared) of a PyTorchJob with an
    elasticPolicy; None without one."""
    spec = child_map(obj, "spec", ())
    policy = spec.get("elasticPolicy")
    if not isinstance(policy, Mapping):
        return None
    specs = child_map(spec, REPLICA_SPECS["PyTorchJob"], ("spec",))
    worker = next((k for k in specs if str(k).lower() == "worker"), None)
    if worker is None:
        return None
    declared = count(as_map(specs[worker], ("spec", "pytorchReplicaSpecs", worker)),
                     "replicas", ("spec", "pytorchReplicaSpecs", worker), 1)
    low = count(policy, "minReplicas", ("spec", "elasticPolicy"), declared)
    high = count(policy, "maxReplicas", ("spec", "elasticPolicy"), declared)
    return str(worker), low, high, declared


def declared_sets(obj: Mapping[str, Any], sets: Sequence[PodSet], item: int,
                  offset: int) -> list[ElasticSet]:
    """The ranges the object itself declares; `sets` are its pod sets, which start at
    `offset` in the gang."""
    gk = _group_kind(obj)
    out: list[ElasticSet] = []
    if gk == RAY_CLUSTER:
        for i, low, high, hosts, path in _ray_groups(obj, only_declared=True):
            position = _position(sets, offset, _ray_name(obj, i))
            if position is not None:
                out.append(ElasticSet(position, item, sets[position - offset].name,
                                      low * hosts, high * hosts, path, hosts))
    elif gk == PYTORCH_JOB:
        worker = _pytorch_worker(obj)
        if worker is not None and worker[1] < worker[2]:
            key, low, high, _ = worker
            position = _position(sets, offset, key)
            if position is not None:
                out.append(ElasticSet(position, item, key, max(low, 0), high,
                                      ("spec", "pytorchReplicaSpecs", key, "replicas")))
    return out


def tolerant_sets(obj: Mapping[str, Any], sets: Sequence[PodSet], item: int,
                  offset: int) -> list[ElasticSet]:
    """Pod sets of kinds that run on fewer pods, each from 1 pod (replica) up to its
    declared count: the candidates for a minAvailable range."""
    gk = _group_kind(obj)
    out: list[ElasticSet] = []
    if gk in REPLICATED and sets and sets[0].count > 1:
        out.append(ElasticSet(offset, item, sets[0].name, 1, sets[0].count,
                              ("spec", "replicas")))
    elif gk == RAY_CLUSTER:
        for i, low, _high, hosts, path in _ray_groups(obj, only_declared=False):
            position = _position(sets, offset, _ray_name(obj, i))
            if position is None:
                continue
            declared = sets[position - offset].count
            lowest = max(low, 1) * hosts
            if declared > lowest:
                out.append(ElasticSet(position, item, sets[position - offset].name,
                                      lowest, declared, path, hosts))
    elif gk == PYTORCH_JOB:
        worker = _pytorch_worker(obj)
        if worker is not None:
            key, low, _high, declared = worker
            position = _position(sets, offset, key)
            if position is not None and declared > max(low, 1):
                out.append(ElasticSet(position, item, key, max(low, 1), declared,
                                      ("spec", "pytorchReplicaSpecs", key, "replicas")))
    return out


def from_min_available(candidates: Sequence[ElasticSet], gang_counts: Sequence[int],
                       min_available: int) -> ElasticSet | None:
    """The range minAvailable gives the wrapper's only tolerant pod set, if it has exactly
    one and minAvailable is below the gang's pod count."""
    total = sum(gang_counts)
    if len(candidates) != 1 or min_available >= total:
        return None
    s = candidates[0]
    others = total - gang_counts[s.position]
    need = min_available - others
    # Whole replicas, enough for minAvailable, never below the set's own floor.
    low = max(s.low, -(-need // s.unit) * s.unit)
    if low >= s.high:
        return None
    return ElasticSet(s.position, s.item, s.name, low, s.high, s.path, s.unit)


def _ray_name(obj: Mapping[str, Any], index: int) -> str:
    groups = child_list(child_map(obj, "spec", ()), "workerGroupSpecs", ("spec",))
    group = groups[index] if isinstance(groups[index], Mapping) else {}
    return f"worker/{group.get('groupName') or index}"


def _position(sets: Sequence[PodSet], offset: int, name: str) -> int | None:
    for i, s in enumerate(sets):
        if s.name == name:
            return offset + i
    return None
