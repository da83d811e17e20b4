"""Pinning: wrapped pods are made behind the dispatcher's scheduling gate, and each is let
onto room its own gang holds — never into room promised to another gang."""

from __future__ import annotations

import copy
from typing import Any

from dispatcher.cluster import ClusterState, node_from_object
from dispatcher.cluster.model import BoundPod, Node
from dispatcher.cluster.state import PlannedPod
from dispatcher.controller.items.shaping import PLACEMENT_GATE, gate_pods
from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.controller.pods.placement import lift_gate
from dispatcher.controller.record.memory import GatedPod
from dispatcher.resources import pod_request

from .fake_kube import FakeKube
from .test_runtime import FIFO, Clock, appwrapper, aw_status, created_job, node, run, started

GPU = {"nvidia.com/gpu": 8, "pods": 1}


def gated_pod(job: dict[str, Any], name: str) -> dict[str, Any]:
    """A pod as the Job controller makes it from the Job's template."""
    template = copy.deepcopy(job["spec"]["template"])
    meta = template.get("metadata") or {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team", "labels": meta.get("labels", {}),
                         "ownerReferences": [{
                             "apiVersion": "batch/v1", "kind": "Job", "controller": True,
                             "name": job["metadata"]["name"],
                             "uid": job["metadata"]["uid"]}]},
            "spec": template["spec"], "status": {"phase": "Pending"}}


def pinned_to(pod: dict[str, Any]) -> list[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return [v for t in terms for f in t.get("matchFields", []) for v in f["values"]]


def one_pod_job(name: str, completions: int = 1) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": 1, "completions": completions, "template": {"spec": {
                "containers": [{"name": "c", "resources": {
                    "limits": {"nvidia.com/gpu": 8}}}]}}}}


def two_pod_job(name: str) -> dict[str, Any]:
    job = one_pod_job(name, 2)
    job["spec"]["parallelism"] = 2
    return job


async def pinning(kube: FakeKube, clock: Clock) -> Dispatcher:
    d = await started(kube, clock)
    d.items.pin = True  # what `dispatcher run` does by default (--pin-pods)
    return d


def arrive(kube: FakeKube, d: Dispatcher, pod: dict[str, Any]) -> None:
    d.on_pod("ADDED", copy.deepcopy(kube.put(pod)))


def seen(kube: FakeKube, d: Dispatcher, name: str) -> dict[str, Any]:
    """The pod as the API has it now, fed back as the watch would."""
    obj = kube.get("v1", "Pod", "team", name)
    assert obj is not None
    d.on_pod("MODIFIED", copy.deepcopy(obj))
    return obj


async def two_pods_let_go(kube: FakeKube, clock: Clock) -> tuple[Dispatcher, list[Any]]:
    """Nodes n1 and n2; "a", a Job of 2 eight-GPU pods, dispatched; both its pods made
    (gated) and let go, not bound yet. The dispatcher and the pods as the API has them."""
    kube.put(node("n1"))
    kube.put(node("n2"))
    kube.put(appwrapper("a", two_pod_job("a")))
    d = await pinning(kube, clock)
    await d.cycle()
    job = created_job(kube, "a")
    assert job["spec"]["template"]["spec"]["schedulingGates"] == [{"name": PLACEMENT_GATE}]
    for i in range(2):
        arrive(kube, d, gated_pod(job, f"a-{i}"))
    await d.cycle()
    return d, [seen(kube, d, f"a-{i}") for i in range(2)]


def test_each_pod_of_a_gang_is_let_onto_a_node_its_gang_holds() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, pods = await two_pods_let_go(kube, clock)
        assert all("schedulingGates" not in p["spec"] for p in pods)
        assert sorted(n for p in pods for n in pinned_to(p)) == ["n1", "n2"]
        assert d.memory.gated == {}
        assert d.memory.pods_pinned == {"created": 0, "gate": 2}

    run(scenario)


