"""What elasticity gains on a trace: the same jobs replayed rigid and elastic.

The ITP traces say nothing about elasticity, so it is assumed, and said with the result:
a job of N GPUs may run on as few as ceil(N/2) of them. Elastic sizes are whole pods, as
the dispatcher scales them: a job of P pods of g GPUs runs with ceil(ceil(N/2) / g) to P
pods, so jobs of one pod (N <= G) stay rigid. Its work is its duration at P pods, done at
a speed proportional to its pods (linear scaling, the usual assumption of elastic
schedulers; real jobs scale worse, which makes the gain an upper bound for the speed and
a fair measure of the waits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from dispatcher.kinds.elastic import ElasticSet
from dispatcher.queue.policy import Policy
from dispatcher.quota import QuotaForest
from dispatcher.simulate.engine import simulate
from dispatcher.simulate.report import Summary, summarise
from dispatcher.simulate.traces import GPU, Trace, TraceJob
from dispatcher.wording import counted, span

ASSUMPTION = ("elastic: a job of N GPUs runs on ceil(N/2) to N of them, in whole pods "
              "(one-pod jobs stay rigid); work scales linearly with its pods")


def elastic_job(job: TraceJob) -> TraceJob:
    """`job` with its pods elastic down to half its GPUs (rounded up to whole pods)."""
    w = job.wrapper
    if len(w.gang) != 1 or w.elastic:
        return job
    ps = w.gang[0].pod_set
    per_pod = ps.request.get(GPU, 0)
    if ps.count < 2 or per_pod <= 0:
        return job
    low = math.ceil(math.ceil(job.gpus / 2) / per_pod)
    if low >= ps.count:
        return job
    sets = (ElasticSet(0, w.gang[0].item, ps.name, low, ps.count, ("spec", "replicas")),)
    return replace(job, wrapper=replace(w, elastic=sets))


def elastic_trace(trace: Trace) -> tuple[Trace, int]:
    """The trace with every multi-pod job elastic; and how many jobs became elastic."""
    jobs = tuple(elastic_job(j) for j in trace.jobs)
    made = sum(1 for a, b in zip(trace.jobs, jobs, strict=True) if a is not b)
    return replace(trace, jobs=jobs, notes=(*trace.notes, ASSUMPTION)), made


@dataclass(frozen=True)
class Comparison:
    rigid: Summary
    elastic: Summary
    elastic_jobs: int
    scale_outs: int
    scale_ins: int


def compare(trace: Trace, nodes: int, gpus_per_node: int, policy: Policy,
            forest: QuotaForest | None = None) -> Comparison:
    """Replay `trace` rigid, then elastic (per-node fit)."""
    rigid = summarise(simulate(trace.jobs, nodes, gpus_per_node, policy, forest=forest), trace)
    stretchy, made = elastic_trace(trace)
    run = simulate(stretchy.jobs, nodes, gpus_per_node, policy, forest=forest)
    return Comparison(rigid, summarise(run, stretchy), made,
                      sum(r.scale_outs for r in run.jobs), sum(r.scale_ins for r in run.jobs))


HEADER = ("", "mean wait", "median wait", "p95 wait", "max wait", "utilisation", "makespan",
          "preemptions", "lost GPU-h")


def rows(c: Comparison) -> list[tuple[str, ...]]:
    def row(label: str, s: Summary) -> tuple[str, ...]:
        d = s.delays
        return (label, span(d.mean), span(d.median), span(d.p95),
                span(d.max), f"{s.utilisation:.1%}", span(s.makespan),
                str(s.preemptions), f"{s.lost_gpu_hours:,.0f}")
    return [row("rigid", c.rigid), row("elastic", c.elastic)]


def to_dict(c: Comparison) -> dict[str, Any]:
    return {"assumption": ASSUMPTION, "elasticJobs": c.elastic_jobs,
            "scaleOuts": c.scale_outs, "scaleIns": c.scale_ins,
            "rigid": _figures(c.rigid), "elastic": _figures(c.elastic)}


def _figures(s: Summary) -> dict[str, Any]:
    return {"delays": s.delays.as_dict(), "utilisation": s.utilisation,
            "makespanSeconds": s.makespan, "preemptions": s.preemptions,
            "lostGpuHours": s.lost_gpu_hours}


def table(c: Comparison, title: str) -> str:
    lines = [title, ASSUMPTION,
             f"{c.elastic_jobs} of {counted(len(c.rigid.run.jobs), 'job')} elastic; "
             f"{counted(c.scale_outs, 'scale-out')}, {counted(c.scale_ins, 'scale-in')}"]
    body: Sequence[tuple[str, ...]] = [HEADER, *rows(c)]
    widths = [max(len(r[k]) for r in body) for k in range(len(HEADER))]
    lines += ["  ".join(v.rjust(w) if k else v.ljust(w) for k, (v, w)
                        in enumerate(zip(r, widths, strict=True))) for r in body]
    return "\n".join(lines)
