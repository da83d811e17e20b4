"""Pods of a kind the dispatcher cannot count (a LeaderWorkerSet): its declaration is a
guess, as Kueue takes it. A pod beyond it gets free room for what is not scarce, never a
GPU the gang did not declare."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from dispatcher.api.conversion import to_v1beta1
from dispatcher.controller.items.shaping import PLACEMENT_GATE
from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.kinds.scope import DEFAULT_ALLOWED_KINDS

from . import fake_kube
from .fake_kube import FakeKube
from .test_placement import arrive, pinned_to, seen
from .test_runtime import LABEL, Clock, node, run, started, types
from .test_runtime_sharing import (
    CPU_TREE,
    bind_where_let,
    cpu_node,
    team_b_asks_30_of_its_32_cpu,
)
from .test_runtime_sharing import started as sharing_started

LWS = ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
STS = ("apps/v1", "StatefulSet")
LEADER = "template.spec.leaderWorkerTemplate.leaderTemplate"
WORKER = "template.spec.leaderWorkerTemplate.workerTemplate"


@pytest.fixture(autouse=True)
def _served() -> Iterator[None]:
    added = {LWS: ("leaderworkersets", True), STS: ("statefulsets", True)}
    fake_kube.SERVED.update(added)
    yield
    for key in added:
        del fake_kube.SERVED[key]


def pod_spec(gpus: int, cpu: str = "200m") -> dict[str, Any]:
    resources = {"requests": {"cpu": cpu}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {"containers": [{"name": "c", "image": "nginx", "resources": resources}]}


def sample(gpus: int = 0, size: int = 3, cpu: str = "200m",
           labels: dict[str, str] | None = None) -> dict[str, Any]:
    """codeflare's sample's mistake, smaller: a group of a leader and `size` - 1 workers,
    one worker declared."""
    lws = {"apiVersion": "/".join(LWS[:1]), "kind": LWS[1], "metadata": {"name": "lws"},
           "spec": {"replicas": 1, "leaderWorkerTemplate": {
               "size": size, "leaderTemplate": {"spec": pod_spec(gpus, cpu)},
               "workerTemplate": {"spec": pod_spec(gpus, cpu)}}}}
    v2 = {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
          "metadata": {"name": "lws", "namespace": "team", "labels": dict(labels or {}),
                       "creationTimestamp": "2027-01-15T08:00:00Z"},
          "spec": {"components": [{"template": lws, "podSets": [
              {"path": LEADER, "replicas": 1}, {"path": WORKER, "replicas": 1}]}]}}
    return to_v1beta1(v2)


async def pinning(kube: FakeKube, clock: Clock) -> Dispatcher:
    """A dispatcher that creates LeaderWorkerSets (allowedKinds.add) and pins pods."""
    d = await started(kube, clock, allowed_kinds=DEFAULT_ALLOWED_KINDS | {
        ("leaderworkerset.x-k8s.io", "LeaderWorkerSet")})
    d.items.pin = True
    return d


def lws_pods(kube: FakeKube) -> list[dict[str, Any]]:
    """The leader and the workers, as the StatefulSets the LeaderWorkerSet makes make
    them from its (gated) templates."""
    lws = kube.get(*LWS, "team", "lws")
    assert lws is not None, "the LeaderWorkerSet was not created"
    sts = kube.put({"apiVersion": STS[0], "kind": STS[1],
                    "metadata": {"name": "lws", "namespace": "team", "ownerReferences": [{
                        "apiVersion": LWS[0], "kind": LWS[1], "name": "lws",
                        "uid": lws["metadata"]["uid"], "controller": True}]}})
    templates = lws["spec"]["leaderWorkerTemplate"]
    pods = []
    members = [("lws-0", templates["leaderTemplate"]), *(
        (f"lws-0-{i}", templates["workerTemplate"]) for i in range(1, templates["size"]))]
    for name, template in members:
        meta = copy.deepcopy(template.get("metadata") or {})
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": name, "namespace": "team",
                                  "labels": meta.get("labels", {}),
                                  "ownerReferences": [{
                                      "apiVersion": STS[0], "kind": STS[1], "name": "lws",
                                      "uid": sts["metadata"]["uid"], "controller": True}]},
                     "spec": copy.deepcopy(template["spec"]), "status": {"phase": "Pending"}})
    return pods


def test_a_pod_beyond_an_uncountable_kinds_declaration_gets_free_room() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=0))
        kube.put(sample())
        d = await pinning(kube, clock)
        await d.cycle()
        pods = lws_pods(kube)
        assert all(p["spec"].get("schedulingGates") == [{"name": PLACEMENT_GATE}]
                   for p in pods)
        for p in pods:
            arrive(kube, d, p)
        await d.cycle()
        await d.cycle()
        assert [pinned_to(seen(kube, d, p["metadata"]["name"])) for p in pods] == \
            [["n1"]] * 3

    run(scenario)


def test_a_gpu_beyond_an_uncountable_kinds_declaration_stays_gated() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        kube.put(sample(gpus=1))
        d = await pinning(kube, clock)
        await d.cycle()
        pods = lws_pods(kube)
        for p in pods:
            arrive(kube, d, p)
        await d.cycle()
        await d.cycle()
        gated = [p["metadata"]["name"] for p in pods
                 if seen(kube, d, p["metadata"]["name"])["spec"].get("schedulingGates")]
        assert len(gated) == 1, gated

    run(scenario)


def test_the_undeclared_workers_of_a_leader_worker_set_are_charged_and_reclaimed() -> None:
    """team-a wraps a LeaderWorkerSet of a leader and 19 workers of 3 cpu, declaring the
    leader and one worker: the 18 others take free room, 60 of the 64 cpu. team-b asks
    30 of its guaranteed 32: team-a is charged the 60 it really uses, borrows, and is
    reclaimed."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(cpu_node("n1"))
        kube.put(cpu_node("n2"))
        kube.put(sample(size=20, cpu="3", labels={"quota_cpu": "team-a"}))
        d = await sharing_started(kube, clock, trees=CPU_TREE, allowed_kinds=(
            DEFAULT_ALLOWED_KINDS | {("leaderworkerset.x-k8s.io", "LeaderWorkerSet")}))
        d.items.pin = True
        await d.cycle()
        pods = lws_pods(kube)
        for p in pods:
            arrive(kube, d, p)
        await d.cycle()
        assert sorted(bind_where_let(kube, d, [p["metadata"]["name"] for p in pods])) == \
            ["n1"] * 10 + ["n2"] * 10
        await d.cycle()
        assert types(kube, "lws")[-1] == "Running"
        await team_b_asks_30_of_its_32_cpu(kube, d, clock, "lws")

    run(scenario)