def test_a_pod_with_no_room_held_waits_at_the_gate_rather_than_take_another_gangs() -> None:
    """The node-deletion fault test's failure in small: a pod its gang holds no room for
    (there, the replacement of a pod lost with its node) must not go into room promised
    to a gang whose pods are not bound yet; kube-scheduler, left to itself, binds it
    there and that gang is left partial."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(node("n2"))
        kube.put(appwrapper("a", one_pod_job("a", completions=2), created=0))
        kube.put(appwrapper("b", one_pod_job("b"), created=1))
        d = await pinning(kube, clock)
        await d.cycle()
        a, b = created_job(kube, "a"), created_job(kube, "b")
        arrive(kube, d, gated_pod(a, "a-0"))
        await d.cycle()
        a0 = seen(kube, d, "a-0")
        (a_node,) = pinned_to(a0)
        a0["spec"]["nodeName"] = a_node
        a0["status"]["phase"] = "Running"
        d.on_pod("MODIFIED", copy.deepcopy(a0))
        # a's Job makes a second pod (its first is lost, or done) while b's is not made.
        arrive(kube, d, gated_pod(a, "a-1"))
        await d.cycle()
        assert seen(kube, d, "a-1")["spec"]["schedulingGates"] == [{"name": PLACEMENT_GATE}]
        arrive(kube, d, gated_pod(b, "b-0"))
        await d.cycle()
        b0 = seen(kube, d, "b-0")
        assert pinned_to(b0) == ["n2" if a_node == "n1" else "n1"]
        # a's first pod ends: its node is free, and a's waiting pod goes there.
        a0["status"]["phase"] = "Succeeded"
        d.on_pod("MODIFIED", copy.deepcopy(a0))
        await d.cycle()
        assert pinned_to(seen(kube, d, "a-1")) == [a_node]

    run(scenario)


def test_without_pinning_pods_are_made_without_the_gate() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", one_pod_job("a")))
        d = Dispatcher(kube, FIFO, clock=clock)  # type: ignore[arg-type]
        for obj in kube.of_kind("Node") + kube.of_kind("AppWrapper"):
            (d.on_node if obj["kind"] == "Node" else d.on_appwrapper)("ADDED", obj)
        await d.cycle()
        assert "schedulingGates" not in created_job(kube, "a")["spec"]["template"]["spec"]

    run(scenario)


def test_the_room_given_to_a_waiting_pod_is_given_to_no_other() -> None:
    state = ClusterState()
    for n in ("n1", "n2"):
        state.upsert_node(_node(n))
    owner = ("team", "a")
    state.reserve(owner, [PlannedPod("n1", GPU), PlannedPod("n2", GPU)])
    first = state.pin(owner, ("team", "a-0"), GPU)
    second = state.pin(owner, ("team", "a-1"), GPU)
    assert {first, second} == {"n1", "n2"}
    assert state.pin(owner, ("team", "a-2"), GPU) is None  # a third: nothing left
    assert state.pin(owner, ("team", "a-0"), GPU) == first  # asked again: the same
    # Bound where it was pinned: the hold and the pin go together.
    state.upsert_pod(("team", "a-0"), BoundPod("team", "a-0", str(first), GPU, "a"))
    assert state.pinned(("team", "a-0")) is None
    assert state.pin(owner, ("team", "a-2"), GPU) is None
    # Gone unbound: its room may be given again.
    state.unpin(("team", "a-1"))
    assert state.pin(owner, ("team", "a-2"), GPU) == second


def test_a_pod_is_not_pinned_to_a_hold_that_does_not_fit_or_a_node_it_may_not_use() -> None:
    state = ClusterState()
    for n in ("n1", "n2"):
        state.upsert_node(_node(n))
    owner = ("team", "a")
    unfit = PlannedPod("n1", GPU)
    state.reserve(owner, [unfit, PlannedPod("n2", GPU)])
    assert state.pin(owner, ("team", "p"), GPU, unfit=[unfit],
                     admits=lambda n: n != "n2") is None
    assert state.pin(owner, ("team", "p"), GPU, unfit=[unfit]) == "n2"


def test_gates_go_on_every_pod_template_once() -> None:
    ray = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "r"},
           "spec": {"headGroupSpec": {"template": {"spec": {"containers": [{"name": "h"}]}}},
                    "workerGroupSpecs": [{"groupName": "w", "replicas": 2, "template": {
                        "spec": {"containers": [{"name": "w"}],
                                 "schedulingGates": [{"name": "theirs"}]}}}]}}
    gate_pods(ray)
    gate_pods(ray)
    assert ray["spec"]["headGroupSpec"]["template"]["spec"]["schedulingGates"] == [
        {"name": PLACEMENT_GATE}]
    assert ray["spec"]["workerGroupSpecs"][0]["template"]["spec"]["schedulingGates"] == [
        {"name": "theirs"}, {"name": PLACEMENT_GATE}]
    bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c"}]}}
    gate_pods(bare)
    assert bare["spec"]["schedulingGates"] == [{"name": PLACEMENT_GATE}]


def test_lifting_keeps_the_pods_own_node_rules_and_other_gates() -> None:
    spec = {"schedulingGates": [{"name": "theirs"}, {"name": PLACEMENT_GATE}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                ]}}},
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 8}}}]}
    body = lift_gate(GatedPod(("team", "a"), {"metadata": {"resourceVersion": "7"},
                                              "spec": spec}), "n1")
    assert body["metadata"] == {"resourceVersion": "7"}
    assert body["spec"]["schedulingGates"] == [{"name": "theirs"}]
    terms = body["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    ours = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    assert [t["matchFields"] for t in terms] == [[ours], [ours]]
    assert [t["matchExpressions"][0]["values"] for t in terms] == [["a"], ["b"]]
    alone = lift_gate(GatedPod(("team", "a"), {
        "metadata": {"resourceVersion": "7"},
        "spec": {"schedulingGates": [{"name": PLACEMENT_GATE}]}}), None)
    assert alone["spec"] == {"schedulingGates": None}
    assert pod_request(spec)["nvidia.com/gpu"] == 8


def _node(name: str) -> Node:
    return node_from_object(node(name))


def test_after_a_restart_a_pod_let_onto_a_node_keeps_its_room_there() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(node("n2"))
        kube.put(appwrapper("a", one_pod_job("a"), created=0))
        d = await pinning(kube, clock)
        await d.cycle()
        a = created_job(kube, "a")
        arrive(kube, d, gated_pod(a, "a-0"))
        await d.cycle()
        a0 = seen(kube, d, "a-0")
        (first,) = pinned_to(a0)
        other = "n2" if first == "n1" else "n1"
        # Let onto the node a fresh plan would not pick (as an earlier plan may have).
        a0["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"][0]["matchFields"][0]["values"] = [other]
        # kill -9; b arrives; a new process lists everything (a-0 not bound yet).
        kube.put(appwrapper("b", one_pod_job("b"), created=1))
        d2 = await pinning(kube, clock)
        await d2.cycle()
        assert [p.node for p in d2.state.reserved_for(("team", "a"))] == [other]
        arrive(kube, d2, gated_pod(created_job(kube, "b"), "b-0"))
        await d2.cycle()
        assert pinned_to(seen(kube, d2, "b-0")) == [first]

    run(scenario)


def test_a_pod_asking_more_cpu_than_planned_goes_to_room_held_for_its_gpus() -> None:
    """KubeRay's worker pods ask more cpu and memory than their template says (found on
    the local cluster): such a pod goes to room held for a pod with its GPUs, never to
    the head's room, which has none."""
    state = ClusterState()
    for n in ("n1", "n2"):
        state.upsert_node(_node(n))
    owner = ("team", "ray")
    head = {"cpu": 100, "memory": 128, "pods": 1}
    worker = {"nvidia.com/gpu": 8, "cpu": 100, "memory": 128, "pods": 1}
    state.reserve(owner, [PlannedPod("n1", head), PlannedPod("n1", worker),
                          PlannedPod("n2", worker)])
    bigger = {**worker, "cpu": 200, "memory": 256}
    assert state.pin(owner, ("team", "w-0"), bigger) == "n1"
    assert state.pin(owner, ("team", "w-1"), bigger) == "n2"
    assert state.pin(owner, ("team", "w-2"), bigger) is None  # not the head's room
    assert state.pin(owner, ("team", "head"), head) == "n1"


