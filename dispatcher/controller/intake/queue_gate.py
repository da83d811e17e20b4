"""The gate into the queue: a queued wrapper goes in, or stays out of it — held (a user's
hold, `spec.suspend`, or its manager lost), failed (a spec it cannot run, a cancellation)
or being deleted. No API calls: what changed is written with the next status.

Holds and cancellations (record/holds.py) are read anew from each event of the wrapper: a
held wrapper stays out of the queue; a cancelled queued one fails here, a cancelled
dispatched one in the admission loop. A manager's copy whose manager is lost is held
(dispatcher.fleet.fence) until its heartbeat is heard again. A wrapper another controller
manages (spec.managedBy, or Kueue's label where the installation leaves those to Kueue)
is not taken in at all.

The rule is one (`kept_out`, `left_to_another`), and the manager's queue in a manager
cluster goes by it too (`kept_out_of_queue`): a wrapper this gate would keep out of the
controller's queue is never sent to a worker, where its copy would only wait.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dispatcher.api.conditions import ConditionType, Reason
from dispatcher.api.management import managed_elsewhere
from dispatcher.api.models import AppWrapperStatus
from dispatcher.controller.record.holds import asked, cancelled_message, held_message
from dispatcher.controller.record.memory import Memory
from dispatcher.controller.record.positions import clear_position
from dispatcher.controller.record.status import Change, copy_status
from dispatcher.controller.record.tracked import Tracked
from dispatcher.fleet.fence import MANAGER_LOST, fenced, is_copy


@dataclass(frozen=True)
class KeptOut:
    """Why a queued wrapper stays out of the queue, and in what words."""

    why: Literal["left to another controller", "deleting", "cancelled", "held"]
    message: str = ""
    reason: str = ""  # the reason of the condition that says so


def kept_out(deleting: bool, cancelled_by: str | None, held_by: str | None, name: str
             ) -> KeptOut | None:
    """The gate: a wrapper being deleted, cancelled or held stays out of the queue (a
    cancelled one fails); None: it goes in."""
    if deleting:
        return KeptOut("deleting")
    if cancelled_by is not None:
        return KeptOut("cancelled", cancelled_message(cancelled_by, created=False),
                       Reason.Cancelled)
    if held_by is not None:
        return KeptOut("held", held_message(held_by, name),
                       MANAGER_LOST if held_by == MANAGER_LOST else Reason.Held)
    return None


def taken_in(obj: Mapping[str, Any]) -> bool:
    """Whether a dispatcher took this wrapper in: it wrote the MCAD status (its first
    decision writes the whole chain; another controller's v1beta2 status converts to a
    state without conditions)."""
    status = obj.get("status")
    return isinstance(status, Mapping) and bool(
        status.get("conditions") or status.get("controllerfirsttimestamp"))


def left_to_another(obj: Mapping[str, Any], leave_kueue_labelled: bool) -> str | None:
    """Why another controller manages the wrapper (api/management.py), so that it is never
    taken in; None when it is the dispatcher's. spec.managedBy is immutable (codeflare's):
    a wrapper a dispatcher took in already stays its own, whatever its annotation says now."""
    meta = obj.get("metadata") or {}
    elsewhere = managed_elsewhere(meta.get("annotations") or {}, meta.get("labels") or {},
                                  leave_kueue_labelled)
    return None if elsewhere is None or taken_in(obj) else elsewhere


def kept_out_of_queue(obj: Mapping[str, Any], leave_kueue_labelled: bool = False
                      ) -> KeptOut | None:
    """What the gate makes of the AppWrapper `obj` as it is written (its labels,
    annotations, deletion): whether it stays out of the queue, and why. Not its spec's
    validity (the queue entry says that) nor a fence on a manager's copy (a worker's)."""
    elsewhere = left_to_another(obj, leave_kueue_labelled)
    if elsewhere is not None:
        return KeptOut("left to another controller", elsewhere)
    meta = obj.get("metadata") or {}
    held_by, cancelled_by = asked(obj)
    return kept_out(bool(meta.get("deletionTimestamp")), cancelled_by, held_by,
                    str(meta.get("name") or ""))


class QueueGate:
    def __init__(self, memory: Memory, clock: Callable[[], float],
                 on_failed: Callable[[str], None]) -> None:
        self.memory = memory
        self.clock = clock
        self.on_failed = on_failed

    def enqueue(self, t: Tracked, change: Change) -> None:
        """A queued wrapper into the queue, unless it is held, cancelled or being deleted."""
        assert t.queued is not None
        out = kept_out(t.deleting or (t.aw is not None and
                                      t.aw.metadata.deletionTimestamp is not None),
                       t.cancelled_by, t.held_by, t.key[1])
        if out is None:
            self.memory.queue.put(t.queued)
        elif out.why == "deleting":
            self.deleting(t)
        elif out.why == "cancelled":
            self.fail(t, change, out.message, out.reason)
        else:
            self.memory.queue.remove(t.key)
            self.memory.sharing.release(t.key)
            clear_position(t.status)
            change.condition(ConditionType.Queueing, out.reason, out.message)
            self.memory.unwritten.add(t.key)

    def fail(self, t: Tracked, change: Change, message: str,
             reason: str = Reason.InvalidSpec) -> None:
        """Failed at intake, never queued again as it is: its spec cannot run, or it was
        cancelled while it waited."""
        t.phase = "done"
        if t.queued is not None and self.memory.queue.get(t.key) is t.queued:
            self.memory.queue.remove(t.key)
        t.queued = None
        self.memory.elastic.discard(t.key)
        self.memory.sharing.release(t.key)  # room held for it while it preempted is free again
        t.status.state = "Failed"
        clear_position(t.status)
        change.condition(ConditionType.Failed, reason, message)
        self.memory.unwritten.add(t.key)
        self.on_failed(reason)

    def deleting(self, t: Tracked) -> None:
        """Being deleted: never admitted, whatever keeps it (a finalizer) and whatever it
        says now. Out of the queue, the room held for it freed; no status is written."""
        t.deleting = True
        if t.phase != "queued":
            return  # dispatched: its objects go with it (loop/stepping.py)
        if t.queued is not None and self.memory.queue.get(t.key) is t.queued:
            self.memory.queue.remove(t.key)
        self.memory.sharing.release(t.key)
        self.memory.elastic.discard(t.key)

    def read_asks(self, t: Tracked, obj: Mapping[str, Any]) -> bool:
        """A hold, release or cancellation in `obj`'s annotations: whether it is news."""
        t.manager_copy |= is_copy((obj.get("metadata") or {}).get("labels") or {})
        held_by, cancelled_by = self.asks_of(obj, t.status, t.manager_copy)
        if (held_by, cancelled_by) == (t.held_by, t.cancelled_by):
            return False
        t.held_by, t.cancelled_by = held_by, cancelled_by
        if t.phase == "queued" and t.queued is not None:
            # Released: back in the queue in its place; the next cycle says why it waits.
            self.enqueue(t, Change(t, self.clock(), copy_status(t.status)))
        # Dispatched: a cancellation is the admission loop's to carry out; a hold waits
        # for a requeue, if any.
        return True

    def asks_of(self, obj: Mapping[str, Any], status: AppWrapperStatus, copy: bool
                ) -> tuple[str | None, str | None]:
        """Who holds and who cancelled it; a manager's copy (`copy`) whose manager is lost,
        or one that was stopped for that, is held by ManagerLost (dispatcher.fleet.fence)."""
        held_by, cancelled_by = asked(obj)
        if fenced(copy, (c.reason for c in status.conditions), self.memory.manager_stale):
            held_by = MANAGER_LOST
        return held_by, cancelled_by

    def rehold(self, t: Tracked) -> bool:
        """The manager's heartbeat went stale or was heard again: hold (or release) its
        copy as its labels and annotations say now; whether that is news."""
        if t.aw is None or t.phase == "done":
            return False
        meta = t.aw.metadata
        lost = fenced(t.manager_copy, (c.reason for c in t.status.conditions),
                      self.memory.manager_stale)
        if lost == (t.held_by == MANAGER_LOST):
            return False  # a user's hold or cancel stays as their last event set it
        self.memory.attention.touch(t.key)
        return self.read_asks(t, {"metadata": {"labels": dict(meta.labels),
                                               "annotations": dict(meta.annotations)}})
