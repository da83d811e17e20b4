"""Preemption of whole gangs as decisions of the core: who goes, per node, and the held room."""

from __future__ import annotations

import pytest

from dispatcher.admission import AWAITING_PREEMPTION, QUOTA_EXCEEDED
from dispatcher.cluster import PlannedPod
from dispatcher.fit import FRAGMENTED, INSUFFICIENT
from dispatcher.preemption import Hold, apply_holds
from dispatcher.queue import Policy
from dispatcher.queue.policy import PolicyError, policy_from_mapping

from .builders import GPU, capacity, node
from .quota_world import World, appwrapper, subtree

PREEMPT = Policy("preempt", order="priority", preemption="lowerPriority")
RECLAIM = Policy("reclaim", order="priority", preemption="reclaim")
NEVER = Policy("never", order="priority")


def gpu_nodes(n: int) -> list[object]:
    return [node(f"n{i}", gpu=8) for i in range(n)]


def test_a_high_priority_job_tears_down_a_low_priority_one_that_holds_every_gpu() -> None:
    """The MCAD blog's second requirement, without quotas: priority spans the cluster."""
    w = World(gpu_nodes(4), PREEMPT)  # type: ignore[arg-type]
    w.submit(appwrapper("raycluster", gpu=8, pods=4, priority=0))
    w.settle()
    w.submit(appwrapper("pytorchjob", gpu=8, pods=2, priority=10))
    decisions = w.cycle()
    d = next(x for x in decisions if x.name == "pytorchjob")
    assert (d.decision, d.preempts) == ("preempt", (("test", "raycluster"),))
    assert d.message.startswith("dispatch after preempting test/raycluster (lower priority); "
                                "then all 2 pods fit: on ")
    w.settle()
    assert w.is_running("pytorchjob") and not w.is_running("raycluster")
    w.complete("pytorchjob")
    w.settle()
    assert w.is_running("raycluster")  # requeued whole, runs again once the room is back


def test_the_never_policy_preempts_nothing() -> None:
    w = World(gpu_nodes(1), NEVER)  # type: ignore[arg-type]
    w.submit(appwrapper("low", gpu=8))
    w.settle()
    w.submit(appwrapper("high", gpu=8, priority=10))
    last = w.settle()
    assert last[("test", "high")].reason == INSUFFICIENT and w.is_running("low")


def test_victims_are_chosen_per_node_not_by_the_total_freed() -> None:
    """n0 holds `whole` (6 GPUs); n1 holds `cheap` (3, the cheapest: most recent) and a
    priority-9 wrapper. An 8-GPU pod needs a whole node: only `whole` can free one, so
    only `whole` goes -- `cheap` would add to the total freed but to no node that helps."""
    w = World(gpu_nodes(2), PREEMPT)  # type: ignore[arg-type]
    for name, gpus, prio in (("whole", 6, 0), ("cheap", 3, 0), ("keep", 3, 9)):
        w.submit(appwrapper(name, gpu=gpus, priority=prio))
        w.settle()
    assert {p.node for p in w.state.holdings(("test", "whole"))} == {"n0"}
    assert {p.node for p in w.state.holdings(("test", "cheap"))} == {"n1"}
    w.submit(appwrapper("big", gpu=8, priority=5))
    d = next(x for x in w.cycle() if x.name == "big")
    assert d.decision == "preempt" and d.preempts == (("test", "whole"),)
    assert {p.node for p in d.placements} == {"n0"}


def test_among_equals_the_most_recently_admitted_goes() -> None:
    """Least work lost: of two priority-0 gangs of 5 GPUs on their own nodes, the newer."""
    w = World(gpu_nodes(2), PREEMPT)  # type: ignore[arg-type]
    w.submit(appwrapper("older", gpu=5))
    w.settle()
    w.submit(appwrapper("newer", gpu=5))
    w.settle()
    w.submit(appwrapper("big", gpu=8, priority=5))
    d = next(x for x in w.cycle() if x.name == "big")
    assert d.preempts == (("test", "newer"),)


def test_a_preemption_that_cannot_make_it_fit_is_not_made() -> None:
    w = World(gpu_nodes(2), PREEMPT)  # type: ignore[arg-type]
    w.submit(appwrapper("same", gpu=8, priority=5))
    w.submit(appwrapper("low", gpu=8, priority=0))
    w.settle()
    w.submit(appwrapper("two-nodes", gpu=8, pods=2, priority=5))  # only `low` may go
    last = w.settle()
    assert last[("test", "two-nodes")].decision == "wait"
    assert w.is_running("low") and w.is_running("same")