def test_a_pod_binding_takes_the_room_it_was_pinned_to_not_another_pods() -> None:
    state = ClusterState()
    for n in ("n1", "n2"):
        state.upsert_node(_node(n))
    owner = ("team", "a")
    small = {"nvidia.com/gpu": 8, "cpu": 100, "pods": 1}
    roomy = {"nvidia.com/gpu": 8, "cpu": 400, "pods": 1}
    state.reserve(owner, [PlannedPod("n1", small), PlannedPod("n2", roomy)])
    assert state.pin(owner, ("team", "p1"), small) == "n1"
    assert state.pin(owner, ("team", "p2"), small) == "n2"  # the roomier hold: its GPUs
    state.upsert_pod(("team", "p2"), BoundPod("team", "p2", "n2", small, "a"))
    # p1's room stays; p2 took from n2's hold only what it asks: the cpu it did not ask
    # stays held for the gang until the gang runs.
    held = sorted((p.node, dict(p.request)) for p in state.reserved_for(owner))
    assert held == [("n1", small), ("n2", {"cpu": 300})]


def test_a_pod_without_a_gpu_is_never_given_room_held_for_one() -> None:
    state = ClusterState()
    for n in ("n1", "n2"):
        state.upsert_node(_node(n))
    owner = ("team", "a")
    state.reserve(owner, [PlannedPod("n1", {"cpu": 2000, "pods": 1}),
                          PlannedPod("n2", {"cpu": 1000, "nvidia.com/gpu": 8, "pods": 1})])
    assert state.pin(owner, ("team", "cpu"), {"cpu": 1000, "pods": 1}) == "n1"
    assert state.pin(owner, ("team", "gpu"), {"cpu": 1000, "nvidia.com/gpu": 8,
                                              "pods": 1}) == "n2"


