"""Teams and priorities for traces that have none (the ITP traces carry no user column).

A rule assigns every job of a CSV trace to a team, by weights (``team-a=2,team-b=1``), and
gives a fraction of the jobs a high priority. Both choices hash the job id, so a job gets
the same team and priority in every run and under every policy, whatever the order of
the trace, and the rule needs no randomness to repeat a comparison.

The team becomes the job's label in every quota tree (``<tree>: <team>``, its leaf), or
the label ``team`` without quota trees, so that the per-team report has something to
read. A YAML trace's AppWrappers carry their own labels and priorities instead.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from dispatcher.simulate.traces import Trace, TraceError, TraceJob

TEAM_LABEL = "team"
HIGH_PRIORITY = 10


@dataclass(frozen=True)
class TeamRule:
    weights: tuple[tuple[str, int], ...]
    high_priority: float = 0.0  # fraction of the jobs given priority HIGH_PRIORITY


def parse_teams(text: str) -> tuple[tuple[str, int], ...]:
    """``team-a=2,team-b=1,team-c`` (a missing weight is 1)."""
    weights: list[tuple[str, int]] = []
    for part in text.split(","):
        name, _, weight = part.strip().partition("=")
        name = name.strip()
        try:
            value = int(weight) if weight.strip() else 1
        except ValueError:
            value = -1
        if not name or value < 1:
            raise TraceError(f"--teams: {part.strip()!r} is not TEAM or TEAM=WEIGHT (a whole "
                             "number ≥ 1); e.g. --teams team-a=2,team-b=1")
        if any(n == name for n, _ in weights):
            raise TraceError(f"--teams: team {name} is given twice")
        weights.append((name, value))
    return tuple(weights)


def _hash(text: str) -> int:
    return zlib.crc32(text.encode())


def _pick(weights: Sequence[tuple[str, int]], slot: int) -> str:
    for team, weight in weights:
        if slot < weight:
            return team
        slot -= weight
    raise AssertionError("slot beyond the total weight")


def assign(trace: Trace, rule: TeamRule, trees: Sequence[str] = ()) -> Trace:
    """The trace with every job labelled with its team and given its priority."""
    total = sum(w for _, w in rule.weights)
    jobs: list[TraceJob] = []
    for job in trace.jobs:
        w = job.wrapper
        team = _pick(rule.weights, _hash(w.name) % total)
        high = _hash(w.name + "/priority") % 10_000 < rule.high_priority * 10_000
        labels = tuple(sorted((tree, team) for tree in trees)) or ((TEAM_LABEL, team),)
        wrapper = replace(w, labels=labels, priority=HIGH_PRIORITY if high else w.priority)
        jobs.append(replace(job, wrapper=wrapper, team=team))
    shares = ", ".join(f"{t} {w / total:.0%}" for t, w in rule.weights)
    note = f"jobs assigned to teams by a hash of their id: {shares}"
    if rule.high_priority:
        note += (f"; {rule.high_priority:.0%} of them, also by hash, at priority "
                 f"{HIGH_PRIORITY} (the rest 0)")
    return replace(trace, jobs=tuple(jobs), notes=(*trace.notes, note))


def team_of(job: TraceJob, trees: Sequence[str] = ()) -> str:
    """The team a job belongs to: assigned by the rule, else its label in the first quota
    tree, else its namespace."""
    if job.team:
        return job.team
    labels = dict(job.wrapper.labels)
    for tree in trees:
        if tree in labels:
            return labels[tree]
    return labels.get(TEAM_LABEL, job.wrapper.namespace)
