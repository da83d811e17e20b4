"""Elastic gangs in the controller against an in-memory API: the object is created at the
size admitted, patched when the core grows it, and the status says what changed."""

from __future__ import annotations

from typing import Any

from dispatcher.admission import queued_from_appwrapper
from dispatcher.api.models import parse_appwrapper
from dispatcher.cluster import BoundPod, ClusterState
from dispatcher.controller.items.scaling import _patch, follow_size, scaled_in
from dispatcher.controller.kube.client import ApiError
from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.controller.record.tracked import StatusWrites, Tracked, items_digest
from dispatcher.kinds.elastic import ElasticSet
from dispatcher.lifecycle import PodCounts, judge
from dispatcher.policy_files import load_policy

from .elastic_world import pytorchjob
from .fake_kube import FakeKube
from .test_runtime import (
    Clock,
    appwrapper,
    aw_status,
    created_job,
    job,
    node,
    pod,
    run,
    started,
    types,
)
from .test_runtime_sharing import PREEMPTION, quota, subtree
from .test_runtime_sharing import started as sharing_started


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
    t = Tracked(("team", "train"), "u", 1, aw, aw.status, StatusWrites({}), 0.0, phase="running",
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
    """The PyTorchJob was deleted behind the dispatcher's back: the patch refused (404)
    undoes the scale-out in status, is not retried for ever, and the loop goes on."""
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
        assert aw_status(kube, "train")["elasticPods"] == [2]
        assert "could not resize to 3 workers: PyTorchJob train: NotFound" in \
            aw_status(kube, "train")["conditions"][-1]["message"]
        assert ("team", "train") not in d.scaling.owed
        clock.now += 10
        await d.cycle()  # nothing owed, nothing raised

    run(scenario)


FORBIDDEN = (
    'pytorchjobs.kubeflow.org "train" is forbidden: User "system:serviceaccount:'
    'dispatcher-system:dispatcher" cannot patch resource "pytorchjobs" in API group '
    '"kubeflow.org" in the namespace "team"')
PYTORCHJOBS = "/apis/kubeflow.org/v1/namespaces/team/pytorchjobs/"


def refuse_patches(kube: FakeKube, times: int = 20) -> list[ApiError]:
    """The API server answers 403 to every PATCH of a PyTorchJob (RBAC without the verb
    patch); what is left of the list says how many were tried."""
    errors = [ApiError(403, "Forbidden", FORBIDDEN) for _ in range(times)]
    kube.fail_next[("PATCH", PYTORCHJOBS)] = errors
    return errors


def created_pytorchjob(kube: FakeKube, name: str) -> dict[str, Any]:
    obj = kube.get("kubeflow.org/v1", "PyTorchJob", "team", name)
    assert obj is not None, f"PyTorchJob {name} was not created"
    return obj


def bind(kube: FakeKube, d: Dispatcher, aw: str, owner: dict[str, Any],
         nodes: list[str]) -> None:
    """Running pods of `owner`, one on each of `nodes`, named as its operator names them."""
    kind = "worker-" if owner["kind"] == "PyTorchJob" else ""
    for i, n in enumerate(nodes):
        p = pod(aw, f"{owner['metadata']['name']}-{kind}{i}", n, "Running", 8, owner)
        kube.put(p)
        d.on_pod("ADDED", p)


def in_leaf(aw: dict[str, Any], leaf: str = "gold") -> dict[str, Any]:
    aw["metadata"]["labels"] = {"quota_gpu": leaf}
    return aw


def last_condition(kube: FakeKube, name: str) -> dict[str, Any]:
    condition: dict[str, Any] = aw_status(kube, name)["conditions"][-1]
    return condition


def test_a_refused_scale_out_keeps_the_size_that_runs_charged_and_its_room_free() -> None:
    """403 to the PATCH of a scale-out to 4 workers: the status goes back to the 2 workers
    the object asks for, so the quota charged is theirs and the room of the 2 that will
    not come is free -- another gang of the same hard quota leaf takes both. The refusal
    says what to grant, and is not met again at every cycle."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        for i in range(4):
            kube.put(node(f"n{i}"))
        tree = [subtree("root", [quota("root", 48)]),
                subtree("teams", [quota("gold", 32, hard=True), quota("bronze", 16)],
                        parent="root")]
        kube.put(in_leaf(appwrapper("blocker", job("blocker", 2, 8), created=1), "bronze"))
        kube.put(in_leaf(elastic("train", 1, 4)))
        d = await sharing_started(kube, clock, trees=tree, policy=load_policy("fifo"))
        await d.cycle()
        assert worker_replicas(kube, "train") == 2
        bind(kube, d, "blocker", created_job(kube, "blocker"), ["n0", "n1"])
        bind(kube, d, "train", created_pytorchjob(kube, "train"), ["n2", "n3"])
        tried = refuse_patches(kube)
        for i in (4, 5):
            d.on_node("ADDED", node(f"n{i}"))
        clock.now += 10
        await d.cycle()
        assert len(tried) == 19  # the patch to 4 workers, refused
        assert worker_replicas(kube, "train") == 2
        status = aw_status(kube, "train")
        assert status["elasticPods"] == [2]
        last = last_condition(kube, "train")
        assert last["reason"] == "ResizeRefused"
        assert last["message"].startswith(
            "could not resize to 4 workers: PyTorchJob train: Forbidden: ")
        assert "cannot patch resource" in last["message"]
        assert "(grant the dispatcher's service account the verb patch on " \
            "pytorchjobs.kubeflow.org" in last["message"]
        assert "it keeps 2 workers" in last["message"]
        assert any(e.get("reason") == "ResizeRefused" and e["type"] == "Warning"
                   for e in kube.of_kind("Event"))
        assert d.tracked[("team", "train")].expected_pods == 2

        kube.put(in_leaf(appwrapper("next", job("next", 2, 8), created=3)))
        d.on_appwrapper("ADDED", kube.get("workload.codeflare.dev/v1beta1", "AppWrapper",
                                          "team", "next"))
        for _ in range(5):
            clock.now += 10
            await d.cycle()
        assert types(kube, "next")[-1] == "Dispatched", aw_status(kube, "next")
        assert len(tried) == 19  # not grown (and refused) again meanwhile
        assert aw_status(kube, "train")["elasticPods"] == [2], aw_status(kube, "train")

    run(scenario)


def test_a_refused_scale_in_does_not_keep_the_preemptor_waiting_for_ever() -> None:
    """A higher-priority wrapper needs one node of an elastic gang running on all 4: the
    scale-in to 3 workers is refused (403). The gang keeps its 4 workers in status, the
    room held for the preemptor on the worker that will not go is given up at once, and
    it competes again: under priority-preemption it preempts the gang whole (deleting it
    is granted) rather than waiting for ever."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        for i in range(4):
            kube.put(node(f"n{i}"))
        kube.put(elastic("train", 1, 4))
        d = await sharing_started(kube, clock, trees=[], policy=PREEMPTION)
        await d.cycle()
        assert worker_replicas(kube, "train") == 4
        bind(kube, d, "train", created_pytorchjob(kube, "train"), ["n0", "n1", "n2", "n3"])
        clock.now += 10
        await d.cycle()
        assert types(kube, "train")[-1] == "Running"
        tried = refuse_patches(kube)
        clock.now += 10
        high = kube.put(appwrapper("high", job("high", 1, 8), created=3, priority=9))
        d.on_appwrapper("ADDED", high)
        await d.cycle()
        assert len(tried) == 19  # the scale-in to 3 workers, refused
        assert aw_status(kube, "train")["elasticPods"] == [4]
        assert last_condition(kube, "train")["message"].startswith(
            "could not resize to 3 workers: PyTorchJob train: Forbidden: ")
        for _ in range(5):  # far less than the hold's deadline
            if kube.get("batch/v1", "Job", "team", "high") is not None:
                break
            clock.now += 10
            await d.cycle()
            if kube.get("kubeflow.org/v1", "PyTorchJob", "team", "train") is None:
                for i in range(4):  # torn down whole: its pods go
                    d.on_pod("DELETED", pod("train", f"train-worker-{i}", f"n{i}",
                                            "Running", 8))
        assert len(tried) == 19  # never asked to shrink again
        preempted = [c for c in aw_status(kube, "train")["conditions"]
                     if c["type"] == "PreemptCandidate"][-1]
        assert "preempted by team/high" in preempted["message"]
        assert types(kube, "high")[-1] == "Dispatched"
        assert not d.memory.sharing.holds

    run(scenario)
