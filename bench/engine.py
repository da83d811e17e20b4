"""Engine benchmark: one admission cycle over 50,000 queued AppWrappers and 5,000 nodes.

Gangs of 1 to 8 pods of 1 to 8 GPUs each (a PyTorchJob per AppWrapper), nodes of
8 GPUs / 96 CPU / 1 TiB. Prints, per fit mode and policy: the full cycle (wall, median of
--repeat, and the CPU time of one), the time to decide the head alone, and the process's
peak RSS. Targets on a 2-core machine (issue 14): cycle < 1 s, head < 5 ms, RSS < 500 MB.
Two cluster states: empty, and a fragmented one where half the GPUs are held by running
pods spread at random. The wall times are those of a machine shared with other work; the
CPU times say what the cycle itself costs.

With quotas (issue 12), in the same run: a 3-level quota tree (the cluster's GPUs over 4
departments of 4 teams each, every fourth team hard-limited, and a default leaf), the
AppWrappers spread over the 16 teams, and half the GPUs held by admitted AppWrappers of
those teams (whose usage the cycle rebuilds, as the controller will); cycle time with
quotas off and on per policy, and with the priority-preemption policy (whose searches for
victims are part of the cycle).

Usage: python bench/engine.py [--wrappers 50000] [--nodes 5000] [--seed 7] [--no-quota]
                              [--repeat 3]
(issue 12's figure with quotas: --wrappers 10000 --nodes 1000)
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import time
from typing import Any

from dispatcher.admission import (
    NO_TOPOLOGY,
    QUOTA_EXCEEDED,
    UNKNOWN_QUOTA,
    CycleStats,
    Decision,
    Fit,
    admit,
    queued_from_appwrapper,
)
from dispatcher.api.models import parse_appwrapper
from dispatcher.cluster import BoundPod, ClusterState, node_from_object
from dispatcher.fit import Capacity
from dispatcher.fit.topology import Topology
from dispatcher.policy_files import load_policy
from dispatcher.preemption import AdmittedWrapper, quota_ledger
from dispatcher.queue import AdmissionQueue, Policy, QueuedWrapper
from dispatcher.quota import QuotaForest

GPU = "nvidia.com/gpu"
QUOTA_TREE = "quota_gpu"
TEAMS = 16  # 4 departments x 4 teams


def node_manifest(i: int) -> dict[str, Any]:
    alloc = {"cpu": "96", "memory": "1Ti", "pods": "110", GPU: "8"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{i:04d}"},
            "status": {"allocatable": alloc, "capacity": alloc}}


def appwrapper_manifest(i: int, rng: random.Random) -> dict[str, Any]:
    pods, gpus = rng.randint(1, 8), rng.randint(1, 8)
    container = {"name": "trainer", "image": "pytorch",
                 "resources": {"limits": {GPU: gpus, "cpu": str(gpus * 4),
                                          "memory": f"{gpus * 32}Gi"}}}
    replica = {"replicas": pods - 1, "template": {"spec": {"containers": [container]}}}
    master = {"replicas": 1, "template": {"spec": {"containers": [container]}}}
    specs = {"Master": master} | ({"Worker": replica} if pods > 1 else {})
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
           "metadata": {"name": f"job-{i}"}, "spec": {"pytorchReplicaSpecs": specs}}
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": f"aw-{i:05d}", "namespace": "bench", "uid": f"uid-{i:05d}",
                         "labels": {QUOTA_TREE: f"team-{i % TEAMS}"}},
            "spec": {"priority": rng.randint(0, 3), "resources": {"GenericItems": [
                {"generictemplate": job}]}}}


def fragmented(state: ClusterState, rng: random.Random) -> None:
    """Half the GPUs held by 1- to 4-GPU pods spread at random over the nodes."""
    target = sum(n.allocatable[GPU] for n in state.nodes.values()) // 2
    names = sorted(state.nodes)
    held, k = 0, 0
    while held < target:
        name = rng.choice(names)
        g = rng.randint(1, 4)
        if state.free(name)[GPU] < g:
            continue
        state.upsert_pod(("other", f"p{k}"), BoundPod("other", f"p{k}", name,
                                                      {GPU: g, "cpu": g * 4000, "pods": 1}))
        held += g
        k += 1


def quota_subtrees(nodes: int) -> list[dict[str, Any]]:
    """cluster (every GPU) > 4 departments (a quarter each) > 4 teams (a sixteenth each);
    every fourth team has hardLimit; a default leaf with nothing under the root."""
    gpus = nodes * 8

    def subtree(name: str, children: list[tuple[str, int, bool]],
                parent: str | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"children": [
            {"name": n, "quotas": {"hardLimit": hard, "requests": {GPU: g}}}
            for n, g, hard in children]}
        if parent:
            spec["parent"] = parent
        return {"apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
                "metadata": {"name": name, "namespace": "kube-system",
                             "labels": {"tree": QUOTA_TREE}}, "spec": spec}

    objs = [subtree("cluster", [("cluster", gpus, False)]),
            subtree("departments", [(f"dept-{d}", gpus // 4, False) for d in range(4)]
                    + [("default", 0, False)], parent="cluster")]
    for d in range(4):
        objs.append(subtree(f"teams-{d}", [(f"team-{4 * d + t}", gpus // TEAMS, t == 3)
                                           for t in range(4)], parent=f"dept-{d}"))
    return objs


def admitted_half(state: ClusterState, rng: random.Random) -> list[AdmittedWrapper]:
    """Half the GPUs held by admitted AppWrappers of 1-4 pods of 1-4 GPUs, one per team
    in turn, priorities 0-3, dispatched over the past hour."""
    target = sum(n.allocatable[GPU] for n in state.nodes.values()) // 2
    names = sorted(state.nodes)
    held, k = 0, 0
    records: list[AdmittedWrapper] = []
    while held < target:
        name = f"running-{k:05d}"
        pods, gpus = rng.randint(1, 4), rng.randint(1, 4)
        request = {GPU: gpus, "cpu": gpus * 4000, "pods": 1}
        for p in range(pods):
            while True:
                node = rng.choice(names)
                if state.free(node)[GPU] >= gpus:
                    break
            state.upsert_pod(("bench", f"{name}-{p}"),
                             BoundPod("bench", f"{name}-{p}", node, request, name))
        held += pods * gpus
        records.append(AdmittedWrapper(
            "bench", name, f"uid-{name}", float(rng.randint(0, 3)),
            {r: v * pods for r, v in request.items()},
            tuple(state.holdings(("bench", name))), -rng.uniform(0, 3600),
            ((QUOTA_TREE, f"team-{k % TEAMS}"),)))
        k += 1
    return records


def quota_rows(args: argparse.Namespace, wrappers: list[QueuedWrapper]) -> None:
    state = ClusterState()
    for i in range(args.nodes):
        state.upsert_node(node_from_object(node_manifest(i)))
    admitted = admitted_half(state, random.Random(args.seed))
    forest = QuotaForest.from_objects(quota_subtrees(args.nodes))
    assert not forest.problems, forest.problems
    now = float(args.wrappers)
    print()
    print(f"With quotas: tree {QUOTA_TREE} of {sum(len(t.order) for t in forest.trees.values())} "
          f"nodes in 3 levels, {len(admitted)} admitted AppWrappers holding half the GPUs, "
          f"{len(wrappers)} queued (per-node fit; each cycle includes the capacity snapshot and, "
          "with quotas, rebuilding the usage from the admitted AppWrappers)")
    header = ("policy", "quotas", "cycle ms", "cpu ms", "dispatched", "preempt",
              "quota waits", "searches")
    print("  ".join(f"{h:>12}" for h in header))
    results: dict[tuple[str, bool], float] = {}
    cpus: dict[tuple[str, bool], float] = {}
    for policy_name in ("fifo", "priority", "backfill", "priority-preemption"):
        policy = load_policy(policy_name)
        queue = AdmissionQueue(policy)
        for w in wrappers:
            queue.put(w)
        ordered = list(queue.ordered(now))
        for on in (False, True):
            def cycle(on: bool = on, policy: Policy = policy,
                      ordered: list[QueuedWrapper] = ordered) -> tuple[list[Decision],
                                                                     CycleStats]:
                stats = CycleStats()
                ledger = quota_ledger(forest, admitted) if on else None
                return admit(ordered, Capacity.of(state), policy, now, "per-node", stats,
                             quota=ledger, admitted=admitted), stats
            cpu0 = time.process_time()
            ms, (decisions, stats) = timed(cycle, repeat=args.repeat)
            cpu = (time.process_time() - cpu0) / args.repeat
            results[(policy_name, on)] = ms * 1e3
            cpus[(policy_name, on)] = cpu * 1e3
            print("  ".join(f"{v:>12}" for v in (
                policy_name, "on" if on else "off", f"{ms * 1e3:.0f}", f"{cpu * 1e3:.0f}",
                sum(d.decision == "dispatch" for d in decisions),
                sum(d.decision == "preempt" for d in decisions),
                sum(d.reason in (QUOTA_EXCEEDED, UNKNOWN_QUOTA) for d in decisions),
                stats.preemptions)))
    worst = max(v for (_, on), v in results.items() if on)
    worst_cpu = max(v for (_, on), v in cpus.items() if on)
    print(f"worst full cycle with quotas {worst:.0f} ms, {worst_cpu:.0f} ms CPU (target < "
          f"1000 ms: {'met' if worst < 1000 else 'MISSED'}); quotas on / off per policy (CPU): "
          + ", ".join(f"{p} {cpus[(p, True)] / cpus[(p, False)]:.2f}x"
                      for p in ("fifo", "priority", "backfill", "priority-preemption")))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn: Any, repeat: int = 5) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def measure(state: ClusterState, ordered: list[QueuedWrapper], policy: Policy, fit: Fit,
            now: float, repeat: int, topology: Topology = NO_TOPOLOGY
            ) -> tuple[float, float, float, float, int, int]:
    """Full cycle (wall and CPU) and head decision (each with its capacity snapshot),
    head alone; with the topology levels if given."""
    cpu0 = time.process_time()
    cycle_s, decisions = timed(lambda: admit(ordered, Capacity.of(state), policy, now, fit,
                                             topology=topology), repeat)
    cpu_s = (time.process_time() - cpu0) / repeat
    head_s, _ = timed(lambda: admit(ordered[:1], Capacity.of(state), policy, now, fit,
                                    topology=topology), 9)
    cap = Capacity.of(state)
    t0 = time.perf_counter()
    admit(ordered[:1], cap, policy, now, fit, topology=topology)
    head_only_s = time.perf_counter() - t0
    stats = CycleStats()
    admit(ordered, Capacity.of(state), policy, now, fit, stats, topology=topology)
    dispatched = sum(d.decision == "dispatch" for d in decisions)
    return (cycle_s * 1e3, cpu_s * 1e3, head_s * 1e3, head_only_s * 1e3, dispatched,
            stats.fit_checks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wrappers", type=int, default=50_000)
    ap.add_argument("--nodes", type=int, default=5_000)
    ap.add_argument("--repeat", type=int, default=3, help="full cycles timed per row")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-quota", action="store_true", help="skip the runs with quotas")
    args = ap.parse_args()
    rng = random.Random(args.seed)

    t0 = time.perf_counter()
    manifests = [appwrapper_manifest(i, rng) for i in range(args.wrappers)]
    t1 = time.perf_counter()
    wrappers = [queued_from_appwrapper(parse_appwrapper(m), float(i))
                for i, m in enumerate(manifests)]
    t2 = time.perf_counter()
    print(f"{args.wrappers} AppWrappers, {args.nodes} nodes x 8 GPU / 96 CPU / 1 TiB")
    print(f"  parse + pod-set inference: {(t2 - t1) * 1e3:.0f} ms "
          f"({(t2 - t1) / args.wrappers * 1e6:.0f} us per AppWrapper; manifests built in "
          f"{(t1 - t0) * 1e3:.0f} ms)")

    now = float(args.wrappers)
    rows: list[tuple[Any, ...]] = []
    for state_name in ("empty", "fragmented"):
        state = ClusterState()
        for i in range(args.nodes):
            state.upsert_node(node_from_object(node_manifest(i)))
        if state_name == "fragmented":
            fragmented(state, random.Random(args.seed))
        for policy_name in ("fifo", "priority", "backfill"):
            policy = load_policy(policy_name)
            queue = AdmissionQueue(policy)
            t_q = time.perf_counter()
            for w in wrappers:
                queue.put(w)
            queue_ms = (time.perf_counter() - t_q) * 1e3
            ordered: list[QueuedWrapper] = list(queue.ordered(now))
            fits: tuple[Fit, ...] = ("per-node", "aggregate")
            for fit in fits:
                rows.append((state_name, policy_name, fit,
                             *measure(state, ordered, policy, fit, now, args.repeat),
                             queue_ms))
    cap_s, _ = timed(lambda: Capacity.of(state))
    print(f"  capacity snapshot of {args.nodes} nodes: {cap_s * 1e3:.2f} ms")
    print()
    header = ("cluster", "policy", "fit", "cycle ms", "cycle cpu ms", "head ms",
              "head-only ms", "dispatched", "fit checks", "queue build ms")
    print("  ".join(f"{h:>14}" for h in header))
    for r in rows:
        print("  ".join(f"{v:>14.1f}" if isinstance(v, float) else f"{v!s:>14}" for v in r))
    print()
    worst_cycle = max(r[3] for r in rows)
    worst_cpu = max(r[4] for r in rows)
    worst_head = max(r[5] for r in rows)
    print(f"worst full cycle {worst_cycle:.0f} ms, {worst_cpu:.0f} ms CPU (target < 1000 ms: "
          f"{'met' if worst_cycle < 1000 else 'MISSED'}); worst head decision incl. snapshot "
          f"{worst_head:.1f} ms (target < 5 ms: {'met' if worst_head < 5 else 'MISSED'}); "
          f"peak RSS {rss_mb():.0f} MB (target < 500 MB: {'met' if rss_mb() < 500 else 'MISSED'})")
    for state_name in ("empty", "fragmented"):
        for policy_name in ("fifo", "backfill"):
            pn = next(r for r in rows if r[:3] == (state_name, policy_name, "per-node"))
            ag = next(r for r in rows if r[:3] == (state_name, policy_name, "aggregate"))
            print(f"  {state_name}/{policy_name}: per-node cycle / aggregate cycle = "
                  f"{pn[4] / max(ag[4], 1e-9):.1f}x (CPU); dispatched per-node {pn[7]} vs "
                  f"aggregate {ag[7]}")
    if not args.no_quota:
        quota_rows(args, wrappers)


if __name__ == "__main__":
    main()
