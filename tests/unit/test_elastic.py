"""Elastic gangs: admitted at their minimum, grown as capacity frees, shrunk instead of
preempted -- the ranges each kind declares and the core's decisions."""

from __future__ import annotations

from typing import Any

from dispatcher.admission import queued_from_appwrapper
from dispatcher.api.models import parse_appwrapper
from dispatcher.cluster import PlannedPod
from dispatcher.elastic import removal_order
from dispatcher.fit import FRAGMENTED, INSUFFICIENT
from dispatcher.queue import Policy

from .builders import GPU, node
from .elastic_world import ElasticWorld, pytorchjob
from .quota_world import appwrapper, subtree

PRIORITY = Policy("priority", order="priority")
FIFO = Policy("fifo", order="arrival")
PREEMPT = Policy("preempt", order="priority", preemption="lowerPriority")


def nodes(n: int, gpu: int = 8) -> list[Any]:
    return [node(f"n{i}", gpu=gpu) for i in range(n)]


def ranges(manifest: dict[str, Any]) -> list[tuple[str, int, int, tuple[object, ...]]]:
    w = queued_from_appwrapper(parse_appwrapper(manifest), 0.0)
    return [(s.name, s.low, s.high, s.path) for s in w.elastic]


# --- what each kind declares ----------------------------------------------------------------


def test_a_pytorchjob_elastic_policy_is_a_range_of_workers() -> None:
    assert ranges(pytorchjob("p", low=2, high=6)) == [
        ("Worker", 2, 6, ("spec", "pytorchReplicaSpecs", "Worker", "replicas"))]


def test_equal_bounds_are_no_range() -> None:
    assert ranges(pytorchjob("p", low=4, high=4)) == []


def raycluster(groups: list[dict[str, Any]], min_available: int | None = None) -> dict[str, Any]:
    def template(gpu: int) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": "ray", "resources": {
            "limits": {"nvidia.com/gpu": gpu, "cpu": "1", "memory": "1Gi"}}}]}}
    spec: dict[str, Any] = {"headGroupSpec": {"template": template(0)}, "workerGroupSpecs": [
        {"template": template(1), **g} for g in groups]}
    aw: dict[str, Any] = {
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": "ray", "namespace": "test"},
        "spec": {"resources": {"GenericItems": [{"generictemplate": {
            "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "ray"},
            "spec": spec}}]}}}
    if min_available is not None:
        aw["spec"]["schedulingSpec"] = {"minAvailable": min_available}
    return aw


def test_ray_worker_groups_with_both_bounds_are_ranges_of_replicas_times_hosts() -> None:
    found = ranges(raycluster([
        {"groupName": "gpu", "replicas": 2, "minReplicas": 1, "maxReplicas": 4, "numOfHosts": 2},
        {"groupName": "fixed", "replicas": 2, "minReplicas": 2, "maxReplicas": 2},
        {"groupName": "unbounded", "replicas": 2, "minReplicas": 1},  # no maximum to grow to
    ]))
    assert found == [("worker/gpu", 2, 8, ("spec", "workerGroupSpecs", 0, "replicas"))]


def test_a_ray_cluster_the_ray_autoscaler_scales_is_left_to_it() -> None:
    aw = raycluster([{"groupName": "gpu", "replicas": 2, "minReplicas": 1, "maxReplicas": 4}])
    aw["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"][
        "enableInTreeAutoscaling"] = True
    assert ranges(aw) == []


def test_min_available_makes_the_only_tolerant_set_elastic() -> None:
    # head 1 + 4 workers; minAvailable 3 leaves the workers 2.
    assert ranges(raycluster([{"groupName": "g", "replicas": 4}],
                             min_available=3)) == [
        ("worker/g", 2, 4, ("spec", "workerGroupSpecs", 0, "replicas"))]


def test_min_available_on_a_kind_that_needs_every_pod_keeps_its_mcad_meaning() -> None:
    job = appwrapper("j", pods=4)
    job["spec"]["schedulingSpec"] = {"minAvailable": 2}
    assert ranges(job) == []  # a Job (custompodresources, too) is never elastic
    tf = pytorchjob("tf", low=1, high=4)
    tf["spec"]["resources"]["GenericItems"][0]["generictemplate"]["kind"] = "TFJob"
    tf["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"][
        "tfReplicaSpecs"] = tf["spec"]["resources"]["GenericItems"][0]["generictemplate"][
        "spec"].pop("pytorchReplicaSpecs")
    tf["spec"]["schedulingSpec"] = {"minAvailable": 2}
    assert ranges(tf) == []