def test_a_running_gang_keeps_the_room_of_a_pod_let_go_and_not_bound_yet() -> None:
    """A gang runs at its minimum (1 of 2 pods): its second pod, let onto its node and
    not bound yet, keeps that room; the next wrapper must not be given it."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(node("n2"))
        kube.put(appwrapper("a", two_pod_job("a"), created=0,
                            schedulingSpec={"minAvailable": 1}))
        d = await pinning(kube, clock)
        await d.cycle()
        a = created_job(kube, "a")
        for i in range(2):
            arrive(kube, d, gated_pod(a, f"a-{i}"))
        await d.cycle()
        a0 = seen(kube, d, "a-0")
        (n,) = pinned_to(a0)
        other = pinned_to(seen(kube, d, "a-1"))
        a0["spec"]["nodeName"] = n
        a0["status"]["phase"] = "Running"
        d.on_pod("MODIFIED", copy.deepcopy(a0))
        await d.cycle()
        assert aw_status(kube, "a")["state"] == "Running"
        kube.put(appwrapper("b", one_pod_job("b"), created=1))
        d.on_appwrapper("ADDED", copy.deepcopy(
            kube.get("workload.codeflare.dev/v1beta1", "AppWrapper", "team", "b")))
        for _ in range(3):
            clock.now += 20
            await d.cycle()
        assert kube.get("batch/v1", "Job", "team", "b") is None
        assert [p.node for p in d.state.reserved_for(("team", "a"))] == other

    run(scenario)


def test_pods_with_rules_the_fit_does_not_model_are_left_to_kube_scheduler() -> None:
    def job_with(**spec: Any) -> dict[str, Any]:
        job = one_pod_job("j")
        job["spec"]["template"]["spec"].update(spec)
        gate_pods(job)
        return job

    spread = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
              "labelSelector": {"matchLabels": {"app": "x"}}}
    anti = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname",
         "labelSelector": {"matchLabels": {"app": "x"}}}]}}
    for rules in ({"affinity": anti}, {"topologySpreadConstraints": [spread]},
                  {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "c"}}]},
                  {"containers": [{"name": "c", "ports": [{"containerPort": 1,
                                                          "hostPort": 1}]}]}):
        assert "schedulingGates" not in job_with(**rules)["spec"]["template"]["spec"], rules
    soft = {**spread, "whenUnsatisfiable": "ScheduleAnyway"}
    assert job_with(topologySpreadConstraints=[soft])["spec"]["template"]["spec"][
        "schedulingGates"] == [{"name": PLACEMENT_GATE}]


def test_a_wrapped_pod_seen_before_its_dispatch_was_recorded_is_let_go() -> None:
    """A wrapped Pod is created by the dispatch itself: its watch event may come before
    the gang counts as dispatched, and held at the gate it sends no other (found on the
    local cluster: such a pod waited forever)."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        bare = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "resources": {
                    "limits": {"nvidia.com/gpu": 8}}}]}}
        kube.put(appwrapper("a", bare))
        d = await pinning(kube, clock)
        await d.cycle()
        t = d.tracked[("team", "a")]
        created = kube.get("v1", "Pod", "team", "p")
        assert created is not None and created["spec"]["schedulingGates"]
        phase, t.phase = t.phase, "queued"  # the event as it came, before the dispatch
        d.on_pod("ADDED", copy.deepcopy(created))
        t.phase = phase
        for _ in range(2):
            await d.cycle()
        assert pinned_to(seen(kube, d, "p")) == ["n1"]

    run(scenario)


