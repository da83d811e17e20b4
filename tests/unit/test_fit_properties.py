"""Properties of the per-node fit, checked against a brute-force search on small clusters.

- It never dispatches a gang that brute force says cannot be placed.
- Every placement it returns is valid: each pod once, on a node that admits it, with
  the capacity that the pods placed before it left.
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from dispatcher.cluster import BoundPod, ClusterState, Node, PlannedPod, Taint
from dispatcher.fit import Capacity, Shortfall, place
from dispatcher.fit.constraints import node_admits
from dispatcher.kinds.podset import PodConstraints, PodSet, Toleration
from dispatcher.resources import INT64_MAX

from .builders import GPU, gang

RESOURCES = (GPU, "cpu", "memory", "pods")

nodes_st = st.lists(
    st.builds(
        lambda gpu, cpu, mem, pods, tainted, cordoned: (gpu, cpu, mem, pods, tainted, cordoned),
        st.integers(0, 8), st.integers(0, 8), st.integers(0, 8), st.integers(1, 4),
        st.booleans(), st.booleans(),
    ),
    min_size=1, max_size=4,
)
pod_sets_st = st.lists(
    st.builds(
        lambda count, gpu, cpu, mem, tolerates: (count, gpu, cpu, mem, tolerates),
        st.integers(0, 3), st.integers(0, 8), st.integers(0, 4), st.integers(0, 4),
        st.booleans(),
    ),
    min_size=1, max_size=3,
).filter(lambda sets: sum(s[0] for s in sets) <= 5)


def build(nodes_spec: list[tuple[int, int, int, int, bool, bool]],
          sets_spec: list[tuple[int, int, int, int, bool]]) -> tuple[list[Node], list[PodSet]]:
    nodes = [
        Node(f"n{i}", {GPU: g, "cpu": c, "memory": m, "pods": p},
             {"zone": "a" if i % 2 else "b"},
             (Taint("gpu", "", "NoSchedule"),) if tainted else (), cordoned)
        for i, (g, c, m, p, tainted, cordoned) in enumerate(nodes_spec)
    ]
    tol = PodConstraints(tolerations=(Toleration("gpu", "Exists"),))
    sets = [
        PodSet(f"s{j}", count, {GPU: g, "cpu": c, "memory": m, "pods": 1},
               tol if tolerates else PodConstraints())
        for j, (count, g, c, m, tolerates) in enumerate(sets_spec)
    ]
    return nodes, sets


def brute_force_fits(nodes: list[Node], sets: list[PodSet]) -> bool:
    pods = [ps for ps in sets for _ in range(ps.count)]
    for assignment in itertools.product(range(len(nodes)), repeat=len(pods)):
        used = [dict.fromkeys(RESOURCES, 0) for _ in nodes]
        ok = True
        for ps, i in zip(pods, assignment, strict=True):
            if not node_admits(nodes[i], ps.constraints):
                ok = False
                break
            for r in RESOURCES:
                used[i][r] += ps.request[r]
                if used[i][r] > nodes[i].allocatable[r]:
                    ok = False
            if not ok:
                break
        if ok:
            return True
    return False


@settings(max_examples=400, deadline=None)
@given(nodes_st, pod_sets_st)
def test_per_node_fit_agrees_with_brute_force(nodes_spec: list[tuple[int, int, int, int, bool,
                                                                     bool]],
                                              sets_spec: list[tuple[int, int, int, int, bool]]
                                              ) -> None:
    nodes, sets = build(nodes_spec, sets_spec)
    result = place(gang(*sets), Capacity.empty(nodes))
    possible = brute_force_fits(nodes, sets)
    if isinstance(result, Shortfall):
        return  # a miss of the heuristic is allowed; a false dispatch is not
    assert possible, "dispatched a gang that no assignment of pods to nodes can hold"
    by_name = {n.name: n for n in nodes}
    used = {n.name: dict.fromkeys(RESOURCES, 0) for n in nodes}
    seen = set()
    for p in result:
        assert p.node is not None
        ps = next(s for s in sets if s.name == p.pod_set)
        assert node_admits(by_name[p.node], ps.constraints)
        for r in RESOURCES:
            used[p.node][r] += ps.request[r]
            assert used[p.node][r] <= by_name[p.node].allocatable[r]
        seen.add((p.pod_set, p.pod))
    assert seen == {(s.name, i) for s in sets for i in range(s.count)}


@settings(max_examples=300, deadline=None)
@given(nodes_st, st.integers(1, 5), st.integers(0, 8), st.integers(0, 4))
def test_identical_pods_never_missed(nodes_spec: list[tuple[int, int, int, int, bool, bool]],
                                     count: int, gpu: int, cpu: int) -> None:
    """For one pod set the fill-tightest-node heuristic is exact: it misses nothing."""
    nodes, sets = build(nodes_spec, [(count, gpu, cpu, 0, True)])
    result = place(gang(*sets), Capacity.empty(nodes))
    assert isinstance(result, list) == brute_force_fits(nodes, sets)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-2, 3), st.integers(0, 3), st.integers(0, 2)),
                min_size=1, max_size=12),
       st.integers(1, 13), st.data())
def test_the_first_nodes_of_the_best_fit_order_are_those_of_the_full_sort(
        free: list[tuple[int, int, int]], first: int, data: st.DataObject) -> None:
    """A fill asks only for the first few nodes of the order: narrowing the sort keys one
    by one (ties in every key, negative free amounts, any subset of rows) gives exactly
    the start of the full sort."""
    nodes = [Node(f"n{i:02d}", {GPU: 3, "cpu": 3, "memory": 2}) for i in range(len(free))]
    cap = Capacity(nodes, {f"n{i:02d}": {GPU: g, "cpu": c, "memory": m}
                           for i, (g, c, m) in enumerate(free)})
    rows = np.array(sorted(data.draw(st.sets(st.integers(0, len(free) - 1), min_size=1))),
                    dtype=np.intp)
    whole = cap.best_fit_positions(rows)
    assert cap.best_fit_positions(rows, first).tolist() == whole[:first].tolist()


change_st = st.one_of(
    st.tuples(st.just("node"), st.integers(0, 3), st.integers(0, 8), st.booleans(),
              st.booleans()),
    st.tuples(st.just("drop-node"), st.integers(0, 3)),
    st.tuples(st.just("pod"), st.integers(0, 5), st.integers(0, 4), st.integers(0, 4),
              st.booleans(), st.booleans()),
    st.tuples(st.just("drop-pod"), st.integers(0, 5)),
    st.tuples(st.just("reserve"), st.integers(0, 1), st.lists(st.integers(0, 4), max_size=3)),
    st.tuples(st.just("release"), st.integers(0, 1)),
    st.just(("snapshot",)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(change_st, max_size=30))
def test_a_snapshot_shows_the_cluster_as_it_is_after_any_changes(
        changes: list[tuple[object, ...]]) -> None:
    """Snapshots share what depends on the nodes and rewrite only the rows of nodes that
    changed: after any nodes joining, leaving, cordoned or tainted, pods binding, going,
    asking for a resource no node has, reservations made and released, a snapshot is
    what a snapshot built from nothing would be."""
    state = ClusterState()
    taint = (Taint("gpu", "", "NoSchedule"),)
    tolerant = PodConstraints(tolerations=(Toleration("gpu", "Exists"),))
    for change in changes:
        kind = change[0]
        if kind == "node":
            _, i, gpu, cordoned, tainted = change
            state.upsert_node(Node(f"n{i}", {GPU: gpu, "cpu": 8, "pods": 4}, {},
                                   taint if tainted else (), bool(cordoned)))
        elif kind == "drop-node":
            state.remove_node(f"n{change[1]}")
        elif kind == "pod":
            _, i, n, gpu, owned, odd = change
            request = {GPU: gpu, "cpu": 1, "pods": 1} | ({"example.com/x": 1} if odd else {})
            state.upsert_pod(("ns", f"p{i}"), BoundPod("ns", f"p{i}", f"n{n}", request,
                                                       "aw0" if owned else None))
        elif kind == "drop-pod":
            state.remove_pod(("ns", f"p{change[1]}"))
        elif kind == "reserve":
            _, w, nodes = change
            state.reserve(("ns", f"aw{w}"), [PlannedPod(f"n{n}", {GPU: 1, "pods": 1})
                                            for n in nodes])
        elif kind == "release":
            state.release(("ns", f"aw{change[1]}"))
        snapshot = Capacity.of(state)
        fresh = Capacity(state.nodes.values(), {n: state.free(n) for n in state.nodes})
        # (A resource only pods on unknown nodes asked for may be a column of zeros.)
        assert {n: {r: v for r, v in f.items() if v} for n, f in snapshot.free.items()} == \
            {n: {r: v for r, v in f.items() if v} for n, f in fresh.free.items()}
        assert {r: v for r, v in snapshot.free_total.items() if v} == \
            {r: v for r, v in fresh.free_total.items() if v}
        assert snapshot.max_free(GPU) == fresh.max_free(GPU)
        for rules in (PodConstraints(), tolerant):
            assert snapshot.eligible(rules) == fresh.eligible(rules)


# Amounts the API server takes: up to 2**63-1 a container, so a pod of two containers asks
# twice that; small ones too, so that something fits.
amount_st = st.one_of(st.integers(0, 8), st.integers(0, INT64_MAX),
                      st.sampled_from([INT64_MAX, 8 * 10**18, 2**48, 2**48 + 1]))
ABSURD = (GPU, "example.com/foo", "memory")
requests_st = st.fixed_dictionaries({r: st.one_of(amount_st, st.integers(0, 2 * INT64_MAX))
                                     for r in ABSURD})


@settings(max_examples=300, deadline=None)
@given(st.lists(st.fixed_dictionaries({r: amount_st for r in ABSURD}), min_size=1, max_size=3),
       st.lists(st.tuples(st.integers(0, 2), requests_st), max_size=4),
       st.lists(st.tuples(st.integers(0, 2), requests_st), max_size=3),
       st.integers(1, 3), st.fixed_dictionaries({r: amount_st for r in ABSURD}))
def test_amounts_beyond_64_bits_never_make_room_that_is_not_there(
        allocatable: list[dict[str, int]], bound: list[tuple[int, dict[str, int]]],
        held: list[tuple[int, dict[str, int]]], count: int, request: dict[str, int]) -> None:
    """Pods bound by anyone may ask more than 64 bits hold, on nodes of any size: a
    snapshot is still taken, it shows no room a node lacks, nor once the room held for
    a gang is given back (a preemption's trial), and what is placed fits for real."""
    state = ClusterState()
    for i, alloc in enumerate(allocatable):
        state.upsert_node(Node(f"n{i}", {**alloc, "pods": 110}))
    names = sorted(state.nodes)
    for i, (n, asked) in enumerate(bound):
        state.upsert_pod(("ns", f"p{i}"), BoundPod("ns", f"p{i}", names[n % len(names)],
                                                   {**asked, "pods": 1}))
    planned = [PlannedPod(names[n % len(names)], {**asked, "pods": 1}) for n, asked in held]
    state.reserve(("ns", "victim"), planned)
    real = {n: state.free(n) for n in names}
    cap = Capacity.of(state)
    for n in names:
        for r, v in cap.free_of(n).items():
            assert v <= 0 or v <= real[n].get(r, 0)
    trial = cap.copy()
    trial.give_back(*trial.amounts((p.node, p.request) for p in planned))
    for p in planned:
        real[p.node] = {r: real[p.node].get(r, 0) + p.request.get(r, 0)
                        for r in {*real[p.node], *p.request}}
    for n in names:
        for r, v in trial.free_of(n).items():
            assert v <= 0 or v <= real[n].get(r, 0)
    result = place(gang(PodSet("s", count, {**request, "pods": 1})), trial)
    event("placed" if isinstance(result, list) else "not placed")
    if isinstance(result, Shortfall):
        return
    for n in names:
        on = [p for p in result if p.node == n]
        for r in ABSURD:
            assert len(on) * request[r] <= max(real[n].get(r, 0), 0)
