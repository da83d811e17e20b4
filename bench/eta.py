"""Start estimates on the ITP traces: predicted against actual starts, in the simulator.

Each trace is replayed (per-node fit, on the fewest 8-GPU nodes that hold its largest job
at <= --load offered load, as bench/simulate.py does); at --samples moments spread over its
submissions, every queued job's start is estimated by the controller's estimator from the
simulated cluster at that moment -- with durations known exactly, and with durations
estimated from the history of completed jobs as the controller does -- and compared with
the start the simulation then gives it (dispatcher.simulate.accuracy).

Errors are absolute (|estimated - actual start|) and relative (that, over the actual wait
from the moment of the estimate). "beyond horizon": estimated not to start within 7 days;
"(wrong)": of those, jobs that did. s/round: seconds to compute one round of estimates (all
the queued jobs of one moment), median (max).

--speed: how long one round of estimates takes in the controller's setting: 1,000 nodes of
8 GPUs / 96 CPU / 1 TiB, half the GPUs held by admitted AppWrappers (1-4 pods of 1-4 GPUs;
they end within 4 hours), and 1,000 or 10,000 queued (gangs of 1-8 pods of 1-8 GPUs, as in
bench/engine.py) expected to run 10 minutes to 4 hours, per policy; with the controller's
default budget (5 s) and without one.

Usage: python bench/eta.py [--only cluster03,cluster07] [--policies fifo,backfill]
                           [--samples 30] [--load 0.85] [--limit N]
       python bench/eta.py --speed [--queued 1000,10000] [--nodes 1000] [--budget 600]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import resource
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import admitted_half, appwrapper_manifest, node_manifest
from simulate import DEFAULT_TRACES, GPUS_PER_NODE, nodes_for, trace_paths

from dispatcher.admission import queued_from_appwrapper
from dispatcher.api.models import parse_appwrapper
from dispatcher.cluster import ClusterState, node_from_object
from dispatcher.eta import Limits, RunningWrapper, forecast
from dispatcher.fit import Capacity
from dispatcher.policy_files import load_policy
from dispatcher.simulate import Simulation, gpu_nodes, read_trace
from dispatcher.simulate.accuracy import (
    ACCURACY_HEADER,
    MODES,
    Probe,
    accuracy_cells,
    compare,
    render,
)


def speed(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    state = ClusterState()
    for i in range(args.nodes):
        state.upsert_node(node_from_object(node_manifest(i)))
    admitted = admitted_half(state, rng)
    now = 0.0
    running = [RunningWrapper(a.key, a.holdings, now + rng.uniform(60, 4 * 3600), a)
               for a in admitted]
    print(f"One round of estimates: {args.nodes} nodes, {len(running)} admitted AppWrappers "
          "holding half the GPUs, per-node fit")
    header = ("queued", "policy", "budget", "wall s", "cpu s", "cycles", "estimated",
              "stopped", "last start")
    rows: list[tuple[str, ...]] = []
    for n in (int(x) for x in args.queued.split(",")):
        wrappers = [queued_from_appwrapper(parse_appwrapper(appwrapper_manifest(i, rng)), i)
                    for i in range(n)]
        durations = {w.key: rng.uniform(600, 4 * 3600) for w in wrappers}
        for name in args.policies.split(","):
            policy = load_policy(name)
            for budget in (5.0, args.budget):
                t0, c0 = time.perf_counter(), time.process_time()
                f = forecast(wrappers, running, Capacity.of(state), policy, now, durations,
                             limits=Limits(budget_seconds=budget))
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                starts = [e.at for e in f.estimates.values()
                          if e.outcome == "start" and e.at is not None]
                rows.append((f"{n:,}", policy.name, f"{budget:g} s", f"{wall:.2f}",
                             f"{cpu:.2f}", f"{f.cycles:,}", f"{len(starts):,} of {n:,}",
                             f.stopped or "-",
                             f"{max(starts, default=now) / 3600:.1f} h"))
                print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    print(render(header, rows))
    # As the controller runs a round: in a thread of its own, beside the event loop.
    gaps = asyncio.run(loop_stalls(functools.partial(
        forecast, wrappers, running, Capacity.of(state), load_policy("fifo"), now, durations,
        limits=Limits(budget_seconds=5.0))))
    idle = asyncio.run(loop_stalls(functools.partial(time.sleep, 5.0)))
    for what, g in ((f"beside a round ({len(wrappers):,} queued, fifo) in a thread", gaps),
                    ("beside a sleeping thread (the machine's own noise)", idle)):
        print(f"event loop {what}: longest stall {max(g) * 1000:.0f} ms, 99th percentile "
              f"{sorted(g)[int(len(g) * 0.99)] * 1000:.1f} ms over {len(g):,} ticks of 1 ms")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


async def loop_stalls(job: Callable[[], object]) -> list[float]:
    """How late a 1 ms ticker on the event loop runs while `job` runs in a thread."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(1) as pool:
        future = loop.run_in_executor(pool, job)
        gaps: list[float] = []
        last = time.perf_counter()
        while not future.done():
            await asyncio.sleep(0.001)
            t = time.perf_counter()
            gaps.append(t - last - 0.001)
            last = t
        await future
    return gaps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--only", help="comma-separated trace names (without .csv)")
    ap.add_argument("--policies", default="fifo,backfill")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--queued", default="1000,10000")
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--budget", type=float, default=600.0,
                    help="--speed: the larger budget, to see a whole round (default 600 s)")
    args = ap.parse_args()
    if args.speed:
        speed(args)
        return
    paths = trace_paths(args.traces, args.only)
    header = ("trace", "jobs", "nodes", "policy", *ACCURACY_HEADER)
    rows: list[tuple[str, ...]] = []
    started = time.perf_counter()
    for path in paths:
        trace = read_trace(path, GPUS_PER_NODE, args.limit)
        nodes = nodes_for(trace, args.load)
        submits = [j.submit for j in trace.jobs]
        for name in args.policies.split(","):
            policy = load_policy(name)
            probe = Probe(min(submits), max(submits), samples=args.samples)
            t0 = time.perf_counter()
            run = Simulation(trace.jobs, gpu_nodes(nodes, GPUS_PER_NODE), policy,
                             observe=probe).run()
            for mode in MODES:
                a = compare(probe, run.jobs, mode)
                rows.append((path.stem, f"{len(trace.jobs):,}", str(nodes), policy.name,
                             *accuracy_cells(a)))
            print(f"  {path.stem} {policy.name}: {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    print(render(header, rows))
    print(f"\n({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
