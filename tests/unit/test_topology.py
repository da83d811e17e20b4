"""Topology-aware placement: pod sets (or whole gangs) inside one rack, block..."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dispatcher.admission import INVALID, admit, fit_rules, queued_from_appwrapper
from dispatcher.api.models import AppWrapper
from dispatcher.cluster import PlannedPod
from dispatcher.config import ConfigError, load_config
from dispatcher.fit import Capacity, Placement, Shortfall
from dispatcher.fit.topology import NO_DOMAIN, Topology, place_in_topology
from dispatcher.kinds import InvalidItem, item_pod_sets
from dispatcher.kinds.podset import PodSet, TopologyRequest
from dispatcher.preemption import AdmittedWrapper, Preemption, PreemptionSearch
from dispatcher.queue import Policy, QueuedWrapper

from .builders import GPU, capacity, gang, node, pod_set, wrapper

FIFO = Policy("fifo", order="arrival")

BLOCK = "cloud.provider.com/topology-block"
RACK = "cloud.provider.com/topology-rack"
LEVELS = Topology((BLOCK, RACK))


def racked(name: str, block: str, rack: str, gpu: int = 8) -> dict[str, object]:
    return {"name": name, "gpu": gpu, "labels": {BLOCK: block, RACK: rack}}


def nodes_in(layout: dict[tuple[str, str], list[int]]) -> Capacity:
    """Nodes per (block, rack), each with the given free GPUs."""
    return capacity(*(
        node(f"{b}-{r}-n{i}", gpu=g, labels={BLOCK: b, RACK: r})
        for (b, r), gpus in layout.items() for i, g in enumerate(gpus)))


def required(ps: PodSet, level: str = RACK, whole: bool = False) -> PodSet:
    return dataclasses.replace(ps, topology=TopologyRequest(level, True, whole))


def preferred(ps: PodSet, level: str = RACK) -> PodSet:
    return dataclasses.replace(ps, topology=TopologyRequest(level, False))


def domains_of(result: list[Placement] | Shortfall, cap: Capacity, label: str) -> set[str]:
    assert isinstance(result, list), result
    return {cap.nodes[p.node].labels[label] for p in result if p.node is not None}


def test_required_rack_keeps_the_pods_in_one_rack_where_plain_fit_spreads_them() -> None:
    # Two racks of 3 free GPUs each side by side, and one rack with 4 nodes of 2: a gang of
    # 4 pods of 2 GPUs fits anywhere, but in one rack only in r3.
    layout = {("b1", "r1"): [2, 2], ("b1", "r2"): [2, 2], ("b1", "r3"): [2, 2, 2, 2]}
    cap = nodes_in(layout)
    result = place_in_topology(gang(required(pod_set(4, gpu=2))), cap, LEVELS)
    assert domains_of(result, cap, RACK) == {"r3"}


def test_best_fit_picks_the_smallest_rack_that_holds_the_set() -> None:
    cap = nodes_in({("b1", "big"): [8] * 4, ("b1", "small"): [8] * 2})
    result = place_in_topology(gang(required(pod_set(2, gpu=8))), cap, LEVELS)
    assert domains_of(result, cap, RACK) == {"small"}


def test_best_fit_takes_the_fullest_rack_so_an_empty_one_stays_whole_for_the_next_gang(
        ) -> None:
    # r1: 8 nodes, 6 busy (16 GPUs free); r2: 4 nodes, all free (32). Gang A (2 x 8 GPUs)
    # fits both; in r1 it leaves r2 whole for gang B (4 x 8 GPUs), which only r2 holds.
    cap = nodes_in({("b1", "r1"): [8] * 8, ("b1", "r2"): [8] * 4})
    for busy in sorted(n for n in cap.names if "-r1-" in n)[:6]:
        cap.take(busy, {GPU: 8})
    a = place_in_topology(gang(required(pod_set(2, gpu=8))), cap, LEVELS)
    assert domains_of(a, cap, RACK) == {"r1"}
    b = place_in_topology(gang(required(pod_set(4, gpu=8))), cap, LEVELS)
    assert domains_of(b, cap, RACK) == {"r2"}


def test_ties_between_equal_racks_go_to_the_fullest() -> None:
    cap = nodes_in({("b1", "empty"): [8, 8], ("b1", "busy"): [8, 8]})
    busy = sorted(n for n in cap.names if "-busy-" in n)
    cap.take(busy[0], {GPU: 4})
    result = place_in_topology(gang(required(pod_set(1, gpu=8))), cap, LEVELS)
    assert [p.node for p in result if isinstance(p, Placement)] == [busy[1]]


def test_a_preferred_set_falling_back_to_a_block_takes_the_fullest_block_too() -> None:
    # No rack holds 3 whole nodes; block b1 (4 racks of 2 nodes, 5 busy) and block b2 (2
    # racks of 2 nodes, all free) hold them together: b1, the fuller, keeps b2 whole.
    cap = nodes_in({**{("b1", f"r{i}"): [8, 8] for i in range(4)},
                    ("b2", "r4"): [8, 8], ("b2", "r5"): [8, 8]})
    for busy in [n for n in cap.names if n.startswith("b1-")][:5]:
        cap.take(busy, {GPU: 8})
    result = place_in_topology(gang(preferred(pod_set(3, gpu=8))), cap, LEVELS)
    assert domains_of(result, cap, BLOCK) == {"b1"}


def test_required_rack_waits_in_topology_terms_while_the_cluster_total_would_fit() -> None:
    cap = nodes_in({("b1", "r1"): [8, 8, 8], ("b1", "r7"): [8, 8, 8], ("b2", "r3"): [8]})
    before = cap.free
    result = place_in_topology(gang(required(pod_set(4, gpu=8))), cap, LEVELS)
    assert isinstance(result, Shortfall)
    assert result.reason == NO_DOMAIN
    assert result.message == (
        f"needs 32 nvidia.com/gpu in one {RACK}: best rack r1 has 24 nvidia.com/gpu free; "
        "56 nvidia.com/gpu free in total")
    assert cap.free == before  # nothing taken


def test_a_rack_name_in_two_blocks_is_two_racks() -> None:
    cap = nodes_in({("b1", "r1"): [8, 8], ("b2", "r1"): [8, 8]})
    result = place_in_topology(gang(required(pod_set(3, gpu=8))), cap, LEVELS)
    assert isinstance(result, Shortfall) and result.reason == NO_DOMAIN


def test_nodes_without_the_label_form_no_rack() -> None:
    cap = capacity(node("a", labels={BLOCK: "b1"}), node("b", labels={BLOCK: "b1"}))
    result = place_in_topology(gang(required(pod_set(2, gpu=8))), cap, LEVELS)
    assert isinstance(result, Shortfall)
    assert result.message == (f"needs 16 nvidia.com/gpu in one {RACK}: no schedulable node it "
                              f"may use carries the label {RACK}")
    block = place_in_topology(gang(required(pod_set(2, gpu=8), BLOCK)), cap, LEVELS)
    assert domains_of(block, cap, BLOCK) == {"b1"}


def test_preferred_rack_falls_back_to_one_block_then_anywhere() -> None:
    cap = nodes_in({("b1", "r1"): [8], ("b1", "r2"): [8], ("b2", "r3"): [8, 8]})
    one_rack = place_in_topology(gang(preferred(pod_set(2, gpu=8))), cap, LEVELS)
    assert domains_of(one_rack, cap, RACK) == {"r3"}
    # Now r3 is full: two pods no longer fit in a rack, but still in block b1.
    in_block = place_in_topology(gang(preferred(pod_set(2, gpu=8))), cap, LEVELS)
    assert domains_of(in_block, cap, BLOCK) == {"b1"}
    cap2 = nodes_in({("b1", "r1"): [8], ("b2", "r2"): [8]})
    anywhere = place_in_topology(gang(preferred(pod_set(2, gpu=8))), cap2, LEVELS)
    assert domains_of(anywhere, cap2, BLOCK) == {"b1", "b2"}


def test_the_wrappers_own_request_keeps_every_pod_set_in_one_domain() -> None:
    cap = nodes_in({("b1", "r1"): [8, 8], ("b1", "r2"): [8, 8]})
    cap.take(sorted(cap.names)[0], {GPU: 8})  # r1 has one node free
    both = gang(required(pod_set(1, gpu=8, name="master"), whole=True),
                required(pod_set(1, gpu=8, name="worker"), whole=True))
    result = place_in_topology(both, cap, LEVELS)
    assert domains_of(result, cap, RACK) == {"r2"}


def test_without_requests_placement_is_the_plain_one() -> None:
    layout = {("b1", "r1"): [8, 4], ("b1", "r2"): [2, 8]}
    plain, topo = nodes_in(layout), nodes_in(layout)
    from dispatcher.fit import place
    assert place(gang(pod_set(3, gpu=4)), plain) == place_in_topology(
        gang(pod_set(3, gpu=4)), topo, LEVELS)


# --- the rules, on many clusters -----------------------------------------------------------

racks_st = st.lists(st.lists(st.integers(0, 8), min_size=1, max_size=4), min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(racks=racks_st, count=st.integers(1, 6), gpu=st.integers(1, 8),
       taken=st.lists(st.tuples(st.integers(0, 19), st.integers(1, 8)), max_size=4))
def test_required_set_in_one_rack_exactly_when_some_rack_holds_it(
        racks: list[list[int]], count: int, gpu: int, taken: list[tuple[int, int]]) -> None:
    cap = nodes_in({("b1" if i % 2 else "b2", f"r{i}"): gpus for i, gpus in enumerate(racks)})
    for row, amount in taken:  # pods already running on some nodes
        name = cap.names[row % len(cap.names)]
        cap.take(name, {GPU: min(amount, cap.free_of(name).get(GPU, 0))})
    # Brute force: identical pods fit a rack when its nodes hold `count` of them.
    by_rack: dict[str, int] = {}
    for name in cap.names:
        rack = cap.nodes[name].labels[RACK]
        by_rack[rack] = by_rack.get(rack, 0) + max(cap.free_of(name).get(GPU, 0), 0) // gpu
    fits = any(n >= count for n in by_rack.values())
    result = place_in_topology(gang(required(pod_set(count, gpu=gpu, cpu=0, mem_gi=0))),
                               cap, LEVELS)
    if fits:
        assert isinstance(result, list), result.message  # never "waits" when a rack fits
        assert len(result) == count
        assert len(domains_of(result, cap, RACK)) == 1
    else:
        assert isinstance(result, Shortfall)


@settings(max_examples=150, deadline=None)
@given(racks=racks_st, sets=st.lists(st.tuples(st.integers(1, 3), st.integers(1, 8),
                                              st.booleans()), min_size=1, max_size=3))
def test_never_a_required_set_across_two_racks(
        racks: list[list[int]], sets: list[tuple[int, int, bool]]) -> None:
    cap = nodes_in({("b1", f"r{i}"): gpus for i, gpus in enumerate(racks)})
    pod_sets = [pod_set(c, gpu=g, name=f"s{i}") for i, (c, g, _) in enumerate(sets)]
    asked = gang(*(required(ps) if req else ps
                   for ps, (_, _, req) in zip(pod_sets, sets, strict=True)))
    result = place_in_topology(asked, cap, LEVELS)
    if isinstance(result, Shortfall):
        return
    for ps, (_, _, req) in zip(pod_sets, sets, strict=True):
        if req:
            mine = [p for p in result if p.pod_set == ps.name]
            assert len({cap.nodes[p.node].labels[RACK] for p in mine if p.node}) == 1


def _slots(cap: Capacity, rack: str, gpu: int) -> int:
    return sum(max(cap.free_of(n).get(GPU, 0), 0) // gpu for n in cap.names
               if cap.nodes[n].labels[RACK] == rack)


def _rack_free(cap: Capacity, rack: str) -> int:
    return sum(max(cap.free_of(n).get(GPU, 0), 0) for n in cap.names
               if cap.nodes[n].labels[RACK] == rack)


@settings(max_examples=300, deadline=None)
@example(used=[[8, 8, 8, 8, 0, 0], [0, 0, 0, 0]], first=(2, 8), second=(4, 8))  # the docs'
@given(used=st.lists(st.lists(st.sampled_from([0, 2, 4, 8]), min_size=1, max_size=6),
                     min_size=1, max_size=4),
       first=st.tuples(st.integers(1, 4), st.sampled_from([1, 2, 4, 8])),
       second=st.tuples(st.integers(1, 6), st.sampled_from([1, 2, 4, 8])))
def test_a_later_gang_never_waits_for_a_rack_a_fuller_choice_for_the_earlier_would_leave(
        used: list[list[int]], first: tuple[int, int], second: tuple[int, int]) -> None:
    # Racks of 8-GPU nodes, each with some GPUs already in use.
    cap = nodes_in({("b1", f"r{i}"): [8] * len(u) for i, u in enumerate(used)})
    for i, u in enumerate(used):
        for k, amount in enumerate(u):
            cap.take(f"b1-r{i}-n{k}", {GPU: amount})
    a = gang(required(pod_set(first[0], gpu=first[1], cpu=0, mem_gi=0, name="a")))
    b = gang(required(pod_set(second[0], gpu=second[1], cpu=0, mem_gi=0, name="b")))
    names = LEVELS.domains(cap, 1).names
    # Brute force: every rack that holds A, and whether B then fits a rack too.
    holders = [r for r in names if _slots(cap, r, first[1]) >= first[0]]
    both: dict[str, bool] = {}
    for r in holders:
        trial = cap.copy()
        placed = LEVELS.place_in(a, trial, names.index(r))
        assert isinstance(placed, list), placed
        both[r] = isinstance(place_in_topology(b, trial, LEVELS), list)
    free = {r: _rack_free(cap, r) for r in holders}
    result_a = place_in_topology(a, cap, LEVELS)
    if not holders:
        assert isinstance(result_a, Shortfall)
        return
    (chosen,) = domains_of(result_a, cap, RACK)  # never across two racks
    assert chosen in holders
    result_b = place_in_topology(b, cap, LEVELS)
    if isinstance(result_b, Shortfall):
        fuller = [r for r in holders if free[r] < free[chosen] and both[r]]
        assert not fuller, (f"B waits with A in {chosen} ({free[chosen]} free), though A "
                            f"in {fuller[0]} ({free[fuller[0]]} free) would let both run")
    else:
        assert len(domains_of(result_b, cap, RACK)) == 1


# --- requests, levels, admission -------------------------------------------------------------

def job(annotations: dict[str, str] | None = None) -> dict[str, object]:
    template: dict[str, object] = {"spec": {"containers": [{
        "name": "c", "resources": {"requests": {GPU: 8}, "limits": {GPU: 8}}}]}}
    if annotations is not None:
        template["metadata"] = {"annotations": annotations}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"parallelism": 2, "completions": 2, "template": template}}


def test_pod_template_annotations_become_the_pod_sets_request() -> None:
    [ps] = item_pod_sets(job({"kueue.x-k8s.io/podset-required-topology": RACK}), None)
    assert ps.topology == TopologyRequest(RACK, True)
    [ps] = item_pod_sets(job({"kueue.x-k8s.io/podset-preferred-topology": BLOCK}), None)
    assert ps.topology == TopologyRequest(BLOCK, False)
    with pytest.raises(InvalidItem, match="has both"):
        item_pod_sets(job({"kueue.x-k8s.io/podset-required-topology": RACK,
                           "kueue.x-k8s.io/podset-preferred-topology": RACK}), None)


def appwrapper(annotations: dict[str, str], item: dict[str, object]) -> AppWrapper:
    return AppWrapper.model_validate({
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": "aw", "namespace": "default", "annotations": annotations},
        "spec": {"resources": {"GenericItems": [{"generictemplate": item}]}}})


def test_appwrapper_annotation_asks_one_domain_for_the_whole_gang() -> None:
    w = queued_from_appwrapper(appwrapper(
        {"kueue.x-k8s.io/podset-required-topology": BLOCK}, job()), 0.0)
    assert [g.pod_set.topology for g in w.gang] == [TopologyRequest(BLOCK, True, True)]


def test_unknown_level_is_invalid_naming_the_configured_levels() -> None:
    w = wrapper("a", required(pod_set(1, gpu=8), "example.com/zone"))
    [d] = admit([w], nodes_in({("b1", "r1"): [8]}), FIFO, 0.0, topology=LEVELS)
    assert d.decision == "invalid" and d.reason == INVALID
    assert d.message == (f"pod set worker asks for required topology level 'example.com/zone', "
                         f"which is not a topology level here: the configured levels are "
                         f"{BLOCK}, {RACK}")
    [d] = admit([w], nodes_in({("b1", "r1"): [8]}), FIFO, 0.0)
    assert d.decision == "invalid" and "configures no topology levels" in d.message


def test_admit_places_required_gangs_in_one_rack_and_the_head_waits_in_topology_terms(
) -> None:
    cap = nodes_in({("b1", "r1"): [8, 8], ("b1", "r2"): [8, 8]})
    first = wrapper("first", required(pod_set(2, gpu=8)), seen=1.0)
    big = wrapper("big", required(pod_set(3, gpu=8)), seen=2.0)
    d1, d2 = admit([first, big], cap, FIFO, 10.0, topology=LEVELS)
    assert d1.decision == "dispatch"
    assert len({cap.nodes[p.node].labels[RACK] for p in d1.placements if p.node}) == 1
    assert d2.decision == "wait" and d2.reason == "NeverFits"
    assert d2.message == ("would not fit even on an empty cluster: needs 24 nvidia.com/gpu in "
                          f"one {RACK}: best rack r1 has 16 nvidia.com/gpu free; 32 "
                          "nvidia.com/gpu free in total")


def test_admit_waits_for_a_rack_while_the_cluster_total_fits() -> None:
    cap = nodes_in({("b1", "r1"): [8, 8], ("b1", "r2"): [8, 8]})
    cap.take(sorted(cap.names)[0], {GPU: 8})
    cap.take(sorted(cap.names)[2], {GPU: 8})
    [d] = admit([wrapper("w", required(pod_set(2, gpu=8)))], cap, FIFO, 0.0, topology=LEVELS)
    assert d.decision == "wait" and d.reason == NO_DOMAIN and d.head_of_line
    assert d.message.startswith(f"needs 16 nvidia.com/gpu in one {RACK}: best rack")


def kueue_topology(*levels: str) -> str:
    """A `topology:` section holding Kueue's Topology object with these levels."""
    return ("topology:\n  apiVersion: kueue.x-k8s.io/v1beta1\n  kind: Topology\n"
            "  metadata: {name: default}\n  spec:\n    levels:\n"
            + "".join(f"    - nodeLabel: {level}\n" for level in levels))