def test_a_minimum_running_time_protects_a_victim() -> None:
    guarded = Policy("guarded", order="priority", preemption="lowerPriority",
                     min_running_seconds=60)
    w = World(gpu_nodes(1), guarded)  # type: ignore[arg-type]
    w.submit(appwrapper("low", gpu=8))
    w.settle()
    w.submit(appwrapper("high", gpu=8, priority=10))
    assert next(x for x in w.cycle() if x.name == "high").decision == "wait"
    w.now += 60
    assert next(x for x in w.cycle() if x.name == "high").decision == "preempt"


def test_the_freed_room_is_held_for_the_preemptor_until_the_victims_pods_are_gone() -> None:
    """Under backfill, so that only the hold keeps the small wrapper out of the room."""
    backfill = Policy("bf", order="priority", backfill=True, preemption="lowerPriority")
    w = World(gpu_nodes(1), backfill, instant_teardown=False)  # type: ignore[arg-type]
    w.submit(appwrapper("low", gpu=6))
    w.settle()
    w.submit(appwrapper("high", gpu=8, priority=10))
    w.submit(appwrapper("small", gpu=2, priority=1))
    decisions = {d.name: d for d in w.cycle()}
    assert decisions["high"].decision == "preempt"
    assert decisions["small"].decision == "wait"  # the 2 free GPUs went to the hold
    # The victim is gone from the API, its pods still terminate: the preemptor waits for
    # them, and the small wrapper still does not get the 2 free GPUs.
    decisions = {d.name: d for d in w.cycle()}
    assert (decisions["high"].decision, decisions["high"].reason) == ("wait",
                                                                       AWAITING_PREEMPTION)
    assert decisions["high"].head_of_line
    assert decisions["small"].decision == "wait"
    assert decisions["low"].decision == "wait"
    w.terminate()
    decisions = {d.name: d for d in w.cycle()}
    assert decisions["high"].decision == "dispatch"
    assert "high" not in [k[1] for k in w.holds]


def test_a_hold_is_given_up_after_the_policys_deadline_and_the_queue_moves_on() -> None:
    """The victim's pods never go (a stuck finalizer, a node that stopped answering): the
    room held for the preemptor is held for `max_hold_seconds`, not for ever. Then the
    preemptor waits as any wrapper that does not fit, saying why, and the 2 free GPUs it
    held go to the small wrapper behind it."""
    backfill = Policy("bf", order="priority", backfill=True, preemption="lowerPriority",
                      max_hold_seconds=120)
    w = World(gpu_nodes(1), backfill, instant_teardown=False)  # type: ignore[arg-type]
    w.submit(appwrapper("low", gpu=6))
    w.settle()
    w.submit(appwrapper("high", gpu=8, priority=10))
    w.submit(appwrapper("small", gpu=2, priority=1))
    assert {d.name: d for d in w.cycle()}["high"].decision == "preempt"
    since = w.holds[("test", "high")].since
    w.now = since + 119
    decisions = {d.name: d for d in w.cycle()}
    assert decisions["high"].reason == AWAITING_PREEMPTION
    assert decisions["small"].decision == "wait"
    w.now = since + 120
    decisions = {d.name: d for d in w.cycle()}
    high = decisions["high"]
    assert (high.decision, high.reason) == ("wait", INSUFFICIENT)
    assert high.message.startswith("gave up the room held for it: what it waited for was "
                                   "not gone after 2m; ")
    assert decisions["small"].decision == "dispatch"
    assert not w.holds


def test_a_policy_file_sets_the_hold_deadline_and_every_policy_has_one() -> None:
    assert policy_from_mapping({"name": "p", "preemptionGuard": {
        "maxHoldSeconds": 60}}).max_hold_seconds == 60
    assert policy_from_mapping({"name": "p"}).max_hold_seconds == 300
    with pytest.raises(PolicyError, match="maxHoldSeconds must be a number > 0"):
        policy_from_mapping({"name": "p", "preemptionGuard": {"maxHoldSeconds": 0}})


def test_a_hold_takes_only_free_room_and_gives_its_owner_all_of_it() -> None:
    cap = capacity(node("a", gpu=8))
    cap.take("a", {GPU: 6})  # pods still bound
    held = apply_holds(cap, {("ns", "p"): Hold((PlannedPod("a", {GPU: 8}),))})
    assert cap.free_of("a")[GPU] == 0  # others see nothing, and never less than nothing
    assert held == {("ns", "p"): [("a", {GPU: 2})]}
    two = capacity(node("a", gpu=8))
    apply_holds(two, {("ns", "p"): Hold((PlannedPod("a", {GPU: 3}),))})
    assert two.free_of("a")[GPU] == 5


