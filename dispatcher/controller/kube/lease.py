"""Leader election on a coordination.k8s.io Lease: one replica dispatches, others wait.

The rules are client-go's: the leader renews the Lease every `retry_period`; a
candidate takes it over once it has seen the same record, unchanged, for a whole
`lease_duration` (measured on its own clock, so clocks need not agree). A leader that
could not renew for `renew_deadline` (< lease_duration) stops acting before anyone else
may take over — the process exits and its restart campaigns again with an empty memory.
A leader that stops cleanly releases the Lease, so a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .client import ApiError, Kube, Resource
from .explain import explain
from .startup import Trouble

log = logging.getLogger("dispatcher.lease")

LEASES = Resource("coordination.k8s.io/v1", "Lease", "leases", True)


def _micro(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


#: How long a Lease not renewed keeps others from leading: a killed leader's successor
#: leads this long after its last renewal, at the soonest.
LEASE_SECONDS = 20.0


class LeaderElector:
    def __init__(self, kube: Kube, namespace: str, name: str = "dispatcher",
                 identity: str | None = None, lease_duration: float = LEASE_SECONDS,
                 renew_deadline: float = 15.0, retry_period: float = 2.0,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        assert renew_deadline < lease_duration
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity or default_identity()
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self.clock = clock
        self.wall = wall
        self.leading = False
        self.lost = asyncio.Event()
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._last_renew = 0.0
        self.trouble = Trouble(log, f"leader election (Lease {namespace}/{name})")

    @property
    def path(self) -> str:
        return LEASES.path(self.namespace, self.name)

    def _body(self, lease: dict[str, Any] | None, transitions: int) -> dict[str, Any]:
        now = _micro(self.wall())
        spec = {"holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.lease_duration),
                "acquireTime": now, "renewTime": now, "leaseTransitions": transitions}
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
            old = lease.get("spec") or {}
            if old.get("holderIdentity") == self.identity and old.get("acquireTime"):
                spec["acquireTime"] = old["acquireTime"]
        return {"apiVersion": LEASES.api_version, "kind": "Lease", "metadata": meta,
                "spec": spec}

    async def _try(self) -> bool:
        """One attempt to acquire or renew; True when we hold the Lease after it."""
        try:
            lease = await self.kube.request("GET", self.path, retry=False)
        except ApiError as e:
            if e.status != 404:
                raise
            try:
                await self.kube.request("POST", LEASES.path(self.namespace),
                                        self._body(None, 0), retry=False)
            except ApiError as created:
                if created.status == 409:
                    return False  # another candidate created it first
                raise
            return True
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        record = (holder, spec.get("renewTime"), lease["metadata"].get("resourceVersion"))
        now = self.clock()
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and now - self._observed_at < duration:
            return False  # someone else holds it and renews it
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder != self.identity:
            transitions += 1
        try:
            await self.kube.request("PUT", self.path, self._body(lease, transitions),
                                    retry=False)
        except ApiError as e:
            if e.status == 409:
                return False  # another candidate was faster
            raise
        return True

    async def acquire(self) -> None:
        """Wait until this replica leads."""
        log.info("%s: waiting to lead (Lease %s/%s)", self.identity, self.namespace,
                 self.name)
        while True:
            try:
                if await self._try():
                    self.trouble.clear()
                    self.leading = True
                    self._last_renew = self.clock()
                    log.info("%s: leading", self.identity)
                    return
                self.trouble.clear()  # standing by is no trouble
            except ApiError as e:
                self.trouble.report(explain(e))
            await asyncio.sleep(self.retry_period)

    async def keep(self) -> None:
        """Renew until the Lease cannot be renewed for `renew_deadline`; then set
        `lost` and return."""
        while True:
            await asyncio.sleep(self.retry_period)
            # A slow API server (a busy one) gets all the time the deadline leaves.
            left = self.renew_deadline - (self.clock() - self._last_renew)
            try:
                if await asyncio.wait_for(self._try(), timeout=max(left, self.retry_period)):
                    self._last_renew = self.clock()
                    continue
                log.error("%s: another replica took the Lease", self.identity)
            except (ApiError, TimeoutError) as e:
                if self.clock() - self._last_renew < self.renew_deadline:
                    log.warning("Lease not renewed (%s); retrying", e)
                    continue
                log.error("%s: Lease not renewed for %.0fs: stepping down",
                          self.identity, self.renew_deadline)
            self.leading = False
            self.lost.set()
            return

    async def release(self) -> None:
        """Give the Lease up (a clean stop), so a standby takes over at once."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = await self.kube.request("GET", self.path, retry=False)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            body = self._body(lease, int((lease.get("spec") or {}).get("leaseTransitions")
                                         or 0))
            body["spec"]["holderIdentity"] = ""
            body["spec"]["leaseDurationSeconds"] = 1
            await self.kube.request("PUT", self.path, body, retry=False)
        except ApiError as e:
            log.info("Lease not released: %s", e)
