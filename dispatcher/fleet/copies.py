"""What the manager does with a wrapper it sent, from the copy its worker holds.

A sent wrapper names its worker (the target, recorded in its status by the manager before
the copy is made: `target`; a label is anyone's to write where no webhook guards it, a
status only the manager's). In each pass, from the worker's last look:

- no copy: make it (the second step of the fence; a manager that died between the two
  steps makes it now, one that died after both finds it here and adopts it);
- a copy being deleted, or one of an earlier wrapper of that name: wait until it is gone;
- a copy the worker requeued, failed, or stopped because it lost its manager (fence.py):
  take the wrapper back to the manager's queue, so it may go to another worker (its copy
  is then no longer sent there and is deleted), unless the wrapper's requeue limit is
  reached: then it fails in the manager too;
- a copy that has waited in its worker, never started, for longer than the bound
  (`START_WITHIN`, the manager's `--worker-start-seconds`): take it back too, to be tried
  in another worker first (`TakeBack.elsewhere`). The manager sent it where its gang fitted
  whole; a copy that does not start there (held by the worker's own users, outranked by
  its own queue, left to another controller, its dispatcher down) would keep that room from
  everyone for good. It never ran: no requeue is counted, and no limit applies;
- otherwise: mirror the copy's status to the manager's wrapper when it differs (all of it
  but the requeue count, which is the manager's: copies start from none).

A worker is lost when it has not answered for longer than the grace, or is no longer
registered: its wrappers are taken back the same way, and their copies deleted when it
answers again (strays). Events of a copy are mirrored to its wrapper once each, a bounded
number per pass.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispatcher.api.labels import MANAGER_UID_LABEL

from .fence import stopped

#: The worker's own count of requeues of its copy: not mirrored (the manager keeps its own).
REQUEUES = "numberOfRequeueings"
#: The worker's record that it holds a copy: not mirrored (the manager's wrapper is none).
COPY_OF = "managerUid"
#: The manager's record of the worker it sent a wrapper to (never mirrored from a copy).
SENT_TO = "workerCluster"
#: At most this many Events of one copy are mirrored in one pass (the newest).
EVENTS_PER_PASS = 10
#: Seconds a copy may wait in its worker, never started, before it is taken back: a
#: worker's dispatcher starts a gang that fits within seconds; minutes leave room for its
#: own queue and a slow start (the manager's `--worker-start-seconds`; 0: never).
START_WITHIN = 300.0
#: A copy's states while it waits in its worker's queue (after it, it has started).
WAITING_STATES = frozenset({"", "Pending"})

Status = Mapping[str, Any]
Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class Make:
    """No copy yet: make it."""


@dataclass(frozen=True)
class Wait:
    """A copy of the name is on its way out: make ours once it is gone."""


@dataclass(frozen=True)
class Mirror:
    status: dict[str, Any]  # what to write on the manager's wrapper


@dataclass(frozen=True)
class TakeBack:
    status: dict[str, Any]  # the manager's wrapper, queued again
    #: Tried in the other workers first: the copy never started in this one.
    elsewhere: bool = False


@dataclass(frozen=True)
class GiveUp:
    status: dict[str, Any]  # the manager's wrapper, failed for good


Step = Make | Wait | Mirror | TakeBack | GiveUp | None


def target(wrapper: Mapping[str, Any]) -> str | None:
    """The worker the manager sent the wrapper to, as the manager recorded it; None: not
    sent (queued, finished, or taken back)."""
    status = wrapper.get("status")
    sent = status.get(SENT_TO) if isinstance(status, Mapping) else None
    return str(sent) if sent else None


def adoptable(wrapper: Mapping[str, Any], copies_by_worker: Mapping[str, Mapping[Key, Any]],
              labelled: str | None) -> str | None:
    """The worker a manager of an earlier version sent the wrapper to, naming it in the
    label `labelled` only: taken for sent there only where that worker holds its copy as
    the manager made it (the wrapper's spec, labelled with its uid) and that worker's
    dispatcher recorded it as the wrapper's copy (in the copy's status, its alone). A label
    a tenant wrote meets none of that."""
    if not labelled or labelled not in copies_by_worker:
        return None
    meta = wrapper.get("metadata") or {}
    copy = copies_by_worker[labelled].get((str(meta.get("namespace")), str(meta.get("name"))))
    if copy is None:
        return None
    uid = meta.get("uid")
    mine = ((copy.get("metadata") or {}).get("labels") or {}).get(MANAGER_UID_LABEL) == uid \
        and (copy.get("status") or {}).get(COPY_OF) == uid
    return labelled if mine and copy.get("spec") == wrapper.get("spec") else None


def requeued(mine: Status, message: str) -> dict[str, Any]:
    """The manager's wrapper back in its queue: Pending, nothing running, one more requeue."""
    return {"state": "Pending", "message": message, "running": 0, "pending": 0,
            REQUEUES: int(mine.get(REQUEUES) or 0) + 1}


