"""Backfill with reservations on the ITP traces: does it keep large gangs from starving?

Every trace named (default: cluster10, cluster01, cluster05) is replayed on the cluster
bench/simulate.py sizes for it (the fewest 8-GPU nodes that hold its largest job and
keep its offered load at or below --load), per-node fit, under:

- fifo;
- backfill: greedy, with the shipped age guard (a head waiting over 30 min blocks);
- backfill, no guard: greedy, nothing ever blocks;
- reserve, predicted: reservations planned with durations predicted as the controller
  does (median of completed jobs of the same shape, else 1 h; for a running job, what
  those that ran longer took beyond its running time);
- reserve, exact: reservations planned with each job's real duration (the oracle).

Columns: mean queueing delay of all jobs, p95 delay of gangs of 8 GPUs or more, the
longest delay of a gang of more than 8 GPUs (more than one node), GPU
utilisation over the makespan, the error of start estimates (median and p90 of |estimated
start - actual start|, every queued job's estimate at --eta moments spread over the
submissions, made by the replay the controller runs, with durations predicted as the
controller does -- the oracle row with exact ones), and the wall time of the run. The
figures are printed, never asserted.

Usage: python bench/reserve.py [--traces DIR] [--only cluster01,cluster10] [--load 0.85]
                               [--limit N] [--eta 20]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

from simulate import DEFAULT_TRACES, GPUS_PER_NODE, nodes_for, trace_paths

from dispatcher.eta import Limits
from dispatcher.policy_files import load_policy
from dispatcher.queue import Policy
from dispatcher.simulate import read_trace, simulate, summarise
from dispatcher.simulate.accuracy import Mode, Probe, compare
from dispatcher.simulate.report import Delays
from dispatcher.simulate.reserving import DurationMode, durations_for
from dispatcher.wording import span


@dataclass(frozen=True)
class Variant:
    label: str
    policy: Policy
    durations: DurationMode = "predicted"


def variants() -> list[Variant]:
    backfill = load_policy("backfill")
    reserve = load_policy("reserve")
    return [Variant("fifo", load_policy("fifo")),
            Variant("backfill (30 min guard)", backfill),
            Variant("backfill, no guard", Policy("backfill-unguarded", order=backfill.order,
                                                 backfill=True)),
            Variant("reserve, predicted", reserve, "predicted"),
            Variant("reserve, exact (oracle)", reserve, "exact")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--only", default="cluster10,cluster01,cluster05")
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--limit", type=int)
    ap.add_argument("--eta", type=int, default=20, metavar="N")
    args = ap.parse_args()
    print("| trace | nodes x GPUs | policy | mean wait | p95 wait, gangs >= 8 GPUs | "
          "max wait, gangs > 8 GPUs | utilisation | ETA error, median / p90 | run time |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in trace_paths(args.traces, args.only):
        trace = read_trace(path, GPUS_PER_NODE, args.limit)
        nodes = nodes_for(trace, args.load)
        submits = [j.submit for j in trace.jobs]
        for v in variants():
            mode: Mode = "exact" if v.durations == "exact" else "history"
            probe = Probe(min(submits), max(submits), samples=args.eta, modes=(mode,),
                          limits=Limits(budget_seconds=2.0))
            t0 = time.perf_counter()
            run = simulate(trace.jobs, nodes, GPUS_PER_NODE, v.policy,
                           durations=durations_for(v.durations), observe=probe)
            wall = time.perf_counter() - t0
            eta = compare(probe, run.jobs, mode)
            s = summarise(run, trace)
            big = [r.wait for r in run.jobs if r.wait is not None and r.gpus >= 8]
            p95 = span(Delays.of(big).p95) if big else "-"
            multi = [r.wait for r in run.jobs if r.wait is not None and r.gpus > 8]
            most = span(max(multi)) if multi else "-"
            print(f"| {path.stem} | {nodes} x {GPUS_PER_NODE} | {v.label} | "
                  f"{span(s.delays.mean)} | {p95} | {most} | {s.utilisation:.1%} | "
                  f"{span(eta.median_error)} / {span(eta.p90_error)} | "
                  f"{wall:.1f} s |", flush=True)


if __name__ == "__main__":
    main()
