"""What elastic gangs gain on the ITP traces: each trace replayed rigid and elastic.

The traces do not say which jobs could run on fewer GPUs; the assumption, printed with
the table: a job of N GPUs runs on ceil(N/2) to N of them, in whole pods (jobs of one
pod stay rigid), and its work scales linearly with its pods
(``dispatcher.simulate.elastic``). Cluster per trace as in bench/simulate.py: the fewest
8-GPU nodes that hold its largest job and keep its offered load at or below --load.

--high-priority F gives the fraction F of the jobs (by a hash of their id) priority 10,
as `dispatcher simulate --high-priority` does: with --policy priority or
priority-preemption, elastic jobs are then shrunk for them (rigid ones wait, or are
preempted whole).

Usage: python bench/elastic.py [--traces DIR] [--load 0.85] [--policy fifo,backfill]
                               [--only cluster01,cluster10] [--limit N] [--high-priority F]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulate import DEFAULT_TRACES, GPUS_PER_NODE, nodes_for, trace_paths

from dispatcher.policy_files import load_policy
from dispatcher.simulate import read_trace
from dispatcher.simulate.elastic import ASSUMPTION, compare, rows
from dispatcher.simulate.teams import TeamRule, assign

HEADER = ("trace", "jobs", "elastic", "nodes", "policy", "run", "mean wait", "median",
          "p95", "max wait", "util", "makespan", "preempted", "lost GPUh", "outs/ins",
          "wall s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--policy", default="fifo,backfill")
    ap.add_argument("--only", help="comma-separated trace names (without .csv)")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--high-priority", type=float, default=0.0)
    args = ap.parse_args()
    print(ASSUMPTION)
    print("cluster per trace: the fewest 8-GPU nodes that hold its largest job and keep its "
          f"offered load <= {args.load:.0%}; per-node fit")
    table: list[tuple[str, ...]] = [HEADER]
    for path in trace_paths(args.traces, args.only):
        trace = read_trace(path, GPUS_PER_NODE, args.limit)
        if args.high_priority:
            trace = assign(trace, TeamRule((("all", 1),), args.high_priority), ())
        nodes = nodes_for(trace, args.load)
        for name in args.policy.split(","):
            t0 = time.perf_counter()
            c = compare(trace, nodes, GPUS_PER_NODE, load_policy(name))
            wall = f"{time.perf_counter() - t0:.1f}"
            for k, r in enumerate(rows(c)):
                table.append((path.stem, f"{len(trace.jobs):,}", str(c.elastic_jobs),
                              str(nodes), name, *r, f"{c.scale_outs}/{c.scale_ins}" if k else "",
                              wall if k else ""))
            print(f"  {path.stem} {name}: {wall} s", file=sys.stderr)
    widths = [max(len(r[c]) for r in table) for c in range(len(HEADER))]
    for r in table:
        print("  ".join(v.ljust(w) if c < 6 else v.rjust(w)
                        for c, (v, w) in enumerate(zip(r, widths, strict=True))))


if __name__ == "__main__":
    main()
