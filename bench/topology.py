"""Topology benchmark: one admission cycle with a third of the gangs requiring a rack.

5,000 nodes (8 GPUs each) in 8 blocks x 40 racks (15 or 16 nodes a rack), the queued
AppWrappers of bench/engine.py (PyTorchJobs of 1 to 8 pods of 1 to 8 GPUs), every third
one annotated ``kueue.x-k8s.io/podset-required-topology: <rack label>`` (its whole gang in
one rack). Prints, per cluster state (empty; half the GPUs held at random) and policy: the
full cycle (wall, median of --repeat, and CPU), the head decision with its capacity
snapshot, and the same for the same AppWrappers without the annotation and without
levels, with the ratio (CPU) of the two. Issue 27's targets: cycle < 1 s, head < 5 ms.

Usage: python bench/topology.py [--wrappers 50000] [--nodes 5000] [--repeat 3] [--seed 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import appwrapper_manifest, fragmented, measure, node_manifest

from dispatcher.admission import NO_TOPOLOGY, queued_from_appwrapper
from dispatcher.api.models import parse_appwrapper
from dispatcher.cluster import ClusterState, node_from_object
from dispatcher.fit import GangPodSet
from dispatcher.fit.topology import Topology
from dispatcher.kinds.podspec import REQUIRED_TOPOLOGY
from dispatcher.policy_files import load_policy
from dispatcher.queue import AdmissionQueue, QueuedWrapper

BLOCK = "cloud.provider.com/topology-block"
RACK = "cloud.provider.com/topology-rack"
LEVELS = Topology((BLOCK, RACK, "kubernetes.io/hostname"))
BLOCKS, RACKS = 8, 40  # racks per block


def racked_state(nodes: int) -> ClusterState:
    state = ClusterState()
    for i in range(nodes):
        manifest = node_manifest(i)
        rack = i * BLOCKS * RACKS // nodes
        manifest["metadata"]["labels"] = {
            BLOCK: f"b{rack // RACKS}", RACK: f"r{rack}",
            "kubernetes.io/hostname": manifest["metadata"]["name"]}
        state.upsert_node(node_from_object(manifest))
    return state


def without_topology(w: QueuedWrapper) -> QueuedWrapper:
    gang = tuple(GangPodSet(g.item, dataclasses.replace(g.pod_set, topology=None))
                 for g in w.gang)
    return dataclasses.replace(w, gang=gang)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wrappers", type=int, default=50_000)
    ap.add_argument("--nodes", type=int, default=5_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    manifests = [appwrapper_manifest(i, rng) for i in range(args.wrappers)]
    for m in manifests[::3]:
        m["metadata"]["annotations"] = {REQUIRED_TOPOLOGY: RACK}
    racked = [queued_from_appwrapper(parse_appwrapper(m), float(i))
              for i, m in enumerate(manifests)]
    plain = [without_topology(w) for w in racked]
    print(f"{args.wrappers} AppWrappers ({len(manifests[::3])} require a rack), {args.nodes} "
          f"nodes in {BLOCKS} blocks x {RACKS} racks; built in "
          f"{time.perf_counter() - t0:.1f} s")
    header = ("cluster", "policy", "topology", "cycle ms", "cpu ms", "head ms", "dispatched",
              "fit checks")
    print("  ".join(f"{h:>11}" for h in header))
    now = float(args.wrappers)
    worst_cycle = worst_head = 0.0
    ratios: list[str] = []
    for state_name in ("empty", "fragmented"):
        state = racked_state(args.nodes)
        if state_name == "fragmented":
            fragmented(state, random.Random(args.seed))
        for policy_name in ("fifo", "backfill"):
            policy = load_policy(policy_name)
            cpu: dict[bool, float] = {}
            for on, wrappers, topology in ((False, plain, NO_TOPOLOGY), (True, racked, LEVELS)):
                queue = AdmissionQueue(policy)
                for w in wrappers:
                    queue.put(w)
                ordered = list(queue.ordered(now))
                cycle, cpu[on], head, _, dispatched, checks = measure(
                    state, ordered, policy, "per-node", now, args.repeat, topology)
                if on:
                    worst_cycle, worst_head = max(worst_cycle, cycle), max(worst_head, head)
                print("  ".join(f"{v:>11}" for v in (
                    state_name, policy_name, "on" if on else "off", f"{cycle:.0f}",
                    f"{cpu[on]:.0f}", f"{head:.2f}", dispatched, checks)))
            ratios.append(f"{state_name}/{policy_name} {cpu[True] / max(cpu[False], 1e-9):.2f}x")
    print(f"with topology: worst full cycle {worst_cycle:.0f} ms (target < 1000 ms: "
          f"{'met' if worst_cycle < 1000 else 'MISSED'}), worst head decision incl. snapshot "
          f"{worst_head:.2f} ms (target < 5 ms: {'met' if worst_head < 5 else 'MISSED'})")
    print("cycle CPU with topology / without: " + ", ".join(ratios))


if __name__ == "__main__":
    main()
