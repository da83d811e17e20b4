"""A cluster driven by the core the way the controller drives it, for quota and preemption
tests: every cycle builds the admitted records and the quota usage, calls `admit`, and
carries out the decisions (dispatch: the pods bind at once; preempt: the victims' pods go,
at once or when `terminate` is called, the victims requeue and the preemptor's room is
held until it dispatches)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatcher.admission import (
    AWAITING_PREEMPTION,
    NO_TOPOLOGY,
    Decision,
    admit,
    charged,
    queued_from_appwrapper,
)
from dispatcher.api.models import parse_appwrapper
from dispatcher.cluster import BoundPod, ClusterState, Node, PlannedPod
from dispatcher.fit import Capacity
from dispatcher.fit.topology import Topology
from dispatcher.preemption import AdmittedWrapper, Hold, quota_ledger
from dispatcher.queue import AdmissionQueue, Policy, QueuedWrapper, WrapperKey
from dispatcher.quota import QuotaForest, QuotaLedger

MI = 2**20


def appwrapper(name: str, labels: Mapping[str, str] | None = None, *, cpu: str = "100m",
               memory: str = "32Mi", gpu: int = 0, pods: int = 1, priority: int = 0,
               namespace: str = "test") -> dict[str, Any]:
    """An AppWrapper of `pods` identical pods (custompodresources, as MCAD's suites use)."""
    requests: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if gpu:
        requests["nvidia.com/gpu"] = gpu
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "labels": dict(labels or {})},
            "spec": {"priority": priority, "resources": {"GenericItems": [{
                "generictemplate": job,
                "custompodresources": [{"replicas": pods, "requests": requests}]}]}}}


def declared_short(name: str, labels: Mapping[str, str], template: Mapping[str, Any],
                   declared: Sequence[tuple[int, Mapping[str, Any]]], priority: int = 0,
                   namespace: str = "test") -> dict[str, Any]:
    """An AppWrapper of `template` whose custompodresources declare `declared` (replicas,
    requests), whatever the object's pods really ask."""
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "labels": dict(labels)},
            "spec": {"priority": priority, "resources": {"GenericItems": [{
                "generictemplate": dict(template),
                "custompodresources": [{"replicas": n, "requests": dict(r)}
                                       for n, r in declared]}]}}}


def job_of(name: str, pods: int, requests: Mapping[str, Any]) -> dict[str, Any]:
    """A Job of `pods` pods at once, each asking `requests`."""
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": pods, "completions": pods, "template": {"spec": {
                "containers": [{"name": "c", "image": "x",
                                "resources": {"requests": dict(requests)}}]}}}}


def leader_workers(name: str, size: int, requests: Mapping[str, Any]) -> dict[str, Any]:
    """A LeaderWorkerSet of one group of `size` pods (a kind the dispatcher cannot count)."""
    spec = {"containers": [{"name": "c", "image": "x",
                            "resources": {"requests": dict(requests)}}]}
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": name}, "spec": {"replicas": 1, "leaderWorkerTemplate": {
                "size": size, "leaderTemplate": {"spec": spec},
                "workerTemplate": {"spec": spec}}}}


def subtree(name: str, tree: str, children: Sequence[tuple[str, Mapping[str, Any], bool]],
            parent: str | None = None) -> dict[str, Any]:
    """A QuotaSubtree: children as (node name, requests, hardLimit)."""
    spec: dict[str, Any] = {"children": [
        {"name": n, "quotas": {"hardLimit": hard, "requests": dict(req)}}
        for n, req, hard in children]}
    if parent is not None:
        spec["parent"] = parent
    return {"apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
            "metadata": {"name": name, "namespace": "kube-system", "labels": {"tree": tree}},
            "spec": spec}


@dataclass
class Running:
    wrapper: QueuedWrapper
    dispatched_at: float
    priority: float
    preempted: tuple[WrapperKey, ...] = ()


