"""Autopilot's node health labels: which resources of a node are flagged, what the fit
offers there, and the installation's settings (codeflare's `autopilot` form)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.cluster import ClusterState, node_from_object
from dispatcher.cluster.autopilot import NO_AUTOPILOT
from dispatcher.config import DispatcherConfig
from dispatcher.fit import Capacity
from dispatcher.fit.constraints import node_takes
from dispatcher.fit.gang import GangPodSet, Shortfall, place
from dispatcher.kinds.podset import NO_CONSTRAINTS, PodSet

HEALTH = "autopilot.ibm.com/gpuhealth"
GPU = "nvidia.com/gpu"


def node(name: str, health: str | None = None, **labels: str) -> dict[str, Any]:
    alloc = {"cpu": "8", "memory": "64Gi", "pods": "110", GPU: "8"}
    if health is not None:
        labels[HEALTH] = health
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": alloc}}


@pytest.mark.parametrize("health,withheld,evicting", [
    (None, set(), set()), ("WARN", set(), set()), ("TESTING", {GPU}, set()),
    ("EVICT", {GPU}, {GPU}), ("ERR", set(), set())])
def test_codeflare_default_labels(health: str | None, withheld: set[str],
                                  evicting: set[str]) -> None:
    n = node_from_object(node("n", health))
    assert (n.withheld, n.evicting) == (withheld, evicting)


def gang(gpus: int, cpu: int = 1000) -> list[GangPodSet]:
    request = {"cpu": cpu, GPU: gpus} if gpus else {"cpu": cpu}
    return [GangPodSet(0, PodSet("p", 1, request, NO_CONSTRAINTS))]


@given(st.integers(1, 8), st.sampled_from(["TESTING", "EVICT"]))
def test_no_new_gpu_pod_on_a_flagged_node_but_cpu_pods_still_go(gpus: int,
                                                                health: str) -> None:
    state = ClusterState()
    state.upsert_node(node_from_object(node("a-flagged", health)))
    cap = Capacity.of(state)
    assert isinstance(place(gang(gpus), cap), Shortfall)
    placed = place(gang(0), cap)
    assert not isinstance(placed, Shortfall) and placed[0].node == "a-flagged"
    state.upsert_node(node_from_object(node("b-healthy")))
    placed = place(gang(gpus), Capacity.of(state))
    assert not isinstance(placed, Shortfall) and placed[0].node == "b-healthy"
    flagged = state.nodes["a-flagged"]
    assert not node_takes(flagged, NO_CONSTRAINTS, {GPU: gpus})
    assert node_takes(flagged, NO_CONSTRAINTS, {"cpu": 1000})


def test_the_installation_names_its_own_labels_or_turns_them_off() -> None:
    config = DispatcherConfig.model_validate({"autopilot": {
        "preferNoScheduleWeight": 50,
        "resourceTaints": {"example.com/fpga": [
            {"key": "fpga-health", "value": "BAD", "effect": "NoExecute"}]}}})
    rules = config.node_health
    assert node_from_object(node("n", "EVICT"), rules).evicting == frozenset()
    flagged = node_from_object(node("n", None, **{"fpga-health": "BAD"}), rules)
    assert flagged.evicting == {"example.com/fpga"} == flagged.withheld
    off = DispatcherConfig.model_validate(
        {"autopilot": {"injectAntiAffinities": False, "monitorNodes": False}}).node_health
    n = node_from_object(node("n", "EVICT"), off)
    assert (n.withheld, n.evicting) == (frozenset(), frozenset())
    assert node_from_object(node("n", "EVICT"), NO_AUTOPILOT).withheld == frozenset()


def test_a_label_effect_that_is_not_a_taint_effect_is_refused() -> None:
    with pytest.raises(ValueError, match="effect"):
        DispatcherConfig.model_validate({"autopilot": {"resourceTaints": {GPU: [
            {"key": HEALTH, "value": "EVICT", "effect": "Evict"}]}}})
