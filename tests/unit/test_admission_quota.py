"""admit() with quota trees: quota before the pods, each dispatch counts, and who holds the line."""

from __future__ import annotations

from dispatcher.admission import BEHIND_HEAD, DISPATCH, QUOTA_EXCEEDED, UNKNOWN_QUOTA, admit
from dispatcher.queue import AdmissionQueue, Policy, QueuedWrapper
from dispatcher.quota import QuotaForest, QuotaLedger

from .builders import GPU, capacity, node, pod_set, wrapper
from .quota_world import World, appwrapper, subtree

FIFO = Policy("fifo", order="arrival")
BACKFILL = Policy("backfill", order="priority", backfill=True)


def forest(hard_a: bool = True) -> QuotaForest:
    """root 16 GPUs over team-a 8 (hard unless said) and team-b 8."""
    return QuotaForest.from_objects([
        subtree("root", "gpu", [("root", {GPU: 16}, False)]),
        subtree("teams", "gpu", [("team-a", {GPU: 8}, hard_a), ("team-b", {GPU: 8}, False),
                                 ("default", {GPU: 0}, False)], parent="root"),
    ])


def labelled(name: str, team: str, gpus: int, seen: float) -> QueuedWrapper:
    w = wrapper(name, pod_set(1, gpu=gpus), seen=seen)
    return QueuedWrapper(w.namespace, w.name, w.uid, w.first_seen, w.gang, labels=(("gpu", team),))


def decide(policy: Policy, ledger: QuotaLedger, *ws: QueuedWrapper, nodes: int = 4
           ) -> dict[str, tuple[str, str, str]]:
    queue = AdmissionQueue(policy)
    for w in ws:
        queue.put(w)
    cap = capacity(*(node(f"n{i}") for i in range(nodes)))
    return {d.name: (d.decision, d.reason, d.message)
            for d in admit(queue.ordered(100), cap, policy, 100, quota=ledger)}


def test_each_dispatch_counts_against_the_quota_of_the_next() -> None:
    ledger = QuotaLedger(forest())
    out = decide(FIFO, ledger, labelled("a1", "team-a", 6, 1), labelled("a2", "team-a", 6, 2))
    assert out["a1"][:2] == ("dispatch", DISPATCH)
    assert out["a2"][:2] == ("wait", QUOTA_EXCEEDED)
    assert out["a2"][2] == ("team-a (tree gpu) would use 12 of its 8 nvidia.com/gpu and cannot "
                            "borrow: hardLimit")
    assert ledger.node_usage("gpu", "team-a") == {GPU: 6}


def test_a_team_short_of_its_own_quota_holds_the_line_for_its_team_only() -> None:
    ledger = QuotaLedger(forest())
    out = decide(FIFO, ledger, labelled("a-big", "team-a", 16, 1),
                 labelled("a-small", "team-a", 1, 2), labelled("b", "team-b", 4, 3))
    assert out["a-big"][:2] == ("wait", QUOTA_EXCEEDED)
    assert out["a-small"] == ("wait", BEHIND_HEAD,
                              "waiting behind default/a-big, which waits for room in quota "
                              "team-a (tree gpu) (fifo policy)")
    assert out["b"][0] == "dispatch"


def test_a_full_root_holds_the_line_for_everyone_under_fifo() -> None:
    ledger = QuotaLedger(forest(hard_a=False))
    out = decide(FIFO, ledger, labelled("a-huge", "team-a", 24, 1),
                 labelled("b", "team-b", 4, 2))
    assert out["a-huge"][:2] == ("wait", QUOTA_EXCEEDED)
    assert out["b"][:2] == ("wait", BEHIND_HEAD)


def test_under_backfill_a_wrapper_short_of_quota_holds_no_line() -> None:
    ledger = QuotaLedger(forest(hard_a=False))
    out = decide(BACKFILL, ledger, labelled("a-huge", "team-a", 24, 1),
                 labelled("a-small", "team-a", 2, 2))
    assert out["a-small"][0] == "dispatch"


def test_labels_naming_no_leaf_wait_without_holding_the_line() -> None:
    ledger = QuotaLedger(forest())
    out = decide(FIFO, ledger, labelled("lost", "team-z", 1, 1), labelled("b", "team-b", 1, 2))
    assert out["lost"][:2] == ("wait", UNKNOWN_QUOTA)
    assert out["b"][0] == "dispatch"


def test_without_a_forest_nothing_changes() -> None:
    ws = [labelled("a1", "team-a", 8, 1), labelled("a2", "team-a", 8, 2)]
    with_empty = decide(FIFO, QuotaLedger(QuotaForest([])), *ws)
    assert [v[0] for v in with_empty.values()] == ["dispatch", "dispatch"]


def test_a_held_preemptor_passes_a_head_that_blocks() -> None:
    """After `boss` preempted `victim`, a higher-priority wrapper arrives; the room is held
    for boss, so the newcomer waits at the head of the line -- and boss, behind it, still
    dispatches into the room held for it."""
    w = World([node("n0")], Policy("p", order="priority", preemption="lowerPriority"))
    w.submit(appwrapper("victim", gpu=8))
    w.settle()
    w.submit(appwrapper("boss", gpu=8, priority=9))
    assert next(d for d in w.cycle() if d.name == "boss").decision == "preempt"
    w.submit(appwrapper("newcomer", gpu=8, priority=20))
    decisions = {d.name: d for d in w.cycle()}
    assert decisions["newcomer"].head_of_line and decisions["newcomer"].decision == "wait"
    assert decisions["victim"].reason == BEHIND_HEAD
    assert decisions["boss"].decision == "dispatch"