@dataclass
class World:
    nodes: Sequence[Node]
    policy: Policy
    subtrees: Sequence[Mapping[str, Any]] = ()
    instant_teardown: bool = True  # victims' pods vanish as soon as they are preempted
    now: float = 1000.0
    state: ClusterState = field(default_factory=ClusterState)
    running: dict[WrapperKey, Running] = field(default_factory=dict)
    holds: dict[WrapperKey, Hold] = field(default_factory=dict)
    terminating: list[WrapperKey] = field(default_factory=list)
    history: list[list[Decision]] = field(default_factory=list)
    ledger: QuotaLedger | None = None
    topology: Topology = NO_TOPOLOGY

    def __post_init__(self) -> None:
        for n in self.nodes:
            self.state.upsert_node(n)
        self.queue = AdmissionQueue(self.policy)
        self.forest = QuotaForest.from_objects(self.subtrees)
        self._pods: dict[WrapperKey, list[tuple[str, str]]] = {}

    def set_quota(self, subtrees: Sequence[Mapping[str, Any]]) -> None:
        self.forest = QuotaForest.from_objects(subtrees)

    def submit(self, manifest: Mapping[str, Any]) -> QueuedWrapper:
        w = queued_from_appwrapper(parse_appwrapper(manifest), self.now)
        self.queue.put(w)
        self.now += 1
        return w

    def admitted(self) -> list[AdmittedWrapper]:
        return [AdmittedWrapper(k[0], k[1], r.wrapper.uid, r.priority,
                                charged(r.wrapper.demand, self.state.holdings(k)),
                                tuple(self.state.holdings(k)), r.dispatched_at,
                                r.wrapper.labels, r.preempted)
                for k, r in self.running.items()]

    def cycle(self) -> list[Decision]:
        admitted = self.admitted()
        self.ledger = quota_ledger(self.forest, admitted, self.holds)
        decisions = admit(self.queue.ordered(self.now), Capacity.of(self.state), self.policy,
                          self.now, quota=self.ledger, admitted=admitted, holds=self.holds,
                          topology=self.topology)
        for d in decisions:
            key = (d.namespace, d.name)
            if d.decision == "dispatch":
                self._dispatch(key, d)
            elif d.decision == "preempt":
                self._preempt(key, d)
            elif key in self.holds and d.reason != AWAITING_PREEMPTION:
                del self.holds[key]
        self.history.append(decisions)
        self.now += 1
        return decisions

    def settle(self, cycles: int = 4) -> dict[WrapperKey, Decision]:
        """Cycles until nothing changes; the last decision of each queued wrapper."""
        last: dict[WrapperKey, Decision] = {}
        for _ in range(cycles):
            decisions = self.cycle()
            for d in decisions:
                last[(d.namespace, d.name)] = d
            if not any(d.decision in ("dispatch", "preempt") for d in decisions):
                break
        return last

    def _dispatch(self, key: WrapperKey, d: Decision) -> None:
        w = self.queue.remove(key)
        assert w is not None
        hold = self.holds.pop(key, None)
        names = []
        for i, p in enumerate(d.placements):
            assert p.node is not None
            pod = (key[0], f"{key[1]}-{i}")
            self.state.upsert_pod(pod, BoundPod(key[0], pod[1], p.node, p.request, key[1]))
            names.append(pod)
        self._pods[key] = names
        self.running[key] = Running(w, self.now, d.effective_priority,
                                    hold.preempted if hold is not None else ())

    def _preempt(self, key: WrapperKey, d: Decision) -> None:
        w = self.queue.get(key)
        assert w is not None
        for victim in d.preempts:
            r = self.running.pop(victim)
            self.queue.put(r.wrapper)
            if self.instant_teardown:
                self._remove_pods(victim)
            else:
                self.terminating.append(victim)
        self.holds[key] = Hold(
            tuple(PlannedPod(p.node, p.request) for p in d.placements if p.node is not None),
            w.labels, d.effective_priority, d.preempts, self.now)

    def terminate(self) -> None:
        """The pods of the preempted wrappers are gone at last."""
        for key in self.terminating:
            self._remove_pods(key)
        self.terminating.clear()

    def _remove_pods(self, key: WrapperKey) -> None:
        for pod in self._pods.pop(key, []):
            self.state.remove_pod(pod)

    def complete(self, name: str, namespace: str = "test") -> None:
        key = (namespace, name)
        del self.running[key]
        self._remove_pods(key)

    def delete(self, name: str, namespace: str = "test") -> None:
        key = (namespace, name)
        if key in self.running:
            self.complete(name, namespace)
        self.queue.remove(key)
        self.holds.pop(key, None)

    def swap_pods(self, name: str, request: Mapping[str, int], namespace: str = "test") -> None:
        """The wrapper's pods turn out to ask `request` each (a kind the dispatcher cannot
        count, declared for less): bound as they really are."""
        for bound in self.state.bound_pods_of((namespace, name)):
            self.state.upsert_pod(bound.key, BoundPod(namespace, bound.name, bound.node,
                                                      dict(request), name))

    def more_pods(self, name: str, count: int, request: Mapping[str, int],
                  namespace: str = "test") -> int:
        """`count` more pods of the wrapper, beyond what it declared, each asking `request`,
        bind in free room, on the first node with enough (the controller gives free room
        to the pods a Job declared short makes, and to a LeaderWorkerSet's undeclared
        workers); one that fits nowhere stays unbound. How many bound."""
        key = (namespace, name)
        names = self._pods.setdefault(key, [])
        bound = 0
        for _ in range(count):
            where = next((n.name for n in self.nodes
                          if all(self.state.free(n.name).get(r, 0) >= v
                                 for r, v in request.items() if v)), None)
            if where is None:
                continue
            pod = (namespace, f"{name}-more-{len(names)}")
            self.state.upsert_pod(pod, BoundPod(namespace, pod[1], where, dict(request), name))
            names.append(pod)
            bound += 1
        return bound

    def is_running(self, name: str, namespace: str = "test") -> bool:
        return (namespace, name) in self.running
