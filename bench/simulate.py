"""Trace replay benchmark: how fast is `dispatcher simulate`, and what do policies do?

1. Speed: the largest ITP trace (most jobs) replayed on 64 nodes x 8 GPUs, and the
   reference run cluster07.csv on 64 x 8 (target: under a minute on a 2-core machine):
   wall time, events (arrivals + completions) per second, admission cycles.
2. Comparison: every trace under fifo / priority / backfill, each with per-node fit and
   MCAD's aggregate rule. Cluster size per trace: the fewest 8-GPU nodes that hold its
   largest job and keep its offered load (GPU-seconds / submission span) at or below
   --load (default 85%) -- busy enough that queues form in its bursts. --nodes N uses
   N nodes for every trace instead. --limit N replays only the first N jobs of each.
   The ITP traces carry no priorities, so `priority` orders by arrival like `fifo` and
   the two rows must agree (the script checks it).

Usage: python bench/simulate.py [--traces DIR] [--load 0.85] [--nodes N] [--limit N]
                                [--only cluster03,cluster07] [--skip-speed]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from dispatcher.admission import Fit
from dispatcher.policy_files import load_policy
from dispatcher.simulate import Run, Summary, read_trace, simulate, summarise
from dispatcher.simulate.traces import Trace
from dispatcher.wording import span

DEFAULT_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "itp"
POLICIES = ("fifo", "priority", "backfill")
FITS: tuple[Fit, ...] = ("per-node", "aggregate")
GPUS_PER_NODE = 8


def nodes_for(trace: Trace, load: float) -> int:
    jobs = trace.jobs
    span = max(j.submit for j in jobs) - min(j.submit for j in jobs)
    work = sum(j.gpus * j.duration for j in jobs)
    by_load = math.ceil(work / max(span, 1.0) / (GPUS_PER_NODE * load))
    by_size = math.ceil(max(j.gpus for j in jobs) / GPUS_PER_NODE)
    return max(by_load, by_size, 1)


def trace_paths(directory: Path, only: str | None) -> list[Path]:
    """The CSV traces of `directory`, or those named in `only` (comma-separated stems)."""
    paths = sorted(directory.glob("*.csv"))
    if only:
        wanted = set(only.split(","))
        paths = [p for p in paths if p.stem in wanted]
    if not paths:
        raise SystemExit(f"no .csv traces in {directory}")
    return paths


def speed(path: Path, nodes: int, label: str, target: float | None = None) -> None:
    t0 = time.perf_counter()
    trace = read_trace(path, GPUS_PER_NODE)
    read_s = time.perf_counter() - t0
    policy = load_policy("fifo")
    for fit in FITS:
        t1 = time.perf_counter()
        run = simulate(trace.jobs, nodes, GPUS_PER_NODE, policy, fit)
        s = summarise(run, trace)
        total = read_s + time.perf_counter() - t1
        verdict = ""
        if target is not None:
            verdict = (f"; read + simulate + report {total:.1f} s (target < {target:.0f} s: "
                       f"{'met' if total < target else 'MISSED'})")
        print(f"  {label} {path.name}, {len(trace.jobs):,} jobs on {nodes} x {GPUS_PER_NODE} "
              f"GPUs, fifo, {fit}: {run.wall_seconds:.1f} s simulated, {run.events:,} events "
              f"({run.events / run.wall_seconds:,.0f} events/s), {run.cycles:,} admission "
              f"cycles, peak queue {s.peak_queue:,}{verdict}")
    print(f"    (reading the trace: {read_s:.2f} s)")


def row(trace_name: str, jobs: int, nodes: int, run: Run, s: Summary) -> tuple[str, ...]:
    d = s.delays
    if run.fit == "per-node":
        frag = f"{len(s.fragmented)} / {s.fragmented_gpu_hours:,.0f}"
        partial = "-"
    else:
        frag = "-"
        partial = f"{len(s.unplaced)} / {len(s.partial)} / {s.held_gpu_hours:,.0f}"
    return (trace_name, f"{jobs:,}", str(nodes), run.policy.name, run.fit,
            f"{s.utilisation:.1%}", span(d.mean), span(d.median),
            span(d.p95), span(d.max), span(s.makespan),
            frag, partial, str(len(s.never_fit) + len(s.never_started)),
            f"{run.wall_seconds:.1f}")


HEADER = ("trace", "jobs", "nodes", "policy", "fit", "util", "mean wait", "median", "p95",
          "max wait", "makespan", "frag jobs/GPUh", "unplaced/partial/GPUh", "not run",
          "wall s")


def print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[c]) for r in [HEADER, *rows]) for c in range(len(HEADER))]
    print("  ".join(h.ljust(w) for h, w in zip(HEADER, widths, strict=True)))
    for r in rows:
        print("  ".join(v.ljust(w) if c < 5 else v.rjust(w)
                        for c, (v, w) in enumerate(zip(r, widths, strict=True))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--only", help="comma-separated trace names (without .csv)")
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args()
    paths = trace_paths(args.traces, args.only)

    if not args.skip_speed:
        print("Speed (one run each; other processes share the machine):")
        largest = max(paths, key=lambda p: sum(1 for _ in p.open()))
        speed(largest, 64, "largest trace")
        reference = args.traces / "cluster07.csv"
        if reference.exists() and reference != largest:
            speed(reference, 64, "reference", target=60)
        print()

    limit = f"the first {args.limit:,} jobs of each trace" if args.limit else "every job"
    sizing = (f"{args.nodes} nodes x {GPUS_PER_NODE} GPUs for every trace" if args.nodes
              else f"per trace, the fewest {GPUS_PER_NODE}-GPU nodes that hold its largest "
                   f"job and keep its offered load <= {args.load:.0%}")
    print(f"Comparison: {limit}; cluster: {sizing}; one admission cycle after every batch "
          "of events.")
    print("frag jobs/GPUh: jobs delayed by fragmentation (per-node fit) and the GPU-hours of "
          "that delay; unplaced/partial/GPUh: jobs dispatched by the aggregate rule with pods "
          "no node could hold / of them holding GPUs idle / GPU-hours held idle; not run: "
          "never fit + never started.")
    print()
    rows: list[tuple[str, ...]] = []
    mismatches: list[str] = []
    t0 = time.perf_counter()
    for path in paths:
        trace = read_trace(path, GPUS_PER_NODE, args.limit)
        nodes = args.nodes or nodes_for(trace, args.load)
        waits: dict[tuple[str, str], list[float | None]] = {}
        for policy_name in POLICIES:
            policy = load_policy(policy_name)
            for fit in FITS:
                run = simulate(trace.jobs, nodes, GPUS_PER_NODE, policy, fit)
                s = summarise(run, trace)
                rows.append(row(path.stem, len(trace.jobs), nodes, run, s))
                waits[(policy_name, fit)] = [r.wait for r in run.jobs]
        for fit in FITS:
            if waits[("fifo", fit)] != waits[("priority", fit)]:
                mismatches.append(f"{path.stem}/{fit}")
    print_table(rows)
    print()
    print(f"{len(rows)} runs in {time.perf_counter() - t0:.0f} s. priority == fifo on every "
          "trace (no priorities in ITP): "
          + ("yes" if not mismatches else "NO: " + ", ".join(mismatches)))


if __name__ == "__main__":
    main()
