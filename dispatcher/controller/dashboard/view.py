"""What the dashboard's page shows, shaped from plain values: the queue's rows with their
filters and pages, the teams' quota trees, the timeline's bars and the wait history.

Pure: no I/O, no clock, no Kubernetes client. The server (api.py) gathers the
facts from the running dispatcher and hands them here; the tests call it directly.
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dispatcher.wording import span

MAX_PAGE = 500
DEFAULT_PAGE = 100
HOUR = 3600.0
HISTORY_HOURS = 24
STATES = ("waiting", "held")


@dataclass(frozen=True)
class Waiting:
    """A waiting AppWrapper, as the dashboard lists it."""

    namespace: str
    name: str
    position: int | None  # in the controller's order; None: held (out of the queue)
    priority: int
    effective_priority: float
    first_seen: float
    teams: tuple[str, ...] = ()  # "tree/leaf" of each quota tree it counts against
    kinds: tuple[str, ...] = ()  # what it wraps
    held_by: str | None = None
    condition: str = ""
    reason: str = ""
    message: str = ""
    estimated_start: float | None = None
    gpus: int = 0
    pods: int = 0

    @property
    def state(self) -> str:
        return "held" if self.held_by is not None else "waiting"


@dataclass(frozen=True)
class Filters:
    namespace: str = ""
    team: str = ""
    kind: str = ""
    state: str = ""
    offset: int = 0
    limit: int = DEFAULT_PAGE

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> Filters:
        """From a request's query; raises ValueError saying what to fix."""
        try:
            offset = int(query.get("offset", 0))
            limit = int(query.get("limit", DEFAULT_PAGE))
        except ValueError:
            raise ValueError("offset and limit must be whole numbers") from None
        if offset < 0 or not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"offset must be ≥ 0 and limit between 1 and {MAX_PAGE}")
        state = query.get("state", "")
        if state and state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)}")
        return cls(query.get("namespace", ""), query.get("team", ""), query.get("kind", ""),
                   state, offset, limit)

    def keeps(self, w: Waiting) -> bool:
        return ((not self.namespace or w.namespace == self.namespace)
                and (not self.team or self.team in w.teams)
                and (not self.kind or self.kind in w.kinds)
                and (not self.state or w.state == self.state))


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def in_words(seconds: float | None) -> str:
    """When it is estimated to start, from now: "in 2h10m", "now", "unknown"."""
    if seconds is None:
        return "unknown"
    return "now" if seconds < 1 else f"in {span(seconds)}"


def reason_in_words(w: Waiting) -> str:
    if w.held_by is not None:
        return w.message or f"held by {w.held_by}"
    if w.message:
        return " ".join(w.message.split())
    if w.reason:
        return w.reason
    return "not looked at by an admission cycle yet"


def in_order(waiting: Iterable[Waiting]) -> list[Waiting]:
    """The controller's order; the held after it, oldest first, so that rows keep their
    places from one refresh to the next."""
    return sorted(waiting, key=lambda w: (w.position is None, w.position or 0, w.first_seen,
                                          w.namespace, w.name))


def row(w: Waiting, now: float) -> dict[str, Any]:
    eta = None if w.estimated_start is None else max(0.0, w.estimated_start - now)
    return {
        "namespace": w.namespace, "name": w.name, "position": w.position,
        "priority": w.priority, "effectivePriority": round(w.effective_priority, 3),
        "state": w.state, "heldBy": w.held_by, "teams": list(w.teams), "kinds": list(w.kinds),
        "gpus": w.gpus, "pods": w.pods,
        "waiting": span(now - w.first_seen), "condition": w.condition, "reason": w.reason,
        "why": reason_in_words(w),
        "estimatedStart": None if w.estimated_start is None else iso(w.estimated_start),
        "estimatedIn": in_words(eta),
    }


def facets(waiting: Iterable[Waiting]) -> dict[str, list[list[Any]]]:
    """The values each filter can take among `waiting`, with how many have each."""
    counts: dict[str, Counter[str]] = {k: Counter() for k in
                                        ("namespaces", "teams", "kinds", "states")}
    for w in waiting:
        counts["namespaces"][w.namespace] += 1
        counts["teams"].update(w.teams)
        counts["kinds"].update(w.kinds)
        counts["states"][w.state] += 1
    return {k: [[v, n] for v, n in sorted(c.items())] for k, c in counts.items()}


def queue_page(ordered: Sequence[Waiting], visible: Collection[str] | None,
               filters: Filters, now: float) -> dict[str, Any]:
    """One page of the queue as a viewer may see it: `visible` the namespaces they may
    list (None: all). Positions stay the whole queue's."""
    mine = [w for w in ordered if visible is None or w.namespace in visible]
    kept = [w for w in mine if filters.keeps(w)]
    page = kept[filters.offset:filters.offset + filters.limit]
    return {"total": len(kept), "inScope": len(mine), "offset": filters.offset,
            "facets": facets(mine), "items": [row(w, now) for w in page]}