def step(worker: str, manager_uid: str, mine: Status, copy: Mapping[str, Any] | None,
         max_requeues: int, now: float = 0.0, start_within: float = 0.0) -> Step:
    """What to do with a sent wrapper whose worker answers, given its copy there.

    `max_requeues` is the wrapper's spec.schedulingSpec.requeuing.maxNumRequeuings
    (0: no limit); `now` the manager's wall clock (seconds) and `start_within` the bound on
    a copy's wait (0: none)."""
    if copy is None:
        return Make()
    meta = copy.get("metadata") or {}
    if meta.get("deletionTimestamp") or \
            (meta.get("labels") or {}).get(MANAGER_UID_LABEL) != manager_uid:
        return Wait()
    theirs: Status = copy.get("status") or {}
    what = ("failed" if theirs.get("state") == "Failed"
            else "stopped" if stopped(theirs)
            else "requeued" if int(theirs.get(REQUEUES) or 0) > 0 else None)
    if what is not None:
        why = f"worker cluster {worker} {what} it"
        if theirs.get("message"):
            why += f": {theirs['message']}"
        done = int(mine.get(REQUEUES) or 0)
        if max_requeues and done >= max_requeues:
            final = {**theirs, "state": "Failed", REQUEUES: done, "message": (
                f"failed: {why}; requeued {done} time(s), the limit "
                "(spec.schedulingSpec.requeuing.maxNumRequeuings)")}
            return GiveUp(final) if _differs(mine, final) else None
        return TakeBack(requeued(mine, f"requeued: {why}"))
    due = start_due(copy, start_within)
    if due is not None and now > due:
        return TakeBack(not_started(worker, start_within, theirs), elsewhere=True)
    mirrored = {k: v for k, v in theirs.items() if k not in (REQUEUES, COPY_OF, SENT_TO)}
    return Mirror(mirrored) if _differs(mine, mirrored) else None


def start_due(copy: Mapping[str, Any] | None, start_within: float) -> float | None:
    """By when (wall seconds) the copy must have started, while it waits in its worker;
    None when it started, or no bound is set. Counted from its creation, as its worker
    stamped it (clocks seconds apart change nothing at this scale)."""
    if copy is None or start_within <= 0:
        return None
    if str((copy.get("status") or {}).get("state") or "") not in WAITING_STATES:
        return None
    stamp = (copy.get("metadata") or {}).get("creationTimestamp")
    try:
        made = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return made + start_within


def not_started(worker: str, start_within: float, theirs: Status) -> dict[str, Any]:
    """The manager's wrapper back in its queue: its copy never started in `worker`."""
    why = f"requeued: worker cluster {worker} did not start it within {start_within:.0f}s"
    if theirs.get("message"):
        why += f" (there: {theirs['message']})"
    return {"state": "Pending", "message": why[:1024], "running": 0, "pending": 0}


def refused(worker: str, reason: str) -> dict[str, Any]:
    """The manager's wrapper failed: its worker refused the copy (it would again)."""
    return {"state": "Failed", "message": f"failed: worker cluster {worker} refused its "
            f"copy: {reason}"[:1024]}


def _differs(mine: Status, theirs: Status) -> bool:
    return any(mine.get(k) != v for k, v in theirs.items())


def lost(target: str, registered: Collection[str], down_since: Mapping[str, float],
         now: float, grace: float) -> bool:
    """The worker has not answered for longer than the grace, or is not registered."""
    if target not in registered:
        return True
    since = down_since.get(target)
    return since is not None and now - since > grace


def lost_message(target: str, registered: Collection[str], grace: float) -> str:
    if target in registered:
        return f"requeued: worker cluster {target} did not answer for over {grace:.0f}s"
    return f"requeued: worker cluster {target} is not registered"


def strays(held: Mapping[Key, Mapping[str, Any]], worker: str,
           sent_to: Mapping[str, str]) -> list[tuple[Key, str]]:
    """The copies in `worker` whose wrapper is not sent there now (deleted, requeued, sent
    elsewhere), as (key, copy uid): to delete, fenced on that uid.

    `sent_to` maps the uid of each sent manager wrapper to its target."""
    out = []
    for key, copy in sorted(held.items()):
        meta = copy.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        uid = (meta.get("labels") or {}).get(MANAGER_UID_LABEL, "")
        if sent_to.get(uid) != worker:
            out.append((key, str(meta.get("uid", ""))))
    return out


def new_events(events: Iterable[Mapping[str, Any]], copy_uid: str, mirrored: Collection[str],
               limit: int = EVENTS_PER_PASS) -> list[Mapping[str, Any]]:
    """The Events of the copy not mirrored yet, oldest first, at most the newest `limit`."""
    mine = [e for e in events
            if (e.get("involvedObject") or {}).get("uid") == copy_uid
            and (e.get("metadata") or {}).get("uid") not in mirrored]
    mine.sort(key=_when)
    return mine[-limit:] if limit > 0 else []


def mirrored_event(event: Mapping[str, Any], worker: str, wrapper: Mapping[str, Any]
                   ) -> dict[str, Any]:
    """The worker's Event as one on the manager's wrapper. Its name comes from the worker
    Event's uid, so a manager that restarts and mirrors it again is refused (409)."""
    meta = wrapper["metadata"]
    uid = str((event.get("metadata") or {}).get("uid", ""))
    when = _when(event)
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta['name'][:200]}.{uid[:36]}",
                     "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": wrapper.get("apiVersion",
                                                     "workload.codeflare.dev/v1beta1"),
                           "kind": "AppWrapper", "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta["uid"]},
        "reason": event.get("reason", ""),
        "message": f"[{worker}] {event.get('message', '')}"[:1024],
        "type": event.get("type", "Normal"),
        "count": int(event.get("count") or 1),
        "firstTimestamp": event.get("firstTimestamp") or when or None,
        "lastTimestamp": event.get("lastTimestamp") or when or None,
        "source": {"component": "dispatcher-manager"},
    }


def _when(event: Mapping[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime")
               or event.get("firstTimestamp") or "")