def v1beta1_sample(size: int, cpu: str, declared_cpu: str,
                   labels: dict[str, str]) -> dict[str, Any]:
    """A v1beta1 AppWrapper of a LeaderWorkerSet of `size` pods, whose custompodresources
    declare one pod of `declared_cpu` (they name no pod template: MCAD's form)."""
    lws = sample(size=size, cpu=cpu)["spec"]["resources"]["GenericItems"][0]["generictemplate"]
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": "lws", "namespace": "team", "labels": labels,
                         "creationTimestamp": "2027-01-15T08:00:00Z"},
            "spec": {"schedulingSpec": {"minAvailable": 0}, "resources": {"GenericItems": [{
                "generictemplate": lws,
                "custompodresources": [{"replicas": 1, "requests": {"cpu": declared_cpu}}]}]}}}


def test_a_v1beta1_leader_worker_sets_pods_are_the_gangs_and_charged() -> None:
    """team-a wraps a LeaderWorkerSet of 20 pods of 3 cpu in a v1beta1 AppWrapper declaring
    one pod of 100m: every pod of it is made behind the gate, labelled for its gang (the
    declaration names no template), takes free room as the gang's and is charged: 60 cpu.
    team-b asks 30 of its guaranteed 32, and team-a is reclaimed."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(cpu_node("n1"))
        kube.put(cpu_node("n2"))
        kube.put(v1beta1_sample(20, "3", "100m", {"quota_cpu": "team-a"}))
        d = await sharing_started(kube, clock, trees=CPU_TREE, allowed_kinds=(
            DEFAULT_ALLOWED_KINDS | {("leaderworkerset.x-k8s.io", "LeaderWorkerSet")}))
        d.items.pin = True
        await d.cycle()
        pods = lws_pods(kube)
        assert all(p["spec"].get("schedulingGates") == [{"name": PLACEMENT_GATE}]
                   and p["metadata"]["labels"].get(LABEL) == "lws" for p in pods)
        for p in pods:
            arrive(kube, d, p)
        await d.cycle()
        assert sorted(bind_where_let(kube, d, [p["metadata"]["name"] for p in pods])) == \
            ["n1"] * 10 + ["n2"] * 10
        await d.cycle()
        await team_b_asks_30_of_its_32_cpu(kube, d, clock, "lws")

    run(scenario)


def test_a_v1beta1_leader_worker_set_gets_no_gpu_it_did_not_declare() -> None:
    """The same, declaring no GPU for pods that ask one each: its pods stay at the gate."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        aw = v1beta1_sample(3, "200m", "200m", {})
        lws = aw["spec"]["resources"]["GenericItems"][0]["generictemplate"]
        for t in ("leaderTemplate", "workerTemplate"):
            lws["spec"]["leaderWorkerTemplate"][t]["spec"] = pod_spec(1)
        kube.put(aw)
        d = await pinning(kube, clock)
        await d.cycle()
        pods = lws_pods(kube)
        for p in pods:
            arrive(kube, d, p)
        await d.cycle()
        await d.cycle()
        assert all(seen(kube, d, p["metadata"]["name"])["spec"].get("schedulingGates")
                   for p in pods)

    run(scenario)
