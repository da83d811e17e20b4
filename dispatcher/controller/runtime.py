"""The dispatcher at run time: cluster state fed by watches, one admission loop.

Watch events (from kopf, or the initial listing) only update in-memory state and wake
the loop; they never call the API. The loop batches whatever happened since it last
ran: it judges dispatched AppWrappers (running? completed? requeue?), runs one
admission cycle off the event loop, then writes the results — status only where it
changed, wrapped objects for each dispatch.

Durable state is in the API only (status, owner references, labels), so a restarted
dispatcher rebuilds everything from a listing: status Dispatched is written *before*
any wrapped object is created, so objects never exist for an AppWrapper whose status
says it is queued, and a restart in between finds Dispatched and creates what is
missing — names are fixed in advance, so never a second copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from dispatcher.admission import (
    BEHIND_HEAD,
    Decision,
    EmptyClusterAnswers,
    Fit,
    admit,
    queued_from_appwrapper,
)
from dispatcher.api.conditions import ConditionType, Reason, latest, set_condition
from dispatcher.api.labels import APPWRAPPER_LABEL
from dispatcher.api.models import AppWrapper, AppWrapperStatus, InvalidSpec, parse_appwrapper
from dispatcher.cluster import ClusterState, bound_pod_from_object, node_from_object
from dispatcher.cluster.state import PlannedPod
from dispatcher.fit import Capacity
from dispatcher.kinds.completion import Outcome, item_outcome, wrapper_outcome
from dispatcher.lifecycle import PodCounts, Verdict, judge, pods_allowed_seconds
from dispatcher.queue import AdmissionQueue, Policy, QueuedWrapper
from dispatcher.resources import GPU

from .items import MAX_LABEL_VALUE, owned_by, prepared_items
from .kube import ApiError, Kube, Resource

log = logging.getLogger("dispatcher")

Key = tuple[str, str]
Phase = Literal["queued", "dispatched", "running", "done"]

APPWRAPPERS = Resource("workload.codeflare.dev/v1beta1", "AppWrapper", "appwrappers", True)
NODES = Resource("v1", "Node", "nodes", False)
PODS = Resource("v1", "Pod", "pods", True)
EVENTS = Resource("v1", "Event", "events", True)

# Settle time after an event before a cycle, so a burst of pod events makes one cycle.
DEBOUNCE_SECONDS = 0.05
# Look again this often even when nothing happens: dynamic priorities, backfill's age
# guard, wrapped objects' outcomes and requeue deadlines move with the clock.
TICK_SECONDS = 5.0
# How often a running wrapper's objects are read for their outcome without pod news.
OUTCOME_REFRESH_SECONDS = 15.0
PARALLEL_WRITES = 16


class Observer:
    """What the dispatcher reports as it works; metrics subclass it. Every method is
    called on the event loop and must not block."""

    def cycle(self, seconds: float, queued: int, decisions: int) -> None: ...
    def dispatched(self, waited_seconds: float) -> None: ...
    def requeued(self, reason: str) -> None: ...
    def failed(self, reason: str) -> None: ...
    def completed(self) -> None: ...
    def snapshot(self, dispatcher: Dispatcher) -> None:
        """After each cycle: gauges (states, queue, capacity) read from the dispatcher."""


@dataclass
class Tracked:
    """One AppWrapper as the dispatcher knows it."""

    key: Key
    uid: str
    generation: int
    aw: AppWrapper | None
    status: AppWrapperStatus
    written: dict[str, Any]  # the status as last read or written, to skip no-op writes
    first_seen: float
    phase: Phase = "queued"
    queued: QueuedWrapper | None = None
    expected_pods: int = 0
    dispatched_at: float = 0.0
    pods: dict[str, str] = field(default_factory=dict)  # pod name -> counted phase
    outcome: Outcome | None = None
    completable: tuple[int, ...] = ()  # items whose kind reports an outcome
    outcome_stale: bool = True
    outcome_read_at: float = 0.0
    check_at: float | None = None
    needs_items: bool = False  # Dispatched, but not every item is known to exist yet


def _now_dt(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


def _pod_bucket(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None  # on its way out: no longer part of the gang's count
    phase = (obj.get("status") or {}).get("phase") or "Pending"
    return {"Running": "running", "Succeeded": "succeeded", "Failed": "failed"}.get(
        phase, "pending")


class Dispatcher:
    def __init__(self, kube: Kube, policy: Policy, fit: Fit = "per-node",
                 clock: Callable[[], float] = time.time,
                 observer: Observer | None = None) -> None:
        self.kube = kube
        self.observer = observer or Observer()
        self.policy = policy
        self.fit: Fit = fit
        self.clock = clock
        self.state = ClusterState()
        self.queue = AdmissionQueue(policy)
        self.tracked: dict[Key, Tracked] = {}
        self.wake = asyncio.Event()
        # Replaced, not cleared, on a node change: a cycle in the executor keeps its own.
        self._empty_answers = EmptyClusterAnswers()
        self._writes = asyncio.Semaphore(PARALLEL_WRITES)
        self._task: asyncio.Task[None] | None = None
        self.cycles = 0
        self.ready = False
        self.last_cycle_at = time.monotonic()
        self._events: list[tuple[Tracked, str, str, str]] = []
        self._pending_teardown: set[Key] = set()
        self._unwritten: set[Key] = set()  # status changed outside a cycle's own writes

    # --- watch events: update memory, wake the loop ---------------------------------

    def on_node(self, event: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        if event == "DELETED":
            self.state.remove_node(name)
        else:
            node = node_from_object(obj)
            if self.state.nodes.get(name) == node:
                return  # a heartbeat: nothing the fit looks at has changed
            self.state.upsert_node(node)
        self._empty_answers = EmptyClusterAnswers()
        self.wake.set()

    def on_pod(self, event: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        gone = event == "DELETED"
        bound = None if gone else bound_pod_from_object(obj)
        changed = self.state.pod(key) != bound
        if changed:
            self.state.upsert_pod(key, bound)
        owner = (meta.get("labels") or {}).get(APPWRAPPER_LABEL)
        if owner:
            t = self.tracked.get((key[0], str(owner)))
            if t is not None:
                bucket = None if gone else _pod_bucket(obj)
                before = t.pods.get(key[1])
                if bucket is None:
                    t.pods.pop(key[1], None)
                else:
                    t.pods[key[1]] = bucket
                if bucket != before:
                    t.outcome_stale = True
                    changed = True
        if changed:
            self.wake.set()

    def on_appwrapper(self, event: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or "default"), str(meta.get("name")))
        t = self.tracked.get(key)
        if event == "DELETED":
            if t is not None and t.uid == meta.get("uid"):
                self._forget(key)
            self.wake.set()
            return
        if t is not None and t.uid == meta.get("uid") \
                and t.generation == int(meta.get("generation") or 0):
            return  # our own status write coming back, or a label change
        if t is not None and t.uid == meta.get("uid") and t.phase != "queued":
            t.generation = int(meta.get("generation") or 0)
            return  # spec edits after dispatch are not applied, as in MCAD
        if t is not None:
            self._forget(key)
        self._intake(key, obj)
        self.wake.set()

    def _forget(self, key: Key) -> None:
        self.tracked.pop(key, None)
        self.queue.remove(key)
        self.state.release(key)

    def _intake(self, key: Key, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        raw_status = obj.get("status") or {}
        try:
            status = AppWrapperStatus.model_validate(raw_status)
        except ValueError:
            status = AppWrapperStatus()
        now = self.clock()
        t = Tracked(key=key, uid=str(meta.get("uid", "")),
                    generation=int(meta.get("generation") or 0), aw=None,
                    status=status, written=status.model_dump(mode="json"), first_seen=now)
        self.tracked[key] = t
        if status.state in ("Completed", "Failed"):
            t.phase = "done"
            return
        try:
            aw = parse_appwrapper(obj)
        except InvalidSpec as e:
            self._fail_spec(t, "; ".join(e.problems))
            return
        t.aw = aw
        t.first_seen = _first_seen(status.controllerfirsttimestamp,
                                   aw.metadata.creationTimestamp, now)
        if len(key[1]) > MAX_LABEL_VALUE:
            self._fail_spec(t, f"metadata.name is {len(key[1])} characters long; the "
                            "dispatcher labels what it creates with the AppWrapper's name, "
                            f"so it must be at most {MAX_LABEL_VALUE}")
            return
        queued = queued_from_appwrapper(aw, t.first_seen)
        if queued.invalid is not None:
            self._fail_spec(t, queued.invalid)
            return
        t.queued = queued
        t.expected_pods = sum(g.pod_set.count for g in queued.gang)
        t.completable = tuple(
            i for i, item in enumerate(aw.spec.resources.GenericItems)
            if item_outcome(item.generictemplate, item.completionstatus) is not None
        )
        if not status.conditions:
            self._condition(t, ConditionType.Init, "", "", now)
            t.status.controllerfirsttimestamp = _now_dt(t.first_seen)
            t.status.state = "Pending"
            t.status.requestedGPUs = sum(g.pod_set.request.get(GPU, 0) * g.pod_set.count
                                         for g in queued.gang)
        last = latest(t.status.conditions)
        kind = last.type if last is not None else ""
        if kind in (ConditionType.Dispatched, ConditionType.Running):
            since = next((c.lastTransitionMicroTime for c in reversed(t.status.conditions)
                          if c.type == ConditionType.Dispatched), None)
            t.dispatched_at = since.timestamp() if since is not None else now
            t.phase = "running" if kind == ConditionType.Running else "dispatched"
            t.needs_items = True
        elif kind == ConditionType.PreemptCandidate:
            # A requeue was cut short by a restart: finish the teardown first.
            t.phase = "dispatched"
            t.check_at = now
            t.needs_items = False
            self._pending_teardown.add(key)
        else:
            self.queue.put(queued)

    def _fail_spec(self, t: Tracked, message: str) -> None:
        self.observer.failed(Reason.InvalidSpec)
        t.phase = "done"
        t.queued = None
        now = self.clock()
        t.status.state = "Failed"
        self._condition(t, ConditionType.Failed, Reason.InvalidSpec, message, now)
        self._unwritten.add(t.key)

    # --- status ----------------------------------------------------------------------

    def _condition(self, t: Tracked, type_: str, reason: str, message: str,
                   now: float) -> bool:
        conditions, changed = set_condition(t.status.conditions, type_, reason, message,
                                            _now_dt(now))
        if changed:
            previous = latest(t.status.conditions)
            t.status.conditions = conditions
            t.status.queuejobstate = type_
            t.status.message = message
            if previous is None or previous.type != type_:
                self._events.append((t, type_, reason, message))
        return changed

    def _set_counts(self, t: Tracked) -> None:
        counts = self.counts(t)
        t.status.pending = counts.pending
        t.status.running = counts.running
        t.status.Succeeded = counts.succeeded
        t.status.failed = counts.failed

    def counts(self, t: Tracked) -> PodCounts:
        values = list(t.pods.values())
        return PodCounts(pending=values.count("pending"), running=values.count("running"),
                         succeeded=values.count("succeeded"), failed=values.count("failed"))

    async def _write_status(self, t: Tracked) -> bool:
        """Write `t.status` if it differs from what the API server has; False if the
        AppWrapper is gone."""
        body = t.status.model_dump(mode="json", exclude_none=True)
        if body == t.written:
            return True
        async with self._writes:
            try:
                await self.kube.request(
                    "PATCH", APPWRAPPERS.path(t.key[0], t.key[1], "status"),
                    {"metadata": {"uid": t.uid}, "status": body},
                    content_type="application/merge-patch+json")
            except ApiError as e:
                if e.status in (404, 409):
                    return False  # deleted (or replaced by a new one of the same name)
                raise
        t.written = body
        return True

    async def _post_events(self) -> None:
        events, self._events = self._events, []
        for t, type_, reason, message in events:
            warning = type_ in (ConditionType.Backoff, ConditionType.Failed,
                                ConditionType.PreemptCandidate)
            now = _now_dt(self.clock()).strftime("%Y-%m-%dT%H:%M:%SZ")
            body = {
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{t.key[1][:200]}.", "namespace": t.key[0]},
                "involvedObject": {"apiVersion": APPWRAPPERS.api_version,
                                   "kind": "AppWrapper", "namespace": t.key[0],
                                   "name": t.key[1], "uid": t.uid},
                "reason": reason or type_, "message": f"{type_}: {message}"[:1024],
                "type": "Warning" if warning else "Normal",
                "firstTimestamp": now, "lastTimestamp": now, "count": 1,
                "source": {"component": "dispatcher"},
            }
            try:
                await self.kube.request("POST", EVENTS.path(t.key[0]), body)
            except ApiError as e:  # an Event is best effort, never worth a failure
                log.debug("event for %s/%s not posted: %s", *t.key, e)

    # --- the loop ------------------------------------------------------------------

    async def start(self) -> None:
        """List what exists, then start the loop. Nothing is decided before the listing
        is complete, so no capacity is missed."""
        for obj in await self.kube.list(NODES):
            self.on_node("ADDED", obj)
        for obj in await self.kube.list(APPWRAPPERS):
            self.on_appwrapper("ADDED", obj)
        for obj in await self.kube.list(PODS):
            self.on_pod("ADDED", obj)
        self.ready = True
        self._task = asyncio.create_task(self._run(), name="dispatcher-admission-loop")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            timeout = self._next_timer()
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=timeout)
                await asyncio.sleep(DEBOUNCE_SECONDS)
            except TimeoutError:
                pass
            self.wake.clear()
            try:
                await self.cycle()
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad cycle must not stop the dispatcher
                log.exception("admission cycle failed; retrying")
                await asyncio.sleep(1.0)

    def _next_timer(self) -> float:
        now = self.clock()
        due = [t.check_at for t in self.tracked.values() if t.check_at is not None]
        soonest = min(due, default=now + TICK_SECONDS)
        return max(0.0, min(soonest - now, TICK_SECONDS))

    async def cycle(self) -> None:
        self.cycles += 1
        now = self.clock()
        started = time.perf_counter()
        await self._lifecycle(now)
        queued, decided = len(self.queue), await self._admit(now)
        unwritten = [self.tracked[k] for k in self._unwritten if k in self.tracked]
        self._unwritten.clear()
        await _gather(self._write_or_forget(t) for t in unwritten)
        await self._post_events()
        self.last_cycle_at = time.monotonic()
        self.observer.cycle(time.perf_counter() - started, queued, decided)
        self.observer.snapshot(self)

    # --- dispatched wrappers -------------------------------------------------------

    async def _lifecycle(self, now: float) -> None:
        active = [t for t in self.tracked.values() if t.phase in ("dispatched", "running")]
        await _gather(self._judge_one(t, now) for t in active)

    async def _judge_one(self, t: Tracked, now: float) -> None:
        assert t.aw is not None
        if t.key in self._pending_teardown:
            self._pending_teardown.discard(t.key)
            await self._teardown(t)
            await self._requeued(t, now, counted=True)
            return
        if t.needs_items and not await self._create_items(t, now):
            return
        if t.completable and (t.outcome_stale or now - t.outcome_read_at
                              >= OUTCOME_REFRESH_SECONDS):
            t.outcome_stale = False
            t.outcome_read_at = now
            t.outcome = await self._read_outcome(t)
        verdict = judge(t.aw, self.counts(t), t.expected_pods, t.outcome, t.dispatched_at,
                        t.phase == "running", now)
        await self._apply(t, verdict, now)

    async def _apply(self, t: Tracked, v: Verdict, now: float) -> None:
        t.check_at = v.check_at
        self._set_counts(t)
        if v.action == "running":
            t.phase = "running"
            self.state.release(t.key)  # its pods hold the capacity now
            self._condition(t, ConditionType.Running, Reason.PodsRunning, v.message, now)
            t.status.state = "Running"
        elif v.action == "completed":
            t.phase = "done"
            t.check_at = None
            self.state.release(t.key)
            t.status.state = "Completed"
            self._condition(t, ConditionType.Completed, Reason.PodsCompleted, v.message, now)
            self.observer.completed()
        elif v.action == "failed":
            t.phase = "done"
            t.check_at = None
            if v.reason != "WrappedObjectFailed":
                await self._teardown(t)  # it holds capacity it will never use well
            self.state.release(t.key)
            t.status.state = "Failed"
            self._condition(t, ConditionType.Failed, v.reason, v.message, now)
            self.observer.failed(v.reason)
        elif v.action == "requeue":
            self._condition(t, ConditionType.PreemptCandidate, v.reason, v.message, now)
            self.observer.requeued(v.reason)
            t.status.numberOfRequeueings += 1
            assert t.aw is not None
            # judge() counts requeues against maxNumRequeuings from the parsed status.
            t.aw.status.numberOfRequeueings = t.status.numberOfRequeueings
            t.status.requeueingTimeInSeconds = int(pods_allowed_seconds(
                t.aw.spec.schedulingSpec.requeuing, t.status.numberOfRequeueings))
            # Durable before the teardown: a restart in between finishes the requeue.
            if not await self._write_status(t):
                self._forget(t.key)
                return
            await self._teardown(t)
            await self._requeued(t, now, counted=False)
            return
        if not await self._write_status(t):
            self._forget(t.key)

    async def _requeued(self, t: Tracked, now: float, counted: bool) -> None:
        self.state.release(t.key)
        t.phase = "queued"
        t.pods.clear()
        t.outcome = None
        t.check_at = None
        t.status.state = "Pending"
        self._set_counts(t)
        self._condition(t, ConditionType.Queueing, Reason.AwaitingHeadOfLine,
                        "requeued; waiting for capacity again", now)
        if t.queued is not None:
            self.queue.put(t.queued)
        if not await self._write_status(t):
            self._forget(t.key)

    async def _read_outcome(self, t: Tracked) -> Outcome | None:
        assert t.aw is not None
        outcomes: list[Outcome | None] = []
        items = prepared_items(t.aw)
        for i in t.completable:
            obj = items[i]
            resource = await self.kube.resource(obj["apiVersion"], obj["kind"])
            if resource is None:
                continue
            try:
                live = await self.kube.request(
                    "GET", resource.path(t.key[0], obj["metadata"]["name"]))
            except ApiError as e:
                if e.status == 404:
                    outcomes.append("running")  # not created yet, or being recreated
                    continue
                raise
            item = t.aw.spec.resources.GenericItems[i]
            outcomes.append(item_outcome(live, item.completionstatus))
        return wrapper_outcome(outcomes)

    # --- admission -----------------------------------------------------------------

    async def _admit(self, now: float) -> int:
        ordered = list(self.queue.ordered(now))
        if not ordered:
            return 0
        capacity = Capacity.of(self.state)
        loop = asyncio.get_running_loop()
        decisions = await loop.run_in_executor(None, functools.partial(
            admit, ordered, capacity, self.policy, now, self.fit,
            empty_answers=self._empty_answers))
        jobs: list[Awaitable[None]] = []
        for d in decisions:
            t = self.tracked.get((d.namespace, d.name))
            if t is None or t.phase != "queued" or (d.namespace, d.name) not in self.queue:
                continue  # deleted or changed while the cycle ran
            if d.decision == "dispatch":
                jobs.append(self._dispatch(t, d, now))
            elif d.decision == "invalid":
                self.queue.remove(t.key)
                self._fail_spec(t, d.message)
                jobs.append(self._write_or_forget(t))
            else:
                self._waiting(t, d, now)
                jobs.append(self._write_or_forget(t))
        await _gather(jobs)
        return len(decisions)

    def _waiting(self, t: Tracked, d: Decision, now: float) -> None:
        if d.reason == BEHIND_HEAD:
            self._condition(
                t, ConditionType.Queueing, Reason.AwaitingHeadOfLine,
                f"waiting for the AppWrappers ahead of it ({self.policy.name} policy)", now)
        else:
            self._condition(t, ConditionType.Backoff, Reason.AppWrapperNotRunnable,
                            f"{d.reason}: {d.message}", now)

    async def _write_or_forget(self, t: Tracked) -> None:
        if not await self._write_status(t):
            self._forget(t.key)

    async def _dispatch(self, t: Tracked, d: Decision, now: float) -> None:
        assert t.aw is not None
        self.queue.remove(t.key)
        planned = [PlannedPod(p.node, p.request) for p in d.placements if p.node is not None]
        self.state.reserve(t.key, planned)
        t.phase = "dispatched"
        t.dispatched_at = now
        t.pods = {}
        t.outcome_stale = True
        self._condition(t, ConditionType.HeadOfLine, Reason.FrontOfQueue, "", now)
        self._condition(t, ConditionType.Dispatched, Reason.AppWrapperRunnable, d.message, now)
        t.status.state = "Running"
        t.status.systempriority = d.effective_priority
        try:
            written = await self._write_status(t)
        except ApiError as e:
            log.warning("dispatch of %s/%s not recorded (%s); back to the queue", *t.key, e)
            written = None
        if not written:
            self.state.release(t.key)
            if written is None and t.queued is not None:
                t.phase = "queued"
                self.queue.put(t.queued)
            else:
                self._forget(t.key)
            return
        self.observer.dispatched(now - t.first_seen)
        await self._create_items(t, now)

    async def _create_items(self, t: Tracked, now: float) -> bool:
        """Create every wrapped object not there yet; adopt our own. On failure, remove
        what was created and fail the AppWrapper: never half a job."""
        assert t.aw is not None
        # Cleared once every item exists: an error half way is retried next cycle.
        t.needs_items = True
        created = 0
        for obj in prepared_items(t.aw):
            where = f"{obj['kind']} {obj['metadata']['name']!r}"
            resource = await self.kube.resource(obj["apiVersion"], obj["kind"])
            if resource is None:
                self.kube.forget(obj["apiVersion"])
                resource = await self.kube.resource(obj["apiVersion"], obj["kind"])
            if resource is None:
                return await self._creation_failed(
                    t, now, f"{where}: kind {obj['kind']} ({obj['apiVersion']}) is not served "
                    "by this cluster; install its CRD or operator, then apply the AppWrapper "
                    "again")
            try:
                await self.kube.request("POST", resource.path(t.key[0]), obj)
                created += 1
            except ApiError as e:
                if e.status != 409:
                    return await self._creation_failed(t, now, f"{where}: {e.message}")
                existing = await self._get(resource, t.key[0], obj["metadata"]["name"])
                if existing is None:
                    return await self._creation_failed(t, now, f"{where}: {e.message}")
                if not owned_by(existing, t.uid):
                    return await self._creation_failed(
                        t, now, f"{where} already exists and does not belong to this "
                        "AppWrapper; rename the item or delete that object")
                if (existing.get("metadata") or {}).get("deletionTimestamp"):
                    # A copy from a requeue is still being deleted: try again later.
                    t.check_at = now + 1.0
                    return True
        t.needs_items = False
        if created:
            log.info("%s/%s: created %d object(s)", *t.key, created)
        return True

    async def _get(self, resource: Resource, namespace: str, name: str
                   ) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self.kube.request("GET", resource.path(namespace, name))
            return obj
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def _creation_failed(self, t: Tracked, now: float, message: str) -> bool:
        t.needs_items = False
        await self._teardown(t)
        self.state.release(t.key)
        t.phase = "done"
        t.check_at = None
        t.status.state = "Failed"
        self._condition(t, ConditionType.Failed, Reason.ItemCreationFailure, message, now)
        self.observer.failed(Reason.ItemCreationFailure)
        await self._write_or_forget(t)
        return False

    async def _teardown(self, t: Tracked) -> None:
        """Delete every wrapped object this AppWrapper owns; pods follow through the
        garbage collector. Asked once: a pod stuck terminating never makes this loop."""
        assert t.aw is not None
        for obj in prepared_items(t.aw):
            resource = await self.kube.resource(obj["apiVersion"], obj["kind"])
            if resource is None:
                continue
            path = resource.path(t.key[0], obj["metadata"]["name"])
            try:
                existing = await self.kube.request("GET", path)
                if not owned_by(existing, t.uid):
                    continue
                await self.kube.request(
                    "DELETE", path, {"propagationPolicy": "Background",
                                     "preconditions": {"uid": existing["metadata"]["uid"]}})
            except ApiError as e:
                if e.status == 403:
                    # Without delete rights a leftover must not stop the status that
                    # tells the user what went wrong; the log says what is left behind.
                    log.warning("cannot delete %s %s for %s/%s: %s",
                                obj["kind"], obj["metadata"]["name"], *t.key, e)
                    continue
                if e.status not in (404, 409):
                    raise


def _first_seen(recorded: datetime | None, created: datetime | None, now: float) -> float:
    """The queue's arrival time. creationTimestamp has whole seconds only, so wrappers
    created within one second would tie (and be ordered by uid); within its creation
    second, the moment this dispatcher first saw it keeps the order they arrived in."""
    if recorded is not None:
        return recorded.timestamp()
    if created is None:
        return now
    second = created.timestamp()
    return min(max(now, second), second + 0.999_999)


async def _gather(jobs: Any) -> None:
    results = await asyncio.gather(*jobs, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
            log.error("dispatcher step failed: %r", r, exc_info=r)
