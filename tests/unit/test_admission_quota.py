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


def test_the_admitted_record_of_a_running_appwrapper() -> None:
    from dispatcher.admission import admitted_from_appwrapper, is_admitted
    from dispatcher.api.models import parse_appwrapper
    from dispatcher.cluster import BoundPod, PlannedPod

    manifest = appwrapper("run", {"gpu": "team-a"}, gpu=4, pods=2, priority=3)
    manifest["status"] = {"state": "Running", "systempriority": 3.5, "conditions": [
        {"type": "Dispatched", "status": "True",
         "lastTransitionMicroTime": "2026-11-01T10:00:00.000000Z"}]}
    aw = parse_appwrapper(manifest)
    assert is_admitted(aw)
    state = World([node("n0"), node("n1")], FIFO).state
    state.upsert_pod(("test", "run-0"), BoundPod("test", "run-0", "n0", {GPU: 4}, "run"))
    state.reserve(("test", "run"), [PlannedPod("n0", {GPU: 4}), PlannedPod("n1", {GPU: 4})])
    # The bound pod took the planned pod of its node; the other is reserved, not bound yet.
    holdings = state.holdings(("test", "run"))
    assert sorted(p.node for p in holdings) == ["n0", "n1"]
    record = admitted_from_appwrapper(aw, holdings, now=0.0, preempted=[("test", "x")])
    assert (record.key, record.priority, record.demand[GPU]) == (("test", "run"), 3.5, 8)
    assert record.dispatched_at == 1793527200.0  # 2026-11-01T10:00:00Z
    assert record.labels == (("gpu", "team-a"),) and record.preempted == (("test", "x"),)
    done = parse_appwrapper({**manifest, "status": {"state": "Completed"}})
    assert not is_admitted(done)


def test_preemption_under_the_aggregate_rule_holds_the_totals() -> None:
    """MCAD's rule places no pod: the preemptor's demand is taken from the totals, so a
    later wrapper of the same cycle does not get the room the victim will free."""
    from dispatcher.cluster import PlannedPod
    from dispatcher.preemption import AdmittedWrapper

    cap = capacity(node("n0", gpu=10))
    cap.take_total({GPU: 8})  # low's; 2 GPUs free, which `small` would fit in
    low = AdmittedWrapper("default", "low", "u", 0.0, {GPU: 8, "pods": 1},
                          (PlannedPod("n0", {GPU: 8, "pods": 1}),), 0.0)
    high = QueuedWrapper("default", "high", "uh", 1.0, wrapper("h", pod_set(1, gpu=8)).gang, 9)
    small = QueuedWrapper("default", "small", "us", 2.0, wrapper("s", pod_set(1, gpu=2)).gang, 9)
    policy = Policy("p", order="priority", backfill=True, preemption="lowerPriority")
    out = admit([high, small], cap, policy, 100, "aggregate", admitted=[low])
    assert [(d.name, d.decision) for d in out] == [("high", "preempt"), ("small", "wait")]
    assert out[0].preempts == (("default", "low"),)


def test_a_borrower_counted_again_keeps_rising_past_the_room_a_later_wrapper_took() -> None:
    """root 4 GPUs > dept 2 (soft) > team-a 2 (hard), team-b 2. `a1` of team-a runs;
    `b` of team-b (2) borrows past the full dept from the root; `a2` of team-a (1) fits
    dept's last GPU. When `a1` completes, `b`, admitted before `a2`, fits its own leaf
    again if counted first, which would leave `a2` nowhere under its hard limit and show
    dept at 3 of 2; counted after `a2`, it stays at the root, and a third team-a wrapper
    fits the room `a1` left."""
    trees = [subtree("root", "gpu", [("root", {GPU: 4}, False)]),
             subtree("depts", "gpu", [("dept", {GPU: 2}, False)], parent="root"),
             subtree("teams", "gpu", [("team-a", {GPU: 2}, True), ("team-b", {GPU: 2}, False)],
                     parent="dept")]
    w = World([node("n0", gpu=8)], BACKFILL, trees)
    for name, team, gpus in (("a1", "team-a", 1), ("b", "team-b", 2), ("a2", "team-a", 1)):
        w.submit(appwrapper(name, {"gpu": team}, gpu=gpus))
        w.settle()
    w.complete("a1")
    w.submit(appwrapper("a3", {"gpu": "team-a"}, gpu=1))
    last = w.settle()
    assert (last[("test", "a3")].decision, last[("test", "a3")].message) == (
        "dispatch", "its pod fits: on n0; quota team-a (tree gpu)")
    w.cycle()
    assert w.ledger is not None and w.ledger.over_quota() == []
    assert [p.describe() for p in w.ledger.placements(("test", "b"))] == [
        "team-b (tree gpu) borrowing from root"]
    assert sorted(k[1] for k in w.running) == ["a2", "a3", "b"]
