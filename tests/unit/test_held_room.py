"""A gang's pods take the room their gang holds by amount, whatever pod shapes the
AppWrapper declared (custompodresources): MCAD's own GLUE example declares 2 pods of
3 cpu / 16G / 1 GPU for a RayCluster whose pods are a GPU-less head and one worker."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api.models import parse_appwrapper
from dispatcher.cluster import ClusterState
from dispatcher.cluster.model import BoundPod, Node
from dispatcher.cluster.state import PlannedPod
from dispatcher.controller.items.shaping import PLACEMENT_GATE
from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.controller.pods.pod_pinning import PodPinning
from dispatcher.kinds.checks import warnings
from dispatcher.lifecycle import PODS_UNPLACEABLE

from .fake_kube import FakeKube
from .test_admission_review import ALICE, admitted, reviewer
from .test_placement import arrive, gated_pod, pinned_to, pinning, seen
from .test_pod_pinning import Leading, applied, creating
from .test_runtime import Clock, appwrapper, aw_status, created_job, run, types

GIB = 1024 ** 3
GPU = "nvidia.com/gpu"
# The GLUE example's declared pod, its head and its worker (here asking 2 GPUs, as the
# blog's worker does), in canonical units.
DECLARED = {"cpu": 3000, "memory": 16 * 10 ** 9, GPU: 1, "pods": 1}
HEAD = {"cpu": 2000, "memory": 16 * 10 ** 9, "pods": 1}
WORKER = {"cpu": 4000, "memory": 16 * 10 ** 9, GPU: 2, "pods": 1}
OWNER = ("team", "glue")


def gpu_node(name: str = "v100", gpus: int = 2, cpu: int = 8000) -> Node:
    return Node(name, {"cpu": cpu, "memory": 61 * GIB, GPU: gpus, "pods": 110})


def glue_hold(state: ClusterState, node: str = "v100") -> None:
    state.reserve(OWNER, [PlannedPod(node, DECLARED), PlannedPod(node, DECLARED)])


def overdrawn(state: ClusterState) -> dict[str, dict[str, int]]:
    """Nodes promised or given more than they have, and by how much."""
    out = {}
    for name in state.nodes:
        short = {r: -v for r, v in state.free(name).items() if v < 0}
        if short:
            out[name] = short
    return out


def test_the_glue_worker_takes_its_gangs_two_declared_pods_on_one_node() -> None:
    state = ClusterState()
    state.upsert_node(gpu_node())
    state.upsert_node(Node("cpu", {"cpu": 16000, "memory": 64 * GIB, "pods": 110}))
    glue_hold(state)
    assert state.pin(OWNER, ("team", "worker"), WORKER) == "v100"
    assert state.pin(OWNER, ("team", "head"), HEAD) == "v100"
    assert overdrawn(state) == {}
    # Both bind where pinned: nothing is held for the gang any more but what is left of
    # its declared room (none: 2 x 3 cpu = 2 + 4 cpu).
    state.upsert_pod(("team", "worker"), BoundPod("team", "worker", "v100", WORKER, "glue"))
    state.upsert_pod(("team", "head"), BoundPod("team", "head", "v100", HEAD, "glue"))
    assert [dict(p.request) for p in state.reserved_for(OWNER)] == []
    assert overdrawn(state) == {}


def test_what_a_pod_takes_comes_off_the_hold_so_the_rest_still_protects_the_gang() -> None:
    state = ClusterState()
    state.upsert_node(gpu_node(gpus=4, cpu=12000))
    state.reserve(OWNER, [PlannedPod("v100", DECLARED) for _ in range(4)])
    assert state.pin(OWNER, ("team", "w-0"), WORKER) == "v100"
    held = state.held_on(OWNER)["v100"]
    assert held[GPU] == 2 and held["pods"] == 3  # two GPUs left for the rest of the gang
    # Another gang sees the node full: the rest of the hold is still promised.
    assert state.free("v100")[GPU] == 0
    assert state.pin(OWNER, ("team", "w-1"), WORKER) == "v100"
    assert state.pin(OWNER, ("team", "w-2"), WORKER) is None  # nothing is left of it


def test_a_pod_takes_free_room_only_beyond_what_its_gang_holds_there() -> None:
    state = ClusterState()
    state.upsert_node(gpu_node(gpus=2, cpu=8000))
    state.reserve(OWNER, [PlannedPod("v100", {"cpu": 1000, GPU: 1, "pods": 1})])
    bigger = {"cpu": 2000, GPU: 2, "pods": 1}
    # The webhook takes no free room: only the loop may make up what the hold lacks.
    assert state.pin(OWNER, ("team", "p"), bigger, top_up=False) is None
    assert state.pin(OWNER, ("team", "p"), bigger) == "v100"
    assert state.free("v100")[GPU] == 0 and state.free("v100")["cpu"] == 6000
    assert overdrawn(state) == {}


def test_a_pod_without_a_gpu_takes_free_room_before_room_held_for_gpu_pods() -> None:
    state = ClusterState()
    state.upsert_node(gpu_node(cpu=10000))
    glue_hold(state)
    # Free cpu serves the head (the loop then gives it free room): the cpu held beside
    # the GPUs is not taken from the worker.
    assert state.pin(OWNER, ("team", "head"), HEAD) is None
    state.reserve_more(OWNER, [PlannedPod("v100", HEAD)])  # what the loop holds for it
    assert state.pin(OWNER, ("team", "head"), HEAD) == "v100"
    assert state.pin(OWNER, ("team", "worker"), WORKER, top_up=False) == "v100"
    # With no free cpu left, the head takes what it needs of the GPU pods' hold.
    tight = ClusterState()
    tight.upsert_node(gpu_node(cpu=6000))
    tight.reserve(OWNER, [PlannedPod("v100", DECLARED), PlannedPod("v100", DECLARED)])
    assert tight.pin(OWNER, ("team", "head"), HEAD) == "v100"
    assert tight.held_on(OWNER)["v100"][GPU] == 2


def test_a_pod_with_no_room_in_hold_or_free_is_not_pinned() -> None:
    state = ClusterState()
    state.upsert_node(gpu_node())
    glue_hold(state)
    assert state.pin(OWNER, ("team", "huge"), {**WORKER, GPU: 3}) is None
    assert state.held_on(OWNER) == {"v100": {"cpu": 6000, "memory": 32 * 10 ** 9, GPU: 2,
                                             "pods": 2}}


# --- properties -----------------------------------------------------------------------

_amounts = st.fixed_dictionaries({"cpu": st.integers(0, 8), GPU: st.integers(0, 4)})


@settings(max_examples=200, deadline=None)
@given(held=st.lists(st.tuples(st.integers(0, 2), _amounts), min_size=1, max_size=6),
       pods=st.lists(st.tuples(_amounts, st.booleans(), st.booleans()), max_size=8),
       free=st.tuples(st.integers(0, 8), st.integers(0, 4)))
def test_never_more_bound_or_promised_on_a_node_than_it_has(
        held: list[tuple[int, dict[str, int]]],
        pods: list[tuple[dict[str, int], bool, bool]], free: tuple[int, int]) -> None:
    """Whatever the hold and the pods, pinning (with or without free room) and binding
    where pinned never leave a node promised more than it has."""
    state = ClusterState()
    hold = [PlannedPod(f"n{i}", {**amount, "pods": 1}) for i, amount in held]
    for i in range(3):
        total = {"cpu": free[0], GPU: free[1], "pods": 110}
        for p in hold:
            if p.node == f"n{i}":
                total = {r: total.get(r, 0) + v for r, v in p.request.items()}
        state.upsert_node(Node(f"n{i}", total))
    state.reserve(OWNER, hold)
    assert overdrawn(state) == {}
    for j, (amount, top_up, binds) in enumerate(pods):
        key = ("team", f"p{j}")
        request = {**amount, "pods": 1}
        node = state.pin(OWNER, key, request, top_up=top_up)
        assert overdrawn(state) == {}
        if node is not None and binds:
            state.upsert_pod(key, BoundPod("team", key[1], node, request, "glue"))
            assert overdrawn(state) == {}


def _split(total: Mapping[str, int], cuts: list[tuple[int, int]]) -> list[dict[str, int]]:
    """`total` shared out into len(cuts) + 1 pods (each cut a share of cpu and GPUs)."""
    pods, left = [], dict(total)
    for cpu, gpu in cuts:
        share = {"cpu": min(cpu, left["cpu"]), GPU: min(gpu, left[GPU])}
        left = {r: left[r] - share[r] for r in left}
        pods.append(share)
    return [*pods, left]


@settings(max_examples=200, deadline=None)
@given(declared=st.lists(_amounts, min_size=1, max_size=5),
       cuts=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 4)), max_size=4),
       order=st.randoms(use_true_random=False))
def test_a_gang_whose_pods_fit_its_hold_in_total_never_waits_on_its_own_hold(
        declared: list[dict[str, int]], cuts: list[tuple[int, int]], order: Any) -> None:
    """Declared pods on one node, real pods that share out the same total another way
    (and no more pods than declared), in any order: each is pinned within the hold,
    taking no free room at all (as the pod webhook does)."""
    total = {"cpu": sum(d["cpu"] for d in declared), GPU: sum(d[GPU] for d in declared)}
    real = _split(total, cuts[:len(declared) - 1])
    order.shuffle(real)
    state = ClusterState()
    state.upsert_node(Node("n", {**total, "pods": len(declared)}))
    state.reserve(OWNER, [PlannedPod("n", {**d, "pods": 1}) for d in declared])
    for j, amount in enumerate(real):
        assert state.pin(OWNER, ("team", f"p{j}"), {**amount, "pods": 1},
                         top_up=False) == "n", (declared, real, j)


# --- the controller -------------------------------------------------------------------

def glue_like(gpus_declared: int, gpus_asked: int) -> dict[str, Any]:
    """A Job of one pod asking `gpus_asked` GPUs, declared as that many pods of 1 GPU
    (or `gpus_declared` pods): custompodresources that do not match the real pod."""
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "glue"},
           "spec": {"parallelism": 1, "completions": 1, "template": {"spec": {
               "containers": [{"name": "c", "resources": {
                   "limits": {GPU: gpus_asked}}}]}}}}
    aw = appwrapper("glue", job, schedulingSpec={"requeuing": {"maxNumRequeuings": 1}})
    aw["spec"]["resources"]["GenericItems"][0]["custompodresources"] = [
        {"replicas": gpus_declared, "requests": {GPU: 1}, "limits": {GPU: 1}}]
    return aw


def two_gpu_node(name: str) -> dict[str, Any]:
    alloc = {"cpu": "8", "memory": "61Gi", "pods": "110", GPU: "2"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": alloc, "capacity": alloc}}


async def glue_pod_made(kube: FakeKube, clock: Clock, gpus_asked: int,
                        gpus_declared: int = 2) -> Dispatcher:
    """Two 2-GPU nodes; `glue_like` with 2 declared GPUs dispatched, its pod made and
    one loop pass over it."""
    kube.put(two_gpu_node("v100"))
    kube.put(two_gpu_node("p100"))
    kube.put(glue_like(gpus_declared=gpus_declared, gpus_asked=gpus_asked))
    d = await pinning(kube, clock)
    await d.cycle()
    arrive(kube, d, gated_pod(created_job(kube, "glue"), "glue-0"))
    await d.cycle()
    return d


def test_a_pod_asking_its_gangs_declared_gpus_at_once_is_let_onto_their_node() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(two_gpu_node("v100"))
        kube.put(glue_like(gpus_declared=2, gpus_asked=2))
        d = await pinning(kube, clock)
        await d.cycle()
        assert types(kube, "glue")[-1] == "Dispatched"
        arrive(kube, d, gated_pod(created_job(kube, "glue"), "glue-0"))
        await d.cycle()
        pod = seen(kube, d, "glue-0")
        assert "schedulingGates" not in pod["spec"]
        assert pinned_to(pod) == ["v100"]

    run(scenario)


def test_a_pod_that_fits_neither_hold_nor_free_room_is_told_then_requeued() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        # 4 GPUs declared as 4 one-GPU pods, held 2 and 2 on two nodes; its one pod asks
        # all 4 on one node, which no node has.
        d = await glue_pod_made(kube, clock, gpus_asked=4, gpus_declared=4)
        await d.cycle()
        assert seen(kube, d, "glue-0")["spec"]["schedulingGates"] == [
            {"name": PLACEMENT_GATE}]
        status = aw_status(kube, "glue")
        assert types(kube, "glue")[-1] == "Dispatched"
        assert "pod glue-0 asks 4 nvidia.com/gpu" in status["message"]
        assert "2 nvidia.com/gpu" in status["message"]  # what the gang holds, and where
        assert "declared 4 x (1 nvidia.com/gpu" in status["message"]
        await asyncio.sleep(0)
        events = [e for e in kube.of_kind("Event") if e["reason"] == PODS_UNPLACEABLE]
        assert len(events) == 1 and "glue-0" in events[0]["message"]
        writes = len(kube.writes)
        await d.cycle()
        assert len(kube.writes) == writes  # told once, not at every cycle
        clock.now += 60  # the admission grace
        await d.cycle()
        assert "PreemptCandidate" in types(kube, "glue")
        assert aw_status(kube, "glue")["numberOfRequeueings"] == 1
        assert kube.get("batch/v1", "Job", "team", "glue") is None  # torn down

    run(scenario)


def test_the_pod_webhook_pins_by_amount_within_the_hold() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(two_gpu_node("v100"))
        kube.put(glue_like(gpus_declared=2, gpus_asked=2))
        d = await pinning(kube, clock)
        await d.cycle()
        d.ready = True
        hook = PodPinning(Leading(d).pins)
        pod = gated_pod(created_job(kube, "glue"), "glue-0")
        patch = await hook.review(creating(pod, "uid-1"))
        assert patch is not None
        assert pinned_to(applied(creating(pod, "uid-1")["object"], patch)) == ["v100"]

    run(scenario)


def test_after_a_restart_a_gang_whose_pods_do_not_match_its_declaration_holds_no_more(
        ) -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d = await glue_pod_made(kube, clock, gpus_asked=2)
        (where,) = pinned_to(seen(kube, d, "glue-0"))
        # kill -9: a new process lists everything; the pod, let onto its node, is not
        # bound yet.
        d2 = await pinning(kube, clock)
        await d2.cycle()
        held = [(p.node, dict(p.request)) for p in d2.state.reserved_for(("team", "glue"))]
        # Its one pod uses both declared GPUs: that is all its gang holds.
        assert held == [(where, {GPU: 2, "pods": 1})]
        other = "p100" if where == "v100" else "v100"
        assert d2.state.free(other)[GPU] == 2

    run(scenario)


def test_declared_pods_unlike_the_real_ones_get_a_warning_at_apply() -> None:
    aw = glue_like(gpus_declared=1, gpus_asked=2)
    # As many pods, as many GPUs, other amounts: accepted as MCAD does, with a warning.
    aw["spec"]["resources"]["GenericItems"][0]["custompodresources"] = [
        {"replicas": 1, "requests": {GPU: 2, "cpu": "1"}}]
    found = warnings(parse_appwrapper(aw))
    assert len(found) == 1
    assert "declares 1 x (2 nvidia.com/gpu, 1 cpu" in found[0]
    assert "will create" in found[0] and "1 x (2 nvidia.com/gpu)" in found[0]
    matching = glue_like(gpus_declared=1, gpus_asked=1)
    assert warnings(parse_appwrapper(matching)) == []

    aw["metadata"]["namespace"] = "team-a"
    _, verdict = admitted(reviewer()[0], aw, ALICE)
    answer = verdict.response("u")
    assert answer["allowed"] is True
    assert any("custompodresources" in w for w in answer["warnings"])


def test_declaring_fewer_gpus_than_the_pods_ask_is_refused_at_apply() -> None:
    aw = glue_like(gpus_declared=1, gpus_asked=2)
    aw["metadata"]["namespace"] = "team-a"
    _, verdict = admitted(reviewer()[0], aw, ALICE)
    answer = verdict.response("u")
    assert answer["allowed"] is False
    assert ("declares 1 nvidia.com/gpu in all, but Job glue will create 1 pod asking "
            "2 nvidia.com/gpu in all") in answer["status"]["message"]


def test_pods_the_objects_make_beyond_what_was_declared_get_free_room() -> None:
    """MCAD's 0006 manifest declares one pod for a Job of parallelism 3: the two pods it
    holds no room for take free room (as kube-scheduler would under MCAD)."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(two_gpu_node("v100"))
        aw = glue_like(gpus_declared=1, gpus_asked=0)
        item = aw["spec"]["resources"]["GenericItems"][0]
        item["custompodresources"] = [{"replicas": 1, "requests": {"cpu": "1"}}]
        item["generictemplate"]["spec"].update(parallelism=2, completions=2)
        item["generictemplate"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {
            "requests": {"cpu": "1"}}
        kube.put(aw)
        d = await pinning(kube, clock)
        await d.cycle()
        for i in range(2):
            arrive(kube, d, gated_pod(created_job(kube, "glue"), f"glue-{i}"))
        await d.cycle()
        assert [pinned_to(seen(kube, d, f"glue-{i}")) for i in range(2)] == [["v100"]] * 2

    run(scenario)


def test_a_pod_asking_more_gpus_than_its_gang_was_admitted_with_stays_gated() -> None:
    """The wrapped object's pods come to ask 4 GPUs where 2 were declared and admitted (an
    object edited after dispatch, a kind the dispatcher cannot count): with 6 GPUs free on
    the node, the pod still gets none of them, and the AppWrapper says why."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        alloc = {"cpu": "32", "memory": "256Gi", "pods": "110", GPU: "8"}
        kube.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "big"},
                  "status": {"allocatable": alloc, "capacity": alloc}})
        kube.put(glue_like(gpus_declared=2, gpus_asked=2))
        d = await pinning(kube, clock)
        await d.cycle()
        pod = gated_pod(created_job(kube, "glue"), "glue-0")
        pod["spec"]["containers"][0]["resources"] = {"limits": {GPU: 4}}
        arrive(kube, d, pod)
        await d.cycle()
        await d.cycle()
        assert seen(kube, d, "glue-0")["spec"]["schedulingGates"] == [
            {"name": PLACEMENT_GATE}]
        message = aw_status(kube, "glue")["message"]
        assert message.startswith("pod glue-0 asks 4 nvidia.com/gpu")
        assert ("2 nvidia.com/gpu more than its gang was admitted with, less what its "
                "other pods take (the AppWrapper declared 2 x (1 nvidia.com/gpu") in message
        assert d.state.free("big")[GPU] == 6  # 2 held for the gang, the rest left to others

    run(scenario)
