"""The cost of a reservation pass: one admission cycle over 10,000 queued wrappers on
1,000 nodes of 8 GPUs, with and without reservations.

The cluster is 90% busy: running gangs of 1 to 32 GPUs, each expected to end within
the next 6 hours. The queue mixes sizes (most small, some gangs of 16 to 64 GPUs) in
arrival order; its head is a 64-GPU gang that does not fit now. Timed, best of
--repeat:

- without: one cycle of greedy backfill (no guard): `admit` over the whole queue;
- with: the reservation pass (`dispatcher.eta.reserve.reservations`: the line up to the
  head under strict head-of-line, and the replay of expected durations until the head
  starts) and then the cycle under `backfill: reserve`.

Prints both times and their ratio; the issue's budget for the pass is 1 s here.

Usage: python bench/reserve_scale.py [--queued 10000] [--nodes 1000] [--repeat 3]
                                     [--reserve-first K]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time

from dispatcher.admission import admit
from dispatcher.cluster.state import PlannedPod
from dispatcher.eta import RunningWrapper
from dispatcher.eta.reserve import reservations
from dispatcher.fit.capacity import Capacity
from dispatcher.fit.gang import place
from dispatcher.policy_files import load_policy
from dispatcher.queue import AdmissionQueue, Policy, QueuedWrapper, WrapperKey
from dispatcher.simulate import gpu_nodes
from dispatcher.simulate.traces import gpu_gang

NOW = 1_800_000_000.0


World = tuple[Capacity, list[RunningWrapper], list[QueuedWrapper], dict[WrapperKey, float]]


def world(queued: int, nodes: int, seed: int = 1) -> World:
    rnd = random.Random(seed)
    cap = Capacity.empty(gpu_nodes(nodes, 8))
    running: list[RunningWrapper] = []
    busy, target = 0, int(nodes * 8 * 0.9)
    i = 0
    while busy < target:
        gpus = rnd.choice([1, 1, 2, 4, 8, 8, 16, 32])
        w = QueuedWrapper("bench", f"run-{i}", f"r{i}", 0.0, gpu_gang(gpus, 8))
        i += 1
        placed = place(w.gang, cap)
        if not isinstance(placed, list):
            break
        busy += gpus
        running.append(RunningWrapper(w.key, tuple(PlannedPod(p.node, p.request)
                                                   for p in placed if p.node),
                                      NOW + rnd.uniform(60, 6 * 3600)))
    waiting = [QueuedWrapper("bench", "head", "head", 1.0, gpu_gang(nodes * 8 // 10 + 64, 8))]
    for k in range(queued - 1):
        gpus = rnd.choice([1, 1, 1, 2, 2, 4, 8, 8, 16, 32, 64])
        waiting.append(QueuedWrapper("bench", f"q-{k}", f"q{k}", 2.0 + k, gpu_gang(gpus, 8)))
    durations = {w.key: rnd.uniform(300, 8 * 3600) for w in waiting}
    return cap, running, waiting, durations


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reserve-first", type=int, default=1, metavar="K",
                    help="reserve the head and the next K-1 that do not fit now")
    args = ap.parse_args()
    cap, running, waiting, durations = world(args.queued, args.nodes)
    greedy = Policy("backfill-unguarded", backfill=True)
    reserve = dataclasses.replace(load_policy("reserve"), reserve_first=args.reserve_first)
    queue = AdmissionQueue(reserve)
    for w in waiting:
        queue.put(w)
    ordered = queue.ordered(NOW)
    without: list[float] = []
    with_: list[float] = []
    dispatched = (0, 0)
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        plain = admit(ordered, cap.copy(), greedy, NOW)
        without.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        planned = reservations(ordered, running, cap, reserve, NOW, durations)
        reserved = admit(ordered, cap.copy(), reserve, NOW, reservations=planned)
        with_.append(time.perf_counter() - t0)
        dispatched = (sum(d.decision == "dispatch" for d in plain),
                      sum(d.decision == "dispatch" for d in reserved))
    held = ", ".join(f"{r.key[1]} in {(r.at - NOW) / 3600:.1f} h on {len(r.nodes)} nodes"
                     for r in planned.held) or "none"
    print(f"{args.queued:,} queued x {args.nodes:,} nodes ({len(running):,} running), "
          f"best of {args.repeat}:")
    print(f"  without reservations: {min(without):.3f} s ({dispatched[0]} dispatched)")
    print(f"  with reservations:    {min(with_):.3f} s ({dispatched[1]} dispatched; "
          f"reserved: {held})")
    print(f"  ratio: {min(with_) / min(without):.2f}")


if __name__ == "__main__":
    main()
