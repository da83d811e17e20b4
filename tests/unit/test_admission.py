"""One admission cycle under each policy: who dispatches, who waits, and why."""

from __future__ import annotations

from dispatcher.admission import BEHIND_HEAD, DISPATCH, INVALID, CycleStats, Decision, admit
from dispatcher.cluster import BoundPod
from dispatcher.fit import FRAGMENTED, INSUFFICIENT, NEVER_FITS, Capacity
from dispatcher.queue import AdmissionQueue, Policy, QueuedWrapper

from .builders import GPU, capacity, cluster, node, pod_set, wrapper

FIFO = Policy("fifo", order="arrival")
PRIORITY = Policy("priority", order="priority")
BACKFILL = Policy("backfill", order="priority", backfill=True, max_head_wait_seconds=600)


def run(policy: Policy, wrappers: list[QueuedWrapper], cap: Capacity, now: float = 100.0,
        fit: str = "per-node") -> list[Decision]:
    queue = AdmissionQueue(policy)
    for w in wrappers:
        queue.put(w)
    return admit(queue.ordered(now), cap, policy, now, fit)  # type: ignore[arg-type]


def summary(decisions: list[Decision]) -> list[tuple[str, str, str]]:
    return [(d.name, d.decision, d.reason) for d in decisions]


def two_nodes() -> Capacity:
    return capacity(node("a"), node("b"))


def busy_two_nodes() -> Capacity:
    """16 GPUs, 4 of them in use: a 2 x 8 gang could fit, but not now."""
    state = cluster(node("a"), node("b"))
    state.upsert_pod(("x", "p"), BoundPod("x", "p", "a", {GPU: 4, "pods": 1}))
    return Capacity.of(state)


def test_fifo_head_blocks_everything_behind_it() -> None:
    ws = [
        wrapper("small-1", pod_set(1, gpu=4), seen=1),
        wrapper("huge", pod_set(2, gpu=8), seen=2),
        wrapper("small-2", pod_set(1, gpu=4), seen=3, priority=100),
    ]
    decisions = run(FIFO, ws, two_nodes())
    assert summary(decisions) == [
        ("small-1", "dispatch", DISPATCH),
        ("huge", "wait", INSUFFICIENT),
        ("small-2", "wait", BEHIND_HEAD),
    ]
    assert decisions[1].head_of_line
    assert "waiting behind default/huge at the head of the line (fifo policy)" in (
        decisions[2].message)


def test_each_dispatch_uses_up_capacity_for_the_next() -> None:
    ws = [wrapper(f"w{i}", pod_set(1, gpu=8), seen=i) for i in range(3)]
    decisions = run(FIFO, ws, two_nodes())
    assert [d.decision for d in decisions] == ["dispatch", "dispatch", "wait"]
    nodes = {d.placements[0].node for d in decisions[:2]}
    assert nodes == {"a", "b"}


def test_priority_orders_by_priority_then_arrival() -> None:
    ws = [
        wrapper("low", pod_set(1, gpu=8), priority=1, seen=1),
        wrapper("high-late", pod_set(1, gpu=8), priority=5, seen=3),
        wrapper("high-early", pod_set(1, gpu=8), priority=5, seen=2),
    ]
    decisions = run(PRIORITY, ws, two_nodes())
    assert summary(decisions) == [
        ("high-early", "dispatch", DISPATCH),
        ("high-late", "dispatch", DISPATCH),
        ("low", "wait", INSUFFICIENT),
    ]


def test_priority_policy_is_strict_head_of_line() -> None:
    ws = [wrapper("big", pod_set(2, gpu=8), priority=5, seen=1),
          wrapper("small", pod_set(1, gpu=1), priority=1, seen=0)]
    assert summary(run(PRIORITY, ws, busy_two_nodes())) == [
        ("big", "wait", INSUFFICIENT), ("small", "wait", BEHIND_HEAD)]


def test_backfill_dispatches_behind_a_head_that_does_not_fit() -> None:
    ws = [wrapper("big", pod_set(2, gpu=8), priority=5, seen=90),
          wrapper("small", pod_set(1, gpu=1), priority=1, seen=95)]
    decisions = run(BACKFILL, ws, busy_two_nodes(), now=100)
    assert summary(decisions) == [("big", "wait", INSUFFICIENT),
                                  ("small", "dispatch", DISPATCH)]
    assert decisions[0].head_of_line


