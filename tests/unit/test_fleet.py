"""The manager's choice of a worker cluster for a gang (dispatcher.fleet).

- It never picks a worker where the whole gang does not fit per node, and never says none
  fits when one does (checked by counting pods per node: exact for one pod shape).
- Best fit: of the workers that fit, the one left with the fewest free GPUs.
- When none fits, the message names every worker and its best.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.fit import Capacity
from dispatcher.fleet import (
    Chosen,
    NoneFits,
    SelectorError,
    Worker,
    choose,
    dispatch,
    parse_selector,
)

from .builders import GPU, gang, node, pod_set, wrapper


def worker(name: str, *gpus_per_node: int, labels: dict[str, str] | None = None,
           quota: dict[str, int] | None = None, reachable: bool = True) -> Worker:
    nodes = [node(f"{name}-n{i}", gpu=g) for i, g in enumerate(gpus_per_node)]
    return Worker(name, Capacity(nodes, {n.name: n.allocatable for n in nodes}),
                  labels or {}, quota, reachable)


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
    workers = [worker("w1", 8, reachable=False), worker("w2", 8, quota={GPU: 4})]
    answer = choose(gang(pod_set(1, gpu=8)), workers)
    assert isinstance(answer, NoneFits)
    assert "w1: unreachable" in answer.message
    assert "w2: its quota leaves 4 of the 8 nvidia.com/gpu the gang needs" in answer.message


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