def test_config_takes_levels_or_a_kueue_topology(tmp_path: Path) -> None:
    plain = tmp_path / "plain.yaml"
    plain.write_text(f"topology:\n  levels: [{BLOCK}, {RACK}]\n")
    assert load_config(plain).topology_levels == LEVELS
    kueue = tmp_path / "kueue.yaml"
    kueue.write_text(kueue_topology(BLOCK, RACK))
    assert load_config(kueue).topology_levels == LEVELS
    twice = tmp_path / "twice.yaml"
    twice.write_text(f"topology:\n  levels: [{RACK}, {RACK}]\n")
    with pytest.raises(ConfigError, match="listed twice"):
        load_config(twice)
    assert load_config(None).topology_levels == Topology()


def test_plan_with_the_configured_levels_keeps_a_gang_in_one_rack_and_says_why_one_waits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dispatcher.cli import main

    from .test_plan import aw, node, write

    def labelled(name: str, block: str, rack: str) -> dict[str, object]:
        return node(name, labels={BLOCK: block, RACK: rack})

    # r1 has 2 nodes, r2 has 3: a gang of 3 whole nodes fits only in r2, and nodes of r1
    # sort first, so a plain placement would use them.
    cluster = write(tmp_path, "cluster.yaml", {"apiVersion": "v1", "kind": "List", "items": [
        labelled("a1", "b1", "r1"), labelled("a2", "b1", "r1"),
        labelled("b1", "b1", "r2"), labelled("b2", "b1", "r2"), labelled("b3", "b1", "r2")]})
    gang3, gang2 = aw("three", 3, 8, created="2026-01-01T00:00:00Z"), aw(
        "two", 2, 8, created="2026-01-01T00:01:00Z")
    for w in (gang3, gang2):
        w["metadata"]["annotations"] = {"kueue.x-k8s.io/podset-required-topology": RACK}
    wrappers = write(tmp_path, "aws.yaml", gang3, gang2,
                     aw("plain", 1, 8, created="2026-01-01T00:02:00Z"))
    config = tmp_path / "config.yaml"
    config.write_text(f"topology:\n  levels: [{BLOCK}, {RACK}]\n")
    assert main(["plan", "-o", "json", "--cluster", cluster, "--config", str(config),
                 wrappers]) == 0
    three, two, plain = json.loads(capsys.readouterr().out)["decisions"]
    assert three["decision"] == "dispatch"
    assert sorted(p["node"] for p in three["placements"]) == ["b1", "b2", "b3"]
    assert two["decision"] == "dispatch"
    assert sorted(p["node"] for p in two["placements"]) == ["a1", "a2"]
    assert plain["decision"] == "wait"
    # Without the levels, the same annotations are refused, naming what to configure.
    assert main(["plan", "-o", "json", "--cluster", cluster, wrappers]) == 0
    three, _, _ = json.loads(capsys.readouterr().out)["decisions"]
    assert three["decision"] == "invalid"
    assert "configures no topology levels" in three["message"]


