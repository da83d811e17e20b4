"""Per-node gang fit: every pod gets a node, or the gang waits with a reason."""

from __future__ import annotations

import pytest

from dispatcher.cluster import BoundPod, PlannedPod, Taint
from dispatcher.fit import (
    FRAGMENTED,
    INSUFFICIENT,
    NEVER_FITS,
    NO_MATCHING_NODE,
    Capacity,
    Placement,
    Shortfall,
    never_fits,
    place,
    place_aggregate,
)
from dispatcher.kinds.podset import PodConstraints, Requirement, Toleration

from .builders import GI, GPU, capacity, cluster, gang, node, pod_set


def placed_nodes(result: list[Placement] | Shortfall) -> list[str | None]:
    assert isinstance(result, list), result
    return [p.node for p in result]


def test_gang_that_fits_gets_one_node_per_pod() -> None:
    cap = capacity(node("a"), node("b"))
    result = place(gang(pod_set(2, gpu=8)), cap)
    assert sorted(placed_nodes(result)) == ["a", "b"]
    assert cap.free["a"][GPU] == 0 and cap.free["b"][GPU] == 0


def test_fragmented_gpus_wait_with_the_message_that_says_so() -> None:
    # 16 GPUs free in total, 2 per node: a pod of 8 has nowhere to go.
    cap = capacity(*(node(f"n{i}", gpu=2) for i in range(8)))
    result = place(gang(pod_set(1, gpu=8)), cap)
    assert isinstance(result, Shortfall)
    assert result.reason == FRAGMENTED
    assert result.message == (
        "16 nvidia.com/gpu free in total, but at most 2 nvidia.com/gpu on any node; "
        "a pod needs 8 nvidia.com/gpu"
    )


def test_aggregate_rule_admits_what_no_node_can_hold() -> None:
    cap = capacity(*(node(f"n{i}", gpu=2) for i in range(8)))
    result = place_aggregate(gang(pod_set(1, gpu=8)), cap)
    assert placed_nodes(result) == [None]
    assert cap.free_total[GPU] == 8


def test_cluster_short_in_total_says_how_much_is_missing() -> None:
    cap = capacity(node("a"), node("b"))
    result = place(gang(pod_set(3, gpu=8)), cap)
    assert isinstance(result, Shortfall)
    assert result.reason == INSUFFICIENT
    assert "needs 24 nvidia.com/gpu, 16 nvidia.com/gpu free" in result.message


def test_failed_gang_takes_nothing() -> None:
    cap = capacity(node("a"), node("b", gpu=4))
    before = {n: dict(f) for n, f in cap.free.items()}
    # Two 6-GPU pods: the first fits on a, the second nowhere.
    result = place(gang(pod_set(2, gpu=6)), cap)
    assert isinstance(result, Shortfall)
    assert cap.free == before
    assert result.reason == FRAGMENTED
    assert result.message.startswith(
        "enough free in total, but only 1 of the 2 pods (")
    assert result.message.endswith(" each) fit on the nodes right now")


def test_best_fit_fills_the_tightest_node_first() -> None:
    cap = capacity(node("big", gpu=8), node("small", gpu=2))
    assert placed_nodes(place(gang(pod_set(1, gpu=2)), cap)) == ["small"]
    # and cpu-only pods go where no GPU would be wasted
    cap = capacity(node("gpu", gpu=8), node("cpu", gpu=0))
    assert placed_nodes(place(gang(pod_set(1, cpu=4)), cap)) == ["cpu"]


def test_largest_pods_are_placed_first() -> None:
    # Small first would put the 2-GPU pod on "eight" and strand the 8-GPU pod.
    cap = capacity(node("eight", gpu=8), node("six", gpu=6))
    result = place(gang(pod_set(1, gpu=2, name="small"), pod_set(1, gpu=8, name="big")), cap)
    by_set = {p.pod_set: p.node for p in result} if isinstance(result, list) else {}
    assert by_set == {"big": "eight", "small": "six"}


def test_pod_count_limit_of_a_node_is_honoured() -> None:
    cap = capacity(node("a", pods=3))
    result = place(gang(pod_set(4, cpu=0.1)), cap)
    assert isinstance(result, Shortfall)
    assert "pods" in result.message


