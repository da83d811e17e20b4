"""Elastic gangs in the controller: the core decides (dispatcher.elastic); this module
carries the sizes out on the live objects.

- At dispatch the size admitted is recorded (status.elasticPods, with the Dispatched
  write) and the items are created at it: the replicas field of each elastic pod set
  (a PyTorchJob's Worker replicas, a Ray worker group's replicas, a Deployment's) is set
  in the object before its creation.
- A scale-out (capacity freed that no wrapper ahead could use) or a scale-in (room for a
  wrapper of higher priority, or within its quota) is written first: status.elasticPods,
  the latest condition's reason (ScaledOut / ScaledIn) and message ("scaled out to 6
  workers …"), then an Event; then the replicas of the live object are patched. A
  scale-out's pods hold their nodes at once (a reservation, as at dispatch). A patch that
  fails for a while (the API server overloaded or down) is owed and tried again at the
  wrapper's next step: the recorded size is what the object must get.
- A patch refused for good (403: the service account lacks `patch` on the kind; 404: the
  object is gone; 422: the operator's webhook refuses the size) is a resize that did not
  happen: the status records again the size the object asks for (so the quota charged and
  the pods expected are those that run), a scale-out's added pods hold nothing more, the
  condition and a Warning Event say why and what to grant, and the gang is neither grown
  nor shrunk for RESIZE_RETRY_SECONDS (the core sees it at its size, not elastic), so a
  refusal is met once per that interval, not at every cycle. A preemptor whose room
  waited for its pods to go gives that room up at once (dispatcher.admission): it does
  not wait for a scale-in that will not happen.
- The gang's health follows: the pods expected are those of its current size, and the
  pods that must run for it to count as running (when minAvailable is not given) are
  those of its minimum, so a scale-out's pods still starting, or a scale-in's going,
  never make it look short of pods.

The admitted records the core needs (size, which pods a scale-in removes) come from
status.elasticPods and the gang's bound pods by name (dispatcher.elastic.removal_order).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dispatcher.admission import Decision
from dispatcher.api.conditions import latest
from dispatcher.cluster import ClusterState, PlannedPod
from dispatcher.controller.kube.client import ApiError, Kube, Resource
from dispatcher.controller.record.status import StatusWriter, event_body
from dispatcher.controller.record.tracked import ACTIVE, Tracked
from dispatcher.elastic import Scale, recorded_counts
from dispatcher.fit.elastic import describe, lowest, sized
from dispatcher.kinds.elastic import ElasticSet
from dispatcher.wording import span

from .shaping import prepared_items

log = logging.getLogger("dispatcher")

RESIZE_REFUSED = "ResizeRefused"
# How long a gang whose resize was refused keeps its size: an administrator has time to
# grant what is missing, and the refusal is not met again at every cycle.
RESIZE_RETRY_SECONDS = 300.0


def pods_of(counts: Sequence[int], t: Tracked) -> int:
    """The pods the gang has at `counts`."""
    assert t.queued is not None
    return sum(g.pod_set.count for g in sized(t.queued.gang, t.queued.elastic, counts))


def follow_size(t: Tracked) -> None:
    """Expected pods and the pods it needs, from the size its status records."""
    if t.queued is None or not t.queued.elastic:
        t.floor = None
        return
    counts = recorded_counts(t.queued, t.status.elasticPods)
    t.expected_pods = pods_of(counts, t)
    t.floor = pods_of(lowest(t.queued.elastic), t)


def scaled_in(t: Tracked, state: ClusterState) -> bool:
    """Whether a member pod of `t` that went away was one a scale-in removes: the gang
    is elastic and still has the pods of its size bound. No replacement is owed then (its
    room is another wrapper's now)."""
    return t.floor is not None and len(state.bound_pods_of(t.key)) >= t.expected_pods


def sized_items(t: Tracked) -> list[dict[str, Any]]:
    """The objects to create, each elastic pod set at the size recorded for it."""
    assert t.aw is not None
    objs = prepared_items(t.aw)
    if t.queued is None or not t.queued.elastic:
        return objs
    for s, pods in zip(t.queued.elastic,
                       recorded_counts(t.queued, t.status.elasticPods), strict=True):
        _set(objs[s.item], s.path, s.replicas(pods))
    return objs


def _set(obj: dict[str, Any], path: Sequence[str | int], value: int) -> None:
    at: Any = obj
    for step in path[:-1]:
        at = at[step]
    at[path[-1]] = value


@dataclass(frozen=True)
class _Refusal:
    """A set's patch the API server refused for good."""

    set: int  # its index among the gang's elastic sets
    resource: Resource
    name: str
    error: ApiError

    def why(self) -> str:
        e = self.error
        group = self.resource.api_version.rpartition("/")[0]
        plural = f"{self.resource.plural}.{group}" if group else self.resource.plural
        text = f"{self.resource.kind} {self.name}: {e.reason or e.status}: {e.message}"
        if e.status == 403:
            text += f" (grant the dispatcher's service account the verb patch on {plural})"
        return text


def _replicas_at(obj: Mapping[str, Any], path: Sequence[str | int]) -> int | None:
    at: Any = obj
    for step in path:
        if isinstance(step, int):
            at = at[step] if isinstance(at, list) and -len(at) <= step < len(at) else None
        else:
            at = at.get(step) if isinstance(at, Mapping) else None
        if at is None:
            return None
    return at if isinstance(at, int) and not isinstance(at, bool) else None


def _patch(s: ElasticSet, replicas: int, removing: Sequence[str] = ()) -> tuple[Any, str]:
    """A patch setting the set's replicas: a merge patch through maps, a JSON patch where
    the path crosses a list (a Ray worker group, which is also told which pods to remove:
    KubeRay would otherwise remove any)."""
    if any(isinstance(step, int) for step in s.path):
        pointer = "/" + "/".join(str(step).replace("~", "~0").replace("/", "~1")
                                 for step in s.path)
        ops: list[dict[str, Any]] = [{"op": "add", "path": pointer, "value": replicas}]
        if removing:
            group = pointer.rsplit("/", 1)[0]
            ops.append({"op": "add", "path": f"{group}/scaleStrategy",
                        "value": {"workersToDelete": list(removing)}})
        return ops, "application/json-patch+json"
    body: Any = replicas
    for step in reversed(s.path):
        body = {step: body}
    return body, "application/merge-patch+json"


class Scaling:
    def __init__(self, kube: Kube, writer: StatusWriter, state: ClusterState) -> None:
        self.kube = kube
        self.writer = writer
        self.state = state
        # Sizes recorded but not yet patched into the live objects, per wrapper.
        self.owed: dict[tuple[str, str], tuple[int, ...]] = {}
        # Scale-ins decided while the wrapper was busy: a preemptor holds room for them.
        self.deferred: dict[tuple[str, str], Scale] = {}
        # The last change of size, which the Running condition keeps saying.
        self.last: dict[tuple[str, str], Scale] = {}
        # Per elastic set, the pods a scale-in owed removes, by name (Ray is told them).
        self.removing: dict[tuple[str, str], tuple[tuple[str, ...], ...]] = {}
        # Gangs whose objects this process knows to have the recorded size: the others
        # (found after a restart) get it patched once, in case a patch was cut short.
        self.synced: set[tuple[str, str]] = set()
        # A scale-out's added pods, per set name, held until its patch is done.
        self.added: dict[tuple[str, str], list[tuple[str, PlannedPod]]] = {}
        # Gangs whose resize was refused: until when they keep their size, and why.
        self.refused: dict[tuple[str, str], tuple[float, str]] = {}

    @staticmethod
    def any_elastic(tracked: Mapping[tuple[str, str], Tracked],
                    elastic: Iterable[tuple[str, str]]) -> bool:
        """Whether an admitted gang may grow: `elastic` names the wrappers to look at."""
        for key in elastic:
            t = tracked.get(key)
            if t is not None and t.queued is not None and t.queued.elastic \
                    and t.phase in ("dispatching", "dispatched", "running"):
                return True
        return False

    def dispatching(self, t: Tracked, d: Decision) -> None:
        """The size admitted goes into the Dispatched write; the items are created at it."""
        if d.elastic:
            t.status.elasticPods = list(d.elastic)
            self.synced.add(t.key)  # created at that size
        follow_size(t)

    def rigid(self, now: float) -> set[tuple[str, str]]:
        """The gangs to be neither grown nor shrunk now: their last resize was refused."""
        for key in [k for k, (until, _) in self.refused.items() if until <= now]:
            del self.refused[key]
        return set(self.refused)

    def requeued(self, t: Tracked) -> None:
        t.status.elasticPods = []
        self.owed.pop(t.key, None)
        self.added.pop(t.key, None)
        self.refused.pop(t.key, None)
        self.removing.pop(t.key, None)
        self.synced.discard(t.key)
        self.deferred.pop(t.key, None)
        self.last.pop(t.key, None)

    def running(self, t: Tracked, reason: str, message: str) -> tuple[str, str]:
        """The Running condition's reason and message: after a change of size, its
        reason (ScaledOut, ScaledIn) and what changed, beside the pod counts."""
        refused = self.refused.get(t.key)
        if refused is not None:
            return RESIZE_REFUSED, f"{refused[1]}; {message}"
        s = self.last.get(t.key)
        if s is None or list(s.after) != t.status.elasticPods:
            return reason, message
        return s.reason, f"{s.message}; {message}"

    def defer(self, t: Tracked, s: Scale, now: float) -> None:
        self.deferred[t.key] = s
        t.timers.check_at = now  # its next step carries it out

    def due(self, t: Tracked) -> bool:
        """Whether `catch_up` has work for `t` at its next step."""
        # Asked of every dispatched wrapper each cycle (loop/due.py): cheap tests first.
        return (bool(self.deferred) and t.key in self.deferred) \
            or (bool(self.owed) and t.key in self.owed) or self._unsynced(t)

    def _unsynced(self, t: Tracked) -> bool:
        return t.queued is not None and bool(t.queued.elastic) \
            and t.key not in self.synced and bool(t.status.elasticPods) and not t.needs_items

    async def catch_up(self, t: Tracked, now: float) -> None:
        """At a wrapper's step: a deferred scale-in, then a patch still owed (or, for a
        gang found after a restart, the size its status records)."""
        s = self.deferred.pop(t.key, None)
        if s is not None:
            await self.scale(t, s, now)
        if self._unsynced(t) and t.queued is not None:
            self.synced.add(t.key)
            self.owed.setdefault(t.key, recorded_counts(t.queued, t.status.elasticPods))
        if t.key in self.owed:
            await self.patch(t, now)

    async def scale(self, t: Tracked, s: Scale, now: float) -> None:
        """Record the new size, then patch the object (see the module docstring)."""
        if t.phase not in ACTIVE or t.queued is None:
            return
        before = self.state.holdings(t.key)
        added = [(p.pod_set, PlannedPod(p.node, p.request)) for p in s.placements
                 if p.node is not None] if s.out else []
        if added:
            # The added pods hold their nodes from now on, beside what the gang holds.
            self.state.reserve(t.key, [*before, *(p for _, p in added)])
        change = self.writer.begin(t, now)
        t.status.elasticPods = list(s.after)
        current = latest(t.status.conditions)
        change.condition(current.type if current is not None else "Running", s.reason,
                         s.message)
        try:
            written = await self.writer.commit(change, force=True)
        except BaseException:
            if s.out:  # not recorded: the added pods will not come
                self.state.reserve(t.key, before)
            raise
        if not written:
            return
        follow_size(t)
        self.owed[t.key] = s.after
        self.removing[t.key] = s.removed_names
        self.last[t.key] = s
        if added:
            self.added[t.key] = added
        log.info("%s/%s: %s", *t.key, s.message)
        await self.writer.event(t.key[0], event_body(t, s.reason, s.message, False, now))
        await self.patch(t, now)

    async def patch(self, t: Tracked, now: float) -> None:
        """Set the replicas of the live objects to the size owed (transient failures
        raise: the step is tried again). Objects not created yet are left alone: they
        are created at the size recorded. A patch refused for good undoes the resize
        (see the module docstring)."""
        counts = self.owed.get(t.key)
        if counts is None or t.queued is None or t.needs_items:
            return
        objs = sized_items(t)
        removing = self.removing.get(t.key, ())
        refusals: list[_Refusal] = []
        for j, (s, pods) in enumerate(zip(t.queued.elastic, counts, strict=True)):
            obj = objs[s.item]
            resource = await self.kube.resource(obj["apiVersion"], obj["kind"])
            if resource is None:
                continue
            body, content_type = _patch(s, s.replicas(pods),
                                        removing[j] if j < len(removing) else ())
            try:
                await self.kube.request("PATCH", resource.path(t.key[0],
                                                               obj["metadata"]["name"]),
                                        body, content_type=content_type)
            except ApiError as e:
                if e.transient:
                    raise
                refusals.append(_Refusal(j, resource, obj["metadata"]["name"], e))
        if refusals:
            await self._undo(t, counts, refusals, now)
        else:
            log.info("%s/%s: %s now", *t.key, describe(t.queued.elastic, counts))
        if self.owed.get(t.key) == counts:  # (not if the step raised: it is tried again)
            del self.owed[t.key]
            self.removing.pop(t.key, None)
            self.added.pop(t.key, None)

    async def _undo(self, t: Tracked, counts: tuple[int, ...], refusals: Sequence[_Refusal],
                    now: float) -> None:
        """A resize refused for some sets: record the size their objects ask for, give
        back what their added pods held, and say why (module docstring)."""
        assert t.queued is not None
        sets = t.queued.elastic
        kept = list(counts)
        for r in refusals:
            kept[r.set] = await self._size_of(t, sets[r.set], r, counts)
        message = (f"could not resize to {describe(sets, counts)}: "
                   + "; ".join(r.why() for r in refusals)
                   + f"; it keeps {describe(sets, kept)} and is not resized for "
                   f"{span(RESIZE_RETRY_SECONDS)}")
        log.warning("%s/%s: %s", *t.key, message)
        change = self.writer.begin(t, now)
        t.status.elasticPods = kept
        current = latest(t.status.conditions)
        change.condition(current.type if current is not None else "Running", RESIZE_REFUSED,
                         message)
        if not await self.writer.commit(change, force=True):
            return
        follow_size(t)
        refused = {sets[r.set].name for r in refusals}
        self._give_back(t, [p for name, p in self.added.pop(t.key, ()) if name in refused])
        self.last.pop(t.key, None)
        self.refused[t.key] = (now + RESIZE_RETRY_SECONDS, message)
        await self.writer.event(t.key[0], event_body(t, RESIZE_REFUSED, message, True, now))

    async def _size_of(self, t: Tracked, s: ElasticSet, r: _Refusal,
                       counts: tuple[int, ...]) -> int:
        """The pods the set's live object asks for; if it cannot be read, the size
        before the refused change (or, not knowing it, the size owed)."""
        try:
            obj = await self.kube.request("GET", r.resource.path(t.key[0], r.name))
        except ApiError:
            obj = None
        replicas = _replicas_at(obj, s.path) if isinstance(obj, Mapping) else None
        if replicas is not None:
            return min(max(replicas * s.unit, s.low), s.high)
        last = self.last.get(t.key)
        return last.before[r.set] if last is not None and last.after == counts \
            else counts[r.set]

    def _give_back(self, t: Tracked, pods: Sequence[PlannedPod]) -> None:
        """Take pods of a scale-out that will not come off the gang's reservation: what
        is still held on their nodes at their requests (the very objects, as unreserve
        wants them)."""
        held = self.state.reserved_for(t.key)
        drop: list[PlannedPod] = []
        for p in pods:
            i = next((i for i, q in enumerate(held)
                      if q.node == p.node and q.request == p.request), None)
            if i is not None:
                drop.append(held.pop(i))
        self.state.unreserve(t.key, drop)