def test_a_victim_never_preempts_its_preemptor_back() -> None:
    """team-a and team-b share a root of 6 GPUs, 4 each. `big` (priority 5) borrows 2 from
    the root; `small` (priority 0, 2 GPUs) is within team-a's quota and reclaims them.
    Requeued, `big` outranks `small` and sits on its leaf: without the guard it would
    preempt `small`, which would reclaim again, for ever."""
    trees = [subtree("root", "gpu", [("root", {GPU: 6}, False)]),
             subtree("teams", "gpu", [("team-a", {GPU: 4}, False),
                                      ("team-b", {GPU: 4}, False)], parent="root")]
    w = World(gpu_nodes(2), PREEMPT, trees)  # type: ignore[arg-type]
    w.submit(appwrapper("big", {"gpu": "team-a"}, gpu=6, priority=5))
    w.settle()
    w.submit(appwrapper("small", {"gpu": "team-a"}, gpu=2, priority=0))
    w.settle(cycles=8)
    assert w.is_running("small") and not w.is_running("big")
    preemptions = [d for cycle in w.history for d in cycle if d.decision == "preempt"]
    assert [(d.name, d.preempts) for d in preemptions] == [("small", (("test", "big"),))]
    last = w.history[-1]
    assert next(d for d in last if d.name == "big").reason == QUOTA_EXCEEDED


def test_quota_is_a_guarantee_against_other_teams_priority() -> None:
    """team-b runs within its own quota at priority 0; team-a's priority-10 wrapper does not
    fit the cluster, but team-b's wrapper is not on team-a's path: nobody is preempted."""
    trees = [subtree("root", "gpu", [("root", {GPU: 16}, False)]),
             subtree("teams", "gpu", [("team-a", {GPU: 8}, False),
                                      ("team-b", {GPU: 8}, False)], parent="root")]
    w = World(gpu_nodes(1), PREEMPT, trees)  # type: ignore[arg-type]
    w.submit(appwrapper("b", {"gpu": "team-b"}, gpu=8))
    w.settle()
    w.submit(appwrapper("a", {"gpu": "team-a"}, gpu=8, priority=10))
    last = w.settle()
    assert last[("test", "a")].reason == INSUFFICIENT and w.is_running("b")


def test_reclaim_takes_back_borrowed_capacity_whatever_the_borrowers_priority() -> None:
    """team-b's two wrappers fill the only node: the priority-9 one sits on team-b's leaf,
    the priority-5 one borrows team-a's share from the root. team-a's priority-1 wrapper is
    within its quota and takes it back under the reclaim policy (which never preempts by
    priority: the borrower's priority is higher)."""
    trees = [subtree("root", "gpu", [("root", {GPU: 8}, False)]),
             subtree("teams", "gpu", [("team-a", {GPU: 4}, False),
                                      ("team-b", {GPU: 4}, False)], parent="root")]
    w = World(gpu_nodes(1), RECLAIM, trees)  # type: ignore[arg-type]
    w.submit(appwrapper("b-high", {"gpu": "team-b"}, gpu=4, priority=9))
    w.submit(appwrapper("b-borrows", {"gpu": "team-b"}, gpu=4, priority=5))
    w.settle()
    w.submit(appwrapper("a", {"gpu": "team-a"}, gpu=4, priority=1))
    d = next(x for x in w.cycle() if x.name == "a")
    assert d.decision == "preempt" and d.preempts == (("test", "b-borrows"),)
    assert "reclaiming the quota it borrows" in d.message
    w.settle()
    assert w.is_running("a") and w.is_running("b-high")


def test_a_fragmented_wait_names_its_reason_when_nothing_may_go() -> None:
    w = World(gpu_nodes(3), RECLAIM)  # type: ignore[arg-type]
    for name in ("x", "y", "z"):
        w.submit(appwrapper(name, gpu=5))
    w.settle()
    w.submit(appwrapper("big", gpu=8, priority=9))  # no quota: nobody borrows, nobody goes
    last = w.settle()
    assert last[("test", "big")].reason == FRAGMENTED


def test_the_victim_is_the_one_that_loses_the_least_work() -> None:
    """`wide` (5 GPUs) started 100 s after `narrow` (1 GPU on the other node, with 4 GPUs
    of priority 9 beside it): after another 100 s, narrow has run 200 GPU-seconds, wide
    500: narrow goes, though it is older."""
    w = World(gpu_nodes(2), PREEMPT)  # type: ignore[arg-type]
    w.submit(appwrapper("narrow", gpu=1))
    w.submit(appwrapper("keep", gpu=4, priority=9))
    w.settle()
    w.now += 100
    w.submit(appwrapper("wide", gpu=5))
    w.settle()
    assert {p.node for p in w.state.holdings(("test", "wide"))} != {
        p.node for p in w.state.holdings(("test", "narrow"))}
    w.now += 100
    w.submit(appwrapper("four", gpu=4, priority=5))
    d = next(x for x in w.cycle() if x.name == "four")
    assert d.preempts == (("test", "narrow"),)


