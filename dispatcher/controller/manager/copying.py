"""The manager's writes about its copies: each made in its worker, the strays deleted, and
the copies' Events mirrored to the manager's wrappers (each once: a copy's Event makes an
Event of a fixed name on the wrapper, so a restarted manager is refused a second)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from typing import Any

from dispatcher.api.labels import CLUSTER_LABEL, MANAGER_UID_LABEL
from dispatcher.controller.kube.client import ApiError, Kube
from dispatcher.controller.record.status import APPWRAPPERS, EVENTS
from dispatcher.fleet import copies as rules

from .workers import WorkerLink, ensure_namespace

log = logging.getLogger("dispatcher.manager")


def refused(e: ApiError) -> bool:
    """The worker said no to this copy, and would again: its webhook denied it, or the
    API server found it invalid. Not a refusal: the manager's account lacking the right
    to create AppWrappers at all (RBAC: the same for every copy, a worker to fix, logged
    and tried again) or an overloaded server."""
    if e.status == 403:
        return "cannot create resource" not in e.message
    return e.status in (400, 422)


class Copying:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube  # the manager's API server: the mirrored Events go there
        #: Per sent wrapper (manager uid): the uids of its copy's Events mirrored already.
        self.mirrored: dict[str, set[str]] = {}

    def keep_only(self, sent: dict[str, dict[str, Any]]) -> None:
        """Forget the mirrored Events of wrappers no longer sent."""
        self.mirrored = {uid: seen for uid, seen in self.mirrored.items() if uid in sent}

    def pending(self, link: WorkerLink, obj: dict[str, Any], copy: dict[str, Any]) -> bool:
        """Whether the copy has Events not mirrored yet."""
        assert link.look is not None
        if copy["metadata"].get("deletionTimestamp"):
            return False
        seen = self.mirrored.get(obj["metadata"]["uid"], set())
        return any(uid not in seen for uid in link.look.events_by_object.get(
            copy["metadata"]["uid"], {}))

    async def mirror_events(self, link: WorkerLink, obj: dict[str, Any],
                            copy: dict[str, Any]) -> None:
        """The copy's Events not mirrored yet, posted on the manager's wrapper."""
        assert link.look is not None
        meta = obj["metadata"]
        if (copy["metadata"].get("labels") or {}).get(MANAGER_UID_LABEL) != meta["uid"]:
            return
        seen = self.mirrored.setdefault(meta["uid"], set())
        for event in rules.new_events(link.look.events_of(copy["metadata"]["uid"]),
                                       copy["metadata"]["uid"], seen):
            try:
                await self.kube.request("POST", EVENTS.path(meta["namespace"]),
                                        rules.mirrored_event(event, link.name, obj))
            except ApiError as e:
                if e.status != 409:  # 409: mirrored before this manager started
                    log.info("event of %s/%s from %s not mirrored: %s", meta["namespace"],
                             meta["name"], link.name, e)
                    continue
            seen.add(event["metadata"]["uid"])

    async def make(self, link: WorkerLink, obj: dict[str, Any]) -> str | None:
        """The copy of the sent wrapper in its worker (one made already is adopted).
        Returns the worker's reason when it refused the copy for good (its admission
        webhook, or the API server's validation): making it again would be refused again."""
        meta = obj["metadata"]
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != CLUSTER_LABEL}
        body = {
            "apiVersion": obj.get("apiVersion", APPWRAPPERS.api_version),
            "kind": "AppWrapper",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                         "labels": {**labels, MANAGER_UID_LABEL: meta["uid"]},
                         "annotations": dict(meta.get("annotations") or {})},
            "spec": obj["spec"],
        }
        path = APPWRAPPERS.path(meta["namespace"])
        try:
            try:
                await link.kube.request("POST", path, body)
            except ApiError as e:
                if e.status != 404:
                    raise
                await ensure_namespace(link.kube, meta["namespace"])
                await link.kube.request("POST", path, body)
        except ApiError as e:
            if e.status == 409:
                return None  # made already: the next look adopts it
            if refused(e):
                log.warning("worker cluster %s refused the copy of %s/%s: %s", link.name,
                            meta["namespace"], meta["name"], e)
                return e.message or str(e)
            log.warning("copy of %s/%s in %s not made yet: %s", meta["namespace"],
                        meta["name"], link.name, e)
            return None
        log.info("%s/%s copied to worker cluster %s", meta["namespace"], meta["name"],
                 link.name)
        return None

    async def delete_strays(self, link: WorkerLink, sent_to: Mapping[str, str],
                            passes: int) -> None:
        """Every copy in the worker, if it answers, whose wrapper is not sent there now
        (`sent_to`: the target of each sent wrapper, by its uid)."""
        if not link.reachable or link.look is None:
            return
        for (namespace, name), uid in rules.strays(link.look.copies, link.name, sent_to):
            log.info("pass %d: deleting copy %s/%s in worker cluster %s: its wrapper "
                     "is no longer sent there", passes, namespace, name, link.name)
            with contextlib.suppress(ApiError):
                await link.kube.request(
                    "DELETE", APPWRAPPERS.path(namespace, name),
                    {"preconditions": {"uid": uid}, "propagationPolicy": "Background"})
