"""Teams sharing a cluster: fifo against priority with preemption, on an ITP trace.

The trace's jobs are assigned to three teams by a hash of their id (team-a half of them,
team-b and team-c a quarter each) and 20 % of them, also by hash, get priority 10. A quota
tree gives each team that share of the cluster's GPUs, borrowing allowed. The cluster is
the fewest 8-GPU nodes that hold the largest job at <= --load offered load (as in
bench/simulate.py). Runs, all per-node fit:

- fifo without quotas (the baseline), fifo with quotas,
- priority with quotas (high-priority jobs first, nobody preempted),
- priority with quotas and reclaim only (a team within its quota takes back what others
  borrow, nobody is preempted for priority),
- priority-preemption with quotas (lowerPriority preemption and reclaiming borrowed
  quota), and the same with a 30-minute minimum running time protecting victims.

Printed per run: GPU utilisation, queueing delay overall and of the high-priority jobs,
each team's mean wait and quota use, preemptions and the GPU-hours of work they threw
away (a preempted job starts over).

Usage: python bench/teams.py [--trace cluster07] [--load 0.85] [--limit N]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulate import DEFAULT_TRACES, GPUS_PER_NODE, nodes_for

from dispatcher.policy_files import load_policy
from dispatcher.quota import QuotaForest
from dispatcher.simulate import read_trace, simulate, summarise
from dispatcher.simulate.report import Summary
from dispatcher.simulate.teams import HIGH_PRIORITY, TeamRule, assign
from dispatcher.wording import span

TREE = "quota_gpu"
SHARES = (("team-a", 2), ("team-b", 1), ("team-c", 1))


def quota_forest(gpus: int) -> QuotaForest:
    total = sum(w for _, w in SHARES)

    def subtree(name: str, children: list[dict[str, Any]],
                parent: str | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"children": children}
        if parent:
            spec["parent"] = parent
        return {"apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
                "metadata": {"name": name, "namespace": "kube-system",
                             "labels": {"tree": TREE}}, "spec": spec}

    return QuotaForest.from_objects([
        subtree("cluster", [{"name": "cluster", "quotas": {"requests": {"nvidia.com/gpu":
                                                                          gpus}}}]),
        subtree("teams", [{"name": t, "quotas": {"requests": {"nvidia.com/gpu":
                                                               gpus * w // total}}}
                          for t, w in SHARES], parent="cluster"),
    ])


def row(label: str, s: Summary) -> list[str]:
    high = next((d for p, d in s.by_priority if p == HIGH_PRIORITY), None)
    teams = {t.team: t for t in s.teams}
    return [label, f"{s.utilisation:.1%}", span(s.delays.mean),
            span(s.delays.p95),
            span(high.mean) if high else "-", span(high.p95) if high else "-",
            *(span(teams[t].delays.mean) for t, _ in SHARES),
            *("-" if teams[t].quota_use is None else f"{teams[t].quota_use:.0%}"
              for t, _ in SHARES),
            f"{s.preemptions:,}", f"{s.lost_gpu_hours:,.0f}", f"{s.run.wall_seconds:.0f}"]


HEADER = ["run", "util", "mean wait", "p95 wait", "prio-10 mean", "prio-10 p95",
          *(f"{t} wait" for t, _ in SHARES), *(f"{t} quota use" for t, _ in SHARES),
          "preemptions", "lost GPU-h", "wall s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="cluster07", help="an ITP trace name or a CSV path")
    ap.add_argument("--load", type=float, default=0.85)
    ap.add_argument("--limit", type=int)
    args = ap.parse_args()
    path = Path(args.trace)
    if not path.exists():
        path = DEFAULT_TRACES / f"{args.trace}.csv"
    base = read_trace(path, GPUS_PER_NODE, args.limit)
    nodes = nodes_for(base, args.load)
    forest = quota_forest(nodes * GPUS_PER_NODE)
    rule = TeamRule(SHARES, high_priority=0.2)
    plain = assign(base, rule)
    labelled = assign(base, rule, tuple(forest.trees))
    preemption = load_policy("priority-preemption")
    runs = [
        ("fifo, no quotas", load_policy("fifo"), plain, None),
        ("fifo, quotas", load_policy("fifo"), labelled, forest),
        ("priority, quotas", load_policy("priority"), labelled, forest),
        ("reclaim only, quotas", replace(preemption, name="reclaim", preemption="reclaim"),
         labelled, forest),
        ("priority-preemption, quotas", preemption, labelled, forest),
        ("  + minRunningSeconds 1800", replace(preemption, min_running_seconds=1800.0),
         labelled, forest),
    ]
    print(f"{path.name}: {len(base.jobs):,} jobs on {nodes} x {GPUS_PER_NODE} GPUs "
          f"({nodes * GPUS_PER_NODE} GPUs); teams by hash: "
          + ", ".join(f"{t} {w / 4:.0%}" for t, w in SHARES)
          + f"; 20% of jobs at priority {HIGH_PRIORITY}; quota tree {TREE}: each team's "
          "share of the GPUs, borrowing allowed; per-node fit")
    rows = [HEADER]
    for label, policy, trace, quota in runs:
        run = simulate(trace.jobs, nodes, GPUS_PER_NODE, policy, "per-node", forest=quota)
        rows.append(row(label, summarise(run, trace)))
    widths = [max(len(r[c]) for r in rows) for c in range(len(HEADER))]
    for r in rows:
        print("  ".join(v.ljust(w) if c == 0 else v.rjust(w)
                        for c, (v, w) in enumerate(zip(r, widths, strict=True))))


if __name__ == "__main__":
    main()
