"""The manager's choice of a worker cluster for a gang (dispatcher.fleet).

- It never picks a worker where the whole gang does not fit per node, and never says none
  fits when one does (checked by counting pods per node: exact for one pod shape).
- Best fit: of the workers that fit, the one left with the fewest free GPUs.
- When none fits, the message names every worker and its best.
- Quota: a worker takes a gang only within its quota trees (borrowing as they allow), with
  the usage its own dispatcher counts plus what the cycle sent there already; the wait
  message names the quota where that is what stops it.
- Topology: a gang that requires a rack goes only to a worker with such a rack free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.fit import Capacity
from dispatcher.fit.topology import Topology
from dispatcher.fleet import (
    Chosen,
    NoneFits,
    SelectorError,
    Worker,
    charge,
    choose,
    dispatch,
    parse_selector,
    take,
    worker_ledger,
)
from dispatcher.kinds.podset import TopologyRequest
from dispatcher.preemption import AdmittedWrapper
from dispatcher.queue import QueuedWrapper
from dispatcher.quota import QuotaLedger

from .builders import GPU, gang, node, pod_set, wrapper
from .quota_world import subtree

RACK = "topology.example.com/rack"


def worker(name: str, *gpus_per_node: int, labels: dict[str, str] | None = None,
           quota: QuotaLedger | None = None, reachable: bool = True,
           racks: Sequence[str] = ()) -> Worker:
    nodes = [node(f"{name}-n{i}", gpu=g, labels={RACK: racks[i]} if racks else None)
             for i, g in enumerate(gpus_per_node)]
    return Worker(name, Capacity(nodes, {n.name: n.allocatable for n in nodes}),
                  labels or {}, quota, reachable)


def team_quota(gold: int, hard: bool = True, root: int = 16,
               admitted: Sequence[AdmittedWrapper] = ()) -> QuotaLedger:
    """Tree `team`: root over gold and silver (8 GPUs), with what `admitted` use."""
    subtrees: list[dict[str, Any]] = [
        subtree("root", "team", [("root", {GPU: root}, False)]),
        subtree("kids", "team", [("gold", {GPU: gold}, hard), ("silver", {GPU: 8}, False)],
                parent="root")]
    ledger = worker_ledger(subtrees, admitted, (), 0.0)
    assert ledger is not None
    return ledger


def gold(name: str, gpus: int = 8, seen: float = 0.0, leaf: str = "gold") -> QueuedWrapper:
    return dataclasses.replace(wrapper(name, pod_set(1, gpu=gpus), seen=seen),
                               labels=(("team", leaf),))


def running(w: QueuedWrapper) -> AdmittedWrapper:
    return AdmittedWrapper(w.namespace, w.name, w.uid, 0.0, w.demand, labels=w.labels)


def fits_by_counting(gpus_per_node: list[int], count: int, gpu: int) -> bool:
    return sum(g // gpu for g in gpus_per_node) >= count


fleet_st = st.lists(st.lists(st.integers(0, 8), min_size=1, max_size=4), min_size=1,
                    max_size=4)


@settings(max_examples=200, deadline=None)
@given(fleet_st, st.integers(1, 4), st.integers(1, 8))
def test_it_picks_a_worker_where_the_gang_fits_and_only_says_none_when_none_does(
        fleet: list[list[int]], count: int, gpu: int) -> None:
    workers = [worker(f"w{i}", *gpus) for i, gpus in enumerate(fleet)]
    answer = choose(gang(pod_set(count, gpu=gpu)), workers)
    fitting = {f"w{i}" for i, gpus in enumerate(fleet) if fits_by_counting(gpus, count, gpu)}
    if fitting:
        assert isinstance(answer, Chosen) and answer.cluster in fitting
        assert len(answer.placements) == count
        # Best fit: no fitting worker is left with fewer free GPUs.
        left = {f"w{i}": sum(gpus) - count * gpu for i, gpus in enumerate(fleet)}
        assert left[answer.cluster] == min(left[w] for w in fitting)
    else:
        assert isinstance(answer, NoneFits)
        for i in range(len(fleet)):
            assert f"w{i}: " in answer.message


@settings(max_examples=100, deadline=None)
@given(fleet_st, st.lists(st.tuples(st.integers(1, 3), st.integers(1, 8)), min_size=1,
                          max_size=6))
def test_a_cycle_never_sends_more_to_a_worker_than_it_holds(
        fleet: list[list[int]], gangs: list[tuple[int, int]]) -> None:
    workers = [worker(f"w{i}", *gpus) for i, gpus in enumerate(fleet)]
    queue = [wrapper(f"aw{j}", pod_set(c, gpu=g), seen=float(j))
             for j, (c, g) in enumerate(gangs)]
    sent: dict[str, int] = {}
    for _, answer in dispatch(queue, workers, now=100.0):
        if isinstance(answer, Chosen):
            for p in answer.placements:
                sent[p.node or ""] = sent.get(p.node or "", 0) + p.request[GPU]
    for i, gpus in enumerate(fleet):
        for n, g in enumerate(gpus):
            assert sent.get(f"w{i}-n{n}", 0) <= g


def test_none_fits_names_each_workers_best_on_one_node() -> None:
    answer = choose(gang(pod_set(2, gpu=8)), [worker("w1", 4, 4), worker("w2", 8, 4, 4)])
    assert isinstance(answer, NoneFits)
    assert "w1: 4 of 8 nvidia.com/gpu free on one node" in answer.message
    # w2 has a node for one pod but not for both: its own reason.
    assert "w2: " in answer.message and "1 of the 2 pods" in answer.message


def test_two_gangs_go_to_different_workers_when_each_fills_one() -> None:
    workers = [worker("w1", 8), worker("w2", 8)]
    queue = [wrapper("a", pod_set(1, gpu=8), seen=1.0), wrapper("b", pod_set(1, gpu=8), seen=2.0)]
    chosen = [a.cluster for _, a in dispatch(queue, workers, now=10.0) if isinstance(a, Chosen)]
    assert sorted(chosen) == ["w1", "w2"]


def test_best_fit_keeps_the_larger_free_worker_whole() -> None:
    answer = choose(gang(pod_set(1, gpu=4)), [worker("big", 8), worker("small", 4)])
    assert isinstance(answer, Chosen) and answer.cluster == "small"


def test_labels_restrict_the_workers_and_say_why_others_are_out() -> None:
    workers = [worker("eu", 8, labels={"region": "eu"}), worker("us", 8, labels={"region": "us"})]
    answer = choose(gang(pod_set(1, gpu=8)), workers, parse_selector("region=us"))
    assert isinstance(answer, Chosen) and answer.cluster == "us"
    workers[1] = worker("us", 2, labels={"region": "us"})
    answer = choose(gang(pod_set(1, gpu=8)), workers, {"region": "us"})
    assert isinstance(answer, NoneFits)
    assert "eu: its labels do not match region=us" in answer.message


def test_unreachable_and_quota_bound_workers_are_passed_over() -> None:
    workers = [worker("w1", 8, reachable=False), worker("w2", 8, quota=team_quota(gold=4))]
    answer = choose(gang(pod_set(1, gpu=8)), workers, labels=(("team", "gold"),))
    assert isinstance(answer, NoneFits)
    assert "w1: unreachable" in answer.message
    assert ("w2: its quota: gold (tree team) would use 8 of its 4 nvidia.com/gpu and cannot "
            "borrow: hardLimit") in answer.message


def test_a_gang_whose_quota_is_full_in_one_worker_goes_to_the_other() -> None:
    # Both have the room; w1 would win the tie, but its gold leaf is full (hard).
    full = team_quota(gold=8, admitted=[running(gold("there"))])
    workers = [worker("w1", 8, quota=full), worker("w2", 8, quota=team_quota(gold=8))]
    queue = [gold("a")]
    [(_, answer)] = dispatch(queue, workers, now=10.0)
    assert isinstance(answer, Chosen) and answer.cluster == "w2"


def test_a_worker_whose_quota_lets_the_gang_borrow_takes_it() -> None:
    # gold is full in w1 but soft, and w1's root has room: the gang borrows there, as
    # w1's dispatcher would let it; w1 is the best fit (fewest GPUs left).
    soft = team_quota(gold=8, hard=False, admitted=[running(gold("there"))])
    workers = [worker("w1", 8, quota=soft), worker("w2", 8, 8, quota=team_quota(gold=8))]
    answer = choose(gang(pod_set(1, gpu=8)), workers, labels=(("team", "gold"),))
    assert isinstance(answer, Chosen) and answer.cluster == "w1"
    # With the root full too, it cannot borrow: the message says which node is full.
    tight = team_quota(gold=8, hard=False, root=8, admitted=[running(gold("there"))])
    answer = choose(gang(pod_set(1, gpu=8)), [worker("w1", 8, quota=tight)],
                    labels=(("team", "gold"),))
    assert isinstance(answer, NoneFits)
    assert "w1: its quota: gold (tree team) would use 16 of its 8" in answer.message
    assert "root would use 16 of its 8 nvidia.com/gpu" in answer.message


def test_a_cycle_counts_what_it_sent_against_the_workers_quota() -> None:
    workers = [worker("w1", 8, 8, quota=team_quota(gold=8)),
               worker("w2", 8, 8, quota=team_quota(gold=8))]
    answers = dispatch([gold("a", seen=1.0), gold("b", seen=2.0), gold("c", seen=3.0)],
                       workers, now=10.0)
    sent = {w.name: a.cluster if isinstance(a, Chosen) else a.message for w, a in answers}
    assert sent["a"] == "w1" and sent["b"] == "w2"  # w1's gold is used by a
    assert "w1: its quota: gold (tree team) would use 16 of its 8" in sent["c"]
    assert "w2: its quota: gold (tree team) would use 16 of its 8" in sent["c"]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 16), st.integers(0, 8)), min_size=1, max_size=3),
       st.lists(st.tuples(st.integers(1, 8), st.sampled_from(["gold", "silver"])),
                min_size=1, max_size=6))
def test_a_cycle_never_sends_a_worker_more_than_its_quota_lets_in(
        fleet: list[tuple[int, int]], gangs: list[tuple[int, str]]) -> None:
    # Room for everything (16 GPUs a node): only quota stops a gang. gold is hard.
    workers = [worker(f"w{i}", 16, 16, 16, quota=team_quota(gold=g, root=r))
               for i, (r, g) in enumerate(fleet)]
    queue = [gold(f"aw{j}", gpus, seen=float(j), leaf=leaf)
             for j, (gpus, leaf) in enumerate(gangs)]
    used = {w.name: {"gold": 0, "silver": 0} for w in workers}
    for w, answer in dispatch(queue, workers, now=100.0):
        leaf, gpus = w.labels[0][1], w.demand[GPU]
        if isinstance(answer, Chosen):
            used[answer.cluster][leaf] += gpus
            continue
        for i, (root, g) in enumerate(fleet):
            # Waits only where the worker's quota stops it, and the message says so.
            u = used[f"w{i}"]
            over_root = sum(u.values()) + gpus > root
            over_gold = leaf == "gold" and u["gold"] + gpus > g  # hard: cannot borrow
            assert over_root or over_gold  # silver (soft) borrows from the root
            assert f"w{i}: its quota: {leaf} (tree team)" in answer.message
    for i, (root, g) in enumerate(fleet):
        assert used[f"w{i}"]["gold"] <= g and sum(used[f"w{i}"].values()) <= root


def rack_gang(pods: int, gpus: int) -> tuple[Any, ...]:
    return gang(dataclasses.replace(pod_set(pods, gpu=gpus),
                                    topology=TopologyRequest(RACK, True)))


def test_a_gang_requiring_a_rack_goes_to_the_worker_with_one_free() -> None:
    # 8 GPUs free in each; only w2 has them in one rack. w1 wins the tie without racks.
    workers = [worker("w1", 4, 4, racks=["r1", "r2"]), worker("w2", 4, 4, racks=["r1", "r1"])]
    queue = [dataclasses.replace(wrapper("a"), gang=rack_gang(2, 4))]
    [(_, answer)] = dispatch(queue, workers, now=10.0, topology=Topology((RACK,)))
    assert isinstance(answer, Chosen) and answer.cluster == "w2"
    workers = [worker("w1", 4, 4, racks=["r1", "r2"])]
    [(_, answer)] = dispatch(queue, workers, now=10.0, topology=Topology((RACK,)))
    assert isinstance(answer, NoneFits) and answer.message.startswith(
        "no worker cluster can take the whole gang now: w1: ")
    assert "rack" in answer.message


def test_a_gang_asking_for_a_level_the_manager_has_not_says_so() -> None:
    queue = [dataclasses.replace(wrapper("a"), gang=rack_gang(1, 4))]
    [(_, answer)] = dispatch(queue, [worker("w1", 8, racks=["r1"])], now=10.0)
    assert isinstance(answer, NoneFits)
    assert f"topology level {RACK!r}, which is not a topology level here" in answer.message


def test_a_bad_selector_says_how_to_write_one() -> None:
    with pytest.raises(SelectorError, match="key=value"):
        parse_selector("region")


def test_room_is_kept_on_a_worker_for_the_pods_of_a_sent_gang_not_bound_yet() -> None:
    from dispatcher.fleet import unbound

    g = gang(pod_set(1, gpu=8, name="master"), pod_set(3, gpu=8, name="worker"))
    assert [(x.pod_set.name, x.pod_set.count) for x in unbound(g, 0)] == [
        ("master", 1), ("worker", 3)]
    assert [(x.pod_set.name, x.pod_set.count) for x in unbound(g, 3)] == [("master", 1)]
    assert unbound(g, 4) == []


def test_simulated_manager_sends_a_job_to_the_free_cluster_where_round_robin_waits() -> None:
    from dispatcher.simulate.clusters import simulate_clusters
    from dispatcher.simulate.traces import TraceJob

    # A long 8-GPU job, then two short ones: round-robin gives the third the first's
    # cluster, where it waits for it; the manager sends it to the free one.
    jobs = [TraceJob(wrapper(f"j{i}", pod_set(1, gpu=8), seen=float(i)), float(i), d, "t")
            for i, d in enumerate((1000.0, 10.0, 10.0))]
    results = {m: simulate_clusters(jobs, 2, 1, 8, m)
               for m in ("manager", "round-robin", "independent")}
    assert results["manager"].mean_wait < results["round-robin"].mean_wait
    assert results["round-robin"].mean_wait > 300 > results["manager"].mean_wait


def test_gangs_that_ask_for_no_room_spread_over_equal_workers() -> None:
    workers = [worker("w1", 8), Worker("w2", worker("w2", 8).capacity, sent=1)]
    queue = [wrapper(f"cm{i}", seen=float(i)) for i in range(5)]  # nothing to place
    chosen = [a.cluster for _, a in dispatch(queue, workers, now=10.0)
              if isinstance(a, Chosen)]
    # w2 holds one already: w1 first, then turn about.
    assert chosen == ["w1", "w1", "w2", "w1", "w2"]


@settings(max_examples=150, deadline=None)
@given(fleet_st, st.lists(st.tuples(st.integers(1, 3), st.sampled_from([2, 4, 8]),
                                    st.sampled_from(["gold", "silver"])),
                          min_size=1, max_size=12))
def test_a_cycle_answers_each_wrapper_as_trying_them_one_by_one_would(
        fleet: list[list[int]], gangs: list[tuple[int, int, str]]) -> None:
    """A cycle answers like gangs refused earlier in it without trying them again: the
    answers are those of trying each in turn on what the ones before it left."""
    def fleet_now() -> list[Worker]:
        return [worker(f"w{i}", *gpus, quota=team_quota(8, hard=False))
                for i, gpus in enumerate(fleet)]

    queue = [gold(f"aw{j:02d}", c * g, seen=float(j), leaf=leaf) if c == 1 else
             dataclasses.replace(wrapper(f"aw{j:02d}", pod_set(c, gpu=g), seen=float(j)),
                                 labels=(("team", leaf),))
             for j, (c, g, leaf) in enumerate(gangs)]
    answers = dispatch(queue, fleet_now(), now=100.0)
    workers = fleet_now()
    for w, answer in answers:
        one_by_one = choose(w.gang, workers, {}, w.labels)
        assert answer == one_by_one
        if isinstance(one_by_one, Chosen):
            picked = next(x for x in workers if x.name == one_by_one.cluster)
            take(picked, one_by_one)
            charge(picked.quota, w, 100.0)
            workers = [dataclasses.replace(x, sent=x.sent + (x is picked)) for x in workers]


def test_a_worker_whose_room_cannot_be_worked_with_costs_that_worker_only() -> None:
    """Any error placing the gang in one worker is that worker's answer, not the choice's."""
    def placer(g: Any, cap: Capacity) -> Any:
        if "w1-n0" in cap.names:
            raise OverflowError("Python int too large to convert to C long")
        from dispatcher.fit.gang import place
        return place(g, cap)

    answer = choose(gang(pod_set(1, gpu=8)), [worker("w1", 8), worker("w2", 8)],
                    placer=placer)
    assert isinstance(answer, Chosen) and answer.cluster == "w2"
    none = choose(gang(pod_set(1, gpu=16)), [worker("w1", 8), worker("w2", 8)],
                  placer=placer)
    assert isinstance(none, NoneFits)
    assert "w1: the gang cannot be placed there (OverflowError: Python int too large" \
        in none.message and "w2: 8 of 16 nvidia.com/gpu free on one node" in none.message


def test_a_worker_the_manager_cannot_read_takes_nothing_and_the_wait_says_so() -> None:
    broken = dataclasses.replace(worker("w1", 8), problem="counting its free room failed")
    answer = choose(gang(pod_set(1, gpu=8)), [broken])
    assert isinstance(answer, NoneFits)
    assert answer.message == ("no worker cluster can take the whole gang now: w1: the manager "
                              "cannot use what it holds (its WorkerCluster's status says why)")


def waiting_copy(state: str = "Pending", made: str = "2027-01-15T08:00:00Z"
                 ) -> dict[str, Any]:
    return {"metadata": {"labels": {"workload.codeflare.dev/manager-uid": "m1"},
                         "creationTimestamp": made},
            "status": {"state": state, "message": "waiting"}}


@pytest.mark.parametrize("state, taken_back", [
    ("", True), ("Pending", True), ("Running", False), ("Completed", False)])
def test_a_copy_that_waited_past_the_bound_is_taken_back_to_be_tried_elsewhere(
        state: str, taken_back: bool) -> None:
    from datetime import datetime

    from dispatcher.fleet import copies

    made = datetime.fromisoformat("2027-01-15T08:00:00+00:00").timestamp()
    copy = waiting_copy(state)
    assert not isinstance(copies.step("w1", "m1", {}, copy, 0, made + 300, 300),
                          copies.TakeBack)  # at the bound: not yet
    step = copies.step("w1", "m1", {}, copy, 1, made + 301, 300)
    assert isinstance(step, copies.TakeBack) == taken_back
    if isinstance(step, copies.TakeBack):
        assert step.elsewhere and step.status == {
            "state": "Pending", "running": 0, "pending": 0,
            "message": "requeued: worker cluster w1 did not start it within 300s (there: "
                       "waiting)"}
    assert not isinstance(copies.step("w1", "m1", {}, copy, 0, made + 10**6, 0),
                          copies.TakeBack)  # no bound: never


def test_a_worker_passed_over_for_a_wrapper_is_said_and_the_others_take_it() -> None:
    w = wrapper("a", pod_set(1, gpu=8))
    out = dispatch([w], [worker("w1", 8), worker("w2", 8)], 0.0, avoid={w.key: {"w1"}})
    assert isinstance(out[0][1], Chosen) and out[0][1].cluster == "w2"
    out = dispatch([w], [worker("w1", 8)], 0.0, avoid={w.key: {"w1"}})
    assert isinstance(out[0][1], NoneFits) and out[0][1].message == (
        "no worker cluster can take the whole gang now: w1: a copy of it did not start "
        "there in time: the others are tried first")
