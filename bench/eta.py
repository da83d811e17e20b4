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

Usage: python bench/eta.py [--only cluster03,cluster07] [--policies fifo,backfill]
                           [--samples 30] [--load 0.85] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulate import DEFAULT_TRACES, GPUS_PER_NODE, nodes_for, trace_paths

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--only", help="comma-separated trace names (without .csv)")
    ap.add_argument("--policies", default="fifo,backfill")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--limit", type=int)
    args = ap.parse_args()
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
