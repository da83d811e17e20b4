"""The worker's side of the fence against a lost manager (dispatcher.fleet.fence has the
rule): while this dispatcher holds a manager's copy, it reads the manager's heartbeat every
second; when the heartbeat goes stale, each copy is held by ManagerLost (one that runs is
torn down by the lifecycle step, as a preemption), and stays so once stopped.

A dispatcher holding no manager's copy reads nothing and holds nothing: one with no manager
runs as it always has.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from dispatcher.controller.kube.client import ApiError, Kube
from dispatcher.controller.kube.lease import LEASES
from dispatcher.controller.record.memory import Memory
from dispatcher.controller.record.tracked import Tracked
from dispatcher.fleet.fence import LEASE_NAME, LEASE_NAMESPACE, Heard, grace_of, hear, stale

log = logging.getLogger("dispatcher")

#: How often the heartbeat is read while copies are held (the fence's margin covers it).
LOOK_SECONDS = 1.0


class ManagerFence:
    def __init__(self, kube: Kube, memory: Memory, rehold: Callable[[Tracked], bool],
                 clock: Callable[[], float] = time.monotonic,
                 every: float = LOOK_SECONDS) -> None:
        """`rehold(t)`: hold or release the copy `t` as the heartbeat now says (intake);
        `clock`: monotonic, never the wall clock (only its rate matters)."""
        self.kube = kube
        self.memory = memory
        self.rehold = rehold
        self.clock = clock
        self.every = every
        self.heard: Heard | None = None
        self._unread = ""  # why the heartbeat could not be read (said once)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="dispatcher-manager-fence")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self.look()
            except asyncio.CancelledError:
                raise
            except Exception:  # the fence must go on looking
                log.exception("reading the manager's heartbeat failed; retrying")
            await asyncio.sleep(self.every)

    def copies(self) -> list[Tracked]:
        return [t for t in self.memory.tracked.values() if t.aw is not None and t.manager_copy]

    async def look(self) -> None:
        """Read the heartbeat (while copies are held) and hold or release the copies."""
        if not self.copies():
            self.heard = None
            self._apply(False)
            return
        record, grace = None, None
        try:
            lease = await asyncio.wait_for(self.kube.request(
                "GET", LEASES.path(LEASE_NAMESPACE, LEASE_NAME), retry=False), 2 * self.every)
            record = str(lease["metadata"].get("resourceVersion") or "") or None
            grace = grace_of(lease)
            self._unread = ""
        except (ApiError, TimeoutError) as e:
            # No Lease, or no answer: no renewal seen, the clock runs on.
            why = str(e) or "no answer"
            if why != self._unread:
                log.info("manager's heartbeat (Lease %s/%s) not read: %s", LEASE_NAMESPACE,
                         LEASE_NAME, why)
            self._unread = why
        now = self.clock()
        self.heard = hear(self.heard, record, grace, now)
        self._apply(stale(self.heard, now))

    def _apply(self, manager_stale: bool) -> None:
        if manager_stale == self.memory.manager_stale:
            return
        self.memory.manager_stale = manager_stale
        if manager_stale:
            assert self.heard is not None
            log.warning("the manager's heartbeat (Lease %s/%s) was not renewed for over %.0fs: "
                        "its copies here stop", LEASE_NAMESPACE, LEASE_NAME, self.heard.grace)
        else:
            log.info("the manager's heartbeat is renewed again")
        if any([self.rehold(t) for t in self.copies()]):
            self.memory.wake.set()
