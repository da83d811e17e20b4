"""Pods left after a wrapper's objects were deleted, and their forceful deletion.

Codeflare's progress guarantee for wrappers written as v1beta2: the dispatcher deletes a
wrapper's objects once (items/creation.py) and their controllers delete the pods; a pod still
there `forcefulDeletionGracePeriod` later (a node that does not answer, a kubelet that never
confirms) is deleted with ``gracePeriodSeconds: 0``, so that a reset can go on and the
room it held is free for certain. The rule is lifecycle.leftover_step; the pods watched are
in Memory.leftovers, recorded when the objects went (or the wrapper was deleted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dispatcher.api.labels import APPWRAPPER_LABEL
from dispatcher.controller.kube.client import ApiError, Kube, Resource
from dispatcher.controller.record.memory import Memory
from dispatcher.controller.record.status import StatusWriter
from dispatcher.controller.record.tasks import RETRY_SECONDS, Work
from dispatcher.controller.record.tracked import Key, Leftover, NamespacedName, Tracked
from dispatcher.lifecycle import Timing, forceful_deletion_grace, leftover_step
from dispatcher.wording import counted, span

log = logging.getLogger("dispatcher")

PODS = Resource("v1", "Pod", "pods", True)
# Reason of the Warning Event that says which pods were deleted at once.
FORCEFUL_DELETION = "ForcefulDeletion"
# A pod still there after its forceful deletion (a finalizer holds it) is deleted at once
# again this often.
FORCE_AGAIN_SECONDS = 30.0


def watch(memory: Memory, t: Tracked, timing: Timing, now: float) -> None:
    """`t`'s objects were deleted (by the dispatcher, or with the wrapper): the pods of its
    gang (proven to be its objects', not merely labelled) are watched until they are gone
    (a wrapper written as v1beta1 leaves them to the garbage collector)."""
    grace = forceful_deletion_grace(t.aw.metadata.annotations, timing) \
        if t.aw is not None else None
    if grace is not None:
        memory.objects_deleted(t.key, {(t.key[0], pod) for pod in t.pods}, grace, now)


class Leftovers:
    def __init__(self, memory: Memory, kube: Kube, writer: StatusWriter, timing: Timing,
                 clock: Callable[[], float]) -> None:
        self.memory = memory
        self.kube = kube
        self.writer = writer
        self.timing = timing
        self.clock = clock
        self._forcing: set[Key] = set()  # a forceful deletion under way

    def objects_deleted(self, t: Tracked) -> None:
        """`t`'s objects were just deleted."""
        watch(self.memory, t, self.timing, self.clock())

    def remaining(self, key: Key) -> int:
        """Pods of `key`'s deleted objects that are still there."""
        left = self.memory.leftovers.get(key)
        return 0 if left is None else len(self._still_there(key, left))

    def next_due(self) -> float | None:
        """When the next forceful deletion is due (None: none is owed)."""
        return min((left.deleted_at + left.grace if left.again_at is None else left.again_at
                    for key, left in self.memory.leftovers.items()
                    if key not in self._forcing), default=None)

    def cycle(self, now: float, spawn: Callable[[Work], None]) -> None:
        """Forget the pods that are gone; delete at once, off the loop, those past their
        grace."""
        for key, left in list(self.memory.leftovers.items()):
            left.pods = self._still_there(key, left)
            step, _ = leftover_step(len(left.pods), left.deleted_at, now, left.grace)
            if step == "gone":
                del self.memory.leftovers[key]
                self._reset_goes_on(key, now)
            elif step == "force" and key not in self._forcing and (
                    left.again_at is None or now >= left.again_at):
                self._forcing.add(key)
                spawn(self._force(key, left, now))

    def _reset_goes_on(self, key: Key, now: float) -> None:
        """The last old pod of a resetting gang is gone: its objects are made again now."""
        t = self.memory.tracked.get(key)
        if t is not None and t.timers.reset_at is not None:
            t.timers.check_at = now
            self.memory.attention.touch(key)

    def _still_there(self, key: Key, left: Leftover) -> set[NamespacedName]:
        return {pod for pod in left.pods if self.memory.pods.get(pod) == key}

    async def _force(self, key: Key, left: Leftover, now: float) -> None:
        try:
            deleted = [pod for pod in sorted(left.pods) if await self._delete_now(key, pod)]
        except ApiError as e:
            log.warning("%s/%s: pods of its deleted objects not deleted at once: %s",
                        *key, e)
            left.again_at = now + (RETRY_SECONDS if e.transient else FORCE_AGAIN_SECONDS)
            return
        finally:
            self._forcing.discard(key)
        left.again_at = now + FORCE_AGAIN_SECONDS
        if not deleted:
            return
        names = ", ".join(name for _, name in deleted)
        message = (f"{counted(len(deleted), 'pod')} of its deleted objects still there "
                   f"{span(now - left.deleted_at)} after their deletion (forceful deletion "
                   f"grace {span(left.grace)}): deleted at once (gracePeriodSeconds 0): "
                   f"{names}")
        log.warning("%s/%s: %s", *key, message)
        t = self.memory.tracked.get(key)
        if t is not None:
            await self.writer.warn(t, FORCEFUL_DELETION, message, now)

    async def _delete_now(self, key: Key, pod: NamespacedName) -> bool:
        """Delete `pod` with no grace if it is still the one `key`'s label claims."""
        path = PODS.path(*pod)
        try:
            live = await self.kube.request("GET", path)
            meta = live.get("metadata") or {}
            if (meta.get("labels") or {}).get(APPWRAPPER_LABEL) != key[1]:
                return False
            await self.kube.request("DELETE", path, {
                "gracePeriodSeconds": 0, "preconditions": {"uid": meta.get("uid")}})
        except ApiError as e:
            if e.status in (404, 409):
                return False  # gone meanwhile, or replaced by a new pod of that name
            raise
        return True
