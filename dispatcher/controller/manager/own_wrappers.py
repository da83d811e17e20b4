"""The manager's own AppWrappers, kept in memory by a watch (the controller's informer):
a pass reads them without listing thousands every second. While the watch is down the
view may have a gap, so a pass is not made (it would decide on a view that misses
changes); the informer resumes or lists again by itself."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from dispatcher.controller.kube.client import ApiError, Kube
from dispatcher.controller.kube.informer import Informer
from dispatcher.controller.record.status import APPWRAPPERS

#: How long a pass waits for the first listing before it is cut short (and tried again).
FIRST_LISTING_SECONDS = 30.0


class OwnWrappers:
    def __init__(self, kube: Kube) -> None:
        self.objects: dict[str, dict[str, Any]] = {}  # uid -> AppWrapper
        self.informer = Informer(kube, APPWRAPPERS, self._on_event, self._on_listed)
        self._task: asyncio.Task[None] | None = None

    async def current(self) -> list[dict[str, Any]]:
        """Every AppWrapper of the manager cluster as last seen; raises ApiError while
        the view cannot be trusted (not listed yet, or its watch down)."""
        if self._task is None:
            self._task = asyncio.create_task(self.informer.run(), name="manager-appwrappers")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.informer.listed.wait(), FIRST_LISTING_SECONDS)
        blind = self.informer.blind_reason()
        if blind is not None:
            raise ApiError(0, "NotWatching", f"the manager's own {blind}")
        return list(self.objects.values())

    def written(self, obj: dict[str, Any], status: Mapping[str, Any],
                answer: Mapping[str, Any] | None) -> None:
        """A status write that succeeded: the view says so until the watch brings it (the
        next pass must neither write it again nor fence a write on the version before)."""
        obj["status"] = {**(obj.get("status") or {}), **status}
        version = ((answer or {}).get("metadata") or {}).get("resourceVersion")
        if version:
            obj["metadata"]["resourceVersion"] = version

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def _on_event(self, kind: str, obj: Mapping[str, Any]) -> None:
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        if kind == "DELETED":
            self.objects.pop(uid, None)
        else:
            self.objects[uid] = dict(obj)

    def _on_listed(self, items: list[dict[str, Any]]) -> None:
        self.objects = {str(o["metadata"].get("uid") or ""): o for o in items}
