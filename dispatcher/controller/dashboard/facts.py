"""The facts the dashboard shows, read from the running dispatcher's memory on the event
loop (api.py serves them; view.py shapes them). Reading only: nothing
here changes memory or talks to the API server.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from dispatcher.api.conditions import latest
from dispatcher.controller.access.creator import wrapped_items
from dispatcher.controller.loop.estimate_round import expected
from dispatcher.controller.record.tracked import ACTIVE, Key, Tracked
from dispatcher.resources import GPU, PODS

from .view import Bar, Started, TeamUsage, Waiting, iso

if TYPE_CHECKING:
    from dispatcher.controller.loop.runtime import Dispatcher

UNPLACED = "not placed yet"


def _gang(t: Tracked) -> dict[str, int]:
    total: dict[str, int] = {}
    for g in t.queued.gang if t.queued is not None else ():
        for r, amount in g.pod_set.request.items():
            total[r] = total.get(r, 0) + amount * g.pod_set.count
    return total


def _kinds(t: Tracked) -> tuple[str, ...]:
    if t.aw is None:
        return ()
    return tuple(sorted({i.kind for i in wrapped_items(t.aw)}))


def _teams_of(t: Tracked, d: Dispatcher) -> tuple[str, ...]:
    forest = d.memory.sharing.forest()
    if forest is None or t.queued is None:
        return ()
    return tuple(f"{tree}/{leaf}" for tree, leaf in forest.resolve(t.queued.labels).leaves)


class Gathering:
    """Gathers the waiting wrappers, keeping what each one's spec says (what it wraps,
    its gang's GPUs and pods) while its spec object is the same: a spec is replaced,
    never changed in place, and reading 10,000 specs again at every refresh would cost
    most of it. Kept only for the wrappers of the last gathering."""

    def __init__(self) -> None:
        self._specs: dict[Key, tuple[object, object, tuple[str, ...], int, int]] = {}

    def waiting(self, d: Dispatcher) -> list[Waiting]:
        """Every waiting wrapper: those the last cycle numbered, then the held."""
        out: list[Waiting] = []
        specs: dict[Key, tuple[object, object, tuple[str, ...], int, int]] = {}
        for e in d.positions.snapshot.entries:
            t = d.tracked.get(e.key)
            if t is None or t.phase != "queued":
                continue
            teams = tuple(f"{q.tree}/{q.node}" for q in e.quota)
            out.append(self._waiting(t, specs, e.position, e.priority, e.effective_priority,
                                     teams))
        for t in d.tracked.values():
            if t.phase == "queued" and t.held_by is not None and t.cancelled_by is None:
                priority = t.aw.spec.priority if t.aw is not None else 0
                out.append(self._waiting(t, specs, None, priority, float(priority),
                                         _teams_of(t, d)))
        self._specs = specs
        return out

    def _waiting(self, t: Tracked, specs: dict[Key, tuple[object, object, tuple[str, ...],
                                                           int, int]],
                 position: int | None, priority: int, effective: float,
                 teams: tuple[str, ...]) -> Waiting:
        spec = self._specs.get(t.key)
        if spec is None or spec[0] is not t.aw or spec[1] is not t.queued:
            gang = _gang(t)
            spec = (t.aw, t.queued, _kinds(t), gang.get(GPU, 0), gang.get(PODS, 0))
        specs[t.key] = spec
        last = latest(t.status.conditions)
        estimate = t.status.estimatedStart
        return Waiting(
            t.key[0], t.key[1], position, priority, effective, t.first_seen, teams, spec[2],
            t.held_by, last.type if last is not None else "", last.reason if last else "",
            t.status.message or (last.message if last else ""),
            estimate.timestamp() if estimate is not None else None, spec[3], spec[4])


def teams(d: Dispatcher) -> list[TeamUsage]:
    ledger = d.memory.sharing.ledger
    if ledger is None:
        return []
    return [TeamUsage(u.tree, u.name, u.parent, u.depth, u.nominal, u.used, u.borrowed)
            for u in ledger.usage()]


def _lane(d: Dispatcher, node: str) -> str:
    """A node's group: its domain at the outermost topology level, else the node."""
    levels = d.topology.levels
    found = d.memory.state.nodes.get(node)
    if levels and found is not None and levels[0] in found.labels:
        return f"{levels[0]}={found.labels[levels[0]]}"
    return node


def bars(d: Dispatcher, now: float) -> list[Bar]:
    """What runs until it is expected to end, and the waiting wrappers from their
    estimated start for their expected duration, on the node groups they use (or are
    estimated to use): what the last round of estimates worked from."""
    r = d.estimates.taken(now, empty=True)
    if r is None:
        return []
    durations, running = expected(r, d.estimates.s, now)
    out: list[Bar] = []
    for w in running:
        t = d.tracked.get(w.key)
        start = t.dispatched_at if t is not None and t.dispatched_at else now
        out.append(Bar(w.key[0], w.key[1], "running", start, w.ends_at,
                       _lanes(d, (p.node for p in w.holdings))))
    forecast = d.estimates.last
    for key, e in (forecast.estimates.items() if forecast is not None else ()):
        if e.at is None or key not in durations:
            continue
        # A preemptor's room is held while its victims go: its start is reserved.
        kind = "reserved" if key in d.memory.sharing.holds else "estimated"
        out.append(Bar(key[0], key[1], kind, e.at, e.at + durations[key],
                       _lanes(d, e.nodes)))
    return out


def _lanes(d: Dispatcher, nodes: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted({_lane(d, n) for n in nodes if n})) or (UNPLACED,)


def started(d: Dispatcher) -> dict[str, list[Started]]:
    """The wrappers this controller saw start, with their first-seen time, as it keeps
    them (a wrapper deleted since is gone from memory, and so from the history), per
    namespace. A walk of every wrapper it tracks, finished ones included: api.py asks at
    most every few seconds."""
    out: dict[str, list[Started]] = {}
    for t in d.tracked.values():
        if t.dispatched_at and t.phase in (*ACTIVE, "done"):
            out.setdefault(t.key[0], []).append(
                Started(t.key[0], _teams_of(t, d), t.first_seen, t.dispatched_at))
    return out


def one(d: Dispatcher, key: Key) -> dict[str, Any] | None:
    """One AppWrapper: its conditions in order, its pods and where they are, why it waits."""
    t = d.tracked.get(key)
    if t is None:
        return None
    s = t.status
    estimate = s.estimatedStart
    return {
        "namespace": key[0], "name": key[1], "phase": t.phase, "state": s.state or "",
        "heldBy": t.held_by, "position": s.queuePosition, "message": s.message,
        "estimatedStart": iso(estimate.timestamp()) if estimate is not None else None,
        "kinds": list(_kinds(t)), "requests": _gang(t),
        "conditions": [{"type": c.type, "status": c.status, "reason": c.reason,
                        "message": c.message,
                        "at": _stamp(c.lastTransitionMicroTime or c.lastUpdateMicroTime)}
                       for c in s.conditions],
        "pods": [{"name": p.name, "node": p.node, "requests": dict(p.request)}
                 for p in d.memory.state.bound_pods_of(key)],
        "podsByState": {b: n for b, n in _count(t.pods.values()).items()},
        "whatIf": (f"kubectl get appwrapper {key[1]} -n {key[0]} -o yaml > aw.yaml && "
                   "kubectl appwrapper plan --live -f aw.yaml"),
    }


def _count(values: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def _stamp(at: datetime | None) -> str:
    return "" if at is None else at.strftime("%Y-%m-%dT%H:%M:%SZ")