def test_backfill_starvation_guard_stops_backfill_for_a_long_waiting_head() -> None:
    ws = [wrapper("big", pod_set(2, gpu=8), priority=5, seen=0),
          wrapper("small", pod_set(1, gpu=1), priority=1, seen=650)]
    decisions = run(BACKFILL, ws, busy_two_nodes(), now=700)  # big has waited 700 s > 600 s
    assert summary(decisions) == [("big", "wait", INSUFFICIENT), ("small", "wait", BEHIND_HEAD)]


def test_dynamic_priority_lets_an_old_wrapper_overtake() -> None:
    ws = [wrapper("new-high", pod_set(1, gpu=8), priority=10, seen=1000),
          wrapper("old-sloped", pod_set(1, gpu=8), priority=0, seen=0, slope=0.02)]
    cap = capacity(node("a"))
    assert run(PRIORITY, ws, cap, now=1001)[0].name == "old-sloped"  # 0.02 x 1001 = 20 > 10
    # At t=400 the old one's effective priority is 8, below 10.
    ws2 = [wrapper("new-high", pod_set(1, gpu=8), priority=10, seen=399),
           wrapper("old-sloped", pod_set(1, gpu=8), priority=0, seen=0, slope=0.02)]
    assert run(PRIORITY, ws2, capacity(node("a")), now=400)[0].name == "new-high"
    ws3 = [wrapper("new-high", pod_set(1, gpu=8), priority=10, seen=999),
           wrapper("old-sloped", pod_set(1, gpu=8), priority=0, seen=0, slope=0.02)]
    first = run(PRIORITY, ws3, capacity(node("a")), now=1000)[0]
    assert (first.name, first.effective_priority) == ("old-sloped", 20.0)


def test_a_gang_that_can_never_fit_does_not_hold_the_line() -> None:
    ws = [wrapper("giant", pod_set(1, gpu=16), seen=1),
          wrapper("ok", pod_set(1, gpu=8), seen=2)]
    decisions = run(FIFO, ws, two_nodes())
    assert summary(decisions) == [("giant", "wait", NEVER_FITS), ("ok", "dispatch", DISPATCH)]
    assert not decisions[0].head_of_line


def test_invalid_wrapper_is_reported_and_the_queue_goes_on() -> None:
    ws = [wrapper("bad", seen=1, invalid="spec.resources.GenericItems is empty"),
          wrapper("ok", pod_set(1, gpu=8), seen=2)]
    decisions = run(FIFO, ws, two_nodes())
    assert summary(decisions) == [("bad", "invalid", INVALID), ("ok", "dispatch", DISPATCH)]
    assert decisions[0].message == "spec.resources.GenericItems is empty"


def test_fragmentation_reason_under_per_node_and_dispatch_under_aggregate() -> None:
    def fragmented() -> Capacity:  # 8 nodes of 8 GPUs, 6 in use on each
        state = cluster(*(node(f"n{i}") for i in range(8)))
        for i in range(8):
            state.upsert_pod(("x", f"p{i}"), BoundPod("x", f"p{i}", f"n{i}", {GPU: 6, "pods": 1}))
        return Capacity.of(state)

    ws = [wrapper("needs-8", pod_set(1, gpu=8), seen=1)]
    per_node = run(FIFO, ws, fragmented())
    assert summary(per_node) == [("needs-8", "wait", FRAGMENTED)]
    assert "at most 2 nvidia.com/gpu on any node" in per_node[0].message
    aggregate = run(FIFO, ws, fragmented(), fit="aggregate")
    assert summary(aggregate) == [("needs-8", "dispatch", DISPATCH)]


def test_same_shaped_gangs_reuse_the_first_answer_within_a_cycle() -> None:
    ws = [wrapper("head", pod_set(2, gpu=8), seen=0)] + [
        wrapper(f"w{i}", pod_set(2, gpu=8), seen=i + 1) for i in range(50)]
    queue = AdmissionQueue(BACKFILL)
    for w in ws:
        queue.put(w)
    stats = CycleStats()
    decisions = admit(queue.ordered(10), busy_two_nodes(), BACKFILL, 10, "per-node", stats)
    assert all(d.decision == "wait" and d.reason == INSUFFICIENT for d in decisions)
    assert (stats.fit_checks, stats.cache_hits) == (1, 50)


def test_capacity_left_after_a_cycle_matches_the_dispatches() -> None:
    cap = two_nodes()
    ws = [wrapper("a", pod_set(2, gpu=3), seen=0), wrapper("b", pod_set(1, gpu=5), seen=1)]
    decisions = run(FIFO, ws, cap)
    assert [d.decision for d in decisions] == ["dispatch", "dispatch"]
    assert cap.free_total[GPU] == 16 - 11
