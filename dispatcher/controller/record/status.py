"""Writing AppWrapper status: conditions, one PATCH per change, Events after it.

- A change is prepared in memory (:meth:`StatusWriter.begin`), then committed by one
  merge PATCH with a uid precondition. Only when the PATCH succeeded do its Events go
  out; when it fails the in-memory status goes back to what the API server has, so
  memory is never ahead of the API.
- Nothing is written when nothing changed. What is news — a condition, a state, a
  requeue — is written at once. Details wait: pod counts, the uids of created items and
  a waiting wrapper's estimated start (with the message that words it) are written with
  the next news, or after `detail_interval` (10 s); a change of message
  alone (a waiting wrapper's shortfall moves with every pod that binds anywhere) after
  `message_interval` (60 s) — so queued wrappers do not turn each unrelated event into
  hundreds of PATCHes, and a gang's pods starting one by one into one PATCH each. A
  waiting wrapper's queue position moves whenever one ahead of it leaves: a move alone
  waits like a message, but its first position and reaching the front are details. All
  such minor writes together are paced (5 a second, bursts of 200), stalest first.
- The uids of the items of a wrapper with nothing to follow (no pod, no outcome: a
  ConfigMap) are never a reason to write: they go with its next write, if any. Its items
  are not looked at again; after a restart they are found by name and adopted by their
  owner reference and creation time, as any item whose uid was not recorded.
- Every condition reached in one step goes into the same PATCH, and one Event names
  them all (``Queueing → HeadOfLine → Dispatched: …``) — except for a wrapper with nothing
  to follow dispatched by its very first status write (`told_by_status_alone`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from dispatcher.api.conditions import ConditionType, latest, set_condition
from dispatcher.api.conditions import says as already_says
from dispatcher.api.models import AppWrapperStatus
from dispatcher.controller.kube.client import ApiError, Kube, Resource
from dispatcher.controller.kube.pacing import EVENT, STATUS, URGENT
from dispatcher.wording import printable

from .attention import Alarms
from .tracked import Tracked, now_dt

log = logging.getLogger("dispatcher")

APPWRAPPERS = Resource("workload.codeflare.dev/v1beta1", "AppWrapper", "appwrappers", True)
EVENTS = Resource("v1", "Event", "events", True)

MESSAGE_INTERVAL_SECONDS = 60.0
DETAIL_INTERVAL_SECONDS = 10.0
# All AppWrappers together: writes of details and messages alone (news is not limited).
# Events wait behind everything else for the client's tokens; past this many waiting,
# more are dropped (as client-go's event recorder drops them under load): a dispatcher
# at its request rate admits work instead of queuing Events without end.
EVENTS_QUEUED_MAX = 50
MINOR_WRITES_PER_SECOND = 5.0
MINOR_WRITES_BURST = 200
DETAILS = ("pending", "running", "Succeeded", "failed", "wrappedItems", "estimatedStart",
           "queuePolicy")
ITEMS = "wrappedItems"
POSITIONS = ("queuePosition", "quotaPositions")  # a move alone waits like a message
# Absent from a status unless set; a merge patch removes a field only when told (null).
REMOVABLE = ("estimatedStart", *POSITIONS, "queuePolicy")
WriteKind = Literal["news", "details", "message"]
WRITE_KINDS: tuple[WriteKind, ...] = ("news", "details", "message")
MAX_MESSAGE = 2048  # a status message is for people: long ones are cut
WARNING_TYPES = frozenset({ConditionType.Backoff, ConditionType.Failed,
                           ConditionType.PreemptCandidate})


def status_body(status: AppWrapperStatus) -> dict[str, Any]:
    body: dict[str, Any] = status.model_dump(mode="json", exclude_none=True)
    # An estimate that no longer holds goes, and so does the position of one that left
    # the queue.
    for name in REMOVABLE:
        body.setdefault(name, None)
    return body


def copy_status(status: AppWrapperStatus) -> AppWrapperStatus:
    """A copy to go back to if a write fails. Its lists are copied, not what they hold:
    conditions and wrapped items are replaced, never changed in place (a deep copy of
    every waiting wrapper's status, every cycle, was a fifth of the dispatcher's time)."""
    copy = status.model_copy()
    copy.conditions = list(status.conditions)
    copy.wrappedItems = list(status.wrappedItems)
    copy.elasticPods = list(status.elasticPods)
    copy.preempted = list(status.preempted)
    return copy


def _without(body: dict[str, Any], details: bool) -> dict[str, Any]:
    """The status without its message (and, with `details`, its pod counts and item
    uids): what is left is the news."""
    out = {k: v for k, v in body.items()
           if k != "message" and k not in POSITIONS and not (details and k in DETAILS)}
    conditions = [dict(c) for c in body.get("conditions", [])]
    if conditions:
        last = conditions[-1]
        last.pop("message", None)
        last.pop("lastUpdateMicroTime", None)
    out["conditions"] = conditions
    return out


def unwritten(t: Tracked, body: dict[str, Any]) -> WriteKind | None:
    """What the status in memory (serialised: `body`) holds that was not written: news,
    details alone, the message alone, or nothing (None)."""
    if body == t.writes.written or (
            t.nothing_to_follow and _without_uids(body) == _without_uids(t.writes.written)):
        return None
    if _without(body, details=True) != _without(t.writes.written, details=True) or (
            t.written_as_v1beta2 and _all_created(body) and not _all_created(t.writes.written)):
        # Every item created is a v1beta2 reader's Running phase (codeflare's).
        return "news"
    if _without(body, details=False) != _without(t.writes.written, details=False) \
            or _moved_to_note(body.get("queuePosition"), t.writes.written.get("queuePosition")):
        return "details"
    return "message"


def _all_created(body: dict[str, Any]) -> bool:
    items = body.get(ITEMS) or []
    return bool(items) and all(i.get("uid") for i in items)


def _without_uids(body: dict[str, Any]) -> dict[str, Any]:
    items = body.get(ITEMS)
    if not items:
        return body
    return {**body, ITEMS: [{k: v for k, v in i.items() if k != "uid"} for i in items]}


def _moved_to_note(position: int | None, written: int | None) -> bool:
    """A queue position worth a prompt write: the first one, or the front."""
    return position != written and (written is None or position == 1)


def _cap(message: str) -> str:
    # Messages quote what tenants wrote (a kind, a resource name, who holds it), and
    # kubectl's columns, describe and Events print them as they are: words only.
    message = printable(message)
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE - 1] + "…"


def says(t: Tracked, type_: str, reason: str, message: str) -> bool:
    """Whether Change.condition would find nothing to change, without the copy a Change
    makes."""
    return already_says(t.status.conditions, type_, reason, _cap(message),
                        generation=t.generation)


def told_by_status_alone(t: Tracked) -> bool:
    """A wrapper with nothing to follow (no pod, no outcome: a ConfigMap) whose first
    status write dispatches it: that write says ``Init → … → Dispatched → Running`` with
    its times, and nothing happens to it afterwards; an Event would repeat the same words
    at the same time (MCAD posts none there either), and cost the API server a third more
    requests per wrapper. A wrapper told to wait before, whose Events said so, gets one
    saying it went; so does every wrapper with pods, and every Warning."""
    return t.nothing_to_follow and not t.writes.written.get("conditions")


@dataclass
class Change:
    """A status change being prepared for one AppWrapper."""

    t: Tracked
    now: float
    before: AppWrapperStatus
    types: list[str] = field(default_factory=list)  # condition types entered, in order
    reason: str = ""
    message: str = ""
    # Whether an Event tells of the conditions entered (see `told_by_status_alone`).
    event: bool = True

    def condition(self, type_: str, reason: str, message: str) -> bool:
        message = _cap(message)
        conditions, changed = set_condition(self.t.status.conditions, type_, reason,
                                            message, now_dt(self.now),
                                            generation=self.t.generation)
        if changed:
            previous = latest(self.t.status.conditions)
            self.t.status.conditions = conditions
            self.t.status.queuejobstate = type_
            self.t.status.message = message
            if previous is None or previous.type != type_:
                self.types.append(type_)
                self.reason, self.message = reason, message
        return changed

    def abandon(self) -> None:
        self.t.status = self.before


class StatusWriter:
    def __init__(self, kube: Kube, clock: Callable[[], float], parallel: int = 16,
                 message_interval: float = MESSAGE_INTERVAL_SECONDS,
                 detail_interval: float = DETAIL_INTERVAL_SECONDS) -> None:
        self.kube = kube
        self.clock = clock
        self.message_interval = message_interval
        self.detail_interval = detail_interval
        self.minor_rate = MINOR_WRITES_PER_SECOND
        self.minor_burst = MINOR_WRITES_BURST
        self._tokens = float(MINOR_WRITES_BURST)
        self._tokens_at = 0.0
        # Per priority: a Dispatched write must not wait for a slot held by writes that
        # wait behind it for a token.
        self._writes = {URGENT: asyncio.Semaphore(parallel), STATUS: asyncio.Semaphore(parallel)}
        self.patches = 0  # status PATCHes sent, for benchmarks and tests
        # Who has a minor write owed, by when: the loop wakes for the soonest and writes
        # the ripe ones without looking through every wrapper.
        self.minor_owed = Alarms()
        # ... by what made them: news, or details or a message alone (the metrics).
        self.written: Counter[WriteKind] = Counter(dict.fromkeys(WRITE_KINDS, 0))
        # Events being posted: off the path of what the write lets happen next (a
        # Dispatched write is followed by creating the items, not by its Event).
        self.events: set[asyncio.Task[None]] = set()
        self.events_dropped = 0

    def begin(self, t: Tracked, now: float) -> Change:
        return Change(t, now, copy_status(t.status))

    def due_at(self, t: Tracked, body: dict[str, Any] | None = None) -> float | None:
        """When the status in memory (`body`, if already serialised) should be written
        (None: it is written)."""
        return self._due(t, unwritten(t, status_body(t.status) if body is None else body))

    def _due(self, t: Tracked, what: WriteKind | None) -> float | None:
        if what is None:
            return None
        if what == "news":
            return t.writes.last_write_at  # now
        if what == "details":
            return t.writes.last_write_at + self.detail_interval
        return t.writes.last_write_at + self.message_interval

    async def commit(self, change: Change, force: bool = False) -> bool:
        """Write the change; False if the AppWrapper is gone (404) or was replaced by
        another of the same name (409). A transient failure restores the in-memory
        status and raises, so the caller tries the whole step again later."""
        try:
            written = await self.write(change.t, change.now, force=force or bool(change.types))
        except ApiError:
            change.abandon()
            raise
        if written and change.types and change.event:
            task = asyncio.create_task(self._post_event(change))
            self.events.add(task)
            task.add_done_callback(self.events.discard)
        return written

    async def write(self, t: Tracked, now: float, force: bool = False) -> bool:
        body = status_body(t.status)
        what = unwritten(t, body)
        if what is None:
            self._owe_minor(t, None)
            return True
        due_at = self._due(t, what)
        assert due_at is not None
        if not force and (now < due_at or not self._minor_token(now)):
            self._owe_minor(t, due_at)
            return True
        # A Dispatched write comes before the items it lets be created.
        priority = URGENT if t.phase == "dispatching" else STATUS
        async with self._writes[priority]:
            try:
                answer = await self.kube.request(
                    "PATCH", APPWRAPPERS.path(t.key[0], t.key[1], "status"),
                    {"metadata": {"uid": t.uid}, "status": body},
                    content_type="application/merge-patch+json", priority=priority,
                    on_send=lambda: setattr(t, "sending", True))
            except ApiError as e:
                if e.status in (404, 409):
                    return False
                raise
            finally:
                t.writes.sending = False
        self.patches += 1
        self.written[what] += 1
        t.writes.written = body
        t.writes.written_version = _version(answer)
        t.writes.last_write_at = now
        # What changed in memory while the PATCH was under way (an estimate, pod counts)
        # is still owed.
        self.owe(t)
        return True

    def owe_position(self, t: Tracked) -> None:
        """`t`'s queue position changed in memory: owed when `unwritten` will say, worked
        out without serialising the status (every waiting wrapper moves when the head
        leaves); `write` looks again when it is due."""
        prompt = _moved_to_note(t.status.queuePosition, t.writes.written.get("queuePosition"))
        what: WriteKind = "details" if prompt else "message"
        due = self._due(t, what)
        assert due is not None
        owed = t.writes.minor_due_at
        self._owe_minor(t, due if owed is None else min(owed, due))

    def owe(self, t: Tracked) -> None:
        """`t`'s status in memory may differ from what was written by details or its
        message alone: written when `due_at` says (by `_flush`, or with the next news)."""
        self._owe_minor(t, self.due_at(t))

    def _owe_minor(self, t: Tracked, at: float | None) -> None:
        t.writes.minor_due_at = at
        self.minor_owed.set(t.key, at)

    def minor_writes_available(self, now: float) -> int:
        """How many minor writes the shared rate lets through now."""
        return int(self._tokens_now(now))

    def minor_write_at(self, now: float) -> float:
        """When the shared rate lets the next minor write through."""
        missing = 1.0 - self._tokens_now(now)
        return now if missing <= 0 or self.minor_rate <= 0 else now + missing / self.minor_rate

    def _tokens_now(self, now: float) -> float:
        return min(self.minor_burst,
                   self._tokens + max(0.0, now - self._tokens_at) * self.minor_rate)

    def _minor_token(self, now: float) -> bool:
        """Details and messages share `minor_rate` writes a second, whatever the number
        of AppWrappers: 10,000 waiting wrappers whose shortfall numbers move are
        refreshed in turn, never all at once."""
        self._tokens = self._tokens_now(now)
        self._tokens_at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    async def _post_event(self, change: Change) -> None:
        last = change.types[-1]
        chain = " → ".join(change.types)
        text = f"{chain}: {change.message}" if change.message else chain
        warning = last in WARNING_TYPES
        await self.event(change.t.key[0], event_body(
            change.t, change.reason or last, text, warning, change.now))

    async def warn(self, t: Tracked, reason: str, message: str, now: float) -> None:
        """A Warning Event that goes with no condition (a spec the dispatcher accepts
        but wants the user to look at)."""
        await self.event(t.key[0], event_body(t, reason, message, True, now))

    async def event(self, namespace: str, body: dict[str, Any]) -> None:
        if self.kube.queued(EVENT) >= EVENTS_QUEUED_MAX:
            self.events_dropped += 1
            if self.events_dropped % 1000 == 1:
                log.info("%d Event(s) not posted so far: %d wait for the API client already "
                         "(the conditions in status say the same)", self.events_dropped,
                         EVENTS_QUEUED_MAX)
            return
        try:
            # Not retried: an Event is best effort, and a retry could post it twice.
            await self.kube.request("POST", EVENTS.path(namespace), body, retry=False,
                                    priority=EVENT)
        except ApiError as e:
            log.debug("event in %s not posted: %s", namespace, e)


def event_body(t: Tracked, reason: str, message: str, warning: bool,
               now: float) -> dict[str, Any]:
    stamp = now_dt(now).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": f"{t.key[1][:200]}.", "namespace": t.key[0]},
        "involvedObject": {"apiVersion": APPWRAPPERS.api_version, "kind": "AppWrapper",
                           "namespace": t.key[0], "name": t.key[1], "uid": t.uid},
        "reason": reason, "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
        "source": {"component": "dispatcher"},
    }


def _version(answer: Any) -> str:
    if isinstance(answer, dict):
        return str((answer.get("metadata") or {}).get("resourceVersion", ""))
    return ""


def is_newer(version: str, than: str) -> bool:
    """resourceVersions are opaque, but etcd's are increasing integers; where both are
    integers an older one (a late watch event of our own write) is told apart."""
    try:
        return int(version) > int(than)
    except ValueError:
        return version != than
