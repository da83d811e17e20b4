"""One AppWrapper as the dispatcher knows it: a cache of the API object plus what the
dispatcher has learned since (its gang's pods, its items' uids, timers).

Memory is never ahead of the API: `phase` moves only after the status write that
records the move succeeded, and every decision names the uid (and spec generation) it
was made for, so an edit or a delete-and-recreate in the meantime voids it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from dispatcher.api.models import AppWrapper, AppWrapperStatus
from dispatcher.kinds.completion import Outcome
from dispatcher.lifecycle import PodCounts
from dispatcher.queue import QueuedWrapper

# (namespace, name) of any namespaced object: an AppWrapper, a pod, a pin's token.
NamespacedName = tuple[str, str]
Key = NamespacedName  # an AppWrapper's
# dispatching: decided and its capacity taken, the Dispatched write under way.
Phase = Literal["queued", "dispatching", "dispatched", "running", "done"]
# Dispatched and not ended: its items exist (or are being made) and it holds capacity.
ACTIVE: tuple[Phase, ...] = ("dispatched", "running")
Bucket = Literal["pending", "running", "succeeded", "failed"]
NO_PODS = PodCounts()


def key_of(obj: Mapping[str, Any]) -> NamespacedName:
    """(namespace, name) of an object as the API sends it."""
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or "default"), str(meta.get("name")))


def now_dt(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


def items_digest(aw: AppWrapper) -> str:
    """What was admitted: the wrapped objects and what they ask for. Recorded at
    dispatch, so a restart can tell that the items were edited after admission."""
    items = [item.model_dump(mode="json", exclude_none=True)
             for item in aw.spec.resources.GenericItems]
    text = json.dumps(items, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class OutcomeReading:
    """What its wrapped objects say of themselves (the outcome their kinds report), and
    when to read them again."""

    outcome: Outcome | None = None
    # Items made that are gone when last read ("Kind 'name'"): deleted by someone else.
    missing: tuple[str, ...] = ()
    stale: bool = True
    read_at: float = 0.0
    pods_done: int = 0  # pods ended when the outcome was last read
    settles: int = 0  # quick reads since every pod ended and no outcome came
    soon: bool = False  # a quick read is due (the loop wakes for it)
    # Ended pods a Job controller has not let go of yet (its tracking finalizer): it counts
    # a pod, removes the finalizer, then writes its status; before, the Job cannot say
    # Complete.
    unsettled: set[str] = field(default_factory=set)

    def again(self) -> None:
        """A new dispatch: the last one's quick re-reads were spent (Completed would wait
        for the refresh)."""
        self.stale = True
        self.missing = ()
        self.pods_done = self.settles = 0
        self.soon = False
        self.unsettled.clear()


@dataclass
class StatusWrites:
    """Its status as written, and the writes owed: what is skipped, paced, cancelled."""

    written: dict[str, Any]  # the status as last read or written, to skip no-op writes
    written_version: str = ""  # resourceVersion our last status write produced
    last_write_at: float = 0.0
    # A change of details or of the message alone waits to be written: when it is due
    # (None: nothing owed), worked out when the change was made: the loop asks for every
    # waiting wrapper at every turn, and working it out means serialising the status.
    minor_due_at: float | None = None
    sending: bool = False  # a status PATCH of it is on the wire
    # Its task is writing why it waits, and that PATCH is not on the wire yet: a decision
    # to dispatch it may cancel the task (the Dispatched write says more).
    waiting_write: bool = False
    wait_reason: str = ""  # why it waits, as last decided (a new reason is written at once)
    decided_to_wait: bool = False  # an admission cycle decided that it waits


@dataclass
class RoomState:
    """The room its gang holds for pods not bound yet, and what went wrong with it."""

    # Rebuilt after a restart: the unbound part of the gang must hold capacity again.
    needs_reservation: bool = False
    # Why a gang not running yet must be requeued at once: a pod of it was let onto a
    # node that went away before it bound (it never will), or its room went with a node
    # and no other has room for it. None: nothing of the kind.
    stranded: str | None = None
    room_lost: bool = False  # its hold was on a node that went away: placed again
    # Requests of member pods that went away unfinished (deleted, lost with their node,
    # failed): their replacements must find the capacity the gang was admitted with.
    lost: list[dict[str, int]] = field(default_factory=list)
    # A member pod of it fits neither the room it holds nor any free room: since when,
    # and why (pods/placement.py); and the last such reason told the user.
    unplaced: tuple[float, str] | None = None
    unplaced_told: str = ""


@dataclass
class Timers:
    """When its lifecycle is to be judged again, and the moments its rules count from."""

    check_at: float | None = None  # judged again then (None: at the idle pace)
    stepped_at: float = 0.0  # when its lifecycle was last judged
    items_at: float | None = None  # when every item was known to exist
    below_min_since: float | None = None  # running, but fewer than minAvailable pods up
    # v1beta2 (lifecycle.judge_v1beta2): since when a pod of the gang has failed; when its
    # reset began (its objects torn down, their re-creation waits for the retry pause);
    # when a failed wrapper's objects go (its deletion-on-failure grace) and when a
    # succeeded one is deleted (its success TTL).
    failed_since: float | None = None
    reset_at: float | None = None
    teardown_at: float | None = None
    delete_at: float | None = None


@dataclass
class Leftover:
    """Pods a wrapper's label claimed when the dispatcher deleted its objects (or the
    wrapper was deleted), watched until they are gone (pods/leftovers.py)."""

    deleted_at: float
    grace: float  # its forceful-deletion grace
    pods: set[NamespacedName]
    # When those still there are deleted at once again (after a forceful deletion that a
    # finalizer held up, or that failed).
    again_at: float | None = None


@dataclass
class Tracked:
    key: Key
    uid: str
    generation: int
    aw: AppWrapper | None
    status: AppWrapperStatus
    writes: StatusWrites
    first_seen: float
    phase: Phase = "queued"
    queued: QueuedWrapper | None = None
    expected_pods: int = 0
    # Pods its objects make as admitted (what the dispatcher infers from them; it may be
    # more than custompodresources declares, as in MCAD's own manifests).
    made_pods: int = 0
    # Every wrapped object is of a kind whose pods the dispatcher counts (False: made_pods
    # is only what a LeaderWorkerSet's declaration says).
    pods_countable: bool = True
    dispatched_at: float = 0.0
    # Pods proven to belong to the gang (owner chain to one of its items): name -> bucket.
    pods: dict[str, Bucket] = field(default_factory=dict)
    completable: tuple[int, ...] = ()  # items whose kind reports an outcome
    # Items read while it is dispatched: those with an outcome; for a wrapper written as
    # v1beta2, every item (one deleted by someone else fails it).
    watched: tuple[int, ...] = ()
    written_as_v1beta2: bool = False  # codeflare's rules and phases apply
    reading: OutcomeReading = field(default_factory=OutcomeReading)
    room: RoomState = field(default_factory=RoomState)
    timers: Timers = field(default_factory=Timers)
    needs_items: bool = False  # Dispatched, but not every item is known to exist yet
    teardown_due: bool = False  # Failed or requeued, but its objects may still exist
    first_attempt: bool = False  # this process dispatched it: a 409 cannot be ours
    # An elastic gang's pods at its minimum: what must run when minAvailable is not given.
    floor: int | None = None
    # The wrappers it preempted to be admitted: they may never preempt it back. Kept in
    # status.preempted too, so that the next leader knows them.
    preempted: tuple[Key, ...] = ()
    # Who holds it queued, who cancelled it (annotations its users set; None: nobody).
    held_by: str | None = None
    cancelled_by: str | None = None
    # A manager's copy: labelled so when this object (this uid) was first or since seen. It
    # stays one if the label goes: the fence against a lost manager must not end with a
    # label a tenant can remove (dispatcher.fleet.fence).
    manager_copy: bool = False
    deleting: bool = False  # it has a deletionTimestamp: never admitted again
    # The API object as last seen, when its spec changed after dispatch: `aw` stays what
    # was admitted (what to tear down), and a requeue queues this (intake.queue_again).
    latest: Mapping[str, Any] | None = None

    def mark_dispatched(self, now: float, preempted: tuple[Key, ...]) -> None:
        """Memory follows a Dispatched status that was written: its items are to be made,
        and nothing its last dispatch's pods said counts for this one."""
        self.preempted = preempted
        self.phase = "dispatched"
        self.dispatched_at = now
        self.pods = {}
        self.first_attempt = True
        self.needs_items = True
        self.timers.items_at = None
        self.reading.again()


    def may_say_it_waits(self) -> bool:
        """A newly arrived wrapper says it waits once a cycle decided so: one that arrived
        while a cycle ran has a place in the queue, but the next cycle will most likely
        dispatch it, and a first status write before that (its place alone) would cost a
        PATCH that tells nothing by the time it is read."""
        return self.writes.decided_to_wait or bool(self.writes.written.get("conditions"))

    @property
    def nothing_to_follow(self) -> bool:
        """No pod to wait for and no outcome to read: it runs once dispatched, and its
        items are not looked at again."""
        return self.expected_pods == 0 and not self.completable

    def counts(self) -> PodCounts:
        if not self.pods:
            return NO_PODS  # most wrappers, every cycle (loop/due.py)
        values = list(self.pods.values())
        return PodCounts(pending=values.count("pending"), running=values.count("running"),
                         succeeded=values.count("succeeded"), failed=values.count("failed"))

    def declared(self) -> list[tuple[int, Mapping[str, int]]]:
        """The pods it was admitted with: how many of each request."""
        gang = self.queued.gang if self.queued is not None else ()
        return [(g.pod_set.count, g.pod_set.request) for g in gang if g.pod_set.count]

    def item_uids(self) -> dict[tuple[str, str], str]:
        """(kind, name) -> uid of the items this wrapper created, as recorded."""
        return {(i.kind, i.name): i.uid for i in self.status.wrappedItems if i.uid}


JOB_TRACKING = "batch.kubernetes.io/job-tracking"  # a Job controller's pod finalizer


def held_by_job(obj: Mapping[str, Any]) -> bool:
    """Whether a Job controller has yet to count the pod (and let it go)."""
    return JOB_TRACKING in ((obj.get("metadata") or {}).get("finalizers") or ())


def pod_bucket(obj: dict[str, Any]) -> Bucket | None:
    meta = obj.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None  # on its way out: no longer part of the gang's count
    phase = (obj.get("status") or {}).get("phase") or "Pending"
    buckets: dict[str, Bucket] = {"Running": "running", "Succeeded": "succeeded",
                                  "Failed": "failed"}
    return buckets.get(phase, "pending")
