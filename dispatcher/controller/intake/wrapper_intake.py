"""AppWrappers into memory: each parsed, reviewed and placed where its status says.

- A wrapper is queued, dispatched (its items may still need creating, its unbound pods
  a reservation), running, or done. A restarted dispatcher learns all of it here from
  the listing, since all durable state is in the API.
- Spec edits: a queued wrapper is re-read; a Failed one is queued again (its message
  told the user to apply it again); a dispatched one whose items changed is torn down and
  requeued with the new spec — an edit never swaps what was admitted for something else.
- Whether a queued wrapper goes into the queue, or is held, failed or being deleted, is
  the gate's (queue_gate.py), which reads its holds and cancellations.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from dispatcher.api.conditions import ConditionType, Reason, latest
from dispatcher.api.labels import MANAGER_UID_LABEL
from dispatcher.api.models import AppWrapper, InvalidSpec, parse_appwrapper
from dispatcher.controller.pods.leftovers import watch as watch_leftovers
from dispatcher.controller.record.holds import asked
from dispatcher.controller.record.memory import Memory
from dispatcher.controller.record.status import Change, copy_status, is_newer, status_body
from dispatcher.controller.record.tracked import (
    Key,
    StatusWrites,
    Tracked,
    items_digest,
    key_of,
    now_dt,
)
from dispatcher.fleet.fence import is_copy
from dispatcher.kinds.scope import GroupKind
from dispatcher.lifecycle import (
    RESETTING,
    RETRY_LIMIT_REACHED,
    Timing,
)
from dispatcher.resources import GPU
from dispatcher.review import review

from .following import first_seen, follow, set_ended_timers, status_of
from .queue_gate import QueueGate, left_to_another

log = logging.getLogger("dispatcher")

# Failed for these reasons means the dispatcher tore (or was tearing) the items down.
TEARDOWN_REASONS = frozenset({Reason.ItemCreationFailure, Reason.DispatchDeadlineExceeded,
                              "RequeueLimitReached", RETRY_LIMIT_REACHED,
                              Reason.Cancelled})


class WrapperIntake:
    def __init__(self, memory: Memory, clock: Callable[[], float], gate: QueueGate,
                 allowed_kinds: Collection[GroupKind], leave_kueue_labelled: bool,
                 timing: Timing, requeues_due: set[Key], edited: set[Key]) -> None:
        """`gate`: whether a queued wrapper goes into the queue (queue_gate.py).
        `requeues_due`, `edited`: dispatched wrappers to tear down and queue again (a
        requeue that a restart cut short; items edited after admission), which the
        admission loop carries out."""
        self.memory = memory
        self.timing = timing  # a v1beta2 wrapper's timers are rebuilt after a restart
        self.clock = clock
        self.gate = gate
        self.allowed_kinds = allowed_kinds
        # Wrappers labelled with a Kueue queue name are Kueue's (management.py).
        self.leave_kueue_labelled = leave_kueue_labelled
        self.requeues_due = requeues_due
        self.edited = edited
        # What the dispatcher accepts but the user should look at: (wrapper, text),
        # posted as Warning Events by the loop, once per new spec.
        self.warnings: list[tuple[Tracked, str]] = []

    def on_appwrapper(self, event: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = key_of(obj)
        uid = str(meta.get("uid", ""))
        generation = int(meta.get("generation") or 0)
        t = self.memory.tracked.get(key)
        self.memory.attention.touch(key)
        if event == "DELETED":
            if t is not None and t.uid == uid:
                # The garbage collector deletes its objects: their pods are watched as
                # those of objects the dispatcher deleted (pods/leftovers.py).
                watch_leftovers(self.memory, t, self.timing, self.clock())
                self.memory.forget(t)
                self.memory.wake.set()
            return
        if t is not None and t.uid == uid:
            self._observed_status(t, obj)
            if meta.get("deletionTimestamp"):
                self.gate.deleting(t)
            edited = generation != t.generation
            if edited:
                self._edited(t, obj, generation)
            now = self.memory.tracked.get(key)  # an edit may have taken it in anew
            if (now is not None and self.gate.read_asks(now, obj)) or edited:
                self.memory.wake.set()
            return  # else our own status write coming back, or a label change
        if t is not None:
            self.memory.forget(t)  # replaced by a new object of the same name
        elsewhere = left_to_another(obj, self.leave_kueue_labelled)  # the gate's rule
        if elsewhere is not None:
            log.debug("%s/%s: left to another controller: %s", *key, elsewhere)
            return
        self._intake(key, obj)
        self.memory.wake.set()

    def _observed_status(self, t: Tracked, obj: Mapping[str, Any]) -> None:
        """The API's status is the truth about what was written: a write we thought had
        failed (a timeout) may have landed. Late echoes of our own writes are skipped."""
        version = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if t.writes.written_version and version and not is_newer(version, t.writes.written_version):
            return
        t.writes.written = status_body(status_of(obj))
        if version:
            t.writes.written_version = version

    def _edited(self, t: Tracked, obj: Mapping[str, Any], generation: int) -> None:
        if t.phase == "queued":
            self.memory.forget(t)
            self._intake(t.key, obj, keep=t)
            return
        if t.phase == "done":
            deleting = bool((obj.get("metadata") or {}).get("deletionTimestamp"))
            # Being deleted bumps the generation of a custom resource: not an edit.
            if t.status.state == "Failed" and asked(obj)[1] is None and not deleting:
                self.memory.forget(t)
                again = self._intake(t.key, obj, keep=t, requeue_failed=True)
                log.info("%s/%s: spec changed after it failed; queued again", *t.key)
                if again is not None:
                    again.generation = generation
            else:
                # Its end holds for the new spec too: said so (observedGeneration), or
                # kubectl wait --for=condition=Completed would wait for ever.
                t.generation = generation
                last = latest(t.status.conditions)
                if last is not None and Change(t, self.clock(), copy_status(t.status)) \
                        .condition(last.type, last.reason, last.message):
                    self.memory.unwritten.add(t.key)
            return
        # Dispatched or running: only an edit of what it creates matters now; whatever
        # requeues it later queues the spec as it is then, as a restart would.
        t.generation = generation
        t.latest = obj
        try:
            aw = parse_appwrapper(obj)
        except InvalidSpec:
            self.edited.add(t.key)
            return
        if t.aw is not None and items_digest(aw) != items_digest(t.aw):
            self.edited.add(t.key)
        else:
            self.edited.discard(t.key)  # back to the items admitted: nothing to redo
            t.aw = aw.model_copy(update={"status": t.aw.status if t.aw else aw.status})
            t.timers.check_at = self.clock()  # judged again now: a deadline or a minimum may be new

    def queue_again(self, t: Tracked) -> None:
        """A requeued wrapper (its objects torn down, Pending written) back in the queue:
        as its spec now is, checked and fitted anew if it was edited since its dispatch."""
        self.edited.discard(t.key)
        if t.latest is None:
            if t.queued is not None:
                self.gate.enqueue(t, Change(t, self.clock(), copy_status(t.status)))
            return
        self.memory.forget(t)
        self._intake(t.key, t.latest, keep=t)

    def _intake(self, key: Key, obj: Mapping[str, Any], keep: Tracked | None = None,
                requeue_failed: bool = False) -> Tracked | None:
        now = self.clock()
        t = self._tracked(key, obj, keep, now)
        status = t.status
        self.memory.tracked[key] = t
        self.memory.elastic.discard(key)
        if status.state in ("Completed", "Failed") and not requeue_failed:
            self._ended(t, obj)
            return t
        change = Change(t, now, status.model_copy(deep=True))
        verdict = review(obj, now, self.allowed_kinds, faults=self.timing.fault_tolerance)
        if verdict.appwrapper is None or verdict.queued is None:
            t.aw = verdict.appwrapper
            self.gate.fail(t, change, verdict.message)
            return t
        aw = verdict.appwrapper
        t.aw = aw
        t.first_seen = keep.first_seen if keep is not None else first_seen(
            status.controllerfirsttimestamp, aw.metadata.creationTimestamp, now)
        queued = dataclasses.replace(verdict.queued, first_seen=t.first_seen)
        if not status.conditions or keep is not None:
            # A new spec: say once what it asks that the dispatcher will not do as
            # written (a restart, finding conditions, does not say it again).
            self.warnings.extend((t, w) for w in verdict.warnings)
        follow(t, aw, queued, self.timing)
        if queued.elastic:
            self.memory.elastic.add(t.key)
        if requeue_failed:
            status.state = "Pending"
            status.numberOfRequeueings = 0
            status.wrappedItems = []
            status.admittedDigest = ""
            status.preempted = []
            change.condition(ConditionType.Queueing, Reason.AwaitingHeadOfLine,
                             "the spec changed after the failure: queued again")
            self.memory.unwritten.add(key)
        if not status.conditions:
            # The whole MCAD chain, written with the first decision in one PATCH.
            change.condition(ConditionType.Init, "", "")
            change.condition(ConditionType.Queueing, Reason.AwaitingHeadOfLine,
                             "waiting for the first admission cycle")
            status.controllerfirsttimestamp = now_dt(t.first_seen)
            status.state = "Pending"
        # What it asks for as its spec now is (an edit changes it).
        status.requestedGPUs = sum(g.pod_set.request.get(GPU, 0) * g.pod_set.count
                                   for g in queued.gang)
        for uid in (i.uid for i in status.wrappedItems if i.uid):
            self.memory.ownership.add_item(uid, key)
        self._resume(t, aw, change, now)
        return t

    def _tracked(self, key: Key, obj: Mapping[str, Any], keep: Tracked | None,
                 now: float) -> Tracked:
        """A new record of the wrapper: its status as the API has it (or as `keep`, the
        record it replaces, knew it)."""
        meta = obj.get("metadata") or {}
        if keep is not None:
            status = keep.status
            written = keep.writes.written
        else:
            status = status_of(obj)
            written = status_body(status)
        t = Tracked(key=key, uid=str(meta.get("uid", "")),
                    generation=int(meta.get("generation") or 0), aw=None,
                    status=status, writes=StatusWrites(written), first_seen=now)
        self._copy_of(t, meta.get("labels") or {}, keep)
        t.held_by, t.cancelled_by = self.gate.asks_of(obj, status, t.manager_copy)
        # Whom it preempted to be admitted, as recorded with its dispatch (loop/runtime.py).
        t.preempted = tuple((ns, name) for ns, _, name in
                            (k.partition("/") for k in status.preempted) if name)
        if keep is not None:
            t.writes.written_version = keep.writes.written_version
            t.writes.last_write_at = keep.writes.last_write_at
        else:
            last = latest(status.conditions)
            stamp = last.lastUpdateMicroTime if last is not None else None
            t.writes.last_write_at = stamp.timestamp() if stamp is not None else 0.0
        return t

    def _ended(self, t: Tracked, obj: Mapping[str, Any]) -> None:
        """Completed or Failed: nothing to do, unless a failure left objects behind."""
        t.phase = "done"
        last = latest(t.status.conditions)
        t.teardown_due = t.status.state == "Failed" and last is not None \
            and last.reason in TEARDOWN_REASONS
        if t.teardown_due:
            try:
                t.aw = parse_appwrapper(obj)
            except InvalidSpec:
                t.teardown_due = False
        set_ended_timers(t, (obj.get("metadata") or {}).get("annotations") or {}, self.timing)

    def _resume(self, t: Tracked, aw: AppWrapper, change: Change, now: float) -> None:
        """Where its conditions say it is: dispatched or running (after a restart), a
        requeue cut short, or queued."""
        status = t.status
        last = latest(status.conditions)
        kind = last.type if last is not None else ""
        if kind in (ConditionType.Dispatched, ConditionType.Running,
                    ConditionType.RunningHoldCompletion):
            since = next((c.lastTransitionMicroTime for c in reversed(status.conditions)
                          if c.type == ConditionType.Dispatched), None)
            t.dispatched_at = since.timestamp() if since is not None else now
            t.phase = "dispatched" if kind == ConditionType.Dispatched else "running"
            t.needs_items = True
            if t.phase == "dispatched":
                self.memory.hold_again(t)
            else:
                t.room.needs_reservation = False
            if last is not None and last.reason == RESETTING:
                # A reset's pause, cut short by a restart: it goes on from when it began.
                stamp = last.lastUpdateMicroTime or last.lastTransitionMicroTime
                t.timers.reset_at = stamp.timestamp() if stamp is not None else now
                t.needs_items = False
            if status.admittedDigest and status.admittedDigest != items_digest(aw):
                self.edited.add(t.key)  # edited while this dispatcher was down
        elif kind == ConditionType.PreemptCandidate:
            # A requeue was cut short by a restart: finish the teardown first.
            t.phase = "dispatched"
            t.teardown_due = True
            self.requeues_due.add(t.key)
        else:
            self.gate.enqueue(t, change)

    def _copy_of(self, t: Tracked, labels: Mapping[str, str], keep: Tracked | None) -> None:
        """Whether `t` is a manager's copy: labelled so now, or when it was first taken
        in, as its status records (written with its next status)."""
        status = t.status
        t.manager_copy = ((keep is not None and keep.manager_copy) or is_copy(labels)
                          or bool(status.managerUid))
        if is_copy(labels) and not status.managerUid:
            status.managerUid = str(labels[MANAGER_UID_LABEL])
            self.memory.unwritten.add(t.key)

    # --- listings ------------------------------------------------------------------------

    def relisted(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """A complete listing of AppWrappers: those not in it any more are gone (a new
        object of the same name included)."""
        listed = list(objs)
        present = {(key_of(o), str((o.get("metadata") or {}).get("uid", ""))) for o in listed}
        for t in [t for t in self.memory.tracked.values() if (t.key, t.uid) not in present]:
            self.memory.forget(t)
        for o in listed:
            self.on_appwrapper("ADDED", o)
