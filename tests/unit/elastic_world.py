"""A cluster driven by the core as the controller drives elastic gangs: every cycle builds
the admitted records with their size and the pods a scale-in removes first (the highest
index, as the training operator does), calls `admit` with `scaling`, and carries out the
decisions -- dispatches and scale-outs bind their pods at once, scale-ins and preemptions
remove theirs at once."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatcher.admission import AWAITING_PREEMPTION, Decision, admit
from dispatcher.cluster import BoundPod, PlannedPod
from dispatcher.elastic import Scale
from dispatcher.fit import Capacity
from dispatcher.fit.elastic import ElasticNow, sized
from dispatcher.fit.gang import Placement, demand
from dispatcher.preemption import AdmittedWrapper, Hold, quota_ledger
from dispatcher.queue import WrapperKey

from .quota_world import Running, World

GPU = "nvidia.com/gpu"


def pytorchjob(name: str, *, low: int, high: int, gpu: int = 8, priority: int = 0,
               replicas: int | None = None, master: bool = True,
               namespace: str = "test", labels: dict[str, str] | None = None) -> dict[str, Any]:
    """An AppWrapper of an elastic PyTorchJob: a Master (unless not) and low..high Workers
    of `gpu` GPUs each."""
    def spec(n: int) -> dict[str, Any]:
        return {"replicas": n, "template": {"spec": {"containers": [{
            "name": "pytorch", "image": "x",
            "resources": {"limits": {GPU: gpu, "cpu": "1", "memory": "1Gi"}}}]}}}
    specs = {"Worker": spec(high if replicas is None else replicas)}
    if master:
        specs["Master"] = spec(1)
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
           "spec": {"elasticPolicy": {"minReplicas": low, "maxReplicas": high},
                    "pytorchReplicaSpecs": specs}}
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         "labels": dict(labels or {})},
            "spec": {"priority": priority, "resources": {"GenericItems": [
                {"generictemplate": job}]}}}


@dataclass
class ElasticWorld(World):
    counts: dict[WrapperKey, tuple[int, ...]] = field(default_factory=dict)
    scales: list[Scale] = field(default_factory=list)
    # Pods per pod-set name, in index order: (pod key, node, request).
    sets: dict[WrapperKey, dict[str, list[tuple[tuple[str, str], str, Mapping[str, int]]]]] = \
        field(default_factory=dict)
    serial: int = 0

    def elastic_now(self, key: WrapperKey, r: Running) -> ElasticNow | None:
        w = r.wrapper
        if not w.elastic:
            return None
        pods = self.sets.get(key, {})
        removable = tuple(
            tuple(PlannedPod(node, req) for _, node, req in reversed(pods.get(s.name, [])))
            for s in w.elastic)
        return ElasticNow(w.elastic, self.counts[key], w.gang, w.first_seen, removable)

    def admitted(self) -> list[AdmittedWrapper]:
        out = []
        for k, r in self.running.items():
            e = self.elastic_now(k, r)
            need = demand(sized(r.wrapper.gang, e.sets, e.counts)) if e else r.wrapper.demand
            out.append(AdmittedWrapper(k[0], k[1], r.wrapper.uid, r.priority, need,
                                       tuple(self.state.holdings(k)), r.dispatched_at,
                                       r.wrapper.labels, r.preempted, e))
        return out

    def cycle(self) -> list[Decision]:
        admitted = self.admitted()
        self.ledger = quota_ledger(self.forest, admitted, self.holds)
        scaling: list[Scale] = []
        decisions = admit(self.queue.ordered(self.now), Capacity.of(self.state), self.policy,
                          self.now, quota=self.ledger, admitted=admitted, holds=self.holds,
                          scaling=scaling, topology=self.topology)
        for d in decisions:
            key = (d.namespace, d.name)
            if d.decision == "dispatch":
                self._dispatch(key, d)
            elif d.decision == "preempt":
                for s in d.shrinks:
                    self._scale(s)
                self._preempt(key, d)
            elif key in self.holds and d.reason != AWAITING_PREEMPTION:
                del self.holds[key]
        for s in scaling:
            self._scale(s)
        self.history.append(decisions)
        self.now += 1
        return decisions

    def _bind(self, key: WrapperKey, placements: tuple[Placement, ...] | list[Placement]) -> None:
        for p in placements:
            assert p.node is not None
            self.serial += 1
            pod = (key[0], f"{key[1]}-{self.serial}")
            self.state.upsert_pod(pod, BoundPod(key[0], pod[1], p.node, p.request, key[1]))
            self._pods.setdefault(key, []).append(pod)
            self.sets.setdefault(key, {}).setdefault(p.pod_set, []).append(
                (pod, p.node, p.request))

    def _dispatch(self, key: WrapperKey, d: Decision) -> None:
        w = self.queue.remove(key)
        assert w is not None
        hold = self.holds.pop(key, None)
        self._pods[key] = []
        self.sets[key] = {}
        self._bind(key, d.placements)
        if d.elastic:
            self.counts[key] = d.elastic
        self.running[key] = Running(w, self.now, d.effective_priority,
                                    hold.preempted if hold is not None else ())

    def _scale(self, s: Scale) -> None:
        self.scales.append(s)
        if s.out:
            self._bind(s.key, s.placements)
        else:
            sets = self.sets[s.key]
            for es, b, a in zip(s.sets, s.before, s.after, strict=True):
                for _ in range(b - a):
                    pod, _node, _req = sets[es.name].pop()  # the highest index goes
                    self.state.remove_pod(pod)
                    self._pods[s.key].remove(pod)
        self.counts[s.key] = s.after

    def _preempt(self, key: WrapperKey, d: Decision) -> None:
        for victim in d.preempts:
            self.counts.pop(victim, None)
            self.sets.pop(victim, None)
        if d.preempts:
            super()._preempt(key, d)
            return
        w = self.queue.get(key)
        assert w is not None
        self.holds[key] = Hold(
            tuple(PlannedPod(p.node, p.request) for p in d.placements if p.node is not None),
            w.labels, d.effective_priority, d.preempts, self.now)

    def complete(self, name: str, namespace: str = "test") -> None:
        super().complete(name, namespace)
        self.counts.pop((namespace, name), None)
        self.sets.pop((namespace, name), None)

    def workers(self, name: str, namespace: str = "test") -> int:
        return len(self.sets.get((namespace, name), {}).get("Worker", []))