def test_plan_puts_the_first_gang_in_the_fuller_rack_so_both_gangs_dispatch(
        capsys: pytest.CaptureFixture[str]) -> None:
    from dispatcher.cli import main

    # examples/plan/topology: r1 has 2 of its 8 nodes free, r2 all 4. Gang A (2 x 8 GPUs)
    # takes r1's free nodes, and gang B (4 x 8 GPUs) then has r2 to itself.
    example = Path(__file__).resolve().parents[2] / "examples" / "plan" / "topology"
    assert main(["plan", "-o", "json", "--cluster", str(example / "cluster.yaml"),
                 "--config", str(example / "config.yaml"),
                 str(example / "appwrappers.yaml")]) == 0
    a, b = json.loads(capsys.readouterr().out)["decisions"]
    assert (a["decision"], b["decision"]) == ("dispatch", "dispatch"), b["message"]
    assert sorted(p["node"] for p in a["placements"]) == ["r1-n7", "r1-n8"]
    assert sorted(p["node"] for p in b["placements"]) == [f"r2-n{i}" for i in range(1, 5)]


def test_the_controller_holds_room_for_a_required_gang_in_one_rack_and_says_why_one_waits(
) -> None:
    from dispatcher.controller.loop.runtime import Dispatcher

    from .fake_kube import FakeKube
    from .test_runtime import Clock, _res, appwrapper, aw_status, run
    from .test_runtime import job as runtime_job
    from .test_runtime import node as runtime_node

    def labelled(name: str, rack: str) -> dict[str, Any]:
        n = runtime_node(name)
        n["metadata"]["labels"] = {BLOCK: "b1", RACK: rack}
        return n

    def racked_wrapper(name: str, pods: int, created: int) -> dict[str, Any]:
        w = appwrapper(name, runtime_job(name, pods, 8), created=created)
        w["metadata"]["annotations"] = {"kueue.x-k8s.io/podset-required-topology": RACK}
        return w

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        for name, rack in (("a1", "r1"), ("a2", "r1"), ("b1", "r2"), ("b2", "r2"),
                           ("b3", "r2"), ("c1", "r3")):
            kube.put(labelled(name, rack))
        kube.put(racked_wrapper("three", 3, 1))
        kube.put(racked_wrapper("big", 3, 2))
        d = Dispatcher(kube, FIFO, clock=clock, topology=LEVELS)  # type: ignore[arg-type]
        for kind, on in (("Node", d.on_node), ("AppWrapper", d.on_appwrapper)):
            for obj in await kube.list(_res(kind)):
                on("ADDED", obj)
        await d.cycle()
        # The room held for the gang (its pods are pinned to it) is one rack's.
        held = sorted(p.node for p in d.state.holdings(("team", "three")))
        assert held == ["b1", "b2", "b3"]
        # 24 GPUs free on a1, a2 and c1, but no rack has them.
        assert aw_status(kube, "big")["message"] == (
            f"{NO_DOMAIN}: needs 24 nvidia.com/gpu in one {RACK}: best rack r1 has 16 "
            "nvidia.com/gpu free; 24 nvidia.com/gpu free in total")

    run(scenario)


