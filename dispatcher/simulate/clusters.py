"""`dispatcher simulate --clusters N`: a trace's GPUs split into N equal clusters, served three
ways, each first come first served (a job that does not fit now holds up those behind it):

- manager: one queue; the job at its head goes to the cluster where its gang fits whole now,
  best fit (dispatcher.fleet), as `dispatcher run --manager` does;
- round-robin: one queue; each job is given the next cluster in turn when it arrives and
  waits until it fits there;
- independent: each job joins the queue of the next cluster in turn; N queues, N
  dispatchers, none seeing the others.

Jobs whose gang does not fit even an empty cluster are left out of all three, and counted.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from dispatcher.fit import Capacity, Placement, Shortfall, place
from dispatcher.fit.gang import never_fits
from dispatcher.fleet import Chosen, Worker, choose
from dispatcher.resources import GPU
from dispatcher.simulate.engine import gpu_nodes
from dispatcher.simulate.traces import TraceJob
from dispatcher.wording import counted

Mode = Literal["manager", "round-robin", "independent"]
MODES: tuple[Mode, ...] = ("manager", "round-robin", "independent")


@dataclass(frozen=True)
class FleetResult:
    mode: Mode
    jobs: int
    mean_wait: float
    p90_wait: float
    utilisation: float  # GPU-seconds used / GPU-seconds there were, first submit to last end


def simulate_clusters(jobs: Sequence[TraceJob], clusters: int, nodes_per_cluster: int,
                      gpus_per_node: int, mode: Mode) -> FleetResult:
    caps = [Capacity.empty(gpu_nodes(nodes_per_cluster, gpus_per_node))
            for _ in range(clusters)]
    runnable = [j for j in jobs if _ever_fits(j, caps[0])]
    order = sorted(range(len(runnable)), key=lambda i: (runnable[i].submit, i))
    queues: list[deque[int]] = [deque() for _ in range(1 if mode != "independent" else clusters)]
    assigned: dict[int, int] = {}
    ends: list[tuple[float, int, int, tuple[Placement, ...]]] = []
    starts: dict[int, float] = {}
    arrived = 0
    used = 0.0
    t = 0.0
    while arrived < len(order) or ends or any(queues):
        next_arrival = runnable[order[arrived]].submit if arrived < len(order) else float("inf")
        next_end = ends[0][0] if ends else float("inf")
        t = min(next_arrival, next_end)
        while ends and ends[0][0] <= t:
            _, _, c, placements = heapq.heappop(ends)
            for p in placements:
                assert p.node is not None
                caps[c].give(p.node, p.request)
        while arrived < len(order) and runnable[order[arrived]].submit <= t:
            i = order[arrived]
            assigned[i] = arrived % clusters
            queues[0 if mode != "independent" else assigned[i]].append(i)
            arrived += 1
        for q, queue in enumerate(queues):
            while queue:
                i = queue[0]
                job = runnable[i]
                if mode == "manager":
                    workers = [Worker(f"c{c}", caps[c]) for c in range(clusters)]
                    answer = choose(job.wrapper.gang, workers)
                    if not isinstance(answer, Chosen):
                        break
                    c, placements = int(answer.cluster[1:]), answer.placements
                    for p in placements:
                        assert p.node is not None
                        caps[c].take(p.node, p.request)
                else:
                    c = assigned[i] if mode == "round-robin" else q
                    result = place(job.wrapper.gang, caps[c])
                    if isinstance(result, Shortfall):
                        break
                    placements = tuple(result)
                queue.popleft()
                starts[i] = t
                used += job.duration * job.wrapper.demand.get(GPU, 0)
                heapq.heappush(ends, (t + job.duration, i, c, tuple(placements)))
        if not ends and arrived >= len(order) and any(queues):
            break  # cannot happen for jobs that fit an empty cluster; no endless loop
    waits = sorted(starts[i] - runnable[i].submit for i in starts)
    first = min((j.submit for j in runnable), default=0.0)
    span = max(t - first, 1e-9)
    total = clusters * nodes_per_cluster * gpus_per_node
    return FleetResult(
        mode, len(runnable),
        sum(waits) / len(waits) if waits else 0.0,
        waits[int(0.9 * (len(waits) - 1))] if waits else 0.0,
        used / (total * span))


def never_fitting(jobs: Sequence[TraceJob], nodes_per_cluster: int, gpus_per_node: int) -> int:
    cap = Capacity.empty(gpu_nodes(nodes_per_cluster, gpus_per_node))
    return sum(1 for j in jobs if not _ever_fits(j, cap))


def _ever_fits(job: TraceJob, empty: Capacity) -> bool:
    return never_fits(job.wrapper.gang, empty) is None


def table(results: Sequence[FleetResult], clusters: int, left_out: int) -> str:
    lines = [f"{counted(clusters, 'cluster')}; {counted(left_out, 'job')} larger than one "
             "cluster left out",
             f"{'dispatch':<12} {'jobs':>7} {'mean wait':>12} {'p90 wait':>12} "
             f"{'GPU util':>9}"]
    for r in results:
        lines.append(f"{r.mode:<12} {r.jobs:>7} {r.mean_wait:>11.0f}s {r.p90_wait:>11.0f}s "
                     f"{100 * r.utilisation:>8.1f}%")
    return "\n".join(lines)
