"""Topology-aware placement on a real control plane: fake nodes in blocks and racks.

Six nodes of 8 GPUs: block b1 holds rack r1 (2 nodes) and rack r2 (3 nodes), block b2
holds rack r3 (1 node). The dispatcher runs with a configuration naming the block and
rack labels as its topology levels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import Cluster, Kubectl, wait_for

from .dispatcher_process import DispatcherProcess, install_crd, wait_quiet
from .test_controller import appwrapper, job, latest, running_pods, wait_condition

BLOCK = "cloud.provider.com/topology-block"
RACK = "cloud.provider.com/topology-rack"
REQUIRED = "kueue.x-k8s.io/podset-required-topology"
PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
CAPACITY = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8",
            "ephemeral-storage": "1Ti", "pods": "110"}


@pytest.fixture
def racks(node_profile: Callable[[str], list[str]], tmp_path: Path) -> list[str]:
    # Node names sort r3's first, then r1's: a plain best fit (ties broken by name) would
    # put a gang on r3's node and r1's.
    groups = [("a", "r3", "b2", 1), ("b", "r1", "b1", 2), ("c", "r2", "b1", 3)]
    doc = {"description": "6 GPU nodes in 2 blocks and 3 racks (topology test)", "nodes": [
        {"name": name, "count": count, "capacity": CAPACITY,
         "labels": {BLOCK: block, RACK: rack}} for name, rack, block, count in groups]}
    path = tmp_path / "racks.yaml"
    path.write_text(yaml.safe_dump(doc))
    return node_profile(str(path))


@pytest.fixture
def dispatcher(local_cluster: Cluster, kubectl: Kubectl, racks: list[str],
               tmp_path: Path) -> Iterator[DispatcherProcess]:
    install_crd(kubectl)
    wait_quiet(kubectl)
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"topology": {"levels": [BLOCK, RACK]}}))
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs / "topology")
    d.start("fifo", extra_args=["--config", str(config)])
    yield d
    d.stop()


def racked(name: str, pods: int, annotation: str = REQUIRED,
           on_template: bool = False) -> dict[str, Any]:
    """An AppWrapper of a Job of `pods` whole-node pods asking for one rack: on the
    AppWrapper (the whole gang) or on the Job's pod template."""
    item = job(name, pods=pods, gpus=8)
    aw = appwrapper(name, item)
    if on_template:
        item["spec"]["template"]["metadata"]["annotations"][annotation] = RACK
    else:
        aw["metadata"]["annotations"] = {annotation: RACK}
    return aw


def racks_of(kubectl: Kubectl, pods: list[dict[str, Any]]) -> set[str]:
    rack = {n["metadata"]["name"]: n["metadata"]["labels"].get(RACK)
            for n in kubectl.items("nodes")}
    return {rack[p["spec"]["nodeName"]] for p in pods}


def test_required_gangs_land_in_one_rack_and_a_gang_waits_for_a_rack_while_the_total_fits(
        dispatcher: DispatcherProcess, kubectl: Kubectl, k: Kubectl) -> None:
    # Three whole nodes: only rack r2 holds them (plain best fit would take r3's and r1's).
    k.apply(racked("three", 3))
    wait_condition(k, "three", "Running", timeout=120)
    assert racks_of(kubectl, running_pods(k, "three", 3)) == {"r2"}
    # 24 GPUs free (r1's two nodes and r3's one), but no rack has them.
    k.apply(racked("big", 3))
    aw = wait_condition(k, "big", "Backoff")
    assert latest(aw)["message"] == (
        f"NoTopologyDomain: needs 24 nvidia.com/gpu in one {RACK}: best rack r1 has 16 "
        "nvidia.com/gpu free; 24 nvidia.com/gpu free in total")
    assert not k.items("jobs", "-l", "workload.codeflare.dev/appwrapper=big")
    k("delete", "appwrapper", "big")
    # A pod set that prefers one rack: the two pods share r1, the one rack holding them
    # (plain best fit would take r3's node and one of r1's).
    k.apply(racked("pair", 2, PREFERRED, on_template=True))
    wait_condition(k, "pair", "Running", timeout=120)
    assert racks_of(kubectl, running_pods(k, "pair", 2)) == {"r1"}
    # The rack frees: the waiting shape now fits r2 again.
    k("delete", "appwrapper", "three")
    k.apply(racked("again", 3))
    wait_condition(k, "again", "Running", timeout=120)
    wait_for(lambda: racks_of(kubectl, running_pods(k, "again", 3)) == {"r2"}, 30,
             "the three pods of again in rack r2")


def pinned(name: str, pods: int, rack: str) -> dict[str, Any]:
    """An AppWrapper of a Job of `pods` whole-node pods, without topology, kept to the
    nodes of one rack by a node selector: busy nodes where the test wants them."""
    item = job(name, pods=pods, gpus=8)
    item["spec"]["template"]["spec"]["nodeSelector"] = {RACK: rack}
    return appwrapper(name, item)


def test_the_first_gang_takes_the_fuller_rack_so_the_second_one_runs_too(
        dispatcher: DispatcherProcess, kubectl: Kubectl, k: Kubectl) -> None:
    # r3's node and two of r2's three are busy: r1 has 16 GPUs free of 16, r2 8 of 24.
    k.apply(pinned("busy-r3", 1, "r3"))
    k.apply(pinned("busy-r2", 2, "r2"))
    wait_condition(k, "busy-r3", "Running", timeout=120)
    wait_condition(k, "busy-r2", "Running", timeout=120)
    # One whole node requiring a rack fits r1 and r2: it goes to r2, the fuller (nothing
    # left there, against 8 GPUs left in r1), and r1 stays whole for the pair after it.
    k.apply(racked("one", 1))
    wait_condition(k, "one", "Running", timeout=120)
    assert racks_of(kubectl, running_pods(k, "one", 1)) == {"r2"}
    k.apply(racked("pair", 2))
    wait_condition(k, "pair", "Running", timeout=120)
    assert racks_of(kubectl, running_pods(k, "pair", 2)) == {"r1"}
