"""Hold, release and cancel: what an AppWrapper's users ask of the dispatcher, through two
annotations that name who asks (``kubectl appwrapper hold|release|cancel`` sets them).

- Held (``workload.codeflare.dev/held-by``): a queued wrapper leaves the queue, keeping
  its first-seen time, so that once released (the annotation removed) it is back in its
  place. Its status says ``Queueing`` / ``Held``, "held by alice". A dispatched wrapper is
  not stopped by a hold; if it is ever requeued, it stays held.
- Cancelled (``workload.codeflare.dev/cancelled-by``): a queued or held wrapper fails at
  once; a dispatched or running one is failed and what it created deleted by the admission
  loop (loop/runtime.py). ``Failed`` / ``Cancelled``, "cancelled by alice": MCAD's end for an
  AppWrapper that will not run. It is final: an edit of its spec does not queue it again.

A v1beta2 AppWrapper whose ``spec.suspend`` is true is held the same way (held by
``spec.suspend``) until it is set to false. A manager's copy whose manager is lost is
held by ``ManagerLost`` (dispatcher.fleet.fence) until its manager deletes it.

Who may ask is plain Kubernetes RBAC: ``patch`` on ``appwrappers`` in its namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.api.labels import CANCELLED_BY_ANNOTATION, HELD_BY_ANNOTATION
from dispatcher.api.management import SUSPENDED_BY, suspended
from dispatcher.fleet.fence import LOST_MESSAGE, MANAGER_LOST
from dispatcher.wording import printable

SOMEONE = "someone"  # an annotation set with no name


def asked(obj: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """Who holds the AppWrapper `obj`, and who cancelled it (None: nobody)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}

    def who(key: str) -> str | None:
        if key not in annotations:
            return None
        # Printed as it is in the status (kubectl's columns, describe): words only.
        return printable(str(annotations[key] or "")).strip() or SOMEONE

    held_by = SUSPENDED_BY if suspended(annotations) else who(HELD_BY_ANNOTATION)
    return held_by, who(CANCELLED_BY_ANNOTATION)


def held_message(held_by: str, name: str) -> str:
    if held_by == MANAGER_LOST:
        return LOST_MESSAGE
    if held_by == SUSPENDED_BY:
        return ("suspended (spec.suspend is true): it keeps its place in the queue and is not "
                "dispatched until spec.suspend is false")
    return (f"held by {held_by}: it keeps its place in the queue and is not dispatched until "
            f"released (kubectl appwrapper release {name})")


def cancelled_message(cancelled_by: str, created: bool) -> str:
    return f"cancelled by {cancelled_by}" + (
        ": what it created is deleted" if created else ": it will not be dispatched")