def test_the_webhook_refuses_an_unknown_level_at_apply_naming_the_levels() -> None:
    from dispatcher.controller.access.creator import Access
    from dispatcher.controller.webhook.admission_review import AppWrapperReview

    from .fake_authz import FakeApi
    from .test_admission_review import ALICE, RIGHTS, admitted
    from .test_admission_review import appwrapper as review_wrapper
    from .test_admission_review import job as review_job

    review = AppWrapperReview(Access(FakeApi(RIGHTS)), topology=LEVELS)  # type: ignore[arg-type]
    zone = review_wrapper(review_job(), annotations={
        "kueue.x-k8s.io/podset-required-topology": "example.com/zone"})
    _, verdict = admitted(review, zone, ALICE)
    assert not verdict.allowed
    assert "'example.com/zone', which is not a topology level here: the configured levels " \
           f"are {BLOCK}, {RACK}" in verdict.message
    rack = review_wrapper(review_job(), annotations={
        "kueue.x-k8s.io/podset-required-topology": RACK})
    _, verdict = admitted(review, rack, ALICE)
    assert verdict.allowed, verdict.message


def test_simulate_on_racks_reports_the_gangs_in_one_rack_with_and_without_requiring_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dispatcher.cli import main

    from .test_simulate import trace

    # 4 nodes of 8 GPUs in 2 racks. `one` takes a node of rack r0; `pair` (16 GPUs, two
    # pods) then fits the tightest nodes: one in each rack, unless it requires a rack.
    path = trace(tmp_path, ("one", 0, 100, 8), ("pair", 1, 100, 16))
    args = ["simulate", "-o", "json", "--trace", path, "--nodes", "4", "--topology", "1x2"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["topology"] == {
        "level": RACK, "startedGangs": 1, "inOneRack": 0, "requiringOneRack": 0,
        "requiringMeanWaitSeconds": 0.0, "gpuUtilisation": 0.742574, "withoutRequiring": None}
    assert main([*args, "--require-rack", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["topology"] == {
        "level": RACK, "startedGangs": 1, "inOneRack": 1, "requiringOneRack": 1,
        "requiringMeanWaitSeconds": 0.0, "gpuUtilisation": 0.742574,
        "withoutRequiring": {"requiringMeanWaitSeconds": 0.0, "startedGangs": 1,
                             "inOneRack": 0, "meanWaitSeconds": 0.0,
                             "gpuUtilisation": 0.742574}}
    assert main([a for a in args if a not in ("-o", "json")] + ["--require-rack", "1"]) == 0
    assert ("topology         1 of 1 started gangs of 2+ pods in one rack; 1 job required one"
            in capsys.readouterr().out)
    assert main(["simulate", "--trace", path, "--nodes", "4", "--require-rack", "0.5"]) == 2
    assert "--require-rack needs --topology" in capsys.readouterr().err
    assert main(["simulate", "--trace", path, "--nodes", "4", "--topology", "2x3"]) == 2
    assert "6 racks for 4 nodes" in capsys.readouterr().err


def test_simulate_takes_a_topology_file_and_shows_what_requiring_a_rack_costs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dispatcher.cli import main

    from .test_simulate import trace

    # Rack r1 holds n-0 and n-1, racks r2 and r3 a node each. `one` takes n-0; `pair` (two
    # pods) then fits n-1 and p anywhere, but no rack holds it until `one` ends at 100 s.
    layout = tmp_path / "racks.yaml"
    layout.write_text(kueue_topology(BLOCK, RACK, "kubernetes.io/hostname") + f"""nodes:
- {{name: n, count: 2, labels: {{{BLOCK}: b1, {RACK}: r1}}}}
- {{name: p, labels: {{{BLOCK}: b1, {RACK}: r2}}}}
- {{name: q, labels: {{{BLOCK}: b2, {RACK}: r3}}}}
""")
    path = trace(tmp_path, ("one", 0, 100, 8), ("pair", 1, 100, 16))
    args = ["simulate", "--trace", path, "--topology", str(layout)]
    assert main([*args, "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cluster"]["nodes"] == 4
    assert out["topology"]["inOneRack"] == 0
    assert out["queueingDelay"]["meanSeconds"] == 0.0
    assert main([*args, "-o", "json", "--require-rack", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["queueingDelay"]["meanSeconds"] == 49.5  # `pair` waited 99 s for rack r1
    assert out["topology"]["inOneRack"] == 1
    assert out["topology"]["withoutRequiring"]["meanWaitSeconds"] == 0.0
    assert out["topology"]["withoutRequiring"]["inOneRack"] == 0
    # The waits of the jobs that required a rack, and of the same jobs without.
    assert out["topology"]["requiringMeanWaitSeconds"] == 99.0
    assert out["topology"]["withoutRequiring"]["requiringMeanWaitSeconds"] == 0.0
    assert main([*args, "--require-rack", "1"]) == 0
    table = capsys.readouterr().out
    assert (" " * 17 + "the 1 job requiring one rack: mean wait 1m39s (0s without)") in table
    assert (" " * 17 + "requiring one rack costs: mean wait 50s (0s without), GPU utilisation "
            "37.5% (74.3% without), gangs in one rack 1 of 1 (0 of 1 without)" in table)
    # What to fix, said plainly.
    assert main([*args, "--nodes", "5"]) == 2
    assert "--nodes 5, but the topology file" in capsys.readouterr().err
    assert main(["simulate", "--trace", path, "--topology", "racks.yml"]) == 2
    assert "or the name of a topology file (there is no such file)" in capsys.readouterr().err
    layout.write_text("nodes: [{name: a}]\n")
    assert main(args) == 2
    assert "topology: Field required" in capsys.readouterr().err


def test_an_elastic_gang_requiring_a_rack_grows_inside_the_rack_it_was_admitted_in(
) -> None:
    from dispatcher.api.models import parse_appwrapper

    from .elastic_world import pytorchjob

    manifest = pytorchjob("elastic", low=2, high=6)
    manifest["metadata"]["annotations"] = {"kueue.x-k8s.io/podset-required-topology": RACK}
    w = queued_from_appwrapper(parse_appwrapper(manifest), 0.0)
    # r1, the smaller rack, holds the minimum (master + 2 workers) and one more worker;
    # r2's free nodes would take three more.
    cap = nodes_in({("b1", "r1"): [8] * 4, ("b1", "r2"): [8] * 5})
    [d] = admit([w], cap, FIFO, 0.0, topology=LEVELS)
    assert d.decision == "dispatch" and d.elastic == (3,)
    assert domains_of(list(d.placements), cap, RACK) == {"r1"}


def test_an_admitted_elastic_gang_requiring_a_rack_grows_only_inside_its_rack() -> None:
    from .elastic_world import ElasticWorld, pytorchjob
    from .quota_world import appwrapper as quota_wrapper

    # Racks r0 (n0-n2) and r1 (n3-n5). `other` takes n0; the elastic gang's minimum
    # (master + 1 worker) fills r0, the fuller rack. When `other` ends it grows onto n0,
    # and never into r1, whose three nodes stay free.
    racks = [node(f"n{i}", labels={BLOCK: "b1", RACK: f"r{i // 3}"}) for i in range(6)]
    world = ElasticWorld(racks, FIFO, topology=LEVELS)
    world.submit(quota_wrapper("other", gpu=8, pods=1))
    world.settle()
    manifest = pytorchjob("elastic", low=1, high=4)
    manifest["metadata"]["annotations"] = {"kueue.x-k8s.io/podset-required-topology": RACK}
    world.submit(manifest)
    world.settle()
    assert world.workers("elastic") == 1
    world.complete("other")
    world.settle()
    assert world.workers("elastic") == 2
    assert {p.node for p in world.state.holdings(("test", "elastic"))} == {"n0", "n1", "n2"}


def test_an_elastic_gang_is_not_scaled_in_for_a_gang_its_freed_room_cannot_hold_in_a_rack(
) -> None:
    from .elastic_world import ElasticWorld, pytorchjob
    from .quota_world import appwrapper as quota_wrapper

    # Racks r0 (n0, n2) and r1 (n1, n3). The elastic gang fills them: its master on n0,
    # workers on n1, n2, n3. Scaling in its last two workers frees n2 and n3: one node in
    # each rack, no room for the urgent gang, which requires one rack.
    racks = [node(f"n{i}", labels={BLOCK: "b1", RACK: f"r{i % 2}"}) for i in range(4)]
    world = ElasticWorld(racks, Policy("preempt", order="priority",
                                       preemption="lowerPriority"), topology=LEVELS)
    world.submit(pytorchjob("elastic", low=1, high=3))
    world.settle()
    assert world.workers("elastic") == 3
    urgent = quota_wrapper("urgent", gpu=8, pods=2, priority=10)
    urgent["metadata"]["annotations"] = {"kueue.x-k8s.io/podset-required-topology": RACK}
    world.submit(urgent)
    world.settle()
    assert world.is_running("urgent"), world.history[-1]
    [placed] = [d for cycle in world.history for d in cycle
                if d.name == "urgent" and d.decision == "dispatch"]
    assert len({world.state.nodes[p.node].labels[RACK] for p in placed.placements
                if p.node}) == 1
    assert not world.scales or all(s.after[0] == 3 for s in world.scales)


# --- preemption inside one domain ----------------------------------------------------------

PREEMPT = Policy("preempt", order="priority", preemption="lowerPriority")


def running(cap: Capacity, name: str, pods: list[tuple[str, int]], priority: int = 0
            ) -> AdmittedWrapper:
    """An admitted wrapper with a pod of `gpu` GPUs on each named node, taken from `cap`."""
    holdings = tuple(PlannedPod(n, {GPU: g}) for n, g in pods)
    for p in holdings:
        cap.take(p.node, p.request)
    return AdmittedWrapper("default", name, f"uid-{name}", float(priority),
                           {GPU: sum(g for _, g in pods)}, holdings)


def preempt_for(w: QueuedWrapper, cap: Capacity,
                admitted: list[AdmittedWrapper]) -> Preemption | None:
    placer, _ = fit_rules("per-node", LEVELS)
    return PreemptionSearch(PREEMPT, 1000.0, admitted, None, placer, LEVELS).search(w, cap)


def test_preemption_frees_the_rack_that_needs_the_fewest_victims() -> None:
    # Three racks of two 8-GPU nodes. `spread` (priority 1) has a pod in each rack; `a` and
    # `b` (priority 0, cheaper) fill a rack each with it; rack C's other node is free. A gang
    # of two whole nodes in one rack must tear `spread` down anyway: in rack C that is all.
    cap = nodes_in({("b1", "A"): [8, 8], ("b1", "B"): [8, 8], ("b1", "C"): [8, 8]})
    victims = [running(cap, "a", [("b1-A-n0", 8)]), running(cap, "b", [("b1-B-n0", 8)]),
               running(cap, "spread", [("b1-A-n1", 8), ("b1-B-n1", 8), ("b1-C-n0", 8)], 1)]
    found = preempt_for(wrapper("big", required(pod_set(2, gpu=8)), priority=5), cap, victims)
    assert found is not None
    assert found.keys == (("default", "spread"),)
    assert domains_of(list(found.placements), cap, RACK) == {"C"}


def test_victims_of_a_gang_without_topology_are_found_as_before() -> None:
    cap = nodes_in({("b1", "A"): [8, 8], ("b1", "B"): [8, 8], ("b1", "C"): [8, 8]})
    victims = [running(cap, "a", [("b1-A-n0", 8)]), running(cap, "b", [("b1-B-n0", 8)]),
               running(cap, "spread", [("b1-A-n1", 8), ("b1-B-n1", 8), ("b1-C-n0", 8)], 1)]
    found = preempt_for(wrapper("big", pod_set(2, gpu=8), priority=5), cap, victims)
    # Anywhere: the cheapest victim, whose node and rack C's free one hold the two pods.
    assert found is not None and found.keys == (("default", "a"),)


@settings(max_examples=200, deadline=None)
@given(racks=st.lists(st.integers(1, 4), min_size=1, max_size=5),
       victims=st.lists(st.tuples(st.integers(0, 3), st.lists(
           st.tuples(st.integers(0, 19), st.integers(1, 8)), min_size=1, max_size=3)),
           min_size=1, max_size=8),
       count=st.integers(1, 4), gpu=st.integers(1, 8))
def test_preemption_for_a_required_rack_frees_one_rack_at_the_cheapest_dearest_victim(
        racks: list[int], victims: list[tuple[int, list[tuple[int, int]]]], count: int,
        gpu: int) -> None:
    cap = nodes_in({("b1", f"r{i}"): [8] * n for i, n in enumerate(racks)})
    admitted: list[AdmittedWrapper] = []
    for k, (prio, pods) in enumerate(victims):
        placed = []
        for row, g in pods:
            name = cap.names[row % len(cap.names)]
            if cap.free_of(name)[GPU] >= g:
                placed.append((name, g))
                cap.take(name, {GPU: g})
        for name, g in placed:
            cap.give(name, {GPU: g})
        if placed:
            admitted.append(running(cap, f"v{k}", placed, prio))
    free = {n: cap.free_of(n)[GPU] for n in cap.names}
    # The search's order: lowest priority, then the least work lost (all ran as long).
    order = sorted(admitted, key=lambda a: (a.priority, a.demand[GPU], a.key))

    def rack(n: str) -> str:
        return cap.nodes[n].labels[RACK]

    def fits_rack(r: str, gone: list[AdmittedWrapper]) -> bool:
        room = dict(free)
        for a in gone:
            for p in a.holdings:
                room[p.node] += p.request[GPU]
        return sum(v // gpu for n, v in room.items() if rack(n) == r) >= count

    # Brute force: per rack, the shortest prefix of its victims that frees it; the
    # cheapest rack is the one whose dearest victim comes first in the order.
    best: int | None = None
    for r in {rack(n) for n in cap.names}:
        mine = [a for a in order if any(rack(p.node) == r for p in a.holdings)]
        for m in range(len(mine) + 1):
            if fits_rack(r, mine[:m]):
                dearest = order.index(mine[m - 1]) if m else -1
                best = dearest if best is None else min(best, dearest)
                break
    w = wrapper("w", required(pod_set(count, gpu=gpu, cpu=0, mem_gi=0)), priority=10)
    if not isinstance(place_in_topology(w.gang, cap.copy(), LEVELS), Shortfall):
        return  # it fits without preemption: no search is made for it
    found = preempt_for(w, cap, admitted)
    if best is None:
        assert found is None
        return
    assert found is not None
    [chosen] = {rack(p.node) for p in found.placements if p.node}
    # Every victim has pods in that rack: none is torn down for room the gang cannot use.
    assert all(any(rack(p.node) == chosen for p in v.holdings) for v in found.victims)
    assert fits_rack(chosen, list(found.victims))
    assert max(order.index(v) for v in found.victims) == best
