"""Elastic gangs in the controller against an in-memory API: the object is created at the
size admitted, patched when the core grows it, and the status says what changed."""

from __future__ import annotations

from typing import Any

from dispatcher.admission import queued_from_appwrapper
from dispatcher.api.models import parse_appwrapper
from dispatcher.cluster import BoundPod, ClusterState
from dispatcher.controller.scaling import _patch, follow_size, scaled_in
from dispatcher.controller.tracked import Tracked, items_digest
from dispatcher.kinds.elastic import ElasticSet
from dispatcher.lifecycle import PodCounts, judge

from .elastic_world import pytorchjob
from .fake_kube import FakeKube
from .test_runtime import Clock, appwrapper, aw_status, job, node, run, started


def elastic(name: str, low: int, high: int) -> dict[str, Any]:
    aw = pytorchjob(name, low=low, high=high, master=False, namespace="team")
    return appwrapper(name, aw["spec"]["resources"]["GenericItems"][0]["generictemplate"],
                      created=2)


def worker_replicas(kube: FakeKube, name: str) -> int:
    obj = kube.get("kubeflow.org/v1", "PyTorchJob", "team", name)
    assert obj is not None, f"PyTorchJob {name} was not created"
    replicas: int = obj["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
    return replicas


def test_created_at_the_size_admitted_then_patched_as_it_grows() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        for i in range(4):
            kube.put(node(f"n{i}"))
        kube.put(appwrapper("blocker", job("blocker", 2, 8), created=1))
        kube.put(elastic("train", 1, 4))
        d = await started(kube, clock)
        await d.cycle()
        # 2 nodes left: admitted at 1 worker and grown to 2 in the same cycle.
        assert worker_replicas(kube, "train") == 2
        status = aw_status(kube, "train")
        assert status["elasticPods"] == [2]
        assert "scaled out to 2 workers (from 1 worker)" in status["conditions"][-1]["message"]
        # Two more nodes join: the admitted gang grows into them.
        for i in (4, 5):
            d.on_node("ADDED", node(f"n{i}"))
        clock.now += 10
        await d.cycle()
        assert worker_replicas(kube, "train") == 4
        status = aw_status(kube, "train")
        assert status["elasticPods"] == [4]
        last = status["conditions"][-1]
        assert (last["type"], last["reason"]) == ("Dispatched", "ScaledOut")
        assert last["message"].startswith("scaled out to 4 workers (from 2 workers)")
        assert any(e.get("reason") == "ScaledOut" and e["message"].startswith(
            "scaled out to 4 workers") for e in kube.of_kind("Event"))
        assert d.tracked[("team", "train")].expected_pods == 4

    run(scenario)


def test_an_elastic_gang_runs_while_its_minimum_runs() -> None:
    """4 workers expected after a scale-out, 2 up (the minimum): it stays Running rather
    than counting as short of pods."""
    aw = parse_appwrapper(elastic("train", 2, 4))
    verdict = judge(aw, PodCounts(pending=2, running=2), 4, None, 0.0, True, 1000.0,
                    below_min_since=None, floor=2)
    assert verdict.action == "running"
    short = judge(aw, PodCounts(pending=2, running=2), 4, None, 0.0, True, 1000.0,
                  below_min_since=0.0)
    assert short.action == "requeue"  # a rigid gang of 4 with 2 up is short


def test_patches_merge_through_maps_and_json_patch_across_lists() -> None:
    worker = ElasticSet(0, 0, "Worker", 1, 4, ("spec", "pytorchReplicaSpecs", "Worker",
                                                "replicas"))
    assert _patch(worker, 3) == ({"spec": {"pytorchReplicaSpecs": {"Worker": {
        "replicas": 3}}}}, "application/merge-patch+json")
    group = ElasticSet(1, 0, "worker/gpu", 2, 8, ("spec", "workerGroupSpecs", 0, "replicas"),
                       2)
    assert _patch(group, 2) == ([{"op": "add", "path": "/spec/workerGroupSpecs/0/replicas",
                                  "value": 2}], "application/json-patch+json")
    # A scale-in names the pods to remove: KubeRay would otherwise remove any.
    ops, _ = _patch(group, 1, ["ray-gpu-worker-x", "ray-gpu-worker-y"])
    assert ops[1] == {"op": "add", "path": "/spec/workerGroupSpecs/0/scaleStrategy",
                      "value": {"workersToDelete": ["ray-gpu-worker-x", "ray-gpu-worker-y"]}}


def test_after_a_restart_the_object_gets_the_size_the_status_records() -> None:
    """A restart between the status write and the patch: the object still asks for 4
    workers, the status says 2. The restarted dispatcher patches it to 2."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        for i in range(4):
            kube.put(node(f"n{i}"))
        aw = kube.put(elastic("train", 1, 4))
        obj = dict(aw["spec"]["resources"]["GenericItems"][0]["generictemplate"])
        obj["metadata"] = {"name": "train", "namespace": "team", "ownerReferences": [{
            "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "name": "train", "uid": aw["metadata"]["uid"], "controller": True}]}
        created = kube.put(obj)
        stamp = "2027-01-15T08:00:05.000000Z"
        aw["status"] = {
            "state": "Running", "queuejobstate": "Dispatched", "elasticPods": [2],
            "admittedDigest": items_digest(parse_appwrapper(aw)),
            "wrappedItems": [{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                              "name": "train", "uid": created["metadata"]["uid"]}],
            "conditions": [{"type": "Dispatched", "status": "True",
                            "reason": "AppWrapperRunnable", "message": "",
                            "lastUpdateMicroTime": stamp, "lastTransitionMicroTime": stamp}]}
        kube.put(aw)
        assert worker_replicas(kube, "train") == 4
        d = await started(kube, clock)
        for _ in range(3):
            clock.now += 20
            await d.cycle()
        assert worker_replicas(kube, "train") == 2
        assert d.tracked[("team", "train")].expected_pods == 2

    run(scenario)


def test_a_pod_a_scale_in_removed_is_not_owed_a_replacement() -> None:
    """After a scale-in to 2 workers, the third worker's pod goes: the gang still has the
    pods of its size, so no capacity is held for a replacement (the room is the
    preemptor's). A pod lost below its size is owed one, as for any gang."""
    aw = parse_appwrapper({**elastic("train", 1, 4), "metadata": {
        "name": "train", "namespace": "team", "uid": "u"}})
    t = Tracked(("team", "train"), "u", 1, aw, aw.status, {}, 0.0, phase="running",
                queued=queued_from_appwrapper(aw, 0.0))
    t.status.elasticPods = [2]
    follow_size(t)
    state = ClusterState()
    for i in range(2):
        state.upsert_pod(("team", f"train-worker-{i}"), BoundPod(
            "team", f"train-worker-{i}", "n0", {"nvidia.com/gpu": 8}, "train"))
    assert (t.expected_pods, t.floor) == (2, 1)
    assert scaled_in(t, state)
    state.remove_pod(("team", "train-worker-1"))
    assert not scaled_in(t, state)


def test_an_object_gone_when_it_is_resized_stops_nothing() -> None:
    """The PyTorchJob was deleted behind the dispatcher's back: the scale-out is recorded,
    the patch refused (404) is not retried for ever, and the loop goes on."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        for i in range(2):
            kube.put(node(f"n{i}"))
        kube.put(elastic("train", 1, 4))
        d = await started(kube, clock)
        await d.cycle()
        assert worker_replicas(kube, "train") == 2
        del kube.objects[next(p for p, o in kube.objects.items()
                              if o.get("kind") == "PyTorchJob")]
        d.on_node("ADDED", node("n2"))
        clock.now += 10
        await d.cycle()
        assert aw_status(kube, "train")["elasticPods"] == [3]
        assert ("team", "train") not in d.scaling.owed
        clock.now += 10
        await d.cycle()  # nothing owed, nothing raised

    run(scenario)