# --- teams -------------------------------------------------------------------------------

@dataclass(frozen=True)
class TeamUsage:
    """A quota node: what it is guaranteed, what its wrappers use and borrow (as the
    quota ledger reports it)."""

    tree: str
    name: str
    parent: str | None
    depth: int
    nominal: Mapping[str, int] = field(hash=False)
    used: Mapping[str, int] = field(hash=False)
    borrowed: Mapping[str, int] = field(hash=False)


def teams(nodes: Sequence[TeamUsage]) -> list[dict[str, Any]]:
    """The quota trees, each node with its resources: guaranteed, used, borrowed (its
    wrappers' use placed above it) and lent (what its children borrow from it and it
    does not itself borrow from above)."""
    children: dict[tuple[str, str], list[TeamUsage]] = {}
    for n in nodes:
        if n.parent is not None:
            children.setdefault((n.tree, n.parent), []).append(n)
    out = []
    for n in nodes:
        kids = children.get((n.tree, n.name), [])
        resources = sorted(set(n.nominal) | set(n.used))
        rows = []
        for r in resources:
            from_kids = sum(k.borrowed.get(r, 0) for k in kids)
            rows.append({"resource": r, "guaranteed": n.nominal.get(r, 0),
                         "used": n.used.get(r, 0), "borrowed": n.borrowed.get(r, 0),
                         "lent": max(0, from_kids - n.borrowed.get(r, 0))})
        out.append({"tree": n.tree, "name": n.name, "parent": n.parent, "depth": n.depth,
                    "resources": rows})
    return out


# --- timeline ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Bar:
    namespace: str
    name: str
    kind: str  # "running", "reserved" (room held for it), "estimated" (its estimated start)
    start: float
    end: float
    lanes: tuple[str, ...]  # node groups (topology domains or nodes) it uses


def timeline(bars: Iterable[Bar], visible: Collection[str] | None, now: float,
             max_lanes: int = 60) -> dict[str, Any]:
    """Bars per lane (a node group), each bar relative to `now` in seconds; a viewer
    sees only the bars of namespaces it may list. Lanes past `max_lanes` are counted,
    not drawn."""
    lanes: dict[str, list[dict[str, Any]]] = {}
    end = now + HOUR
    for b in bars:
        if visible is not None and b.namespace not in visible:
            continue
        end = max(end, b.end)
        for lane in b.lanes or ("unplaced",):
            lanes.setdefault(lane, []).append({
                "namespace": b.namespace, "name": b.name, "kind": b.kind,
                "from": round(b.start - now), "to": round(b.end - now),
                "start": iso(b.start), "end": iso(b.end)})
    names = sorted(lanes)
    return {"now": iso(now), "span": round(end - now),
            "lanes": [{"lane": n, "bars": sorted(lanes[n], key=lambda x: (x["from"],
                                                                            x["name"]))}
                      for n in names[:max_lanes]],
            "moreLanes": max(0, len(names) - max_lanes)}


# --- history -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Started:
    """A wrapper that started: when it was first seen and when it was dispatched."""

    namespace: str
    teams: tuple[str, ...]
    first_seen: float
    dispatched_at: float


def history(started: Iterable[Started], visible: Collection[str] | None,
            now: float) -> dict[str, Any]:
    """Per team (its quota leaf; its namespace without quota trees), the wait of the
    wrappers that started in each hour of the last day: how many, median and longest."""
    edges = [now - HISTORY_HOURS * HOUR + i * HOUR for i in range(HISTORY_HOURS + 1)]
    waits: dict[str, list[list[float]]] = {}
    for s in started:
        if visible is not None and s.namespace not in visible:
            continue
        if s.dispatched_at > now:
            continue
        # The last hour ends now, and includes it.
        hour = min(bisect.bisect_right(edges, s.dispatched_at) - 1, HISTORY_HOURS - 1)
        if hour < 0:
            continue
        for team in s.teams or (f"namespace {s.namespace}",):
            hours = waits.get(team)
            if hours is None:  # not setdefault: its default would be built for every row
                hours = waits[team] = [[] for _ in range(HISTORY_HOURS)]
            hours[hour].append(max(0.0, s.dispatched_at - s.first_seen))
    return {"hours": [iso(e) for e in edges[:-1]], "teams": [
        {"team": team, "hours": [{"started": len(h),
                                  "medianSeconds": round(statistics.median(h)) if h else None,
                                  "longestSeconds": round(max(h)) if h else None}
                                 for h in hours]}
        for team, hours in sorted(waits.items())]}