def test_a_gang_whose_pod_was_let_onto_a_node_that_went_is_requeued_at_once() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, _ = await two_pods_let_go(kube, clock)
        d.on_node("DELETED", node("n1"))
        await d.cycle()
        assert "PreemptCandidate" in [c["type"] for c in
                                      aw_status(kube, "a").get("conditions", [])]
        assert kube.get("batch/v1", "Job", "team", "a") is None  # torn down, not left

    run(scenario)


def test_a_gang_whose_room_went_with_a_node_and_fits_nowhere_else_is_requeued() -> None:
    """Held anyway, its room would be promised twice (the full-size node-deletion fault
    test: 2-3 GPUs over what the nodes left had, for 8 s)."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(node("n2"))
        kube.put(appwrapper("a", one_pod_job("a")))
        d = await pinning(kube, clock)
        await d.cycle()
        (planned,) = d.state.reserved_for(("team", "a"))
        other = "n2" if planned.node == "n1" else "n1"
        hog = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "hog", "namespace": "team"},
               "spec": {"nodeName": other, "containers": [{"name": "c", "resources": {
                   "limits": {"nvidia.com/gpu": 8}}}]}, "status": {"phase": "Running"}}
        arrive(kube, d, hog)
        d.on_node("DELETED", node(planned.node))
        await d.cycle()
        assert "PreemptCandidate" in [c["type"] for c in
                                      aw_status(kube, "a").get("conditions", [])]
        assert d.state.reserved_for(("team", "a")) == []

    run(scenario)


def node_named_job(name: str, on: str) -> dict[str, Any]:
    job = one_pod_job(name)
    job["spec"]["template"]["spec"]["nodeName"] = on
    return job


async def made_by_job_controller(kube: FakeKube, d: Dispatcher, job: dict[str, Any],
                                 name: str) -> dict[str, Any]:
    """The Job controller creates a pod from the Job's template, through the API (which
    refuses a node name beside a scheduling gate), and the watch brings it."""
    pod = gated_pod(job, name)
    made: dict[str, Any] = await kube.request("POST", "/api/v1/namespaces/team/pods", pod)
    d.on_pod("ADDED", copy.deepcopy(made))
    return made


def test_a_template_that_names_its_node_makes_pods_that_run_there() -> None:
    """Issue 31 item 7: the gate went on a template with spec.nodeName, the API server
    refused every pod made from it ("cannot be set until all schedulingGates have been
    cleared"), and the wrapper was requeued for ever. Such a pod is never scheduled: the
    fit plans it on its node alone (n2, though n1 is as free), and it goes there as made."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(node("n2"))
        kube.put(appwrapper("a", node_named_job("a", "n2")))
        d = await pinning(kube, clock)
        await d.cycle()
        assert [p.node for p in d.state.reserved_for(("team", "a"))] == ["n2"]
        job = created_job(kube, "a")
        template = job["spec"]["template"]["spec"]
        assert template["nodeName"] == "n2" and "schedulingGates" not in template
        made = await made_by_job_controller(kube, d, job, "a-0")
        assert made["spec"]["nodeName"] == "n2"
        made["status"]["phase"] = "Running"
        d.on_pod("MODIFIED", copy.deepcopy(made))
        await d.cycle()
        assert aw_status(kube, "a")["state"] == "Running"
        assert d.state.reserved_for(("team", "a")) == []  # its pod holds the room now

    run(scenario)


def test_a_wrapped_pod_that_names_its_node_is_created() -> None:
    """The same for a Pod item, which the dispatcher creates itself: it failed with
    ItemCreationFailure quoting the API server."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                  "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}}))
        d = await pinning(kube, clock)
        await d.cycle()
        assert aw_status(kube, "a")["state"] == "Running"
        made = kube.get("v1", "Pod", "team", "p")
        assert made is not None and made["spec"]["nodeName"] == "n1"

    run(scenario)
