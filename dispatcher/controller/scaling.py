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
  fails is owed and tried again at the wrapper's next step: the recorded size is what the
  object must get.
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
from typing import Any

from dispatcher.admission import Decision
from dispatcher.api.conditions import latest
from dispatcher.cluster import ClusterState, PlannedPod
from dispatcher.elastic import Scale, recorded_counts
from dispatcher.fit.elastic import describe, lowest, sized
from dispatcher.kinds.elastic import ElasticSet

from .items import prepared_items
from .kube import ApiError, Kube
from .status import StatusWriter, event_body
from .tracked import Tracked

log = logging.getLogger("dispatcher")


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

    def requeued(self, t: Tracked) -> None:
        t.status.elasticPods = []
        self.owed.pop(t.key, None)
        self.removing.pop(t.key, None)
        self.synced.discard(t.key)
        self.deferred.pop(t.key, None)
        self.last.pop(t.key, None)

    def running(self, t: Tracked, reason: str, message: str) -> tuple[str, str]:
        """The Running condition's reason and message: after a change of size, its
        reason (ScaledOut, ScaledIn) and what changed, beside the pod counts."""
        s = self.last.get(t.key)
        if s is None or list(s.after) != t.status.elasticPods:
            return reason, message
        return s.reason, f"{s.message}; {message}"

    def defer(self, t: Tracked, s: Scale, now: float) -> None:
        self.deferred[t.key] = s
        t.check_at = now  # its next step carries it out

    def due(self, t: Tracked) -> bool:
        """Whether `catch_up` has work for `t` at its next step."""
        return t.key in self.deferred or t.key in self.owed or self._unsynced(t)

    def _unsynced(self, t: Tracked) -> bool:
        return t.key not in self.synced and t.queued is not None \
            and bool(t.queued.elastic) and bool(t.status.elasticPods) and not t.needs_items

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
            await self.patch(t)

    async def scale(self, t: Tracked, s: Scale, now: float) -> None:
        """Record the new size, then patch the object (see the module docstring)."""
        if t.phase not in ("dispatched", "running") or t.queued is None:
            return
        before = self.state.holdings(t.key)
        if s.out:
            # The added pods hold their nodes from now on, beside what the gang holds.
            added = [PlannedPod(p.node, p.request) for p in s.placements if p.node is not None]
            self.state.reserve(t.key, [*before, *added])
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
        log.info("%s/%s: %s", *t.key, s.message)
        await self.writer.event(t.key[0], event_body(t, s.reason, s.message, False, now))
        await self.patch(t)

    async def patch(self, t: Tracked) -> None:
        """Set the replicas of the live objects to the size owed (transient failures
        raise: the step is tried again). Objects not created yet are left alone: they
        are created at the size recorded."""
        counts = self.owed.get(t.key)
        if counts is None or t.queued is None or t.needs_items:
            return
        objs = sized_items(t)
        removing = self.removing.get(t.key, ())
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
                # Gone (its wrapper is being torn down) or refused: nothing to retry; the
                # gang's lifecycle says what happens to it.
                log.warning("%s/%s: %s %s not resized: %s", *t.key, obj["kind"],
                            obj["metadata"]["name"], e)
        if self.owed.get(t.key) == counts:
            del self.owed[t.key]
            self.removing.pop(t.key, None)
        log.info("%s/%s: %s now", *t.key, describe(t.queued.elastic, counts))
