"""Small builders for core tests: nodes and pod sets in canonical units."""

from __future__ import annotations

from typing import Any

from dispatcher.cluster import ClusterState, Node, Taint
from dispatcher.fit import Capacity, GangPodSet
from dispatcher.kinds.podset import NO_CONSTRAINTS, PodConstraints, PodSet
from dispatcher.queue import QueuedWrapper

GPU = "nvidia.com/gpu"
GI = 1024**3


def node(name: str, gpu: int = 8, cpu: int = 96, mem_gi: int = 1024, pods: int = 110,
         labels: dict[str, str] | None = None, taints: tuple[Taint, ...] = (),
         unschedulable: bool = False) -> Node:
    alloc = {"cpu": cpu * 1000, "memory": mem_gi * GI, "pods": pods}
    if gpu:
        alloc[GPU] = gpu
    return Node(name, alloc, labels or {}, taints, unschedulable)


def pod_set(count: int, gpu: int = 0, cpu: float = 1, mem_gi: float = 1, name: str = "worker",
            constraints: PodConstraints = NO_CONSTRAINTS) -> PodSet:
    req = {"cpu": int(cpu * 1000), "memory": int(mem_gi * GI), "pods": 1}
    if gpu:
        req[GPU] = gpu
    return PodSet(name, count, req, constraints)


def gang(*sets: PodSet) -> tuple[GangPodSet, ...]:
    return tuple(GangPodSet(0, s) for s in sets)


def cluster(*nodes: Node) -> ClusterState:
    state = ClusterState()
    for n in nodes:
        state.upsert_node(n)
    return state


def capacity(*nodes: Node) -> Capacity:
    return Capacity.of(cluster(*nodes))


def wrapper(name: str, *sets: PodSet, priority: int = 0, seen: float = 0.0,
            slope: float = 0.0, invalid: str | None = None) -> QueuedWrapper:
    return QueuedWrapper("default", name, f"uid-{name}", seen, gang(*sets), priority, slope,
                         invalid)


def nested(depth: int) -> dict[str, Any]:
    """A mapping nested `depth` levels deep: {"x": {"x": ... {}}}."""
    value: dict[str, Any] = {}
    for _ in range(depth):
        value = {"x": value}
    return value