def test_a_deployment_below_min_available_is_elastic() -> None:
    aw = {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
          "metadata": {"name": "d", "namespace": "test"},
          "spec": {"schedulingSpec": {"minAvailable": 2}, "resources": {"GenericItems": [
              {"generictemplate": {
                  "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                  "spec": {"replicas": 5, "template": {"spec": {"containers": [
                      {"name": "c", "resources": {"requests": {"cpu": "1"}}}]}}}}}]}}}
    assert [(low, high) for _, low, high, _ in ranges(aw)] == [(2, 5)]


# --- admission at the minimum -----------------------------------------------------------------


def test_admitted_at_its_minimum_when_its_maximum_does_not_fit() -> None:
    w = ElasticWorld(nodes(4), PRIORITY)
    w.submit(appwrapper("other", gpu=8, pods=1))
    w.settle()
    w.submit(pytorchjob("elastic", low=2, high=6))
    last = w.settle()
    d = last[("test", "elastic")]
    assert d.decision == "dispatch" and w.workers("elastic") == 2
    assert "admitted at its minimum, 2 workers" in d.message


def test_never_a_partial_minimum() -> None:
    """Master + 2 workers of 8 GPUs need 3 nodes; 2 are free: nothing is dispatched."""
    w = ElasticWorld(nodes(3), PRIORITY)
    w.submit(appwrapper("other", gpu=8, pods=1))
    w.settle()
    w.submit(pytorchjob("elastic", low=2, high=6))
    last = w.settle()
    assert last[("test", "elastic")].reason in (INSUFFICIENT, FRAGMENTED)
    assert not w.is_running("elastic") and w.workers("elastic") == 0


def test_a_wrapper_that_fits_whole_is_admitted_whole_in_one_cycle() -> None:
    w = ElasticWorld(nodes(8), PRIORITY)
    w.submit(pytorchjob("elastic", low=2, high=6))
    d = w.cycle()[0]
    assert d.decision == "dispatch" and d.elastic == (6,) and len(d.placements) == 7
    assert "scaled out to 6 workers (from 2 workers)" in d.message


def test_wrappers_behind_it_dispatch_before_it_grows() -> None:
    """Admission at the minimum leaves room for the wrappers behind it in the same cycle."""
    w = ElasticWorld(nodes(6), FIFO)
    w.submit(pytorchjob("elastic", low=2, high=6))
    w.submit(appwrapper("behind", gpu=8, pods=2))
    w.cycle()
    assert w.is_running("behind") and w.workers("elastic") == 3  # 6 nodes: 3 + 1 + 2


# --- growth --------------------------------------------------------------------------------


def test_grows_when_another_wrapper_completes() -> None:
    w = ElasticWorld(nodes(4), PRIORITY)
    w.submit(appwrapper("other", gpu=8, pods=2))
    w.settle()
    w.submit(pytorchjob("elastic", low=1, high=6))
    w.settle()
    assert w.workers("elastic") == 1
    w.complete("other")
    w.settle()
    assert w.workers("elastic") == 3
    assert w.scales[-1].message.startswith("scaled out to 3 workers (from 1 worker)")


def test_does_not_grow_into_room_a_wrapper_ahead_of_it_could_use() -> None:
    """`big` (priority 5) waits for 3 nodes; one frees: `elastic` (priority 0) must not
    take it, or `big` would wait behind a gang it outranks."""
    w = ElasticWorld(nodes(4), PRIORITY)
    w.submit(appwrapper("a", gpu=8, pods=1))
    w.submit(appwrapper("b", gpu=8, pods=1))
    w.settle()
    w.submit(pytorchjob("elastic", low=1, high=6, master=False))
    w.settle()
    assert w.workers("elastic") == 2
    w.submit(appwrapper("big", gpu=8, pods=3, priority=5))
    w.settle()
    w.complete("a")
    last = w.settle()
    assert last[("test", "big")].decision == "wait" and w.workers("elastic") == 2
    w.complete("b")
    w.settle()
    assert w.is_running("big")


