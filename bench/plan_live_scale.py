"""How long `dispatcher plan --live` takes to answer on a large cluster, listing aside:
`dispatcher.whatif.what_if` over 1,000 nodes of 8 GPUs (90% busy: running AppWrappers and
their pods), 10,000 pending AppWrappers, and one AppWrapper submitted. The issue's target
for the whole answer is 2 s; the listing through the API server comes on top.

The CPU time is printed beside the wall time: on a shared machine it is the steadier of
the two; the load average says how shared. The two replays inside stop on wall time
(`dispatcher.whatif.LIMITS`), so on a loaded machine they get less of the CPU.

Usage: python bench/plan_live_scale.py [--queued 10000] [--nodes 1000] [--policy reserve]
"""

from __future__ import annotations

import argparse
import os
import random
import time
from typing import Any

from dispatcher.plan import Document
from dispatcher.policy_files import load_policy
from dispatcher.whatif import Live, what_if

GPU = "nvidia.com/gpu"
NOW = 1_800_000_000.0
CREATED = "2027-01-15T07:00:00Z"


def appwrapper(name: str, pods: int, gpus: int, running: bool = False) -> dict[str, Any]:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"parallelism": pods, "completions": pods, "template": {"spec": {
               "containers": [{"name": "c", "resources": {"limits": {GPU: gpus}}}]}}}}
    obj: dict[str, Any] = {
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        # As listed: the API server gives every object a uid.
        "metadata": {"name": name, "namespace": "bench", "uid": f"uid-{name}",
                     "creationTimestamp": CREATED},
        "spec": {"resources": {"GenericItems": [{"generictemplate": job}]}}}
    if running:
        obj["status"] = {"state": "Running", "queuejobstate": "Running"}
    return obj


def pod(name: str, owner: str, node: str, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "bench",
                         "labels": {"workload.codeflare.dev/appwrapper": owner}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {
                "limits": {GPU: str(gpus)}}}]}, "status": {"phase": "Running"}}


def world(queued: int, nodes: int, seed: int = 1) -> Live:
    rnd = random.Random(seed)
    cluster = [Document(f"node {i}", {"apiVersion": "v1", "kind": "Node",
                                      "metadata": {"name": f"n{i:04d}"},
                                      "status": {"allocatable": {"cpu": "96",
                                                                 "memory": "1Ti",
                                                                 "pods": "110",
                                                                 GPU: "8"}}})
               for i in range(nodes)]
    wrappers = []
    # Whole busy nodes, one running AppWrapper of 1 to 4 nodes at a time.
    node, busy, i = 0, int(nodes * 0.9), 0
    while node < busy:
        span = min(rnd.choice([1, 1, 2, 4]), busy - node)
        name = f"run-{i}"
        wrappers.append(Document(name, appwrapper(name, span, 8, running=True)))
        cluster += [Document(f"{name}-{k}", pod(f"{name}-{k}", name, f"n{node + k:04d}", 8))
                    for k in range(span)]
        node += span
        i += 1
    for k in range(queued):
        gpus = rnd.choice([1, 2, 4, 8, 8, 16, 32])
        pods, per_pod = max(gpus // 8, 1), min(gpus, 8)
        wrappers.append(Document(f"q-{k}", appwrapper(f"q-{k}", pods, per_pod)))
    return Live(cluster, wrappers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=1_000)
    ap.add_argument("--policy", default="reserve")
    args = ap.parse_args()
    live = world(args.queued, args.nodes)
    mine = [Document("submitted", appwrapper("mine", 4, 8))]
    t0, c0 = time.perf_counter(), time.process_time()
    answer = what_if(live, mine, load_policy(args.policy), "per-node", NOW)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    (a,) = answer.answers
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{args.queued:,} pending x {args.nodes:,} nodes, policy {args.policy}: "
          f"{seconds:.2f} s ({cpu:.2f} s of CPU; load average {load}); "
          f"{a.decision.decision}, estimate {a.estimate}, {len(a.delays)} delayed")


if __name__ == "__main__":
    main()
