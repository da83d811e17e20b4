"""Properties of elastic gangs, checked from scratch after every cycle of random runs:

- never below its minimum nor above its maximum: every admitted elastic gang runs with a
  count in its range for every elastic set, and its bound pods are that many;
- never a partial minimum: a dispatch places every pod of the gang's minimum (and every
  pod of its other sets) -- never fewer;
- never more than a node has: on every node the requests of the bound pods stay within
  its allocatable, resource by resource;
- never more than the quota allows: growth and shrinking keep every quota node within its
  quota, and nobody borrows past a hard limit.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from dispatcher.preemption import quota_ledger
from dispatcher.queue import Policy

from .builders import node
from .elastic_world import ElasticWorld, pytorchjob
from .quota_world import appwrapper
from .test_preemption_properties import TEAMS, trees

POLICIES = (Policy("priority", order="priority"), Policy("fifo", order="arrival"),
            Policy("preempt", order="priority", preemption="lowerPriority"),
            Policy("backfill", order="priority", backfill=True))

elastic_jobs = st.fixed_dictionaries({
    "low": st.integers(1, 3), "extra": st.integers(1, 4), "gpu": st.sampled_from([2, 4, 8]),
    "priority": st.integers(0, 2), "master": st.booleans()})
plain_jobs = st.fixed_dictionaries({
    "gpu": st.sampled_from([2, 4, 8]), "pods": st.integers(1, 3), "priority": st.integers(0, 2)})
actions = st.lists(st.one_of(
    st.tuples(st.just("elastic"), elastic_jobs),
    st.tuples(st.just("plain"), plain_jobs),
    st.tuples(st.just("complete"), st.integers(0, 20))), min_size=1, max_size=12)


def check(w: ElasticWorld) -> None:
    used: dict[str, Counter[str]] = {}
    for p in w.state.pods():
        used.setdefault(p.node, Counter()).update(p.request)
    for n in w.nodes:
        for r, v in used.get(n.name, Counter()).items():
            assert v <= n.allocatable.get(r, 0), f"{n.name} over {r}"
    for key, r in w.running.items():
        for s in r.wrapper.elastic:
            pods = len(w.sets[key].get(s.name, []))
            assert s.low <= w.counts[key][r.wrapper.elastic.index(s)] == pods <= s.high


def check_dispatches(w: ElasticWorld) -> None:
    for d in w.history[-1]:
        if d.decision != "dispatch":
            continue
        wrapper = w.running[(d.namespace, d.name)].wrapper
        placed = Counter(p.pod_set for p in d.placements)
        lows = {wrapper.gang[s.position].pod_set.name: s.low for s in wrapper.elastic}
        for g in wrapper.gang:
            need = lows.get(g.pod_set.name, g.pod_set.count)
            assert placed[g.pod_set.name] >= need, "a partial minimum"


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 5), st.sampled_from([4, 8]), st.sampled_from(POLICIES), actions)
def test_elastic_gangs_stay_in_range_whole_and_on_their_nodes(
        n: int, gpus: int, policy: Policy, steps: list[tuple[str, Any]]) -> None:
    w = ElasticWorld([node(f"n{i}", gpu=gpus) for i in range(n)], policy)
    for i, (what, arg) in enumerate(steps):
        if what == "elastic":
            w.submit(pytorchjob(f"e{i}", low=arg["low"], high=arg["low"] + arg["extra"],
                                gpu=min(arg["gpu"], gpus), priority=arg["priority"],
                                master=arg["master"]))
        elif what == "plain":
            w.submit(appwrapper(f"p{i}", gpu=min(arg["gpu"], gpus), pods=arg["pods"],
                                priority=arg["priority"]))
        elif w.running:
            names = sorted(w.running)
            w.complete(names[arg % len(names)][1])
        for _ in range(3):
            w.cycle()
            check(w)
            check_dispatches(w)


def check_quota_held(w: ElasticWorld) -> None:
    """The quota usage of the admitted wrappers, at their current sizes, rebuilt from
    scratch: no node above its quota, nobody borrowing past a hard node."""
    ledger = quota_ledger(w.forest, w.admitted())
    assert not ledger.over_quota(), ledger.over_quota()


@settings(max_examples=60, deadline=None)
@example([16, 8, 0, 0, 8], [False, False, False, True], POLICIES[0],
         [("team-a", True, 1, 0), ("team-b", False, 1, 0), ("team-b", False, 1, 0),
          ("team-a", False, 1, 1)])
@given(st.lists(st.integers(0, 24), min_size=5, max_size=5),
       st.lists(st.booleans(), min_size=4, max_size=4),
       st.sampled_from(POLICIES[:3]),
       st.lists(st.tuples(st.sampled_from(TEAMS), st.booleans(), st.integers(1, 3),
                          st.integers(0, 2)), min_size=1, max_size=8))
def test_elastic_gangs_grow_and_shrink_within_quota(
        quota: list[int], hard: list[bool], policy: Policy,
        jobs: list[tuple[str, bool, int, int]]) -> None:
    w = ElasticWorld([node(f"n{i}", gpu=8) for i in range(3)], policy, trees(quota, hard))
    for i, (team, elastic, size, prio) in enumerate(jobs):
        labels = {"gpu": team}
        if elastic:
            w.submit(pytorchjob(f"e{i}", low=1, high=1 + size, gpu=4, priority=prio,
                                master=False, labels=labels))
        else:
            w.submit(appwrapper(f"p{i}", labels, gpu=4, pods=size, priority=prio))
        for _ in range(2):
            w.cycle()
            check(w)
            check_quota_held(w)