def test_grows_onto_nodes_the_waiting_wrapper_ahead_cannot_use() -> None:
    """The wrapper ahead only runs on gpu nodes of type a100: the freed h100 node is the
    elastic gang's to grow onto."""
    w = ElasticWorld([node("a0", labels={"type": "a100"}), node("h0", labels={"type": "h100"}),
                      node("h1", labels={"type": "h100"}), node("h2", labels={"type": "h100"})],
                     PRIORITY)
    w.submit(appwrapper("a-user", gpu=8))
    w.submit(appwrapper("h-user", gpu=8))
    w.settle()
    w.submit(pytorchjob("elastic", low=1, high=4))
    w.settle()
    ahead = appwrapper("wants-a100", gpu=8, pods=1, priority=5)
    ahead["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"]["template"][
        "spec"]["nodeSelector"] = {"type": "a100"}
    ahead["spec"]["resources"]["GenericItems"][0].pop("custompodresources")
    ahead["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"]["template"][
        "spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 8}}
    w.submit(ahead)
    w.settle()
    before = w.workers("elastic")
    w.complete("h-user")
    w.settle()
    assert w.workers("elastic") == before + 1


# --- shrinking instead of preempting ---------------------------------------------------------


def test_shrinks_for_a_higher_priority_wrapper_instead_of_being_preempted() -> None:
    w = ElasticWorld(nodes(6), PREEMPT)
    w.submit(pytorchjob("elastic", low=2, high=5))
    w.settle()
    assert w.workers("elastic") == 5
    w.submit(appwrapper("urgent", gpu=8, pods=2, priority=10))
    w.settle()
    assert w.is_running("urgent") and w.is_running("elastic")
    assert w.workers("elastic") == 3
    assert w.scales[-1].message.startswith(
        "scaled in to 3 workers (from 5 workers) to make room for test/urgent")


def test_never_shrinks_below_its_minimum_then_preempts_whole() -> None:
    w = ElasticWorld(nodes(4), PREEMPT)
    w.submit(pytorchjob("elastic", low=2, high=3))
    w.settle()
    assert w.workers("elastic") == 3
    w.submit(appwrapper("urgent", gpu=8, pods=3, priority=10))
    w.settle()
    # Shrinking to 2 workers frees one node; 3 are needed: the whole gang goes.
    assert w.is_running("urgent") and not w.is_running("elastic")
    assert all(s.after[0] >= 2 for s in w.scales)


def test_same_priority_under_fifo_never_shrinks() -> None:
    w = ElasticWorld(nodes(4), FIFO)
    w.submit(pytorchjob("elastic", low=1, high=3))
    w.settle()
    w.submit(appwrapper("later", gpu=8, pods=1, priority=10))
    last = w.settle()
    assert last[("test", "later")].decision == "wait" and w.workers("elastic") == 3


def test_pods_go_to_their_set_by_name_even_when_the_operator_changed_their_requests() -> None:
    """KubeRay adds to its pods' requests: a worker is known by its group in its name, and
    Kubeflow workers go highest index first."""
    w = queued_from_appwrapper(parse_appwrapper(raycluster([
        {"groupName": "gpu", "replicas": 2, "minReplicas": 1, "maxReplicas": 4}])), 0.0)
    other = {"nvidia.com/gpu": 1, "cpu": 1500, "memory": 2**31, "pods": 1}
    order = removal_order(w, [("ray-head-x1", PlannedPod("n0", {"cpu": 1000})),
                              ("ray-gpu-worker-abcde", PlannedPod("n1", other)),
                              ("ray-gpu-worker-zzzzz", PlannedPod("n2", other))])
    assert [n for n, _ in order[0]] == ["ray-gpu-worker-zzzzz", "ray-gpu-worker-abcde"]
    job = queued_from_appwrapper(parse_appwrapper(pytorchjob("t", low=1, high=12)), 0.0)
    pods = [(f"t-worker-{i}", PlannedPod("n0", {})) for i in (2, 10, 1)] + [
        ("t-master-0", PlannedPod("n0", {}))]
    assert [n for n, _ in removal_order(job, pods)[0]] == ["t-worker-10", "t-worker-2",
                                                         "t-worker-1"]


def test_a_borrower_shrinks_for_a_team_within_its_quota_under_fifo() -> None:
    """team-b's elastic job grew to the whole cluster, borrowing team-a's half; team-a's job,
    within its quota, takes that half back by scaling it in -- no priority involved."""
    trees = [subtree("root", "gpu", [("root", {GPU: 32}, False)]),
             subtree("teams", "gpu", [("team-a", {GPU: 16}, False),
                                      ("team-b", {GPU: 16}, False)], parent="root")]
    w = ElasticWorld(nodes(4), FIFO, trees)
    w.submit(pytorchjob("elastic", low=1, high=4, master=False, labels={"gpu": "team-b"}))
    w.settle()
    assert w.workers("elastic") == 4  # 32 GPUs: 16 of them borrowed
    w.submit(appwrapper("owed", {"gpu": "team-a"}, gpu=8, pods=2))
    w.settle()
    assert w.is_running("owed") and w.workers("elastic") == 2
    assert "it borrows quota that test/owed is owed" in w.scales[-1].message