def test_a_reclaimed_borrower_that_returns_in_the_preemptors_cycle_leaves_it_its_room() -> None:
    """root 7 GPUs over dept 6 (soft: team-a 0, team-b 6 hard) and team-c 0. Two team-a
    wrappers of 1 GPU borrow at dept; `train` of team-b asks for 2 x 3 GPUs within its
    own quota and reclaims both (its name sorts after theirs: see the ledger test of the
    same case). Requeued, `r0` comes back in the cycle `train` dispatches, borrowing from
    the root past the full dept, and `r1` waits: the root is full. Counted again every
    cycle, `train` keeps dept's 6 GPUs and `r0` stays at the root: dept never holds 7
    (found by test_quota_is_never_exceeded_across_cycles)."""
    trees = [subtree("root", "gpu", [("root", {GPU: 7}, False)]),
             subtree("depts", "gpu", [("dept", {GPU: 6}, False), ("team-c", {GPU: 0}, False)],
                     parent="root"),
             subtree("teams", "gpu", [("team-a", {GPU: 0}, False), ("team-b", {GPU: 6}, True)],
                     parent="dept")]
    w = World([node("n0", gpu=2), node("n1", gpu=6)],  # type: ignore[list-item]
              Policy("p", order="priority", backfill=True, preemption="lowerPriority"), trees)
    for name in ("r0", "r1"):
        w.submit(appwrapper(name, {"gpu": "team-a"}, gpu=1))
        w.settle()
    w.submit(appwrapper("train", {"gpu": "team-b"}, gpu=3, pods=2))
    d = next(x for x in w.cycle() if x.name == "train")
    assert (d.decision, d.preempts) == ("preempt", (("test", "r1"), ("test", "r0")))
    assert d.message == ("dispatch after preempting test/r1, test/r0 (reclaiming the quota "
                         "they borrow); then all 2 pods fit: on n1; quota team-b (tree gpu)")
    w.settle()
    for _ in range(3):  # the same answer however often it is counted again
        last = {x.name: x for x in w.cycle()}
        assert w.ledger is not None and w.ledger.over_quota() == []
        assert w.ledger.node_usage("gpu", "dept") == {GPU: 6}
        assert [p.describe() for p in w.ledger.placements(("test", "r0"))] == [
            "team-a (tree gpu) borrowing from root"]
        assert [p.describe() for p in w.ledger.placements(("test", "train"))] == [
            "team-b (tree gpu)"]
        assert sorted(w.running) == [("test", "r0"), ("test", "train")]
        assert (last["r1"].decision, last["r1"].reason) == ("wait", QUOTA_EXCEEDED)
        assert last["r1"].message == ("team-a (tree gpu) would use 1 of its 0 nvidia.com/gpu "
                                      "and cannot borrow: root would use 8 of its 7 "
                                      "nvidia.com/gpu")


def test_a_held_preemptor_behind_a_wrapper_of_its_shape_short_of_quota_dispatches() -> None:
    """team-a is hard at 1 GPU. Under arrival order, `high` (priority 1) preempts `low`
    (priority 0), which is requeued ahead of it. Next cycle `low` is short of quota, for
    `high`'s hold counts; `high`, its hold taken out, fits and dispatches -- it is not
    given `low`'s answer for the same labels and shape, which dropped its hold, let `low`
    back in, and made it preempt again, for ever."""
    trees = [subtree("root", "gpu", [("root", {GPU: 4}, False)]),
             subtree("teams", "gpu", [("team-a", {GPU: 1}, True), ("team-b", {GPU: 3}, False)],
                     parent="root")]
    w = World(gpu_nodes(1), Policy("fifo", order="arrival", preemption="lowerPriority"),
              trees)  # type: ignore[arg-type]
    w.submit(appwrapper("low", {"gpu": "team-a"}, gpu=1))
    w.settle()
    w.submit(appwrapper("high", {"gpu": "team-a"}, gpu=1, priority=1))
    w.settle(cycles=6)
    assert w.is_running("high") and not w.is_running("low")
    preemptions = [(d.name, d.preempts) for cycle in w.history for d in cycle
                   if d.decision == "preempt"]
    assert preemptions == [("high", (("test", "low"),))]
    low = next(d for d in w.history[-1] if d.name == "low")
    assert (low.reason, low.message) == (QUOTA_EXCEEDED, "team-a (tree gpu) would use 2 of its "
                                         "1 nvidia.com/gpu and cannot borrow: hardLimit")