def test_cordoned_node_takes_no_pod_and_is_not_free_capacity() -> None:
    cap = capacity(node("a", unschedulable=True), node("b", gpu=4))
    assert cap.free_total[GPU] == 4
    assert placed_nodes(place(gang(pod_set(1, gpu=4)), cap)) == ["b"]
    assert isinstance(place(gang(pod_set(1, gpu=8)), cap), Shortfall)


@pytest.mark.parametrize(
    ("toleration", "effect", "admitted"),
    [
        (None, "NoSchedule", False),
        (None, "NoExecute", False),
        (None, "PreferNoSchedule", True),
        (Toleration("gpu", "Exists"), "NoSchedule", True),
        (Toleration("gpu", "Equal", "yes"), "NoSchedule", True),
        (Toleration("gpu", "Equal", "no"), "NoSchedule", False),
        (Toleration("gpu", "Exists", effect="NoExecute"), "NoSchedule", False),
        (Toleration("", "Exists"), "NoExecute", True),
        (Toleration("other", "Exists"), "NoSchedule", False),
    ],
)
def test_taints_need_a_matching_toleration(toleration: Toleration | None, effect: str,
                                           admitted: bool) -> None:
    tainted = node("t", taints=(Taint("gpu", "yes", effect),))
    constraints = PodConstraints(tolerations=(toleration,) if toleration else ())
    result = place(gang(pod_set(1, gpu=1, constraints=constraints)), capacity(tainted))
    assert isinstance(result, list) is admitted
    if not admitted:
        assert isinstance(result, Shortfall) and result.reason == NO_MATCHING_NODE


def test_node_selector_picks_the_labelled_node() -> None:
    cap = capacity(node("a100", labels={"gpu": "a100"}), node("v100", labels={"gpu": "v100"}))
    sel = PodConstraints(node_selector=(("gpu", "v100"),))
    assert placed_nodes(place(gang(pod_set(1, gpu=1, constraints=sel)), cap)) == ["v100"]
    none = PodConstraints(node_selector=(("gpu", "h100"),))
    result = place(gang(pod_set(1, gpu=1, constraints=none)), cap)
    assert isinstance(result, Shortfall) and result.reason == NO_MATCHING_NODE
    assert "nodeSelector gpu=h100" in result.message


@pytest.mark.parametrize(
    ("requirement", "expected"),
    [
        (Requirement("zone", "In", ("z1",)), ["z1"]),
        (Requirement("zone", "NotIn", ("z1",)), ["bare", "z2"]),
        (Requirement("zone", "Exists"), ["z1", "z2"]),
        (Requirement("zone", "DoesNotExist"), ["bare"]),
        (Requirement("gen", "Gt", ("3",)), ["z2"]),
        (Requirement("gen", "Lt", ("3",)), ["z1"]),
        (Requirement("metadata.name", "In", ("bare",)), ["bare"]),
    ],
)
def test_required_node_affinity_operators(requirement: Requirement, expected: list[str]) -> None:
    nodes = [
        node("z1", labels={"zone": "z1", "gen": "2"}),
        node("z2", labels={"zone": "z2", "gen": "4"}),
        node("bare"),
    ]
    constraints = PodConstraints(affinity_terms=((requirement,),))
    assert sorted(capacity(*nodes).eligible(constraints)) == expected


def test_affinity_terms_are_ored_and_requirements_anded() -> None:
    nodes = [node("a", labels={"x": "1", "y": "1"}), node("b", labels={"x": "1"})]
    both = PodConstraints(affinity_terms=((Requirement("x", "Exists"),
                                           Requirement("y", "Exists")),))
    either = PodConstraints(affinity_terms=((Requirement("y", "Exists"),),
                                            (Requirement("x", "In", ("1",)),)))
    empty_term = PodConstraints(affinity_terms=((),))
    cap = capacity(*nodes)
    assert cap.eligible(both) == ["a"]
    assert cap.eligible(either) == ["a", "b"]
    assert cap.eligible(empty_term) == []


