"""Figures of a simulation run, as a table for people and JSON for programs.

Definitions (all times in seconds of the trace):
- makespan: first submission to last completion.
- GPU utilisation: GPU-seconds of running jobs / (cluster GPUs x makespan). GPUs held
  by partial gangs (bound pods of a gang whose other pods found no node, aggregate fit)
  are not use: they are reported beside it.
- queueing delay of a job: its start minus its submission, over the jobs that started;
  percentiles interpolate linearly between ranks (numpy's default).
- delayed by fragmentation (per-node fit): jobs that waited while the cluster's total
  free capacity covered their demand, and for how long; GPU-hours = GPUs x that time.
- largest starvation: the longest wait of any job (still waiting at the end counts to
  the end), and how many jobs submitted after it started before it.
- per team (jobs assigned to teams, or quota trees given): the team's queueing delay;
  GPU-hours its jobs ran (work later lost included); its quota (the GPUs of its leaf in
  the first tree) and quota use = those GPU-hours / (quota x makespan), above 100% when
  it borrowed; GPU-hours run on borrowed quota; how often its jobs were preempted and
  the GPU-hours of work that threw away (a preempted job starts over).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dispatcher.fit.topology import noun
from dispatcher.simulate.engine import NODE_CPU_MILLI, NODE_MEMORY, JobRun, Run
from dispatcher.simulate.teams import team_of
from dispatcher.simulate.traces import Trace
from dispatcher.wording import plural, span

SHOWN = 5  # jobs listed by name in the table for each kind of problem


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) of sorted `values`, linearly interpolated."""
    if not values:
        return math.nan
    pos = (len(values) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


@dataclass(frozen=True)
class Delays:
    jobs: int
    waited: int  # jobs with a delay above zero
    mean: float
    median: float
    p95: float
    max: float

    @classmethod
    def of(cls, waits: Sequence[float]) -> Delays:
        w = sorted(waits)
        mean = sum(w) / len(w) if w else math.nan
        return cls(len(w), sum(x > 0 for x in w), mean, percentile(w, 50), percentile(w, 95),
                   w[-1] if w else math.nan)

    def as_dict(self) -> dict[str, Any]:
        return {"jobs": self.jobs, "waited": self.waited, "meanSeconds": _num(self.mean),
                "medianSeconds": _num(self.median), "p95Seconds": _num(self.p95),
                "maxSeconds": _num(self.max)}


@dataclass(frozen=True)
class Starvation:
    job: JobRun
    wait: float
    still_waiting: bool
    overtaken_by: int  # jobs submitted after it that started before it


@dataclass(frozen=True)
class TeamStats:
    team: str
    jobs: int
    delays: Delays
    gpu_hours: float
    quota_gpus: int | None  # its leaf's GPUs in the first quota tree
    quota_use: float | None  # gpu_hours / (quota x makespan)
    borrowed_gpu_hours: float
    preemptions: int
    lost_gpu_hours: float

    def as_dict(self) -> dict[str, Any]:
        return {"team": self.team, "jobs": self.jobs, "queueingDelay": self.delays.as_dict(),
                "gpuHours": round(self.gpu_hours, 3), "quotaGpus": self.quota_gpus,
                "quotaUse": None if self.quota_use is None else round(self.quota_use, 6),
                "borrowedGpuHours": round(self.borrowed_gpu_hours, 3),
                "preemptions": self.preemptions,
                "lostGpuHours": round(self.lost_gpu_hours, 3)}


def _teams(run: Run, makespan: float) -> tuple[TeamStats, ...]:
    by_team: dict[str, list[JobRun]] = {}
    for r in run.jobs:
        if r.never_fits is None:
            by_team.setdefault(team_of(r.job, run.trees), []).append(r)
    out: list[TeamStats] = []
    for team in sorted(by_team):
        runs = by_team[team]
        hours = sum(r.gpu_seconds for r in runs) / 3600
        quota = run.team_quota.get(team) if run.team_quota else None
        use = hours * 3600 / (quota * makespan) if quota and makespan else None
        out.append(TeamStats(
            team, len(runs), Delays.of([r.wait for r in runs if r.wait is not None]), hours,
            quota, use, sum(r.borrowed_gpu_seconds for r in runs) / 3600,
            sum(r.preemptions for r in runs), sum(r.lost_gpu_seconds for r in runs) / 3600))
    return tuple(out)


@dataclass(frozen=True)
class Summary:
    run: Run
    trace: Trace
    makespan: float
    utilisation: float  # GPU-seconds of running jobs / (GPUs x makespan)
    held_fraction: float  # GPU-seconds held idle by partial gangs / (GPUs x makespan)
    delays: Delays
    by_size: tuple[tuple[int, int, Delays], ...]  # (GPUs, pods, delays)
    never_fit: tuple[JobRun, ...]
    never_started: tuple[JobRun, ...]  # could fit, but did not start by the end
    fragmented: tuple[JobRun, ...]
    fragmented_gpu_hours: float
    unplaced: tuple[JobRun, ...]  # dispatched with pods no node could hold (aggregate)
    partial: tuple[JobRun, ...]  # ... of which some pods were bound, holding GPUs
    held_gpu_hours: float
    starvation: Starvation | None
    peak_queue: int
    teams: tuple[TeamStats, ...] = ()  # when jobs belong to teams or quota trees are given
    by_priority: tuple[tuple[int, Delays], ...] = ()  # when the trace has several priorities
    preemptions: int = 0
    preempted_jobs: int = 0
    lost_gpu_hours: float = 0.0
    # With a topology: the started gangs of 2 pods or more, those of them in one rack, and
    # those that required it.
    gangs: int = 0
    one_rack: int = 0
    required_rack: int = 0
    # The policy's backfill limit: runs it stopped, of how many jobs, the work they lost.
    limit_stops: int = 0
    limit_jobs: int = 0
    limit_lost_gpu_seconds: float = 0.0


def summarise(run: Run, trace: Trace) -> Summary:
    runs = run.jobs
    finishes = [r.finished for r in runs if r.finished is not None]
    end = max(finishes) if finishes else run.start
    makespan = end - run.start
    busy_area = held_area = 0.0
    for k in range(len(run.times) - 1):
        t0, t1 = run.times[k], min(run.times[k + 1], end)
        if t1 > t0:
            busy_area += run.busy[k] * (t1 - t0)
            held_area += run.held[k] * (t1 - t0)
    capacity = run.total_gpus * makespan
    started = [r for r in runs if r.wait is not None]
    sizes: dict[tuple[int, int], list[float]] = {}
    for r in started:
        sizes.setdefault((r.gpus, r.job.pods), []).append(r.wait or 0.0)
    fragmented = tuple(r for r in runs if r.fragmented_seconds > 0)
    unplaced = tuple(r for r in runs if r.partial)
    gangs = [r for r in started if r.job.pods >= 2] if run.racked else []
    return Summary(
        run=run,
        trace=trace,
        makespan=makespan,
        utilisation=busy_area / capacity if capacity else 0.0,
        held_fraction=held_area / capacity if capacity else 0.0,
        delays=Delays.of([r.wait or 0.0 for r in started]),
        by_size=tuple((g, p, Delays.of(w)) for (g, p), w in sorted(sizes.items())),
        never_fit=tuple(r for r in runs if r.never_fits is not None),
        never_started=tuple(r for r in runs if r.started is None and r.never_fits is None),
        fragmented=fragmented,
        fragmented_gpu_hours=sum(r.gpus * r.fragmented_seconds for r in fragmented) / 3600,
        unplaced=unplaced,
        partial=tuple(r for r in unplaced if r.held_gpu_seconds > 0),
        held_gpu_hours=sum(r.held_gpu_seconds for r in unplaced) / 3600,
        starvation=_starvation(runs, run.end),
        peak_queue=max(run.queued, default=0),
        teams=_teams(run, makespan) if run.trees or any(r.job.team for r in runs) else (),
        by_priority=_by_priority(started),
        preemptions=sum(r.preemptions for r in runs),
        preempted_jobs=sum(r.preemptions > 0 for r in runs),
        lost_gpu_hours=sum(r.lost_gpu_seconds for r in runs) / 3600,
        gangs=len(gangs),
        one_rack=sum(r.racks == 1 for r in gangs),
        required_rack=sum(_requires_rack(r) for r in runs),
        limit_stops=sum(r.limit_stops for r in runs),
        limit_jobs=sum(r.limit_stops > 0 for r in runs),
        limit_lost_gpu_seconds=sum(r.limit_lost_gpu_seconds for r in runs),
    )


def _requires_rack(r: JobRun) -> bool:
    return any(g.pod_set.topology is not None and g.pod_set.topology.required
               for g in r.job.wrapper.gang)


def _by_priority(started: Sequence[JobRun]) -> tuple[tuple[int, Delays], ...]:
    waits: dict[int, list[float]] = {}
    for r in started:
        waits.setdefault(r.job.wrapper.priority, []).append(r.wait or 0.0)
    if len(waits) < 2:
        return ()
    return tuple((p, Delays.of(w)) for p, w in sorted(waits.items(), reverse=True))


def _starvation(runs: Sequence[JobRun], end: float) -> Starvation | None:
    candidates = [r for r in runs if r.never_fits is None]
    if not candidates:
        return None

    def waited(r: JobRun) -> float:
        return (r.started if r.started is not None else end) - r.job.submit

    worst = max(candidates, key=waited)
    began = worst.started if worst.started is not None else math.inf
    overtaken = sum(1 for r in candidates if r.job.submit > worst.job.submit
                    and r.started is not None and r.started < began)
    return Starvation(worst, waited(worst), worst.started is None, overtaken)


# --- formatting --------------------------------------------------------------------


def _num(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 3)


def _count(n: int, word: str) -> str:
    return f"{n:,} {plural(n, word)}"


def _pods(n: int) -> str:
    return _count(n, "pod")


def _pending_seconds(r: JobRun, end: float) -> float:
    if r.dispatched is None:
        return 0.0
    return (r.started if r.started is not None else end) - r.dispatched


def _names(runs: Sequence[JobRun]) -> str:
    shown = ", ".join(r.job.name for r in runs[:SHOWN])
    return shown + (f" and {len(runs) - SHOWN} more" if len(runs) > SHOWN else "")


# A job dispatched whose pods never all found a node, or one no cycle decided on.
_DISPATCHED = ("Dispatched", "dispatched, but its pods never all found a node")
_NO_DECISION = ("NotDecided", "no admission cycle decided on it")


def why_waiting(runs: Sequence[JobRun]) -> list[tuple[str, list[JobRun]]]:
    """The jobs that never started by the core's reason for their last wait (the
    reasons `plan` gives), the most common first."""
    by_reason: dict[str, list[JobRun]] = {}
    for r in runs:
        by_reason.setdefault(_waiting(r)["waitReason"], []).append(r)
    return sorted(by_reason.items(), key=lambda item: -len(item[1]))


def model_notes(run: Run) -> list[str]:
    return [
        f"{_count(run.nodes, 'node')} x {run.gpus_per_node} GPUs ({run.total_gpus} GPUs); "
        f"each node also has {NODE_CPU_MILLI // 1000:,} CPUs, {NODE_MEMORY >> 50} PiB of "
        "memory and 110 pods, so only GPUs and the pod limit bind",
        "one admission cycle after every batch of arrivals and completions",
    ]


def to_table(s: Summary, without: Summary | None = None) -> str:
    """The report; `without`: the same trace replayed without requiring a domain."""
    run = s.run
    n = len(run.jobs)
    lines = [
        f"dispatcher simulate: {s.trace.source}, {_count(n, 'job')}, policy {run.policy.name}, "
        f"{run.fit} fit",
        *(f"  {note}" for note in [*model_notes(run), *s.trace.notes]),
        "",
    ]

    def row(label: str, text: str) -> None:
        lines.append(f"{label:<17}{text}")

    started = s.delays.jobs
    row("jobs", f"{n:,} in the trace: {started:,} started, "
        f"{_finished(run):,} finished, "
        + (f"{s.limit_jobs:,} ended at the backfill limit, "
           if run.policy.backfill_limit_action == "fail" and s.limit_jobs else "")
        + f"{len(s.never_fit):,} never fit the cluster, {len(s.never_started):,} never started")
    if s.never_fit:
        first = s.never_fit[0]
        row("  never fit", f"{_names(s.never_fit)} (e.g. {first.job.name}, {first.gpus} GPUs "
            f"in {_pods(first.job.pods)}: {first.never_fits})")
    if s.never_started:
        row("  never started", f"{_names(s.never_started)}")
        for k, (reason, runs) in enumerate(why_waiting(s.never_started)):
            row("    why" if k == 0 else "", f"{len(runs):,} {reason} (e.g. "
                f"{runs[0].job.name}: {_waiting(runs[0])['waitMessage']})")
    row("makespan", f"{span(s.makespan)} ({s.makespan:,.0f}s), peak queue "
        f"{_count(s.peak_queue, 'job')}")
    util = f"{s.utilisation:.1%} of {run.total_gpus:,} GPUs over the makespan"
    if run.fit == "aggregate":
        util += f"; {s.held_fraction:.1%} more held idle by partial gangs"
    row("GPU utilisation", util)
    d = s.delays
    row("queueing delay", f"mean {span(d.mean)}, median {span(d.median)}, "
        f"p95 {span(d.p95)}, max {span(d.max)} "
        f"({d.waited:,} of {_count(d.jobs, 'started job')} waited)")
    header = ("GPUS", "PODS", "JOBS", "WAITED", "MEAN", "MEDIAN", "P95", "MAX")
    table = [header] + [
        (str(g), str(p), f"{x.jobs:,}", f"{x.waited:,}", span(x.mean),
         span(x.median), span(x.p95), span(x.max))
        for g, p, x in s.by_size
    ]
    lines.append("  by gang size:")
    lines.extend(_aligned(table))
    if run.fit == "per-node":
        row("fragmentation", f"{_count(len(s.fragmented), 'job')} waited while the cluster's total "
            "free GPUs covered them (the aggregate rule would have admitted them): "
            f"{s.fragmented_gpu_hours:,.1f} GPU-hours of delay")
        row("partial gangs", "none: per-node fit places every pod before it dispatches")
    else:
        row("fragmentation", "not measured under the aggregate rule (see partial gangs)")
        pending = sorted(_pending_seconds(r, run.end) for r in s.unplaced)
        row("partial gangs", f"{_count(len(s.unplaced), 'dispatched job')} had pods no node could "
            f"hold (pending for nodes: median {span(percentile(pending, 50))}, "
            f"max {span(pending[-1] if pending else math.nan)}); "
            f"{len(s.partial):,} of them held the GPUs of their placed pods idle waiting for "
            f"the rest ({s.held_gpu_hours:,.1f} GPU-hours)"
            + (f": {_names(s.partial)}" if s.partial else ""))
    if s.starvation is not None:
        st = s.starvation
        state = "still waiting at the end after" if st.still_waiting else "waited"
        row("starvation", f"longest wait: {st.job.job.name} ({st.job.gpus} GPUs in "
            f"{_pods(st.job.job.pods)}) {state} {span(st.wait)}; "
            f"{_count(st.overtaken_by, 'job')} submitted after it started before it")
    for p, x in s.by_priority:
        row(f"priority {p}", f"{_count(x.jobs, 'job')}: mean wait {span(x.mean)}, p95 "
            f"{span(x.p95)}, max {span(x.max)}")
    if run.racked:
        kind = noun(run.level)
        row("topology", f"{s.one_rack:,} of {s.gangs:,} started gangs of 2+ pods in one {kind}; "
            f"{_count(s.required_rack, 'job')} required one")
        if without is not None:
            asked = _required_jobs(s)
            row("", f"the {_count(len(asked), 'job')} requiring one {kind}: mean wait "
                f"{span(_mean_wait(s, asked))} ({span(_mean_wait(without, asked))} without)")
            row("", f"requiring one {kind} costs: mean wait {span(s.delays.mean)} "
                f"({span(without.delays.mean)} without), GPU utilisation {s.utilisation:.1%} "
                f"({without.utilisation:.1%} without), gangs in one {kind} {s.one_rack:,} of "
                f"{s.gangs:,} ({without.one_rack:,} of {without.gangs:,} without)")
    if run.policy.backfill_limit_seconds is not None:
        row("backfill limit", _limit_text(s))
    if run.policy.preemption != "never":
        row("preemption", f"{_count(s.preemptions, 'preemption')} of "
            f"{_count(s.preempted_jobs, 'job')}: {s.lost_gpu_hours:,.1f} GPU-hours of work "
            "lost (a preempted job starts over)")
    if s.teams:
        lines.append("  by team:" + ("" if run.team_quota else " (no quota trees)"))
        teams: list[tuple[str, ...]] = [("TEAM", "JOBS", "MEAN WAIT", "P95 WAIT", "GPU-H",
                                         "QUOTA", "QUOTA USE", "BORROWED GPU-H", "PREEMPTED",
                                         "LOST GPU-H")]
        teams.extend(
            (t.team, f"{t.jobs:,}", span(t.delays.mean), span(t.delays.p95),
             f"{t.gpu_hours:,.0f}", "-" if t.quota_gpus is None else str(t.quota_gpus),
             "-" if t.quota_use is None else f"{t.quota_use:.1%}",
             f"{t.borrowed_gpu_hours:,.0f}", f"{t.preemptions:,}", f"{t.lost_gpu_hours:,.1f}")
            for t in s.teams)
        lines.extend(_aligned(teams, left=1))
    rate = run.events / run.wall_seconds if run.wall_seconds else 0.0
    row("run", f"{_count(run.events, 'event')}, {_count(run.cycles, 'admission cycle')} in "
        f"{run.wall_seconds:.1f}s ({rate:,.0f} events/s)")
    return "\n".join(lines)


def _required_jobs(s: Summary) -> frozenset[str]:
    """The jobs that required a domain, by where the trace has them (the same jobs in the
    replay without the requirement)."""
    return frozenset(r.job.where for r in s.run.jobs if _requires_rack(r))


def _mean_wait(s: Summary, jobs: frozenset[str]) -> float:
    """The mean wait of those of `jobs` that started (0 when none did)."""
    waits = [r.wait for r in s.run.jobs if r.job.where in jobs and r.wait is not None]
    return sum(waits) / len(waits) if waits else 0.0


def _finished(run: Run) -> int:
    """Jobs that ran to completion (not those the backfill limit ended)."""
    return sum(r.finished is not None and not r.ended_at_limit for r in run.jobs)


def _limit_text(s: Summary) -> str:
    policy = s.run.policy
    ended = ("ended there (backfillLimitAction: fail)" if policy.backfill_limit_action == "fail"
             else "torn down there and queued again (backfillLimitAction: requeue)")
    return (f"{span(policy.backfill_limit_seconds or 0)} for a job dispatched as a backfill: "
            f"{_count(s.limit_jobs, 'job')} {ended}, {_count(s.limit_stops, 'time')}; "
            f"{s.limit_lost_gpu_seconds:,.0f} GPU-seconds of work lost")


def _aligned(rows: Sequence[Sequence[str]], left: int = 0) -> list[str]:
    """Rows as indented columns: the first `left` columns left-aligned, the rest right."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["    " + "  ".join(v.ljust(w) if c < left else v.rjust(w)
                               for c, (v, w) in enumerate(zip(r, widths, strict=True)))
            for r in rows]


def _waiting(r: JobRun) -> dict[str, str]:
    """Why a job that never started waits: the core's reason and words."""
    reason, message = (_DISPATCHED if r.dispatched is not None
                       else r.waiting or _NO_DECISION)
    return {"waitReason": reason, "waitMessage": message}


def _job(r: JobRun, end: float) -> dict[str, Any]:
    out: dict[str, Any] = {"job": r.job.name, "gpus": r.gpus, "pods": r.job.pods,
                           "where": r.job.where, "submitted": r.job.submit}
    if r.never_fits is not None:
        out["reason"] = r.never_fits
    if r.dispatched is not None:
        out["dispatched"] = r.dispatched
    if r.started is not None:
        out["started"] = r.started
    if r.partial:
        out["podsBoundAtDispatch"] = r.bound_at_dispatch
        out["podsBound"] = r.bound_pods
        out["pendingSeconds"] = _pending_seconds(r, end)
        out["heldGpuHours"] = round(r.held_gpu_seconds / 3600, 3)
    return out


def to_dict(s: Summary, without: Summary | None = None) -> dict[str, Any]:
    """The report as data; `without`: the same trace replayed without requiring a domain."""
    run = s.run
    rate = run.events / run.wall_seconds if run.wall_seconds else 0.0
    st = s.starvation
    return {
        "trace": s.trace.source,
        "policy": run.policy.name,
        "fit": run.fit,
        "cluster": {"nodes": run.nodes, "gpusPerNode": run.gpus_per_node,
                    "gpus": run.total_gpus},
        "notes": [*model_notes(run), *s.trace.notes],
        "jobs": {"total": len(run.jobs), "started": s.delays.jobs,
                 "finished": _finished(run),
                 "neverFit": len(s.never_fit), "neverStarted": len(s.never_started)},
        "makespanSeconds": s.makespan,
        "gpuUtilisation": round(s.utilisation, 6),
        "gpuHeldByPartialGangs": round(s.held_fraction, 6),
        "peakQueue": s.peak_queue,
        "queueingDelay": s.delays.as_dict(),
        "queueingDelayByGangSize": [{"gpus": g, "pods": p, **d.as_dict()}
                                    for g, p, d in s.by_size],
        "fragmentation": None if run.fit != "per-node" else {
            "jobs": len(s.fragmented),
            "gpuHours": round(s.fragmented_gpu_hours, 3),
        },
        "partialGangs": None if run.fit != "aggregate" else {
            "unplacedAtDispatch": len(s.unplaced),
            "holdingIdleGpus": len(s.partial),
            "heldGpuHours": round(s.held_gpu_hours, 3),
            "jobs": [_job(r, run.end) for r in s.unplaced],
        },
        "starvation": None if st is None else {
            **_job(st.job, run.end), "waitSeconds": st.wait, "stillWaiting": st.still_waiting,
            "overtakenBy": st.overtaken_by,
        },
        "neverFit": [_job(r, run.end) for r in s.never_fit],
        "neverStarted": [{**_job(r, run.end), **_waiting(r)} for r in s.never_started],
        "neverStartedBy": {reason: len(runs) for reason, runs in why_waiting(s.never_started)},
        "queueingDelayByPriority": [{"priority": p, **d.as_dict()} for p, d in s.by_priority],
        "preemption": None if run.policy.preemption == "never" else {
            "preemptions": s.preemptions, "jobsPreempted": s.preempted_jobs,
            "lostGpuHours": round(s.lost_gpu_hours, 3)},
        "backfillLimit": None if run.policy.backfill_limit_seconds is None else {
            "seconds": run.policy.backfill_limit_seconds,
            "action": run.policy.backfill_limit_action, "jobs": s.limit_jobs,
            "stops": s.limit_stops, "lostGpuSeconds": round(s.limit_lost_gpu_seconds, 3)},
        "teams": [t.as_dict() for t in s.teams],
        "topology": None if not run.racked else {
            "level": run.level, "startedGangs": s.gangs, "inOneRack": s.one_rack,
            "requiringOneRack": s.required_rack,
            "requiringMeanWaitSeconds": _num(_mean_wait(s, _required_jobs(s))),
            "gpuUtilisation": round(s.utilisation, 6),
            "withoutRequiring": None if without is None else {
                "requiringMeanWaitSeconds": _num(_mean_wait(without, _required_jobs(s))),
                "startedGangs": without.gangs, "inOneRack": without.one_rack,
                "meanWaitSeconds": _num(without.delays.mean),
                "gpuUtilisation": round(without.utilisation, 6)}},
        "run": {"events": run.events, "admissionCycles": run.cycles,
                "wallSeconds": round(run.wall_seconds, 3), "eventsPerSecond": round(rate)},
    }


def to_json(s: Summary) -> str:
    return json.dumps(to_dict(s), indent=2)
