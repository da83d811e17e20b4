"""`dispatcher run --manager`: one queue in a manager cluster, gangs sent to worker clusters.

Each pass: look at every worker registered (worker_clusters.py, workers.py); requeue the
wrappers of a worker unreachable for longer than the grace; keep each sent wrapper's copy
(make it if missing, mirror its status back); delete every copy the manager no longer sends
there (its wrapper deleted, requeued or sent elsewhere); then send the queued wrappers, in
queue order, to the worker where each gang fits whole now (dispatcher.fleet: per node, with
the topology levels of the manager's configuration, within the worker's quota:
worker_quota.py), or tell them why none can. The queue holds exactly what the controller's
queue gate lets into its own (intake/queue_gate.py): a held, suspended or cancelled wrapper,
or another controller's, is never sent (its copy would only wait, keeping its room).

No wrapper runs in two clusters because the manager's wrapper names its worker (in its
status, status.workerCluster: what the manager recorded, where tenants cannot write; never a
label, which they can where no webhook guards it) before the copy is made, by a write fenced
on its resourceVersion; a copy is kept only in the worker its wrapper names. A manager killed
between the two writes finds the record when it starts again and makes the copy then; one
killed after both adopts the copy. A wrapper sent by a manager of an earlier version, which
named the worker in the label workload.codeflare.dev/cluster only, is taken for sent there
only where that worker holds its copy as the manager made it (fleet.copies.adoptable).
A worker cut off from the manager stops its copies before the grace runs out: the manager
renews a heartbeat there each pass, and between passes while one runs long (heartbeats.py),
and counts the grace from the last renewal the worker acknowledged.

Nothing a worker holds ends a pass, let alone the manager: an error reading or deciding
about one worker (whatever it is) costs that worker, which is sent nothing in that pass and
whose WorkerCluster says what failed (worker_clusters.py); the pass, and the heartbeat,
go on for the others. A process that exited would leave every worker's fence to stop
every copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from dispatcher.admission import FINISHED_STATES
from dispatcher.api.labels import CLUSTER_LABEL
from dispatcher.controller.intake.queue_gate import kept_out_of_queue
from dispatcher.controller.kube.client import ApiError, Kube
from dispatcher.controller.record.status import APPWRAPPERS
from dispatcher.fit import Capacity
from dispatcher.fit.gang import Placer
from dispatcher.fit.rules import NO_TOPOLOGY, Fit, fit_rules
from dispatcher.fit.topology import Topology
from dispatcher.fleet import (
    Chosen,
    NoneFits,
    Worker,
    dispatch,
    unbound,
)
from dispatcher.fleet import copies as rules
from dispatcher.queue.queue import QueuedWrapper
from dispatcher.resources import GPU

from .copying import Copying
from .entries import Entries
from .heartbeats import Heartbeats
from .manager_metrics import ManagerMetrics, WorkerFigures
from .own_wrappers import OwnWrappers
from .worker_clusters import WorkerClusters
from .worker_quota import worker_quota
from .workers import Connect, WorkerLink, connect

log = logging.getLogger("dispatcher.manager")

READY = "dispatcher ready: manager of worker clusters"
#: Writes about different wrappers in flight at once (the client paces them).
PARALLEL = 16
#: Waiting wrappers' messages written in one pass, at most (the rest in the next passes).
WAITING_WRITES_PER_PASS = 50
T = TypeVar("T")
#: The step of a pass that reads a worker's room (what its fault says failed).
ROOM = "counting its free room and quota from its nodes, pods and QuotaSubtrees"


@dataclass(frozen=True)
class ManagerSettings:
    kubeconfig: str | None = None
    #: Seconds a worker may stay unreachable before its wrappers are requeued.
    grace: float = 60.0
    interval: float = 1.0
    metrics_port: int = 0  # 0: no /metrics or /healthz
    metrics_host: str = "0.0.0.0"
    #: How gangs are placed in a worker: as its dispatcher does (`--fit`, and the
    #: configuration's topology levels).
    fit: Fit = "per-node"
    topology: Topology = NO_TOPOLOGY
    #: Seconds a copy may wait in its worker, never started, before it is taken back and
    #: tried in another worker first (`--worker-start-seconds`; 0: never).
    start_within: float = rules.START_WITHIN
    #: `--leave-kueue-labelled`: wrappers labelled with a Kueue queue name are Kueue's, in
    #: the manager's queue as in the controller's.
    leave_kueue_labelled: bool = False
    #: Two replicas or more: only the holder of this Lease (in the manager cluster) sends.
    leader_election: bool = False
    lease_namespace: str = "dispatcher-system"
    lease_name: str = "dispatcher-manager-leader"


class Manager:
    def __init__(self, kube: Kube, settings: ManagerSettings, directory: Path,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, link: Connect = connect,
                 metrics: ManagerMetrics | None = None) -> None:
        self.kube = kube
        self.metrics = metrics if metrics is not None else ManagerMetrics()
        self.settings = settings
        self.clock = clock
        self.wall = wall
        self.clusters = WorkerClusters(kube, directory, clock, link)
        self.passes = 0  # numbered in the log: what a returning worker's pass did
        self.copying = Copying(kube)
        self.entries = Entries()
        self.own = OwnWrappers(kube)
        self.heartbeats = Heartbeats(settings.grace, clock, wall)
        #: Per worker: its room as the last pass saw it (read by the Clusters view).
        self.last_workers: dict[str, Worker] = {}
        #: Per sent wrapper (uid) the last pass found nothing to do for: what it saw then,
        #: and until when that holds (a copy that waits must have started by then).
        self.settled: dict[str, tuple[tuple[str | None, str | None, int], float]] = {}
        #: Per wrapper (uid) whose copy did not start in a worker: that worker, and until
        #: when the others are tried first.
        self.avoid: dict[str, tuple[str, float]] = {}

    async def run(self, stop: asyncio.Event) -> int:
        log.info("%s (grace %.0fs; workers stop the copies of a manager unheard for %ds)",
                 READY, self.settings.grace, self.heartbeats.seconds)
        beats = asyncio.create_task(self.heartbeats.keep(
            lambda: list(self.clusters.links.values()), self.settings.interval, stop))
        try:
            while not stop.is_set():
                started = self.clock()
                try:
                    await self.cycle()
                except ApiError as e:
                    log.warning("manager pass cut short: %s", e)
                except Exception:
                    # No worker's (those cost their worker only): the manager's own. Said
                    # with its traceback, and the next pass tries again.
                    log.exception("manager pass %d failed", self.passes)
                self.metrics.passed(self.clock() - started)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.settings.interval)
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
            await self.close()
        return 0

    async def close(self) -> None:
        """Its watches end (the manager stops, or another process takes over)."""
        await self.own.close()
        await self.clusters.close()

    async def cycle(self) -> None:
        self.passes += 1
        self.clusters.begin_pass()
        await self.clusters.sync()
        links = self.clusters.links
        now = self.clock()
        await self._each_worker("watching it", lambda link: link.refresh(now), links.values())
        await self._each_worker("renewing its heartbeat", self.heartbeats.renew,
                                [link for link in links.values() if link.reachable])
        await self.clusters.answered(now, self.heartbeats.renewed_at, self.passes)
        wrappers = await self.own.current()
        queued, sent, held = await self._split(wrappers, now)
        self.entries.keep_only(obj["metadata"]["uid"] for obj in wrappers)
        wall = self.wall()
        self.avoid = {uid: (worker, until) for uid, (worker, until) in self.avoid.items()
                      if until > wall and uid in self.own.objects}
        await self._keep_copies(sent)
        self.copying.keep_only(sent)
        self.settled = {uid: seen for uid, seen in self.settled.items() if uid in sent}
        sent_to = {uid: _target(obj) for uid, obj in sent.items()}
        for link in list(links.values()):
            await self._guarded(link.name, "deleting the copies no longer sent there",
                                self.copying.delete_strays(link, sent_to, self.passes), None)
        workers = self._workers(sent)
        self.last_workers = {w.name: w for w in workers}
        self.metrics.observe({w.name: WorkerFigures(
            w.sent, w.reachable, w.capacity.free_total.get(GPU, 0)) for w in workers})
        await self._dispatch(queued, workers, held)
        self.clusters.end_pass()

    async def _split(self, wrappers: list[dict[str, Any]], now: float
                     ) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]],
                                list[tuple[dict[str, Any], str]]]:
        """The queued wrappers; the sent ones by uid (those of a lost worker taken back);
        the held ones, with what to tell them."""
        links = self.clusters.links
        queued: list[dict[str, Any]] = []
        sent: dict[str, dict[str, Any]] = {}  # manager uid -> wrapper
        held: list[tuple[dict[str, Any], str]] = []
        for obj in wrappers:
            meta = obj["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            target = rules.target(obj) or await self._adopted(obj)
            if target is None:
                if (obj.get("status") or {}).get("state") not in FINISHED_STATES:
                    await self._gate(obj, queued, held)
            elif rules.lost(target, links, self.clusters.down_since, now, self.settings.grace):
                why = rules.lost_message(target, links, self.settings.grace)
                await self._requeue(obj, rules.requeued(obj.get("status") or {}, why))
            else:
                sent[meta["uid"]] = obj
        return queued, sent, held

    async def _adopted(self, obj: dict[str, Any]) -> str | None:
        """The worker a manager of an earlier version sent `obj` to (its label only), now
        recorded in its status; None: not sent (whatever its label says)."""
        labelled = ((obj["metadata"].get("labels") or {}).get(CLUSTER_LABEL))
        if not labelled:
            return None
        copies = {name: link.look.copies for name, link in self.clusters.links.items()
                  if link.reachable and link.look is not None}
        worker = rules.adoptable(obj, copies, labelled)
        if worker is None or not await self._fenced_target(obj, worker):
            return None
        log.info("%s sent to worker cluster %s by an earlier manager: adopted", _name(obj),
                 worker)
        return worker

    async def _gate(self, obj: dict[str, Any], queued: list[dict[str, Any]],
                    held: list[tuple[dict[str, Any], str]]) -> None:
        """Into the queue (`queued`), or kept out of it by the controller's own queue gate:
        held (`held`, told why), cancelled (failed), another controller's (left alone).
        Sent, it would only wait in its worker, keeping that room from everyone."""
        out = kept_out_of_queue(obj, self.settings.leave_kueue_labelled)
        if out is None:
            queued.append(obj)
        elif out.why == "held":
            held.append((obj, out.message))
        elif out.why == "cancelled":
            await self._write_status(obj, {"state": "Failed", "message": out.message})

    async def _each_worker(self, stage: str, step: Callable[[WorkerLink], Awaitable[None]],
                           links: Iterable[WorkerLink]) -> None:
        """`step` for each worker at once; one that fails is that worker's fault."""
        chosen = list(links)
        results = await asyncio.gather(*(step(link) for link in chosen),
                                       return_exceptions=True)
        for link, result in zip(chosen, results, strict=True):
            if isinstance(result, Exception):
                self.clusters.fault(link.name, stage, result)
            elif isinstance(result, BaseException):
                raise result

    async def _guarded(self, worker: str, stage: str, step: Awaitable[T], instead: T) -> T:
        """`step`'s result; `instead` when it failed, as the worker's fault. An ApiError of
        the manager's own cluster still cuts the pass short (tried again in the next)."""
        try:
            return await step
        except ApiError:
            raise
        except Exception as e:
            self.clusters.fault(worker, stage, e)
            return instead

    # ------------------------------------------------------------------ sent wrappers
    async def _requeue(self, obj: dict[str, Any], status: dict[str, Any]) -> bool:
        """Back to the manager's queue, with `status`: its target cleared (fenced), so it
        may go to another worker; the copy is then a stray, deleted where its worker
        answers."""
        log.warning("%s %s", _name(obj), status.get("message"))
        return await self._fenced_target(obj, None, status)

    async def _keep_copies(self, sent: dict[str, dict[str, Any]]) -> None:
        """Each sent wrapper's copy kept; those taken back to the queue leave `sent`."""
        busy = [uid for uid, obj in sent.items() if self._looked(obj) is not None]
        kept = await _bounded([
            self._guarded(_target(sent[uid]), f"keeping its copy of {_name(sent[uid])}",
                          self._keep_copy(sent[uid]), True) for uid in busy])
        for uid, keep in zip(busy, kept, strict=True):
            if not keep:
                del sent[uid]

    def _looked(self, obj: dict[str, Any]
                ) -> tuple[WorkerLink, dict[str, Any] | None, rules.Step] | None:
        """`_copy_step`, an error in it its worker's fault (nothing done this pass)."""
        try:
            return self._copy_step(obj)
        except Exception as e:
            self.clusters.fault(_target(obj), f"looking at its copy of {_name(obj)}", e)
            return None

    def _copy_step(self, obj: dict[str, Any]
                   ) -> tuple[WorkerLink, dict[str, Any] | None, rules.Step] | None:
        """The sent wrapper's link, copy and what to do with it; None when there is nothing
        to do (its worker not answering, or the copy as the wrapper already says, with no
        Event left to mirror): most sent wrappers in most passes."""
        meta = obj["metadata"]
        link = self.clusters.links[_target(obj)]
        if not link.reachable or link.look is None:
            return None
        copy = link.look.copies.get((meta["namespace"], meta["name"]))
        # What the answer depends on: the wrapper, its copy, the Events about the copy.
        # Thousands of finished wrappers stay sent: unchanged, they cost a lookup a pass.
        seen = (meta.get("resourceVersion"), None, 0) if copy is None else (
            meta.get("resourceVersion"), copy["metadata"].get("resourceVersion"),
            len(link.look.events_by_object.get(copy["metadata"].get("uid"), {})))
        wall = self.wall()
        known = self.settled.get(meta["uid"])
        if known is not None and known[0] == seen and wall <= known[1]:
            return None
        limit = ((obj.get("spec") or {}).get("schedulingSpec") or {}).get("requeuing") or {}
        step = rules.step(link.name, meta["uid"], obj.get("status") or {}, copy,
                          int(limit.get("maxNumRequeuings") or 0), wall,
                          self.settings.start_within)
        if step is None and (copy is None or not self.copying.pending(link, obj, copy)):
            due = rules.start_due(copy, self.settings.start_within)
            self.settled[meta["uid"]] = (seen, math.inf if due is None else due)
            return None
        self.settled.pop(meta["uid"], None)
        return link, copy, step

    async def _keep_copy(self, obj: dict[str, Any]) -> bool:
        """Keep the sent wrapper's copy in its worker; False when the wrapper was taken back
        to the queue (its copy requeued or failed there)."""
        todo = self._copy_step(obj)
        if todo is None:
            return True
        link, copy, step = todo
        match step:
            case rules.Make():
                if await self._still_sent(link, obj) and not await self._make(link, obj):
                    return False
            case rules.Mirror(status) | rules.GiveUp(status):
                await self._write_status(obj, status)
            case rules.TakeBack(status, elsewhere):
                if await self._requeue(obj, status):
                    if elsewhere:  # the others first, for as long again
                        until = self.wall() + self.settings.start_within
                        self.avoid[obj["metadata"]["uid"]] = (link.name, until)
                    return False
        if copy is not None and not (copy["metadata"].get("deletionTimestamp")):
            await self.copying.mirror_events(link, obj, copy)
        return True

    # ------------------------------------------------------------------ dispatching
    async def _dispatch(self, queued: list[dict[str, Any]], workers: list[Worker],
                        held: list[tuple[dict[str, Any], str]]) -> None:
        if not queued and not held:
            return
        entries: dict[tuple[str, str], dict[str, Any]] = {}
        queue: list[QueuedWrapper] = []
        selectors: dict[tuple[str, str], dict[str, str]] = {}
        refused: list[tuple[dict[str, Any], str]] = []
        for obj in queued:
            read = self.entries.read(obj, self.wall())
            if isinstance(read, str):
                refused.append((obj, read))
                continue
            entry, selectors[read[0].key] = read
            queue.append(entry)
            entries[entry.key] = obj
        waits = held + refused
        writes = []
        avoid = {entry.key: {self.avoid[entry.uid][0]} for entry in queue
                 if entry.uid in self.avoid}
        for entry, answer in dispatch(queue, workers, self.wall(), selectors,
                                      self.settings.fit, self.settings.topology, avoid):
            obj = entries[entry.key]
            if isinstance(answer, NoneFits):
                waits.append((obj, answer.message))
            else:
                writes.append(self._send(obj, answer))
        # Only the messages that changed are written (most of a long queue's do not), the
        # head of the queue's first, and a pass's share only: thousands posted at once
        # must not hold the pass, and the copies it makes, for minutes.
        changed = [(obj, message) for obj, message in waits
                   if (obj.get("status") or {}).get("message") != message]
        writes += [self._waiting(obj, message)
                   for obj, message in changed[:WAITING_WRITES_PER_PASS]]
        # The room of each was taken in the decision: the writes, each fenced on its own
        # wrapper, need no order between them.
        await _bounded(writes)

    def _workers(self, sent: dict[str, dict[str, Any]]) -> list[Worker]:
        """Each worker's free room now, less what the wrappers sent there still need; a
        worker whose room cannot be worked out (or that failed earlier in the pass) takes
        nothing."""
        out = []
        running: dict[str, list[dict[str, Any]]] = {}
        for obj in sent.values():
            if (obj.get("status") or {}).get("state") not in FINISHED_STATES:
                running.setdefault(_target(obj), []).append(obj)
        for name, link in sorted(self.clusters.links.items()):
            there = running.get(name, [])
            try:
                worker = self._worker(link, there)
            except Exception as e:
                self.clusters.fault(name, ROOM, e)
                worker = Worker(name, Capacity([], {}), link.labels, None, link.reachable,
                                len(there))
            problem = self.clusters.faults_now.get(name)
            out.append(worker if problem is None else replace(worker, problem=problem))
        return out

    def _worker(self, link: WorkerLink, there: list[dict[str, Any]]) -> Worker:
        """The worker as the choice sees it: its free room, less what `there` (the
        wrappers sent to it, not finished) still needs, and its quota."""
        if link.look is None:
            return Worker(link.name, Capacity([], {}), link.labels, reachable=False,
                          sent=len(there))
        cap = Capacity.of(link.look.state)
        placer, _ = fit_rules(self.settings.fit, self.settings.topology)
        for obj in there:
            read = self.entries.read(obj, self.wall())
            if not isinstance(read, str):
                _hold(cap, read[0], obj, link, placer)
        quota = worker_quota(link.look.subtrees, link.look.wrappers, link.look.state,
                             self.wall(), there)
        return Worker(link.name, cap, link.labels, quota, link.reachable, len(there))

    async def _send(self, obj: dict[str, Any], chosen: Chosen) -> None:
        meta = obj["metadata"]
        # The target first, fenced: a manager that dies now makes the copy when it starts
        # again; two managers (or a stale view) cannot both send it.
        if not await self._fenced_target(obj, chosen.cluster):
            return
        log.info("%s/%s goes to worker cluster %s", meta["namespace"], meta["name"],
                 chosen.cluster)
        await self._make(self.clusters.links[chosen.cluster], obj)

    async def _still_sent(self, link: WorkerLink, obj: dict[str, Any]) -> bool:
        """Whether the API server's wrapper, not the watched view of it (which may lag a
        write of this manager's), still names this worker (its record): a copy is made only
        then."""
        meta = obj["metadata"]
        try:
            fresh = await self.kube.request("GET", APPWRAPPERS.path(meta["namespace"],
                                                                    meta["name"]))
        except ApiError:
            return False  # gone, or no answer: the next pass sees
        fmeta = fresh.get("metadata") or {}
        return fmeta.get("uid") == meta["uid"] and rules.target(fresh) == link.name

    async def _make(self, link: WorkerLink, obj: dict[str, Any]) -> bool:
        """Make the copy; False when its worker refused it: the wrapper then fails with
        the worker's reason, and is sent nowhere (its target cleared, fenced)."""
        reason = await self.copying.make(link, obj)
        if reason is None:
            return True
        await self._fenced_target(obj, None, rules.refused(link.name, reason))
        return False

    async def _waiting(self, obj: dict[str, Any], message: str) -> None:
        if (obj.get("status") or {}).get("message") != message:
            await self._write_status(obj, {"message": message})

    async def _fenced_target(self, obj: dict[str, Any], cluster: str | None,
                             status: dict[str, Any] | None = None) -> bool:
        """Record in the wrapper's status the worker it is sent to (None: none), with
        `status` if given, in one write fenced on the resourceVersion the pass saw; False
        when the wrapper changed or went since (the next pass sees it)."""
        meta = obj["metadata"]
        written = {**(status or {}), rules.SENT_TO: cluster}
        try:
            updated = await self.kube.request(
                "PATCH", APPWRAPPERS.path(meta["namespace"], meta["name"], "status"),
                {"metadata": {"resourceVersion": meta["resourceVersion"]},
                 "status": written}, content_type="application/merge-patch+json")
        except ApiError as e:
            if e.status in (404, 409):
                return False
            raise
        # The view says what was written until the watch brings it.
        self.own.written(obj, written, updated)
        return True

    async def _write_status(self, obj: dict[str, Any], status: dict[str, Any]) -> None:
        meta = obj["metadata"]
        with contextlib.suppress(ApiError):
            updated = await self.kube.request(
                "PATCH", APPWRAPPERS.path(meta["namespace"], meta["name"], "status"),
                {"status": status}, content_type="application/merge-patch+json")
            self.own.written(obj, status, updated)


def _target(obj: dict[str, Any]) -> str:
    """The worker a wrapper known to be sent was sent to."""
    target = rules.target(obj)
    assert target is not None
    return target


def _name(obj: dict[str, Any]) -> str:
    return f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"


def _hold(cap: Capacity, entry: QueuedWrapper, obj: dict[str, Any], link: WorkerLink,
          placer: Placer) -> None:
    """Take from `cap` the room the wrapper's pods not bound yet in the worker will need."""
    assert link.look is not None
    meta = obj["metadata"]
    rest = unbound(entry.gang, link.look.bound(meta["namespace"], meta["name"]))
    if rest:
        placer(rest, cap)  # taken if it fits; if not, the worker is full for it anyway


async def _bounded(steps: Sequence[Awaitable[T]]) -> list[T]:
    """Run `steps` together, at most PARALLEL at a time; their results in order."""
    gate = asyncio.Semaphore(PARALLEL)

    async def one(step: Awaitable[T]) -> T:
        async with gate:
            return await step

    return list(await asyncio.gather(*(one(s) for s in steps)))