def test_bound_pods_and_reservations_use_capacity_terminal_pods_do_not() -> None:
    state = cluster(node("a"), node("b"))
    state.upsert_pod(("ns", "p"), BoundPod("ns", "p", "a", {GPU: 6, "pods": 1}))
    state.reserve(("ns", "aw"), [PlannedPod("b", {GPU: 8, "pods": 1})])
    cap = Capacity.of(state)
    assert cap.free["a"][GPU] == 2 and cap.free["b"][GPU] == 0
    # the reserved wrapper's pod binds (elsewhere than planned): capacity is not counted twice
    state.upsert_pod(("ns", "aw-0"), BoundPod("ns", "aw-0", "a", {GPU: 8, "pods": 1}, "aw"))
    assert state.reserved_for(("ns", "aw")) == []
    assert state.free("b")[GPU] == 8 and state.free("a")[GPU] == -6
    # the pod finishes: gone from the books
    state.remove_pod(("ns", "aw-0"))
    state.remove_pod(("ns", "p"))
    assert state.free("a")[GPU] == 8


def test_a_pod_bound_off_plan_moves_the_hold_it_displaced_to_the_room_it_left() -> None:
    # g was planned on a, h on b; the scheduler binds g's pod on b. h's pod will go to a:
    # a is not free for a third gang.
    state = cluster(node("a"), node("b"))
    state.reserve(("ns", "g"), [PlannedPod("a", {GPU: 8, "pods": 1})])
    state.reserve(("ns", "h"), [PlannedPod("b", {GPU: 8, "pods": 1})])
    state.upsert_pod(("ns", "g-0"), BoundPod("ns", "g-0", "b", {GPU: 8, "pods": 1}, "g"))
    assert state.free("a")[GPU] == 0 and state.free("b")[GPU] == 0
    assert [p.node for p in state.reserved_for(("ns", "h"))] == ["a"]
    assert Capacity.of(state).free_total[GPU] == 0
    # h's pod then binds on a: nothing is held any more, nothing is over-committed.
    state.upsert_pod(("ns", "h-0"), BoundPod("ns", "h-0", "a", {GPU: 8, "pods": 1}, "h"))
    assert state.reserved_for(("ns", "h")) == []
    assert state.free("a")[GPU] == 0 and state.free("b")[GPU] == 0


def test_reservation_accounts_for_pods_bound_before_it() -> None:
    # A restarted dispatcher re-reserves a wrapper whose pods are partly bound already.
    state = cluster(node("a"))
    state.upsert_pod(("ns", "aw-0"), BoundPod("ns", "aw-0", "a", {GPU: 4, "pods": 1}, "aw"))
    state.reserve(("ns", "aw"), [PlannedPod("a", {GPU: 4, "pods": 1})] * 2)
    assert len(state.reserved_for(("ns", "aw"))) == 1
    assert state.free("a")[GPU] == 0
    # The same pod updated again does not take a second planned pod.
    state.upsert_pod(("ns", "aw-0"), BoundPod("ns", "aw-0", "a", {GPU: 4, "pods": 1}, "aw"))
    assert len(state.reserved_for(("ns", "aw"))) == 1


def test_never_fits_names_the_empty_cluster() -> None:
    nodes = [node("a"), node("b")]
    empty = Capacity.empty(nodes)
    why = never_fits(gang(pod_set(1, gpu=16)), empty)
    assert why is not None and why.reason == NEVER_FITS
    assert why.message.startswith("would not fit even on an empty cluster: ")
    assert never_fits(gang(pod_set(2, gpu=8)), empty) is None
    assert empty.free["a"][GPU] == 8  # the trial gave back what it took


def test_memory_and_cpu_are_checked_per_node() -> None:
    cap = capacity(node("a", cpu=4, mem_gi=16), node("b", cpu=4, mem_gi=16))
    result = place(gang(pod_set(1, cpu=1, mem_gi=20)), cap)
    assert isinstance(result, Shortfall) and result.reason == FRAGMENTED
    assert "memory" in result.message
    assert placed_nodes(place(gang(pod_set(2, cpu=4, mem_gi=16)), cap)) == ["a", "b"]
    assert cap.free["a"]["memory"] == 0 and cap.free_total["memory"] == 0
    assert GI > 0
