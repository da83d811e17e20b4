"""Pods into memory: the cluster state (free capacity per node) and the gangs' pod counts.

A pod counts for an AppWrapper's gang only once its owner chain proves it (record/ownership.py);
until then its phase is kept, for an item adopted later may prove it. A gang's pod still
at the placement gate, or let onto a node and not bound yet, is remembered for the
placer (placement.py) and, after a restart, for rebuilding its gang's hold.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Set
from typing import Any

from dispatcher.api.labels import APPWRAPPER_LABEL
from dispatcher.cluster import BoundPod, bound_pod_from_object
from dispatcher.cluster.model import is_terminal
from dispatcher.controller.items.scaling import scaled_in
from dispatcher.controller.items.shaping import ours
from dispatcher.controller.record.memory import GatedPod, Memory
from dispatcher.controller.record.tracked import (
    ACTIVE,
    Bucket,
    Key,
    Tracked,
    held_by_job,
    key_of,
    pod_bucket,
)
from dispatcher.kinds import InvalidItem, PodConstraints, constraints_of
from dispatcher.resources import pod_request

from .placement import let_onto, token_key, token_of

log = logging.getLogger("dispatcher")


class PodIntake:
    def __init__(self, memory: Memory, requeues_due: Set[Key]) -> None:
        """`requeues_due`: dispatched wrappers to tear down and queue again (a pod of
        theirs that stops holding its node is owed nothing)."""
        self.memory = memory
        self.requeues_due = requeues_due
        # Pods whose owner chain is being looked up, and their phase (and whether a Job
        # controller still holds them) meanwhile.
        self._pending_buckets: dict[tuple[str, str], tuple[Bucket | None, bool]] = {}

    def on_pod(self, event: str, obj: Mapping[str, Any]) -> None:
        try:
            self._on_pod(event, obj)
        except Exception as e:  # one pod's error costs that pod, never the watch
            self._unreadable(obj, e)

    def _unreadable(self, obj: Mapping[str, Any], error: Exception) -> None:
        """A pod that could not be read (its requests, its rules) is left out: nothing is
        decided from it, its gate is not lifted, and while it is bound its node counts as
        having nothing free (what it takes there is not known)."""
        key = key_of(obj)
        spec = obj.get("spec") or {}
        node = spec.get("nodeName") if not is_terminal(obj) else None
        log.warning("pod %s/%s could not be read (%s: %s): left out%s", *key,
                    type(error).__name__, str(error)[:300],
                    f"; node {node} counts as full while it is there" if node else "")
        self._on_pod("DELETED", obj)
        self.memory.pods[key] = None  # known: a listing without it forgets it
        if node:
            self.memory.state.unreadable_pod(key, str(node))
        self.memory.wake.set()

    def _on_pod(self, event: str, obj: Mapping[str, Any]) -> None:
        key = key_of(obj)
        gone = event == "DELETED"
        labels = (obj.get("metadata") or {}).get("labels") or {}
        claim = labels.get(APPWRAPPER_LABEL)
        claimed: Key | None = (key[0], str(claim)) if claim else None
        self._take_pin(key, obj, claimed)
        self._gate_or_lift(key, obj, claimed, gone)
        if gone or is_terminal(obj):
            self.memory.state.unpin(key)  # ended without binding: its room is not its any more
        owner = self._remember(key, obj, claimed, gone)
        changed = self._bind(key, obj, owner, gone)
        if claimed is not None:
            self.memory.attention.touch(claimed)
            t = self.memory.tracked.get(claimed)
            if t is not None:
                bucket = pod_bucket(dict(obj)) if owner is not None else None
                changed |= self._count(t, key[1], bucket, held_by_job(obj))
                if owner is not None and t.phase == "done" and t.teardown_due:
                    changed = True  # pods of a failed gang appeared: tear it down again
        if changed:
            self.memory.wake.set()

    def _take_pin(self, key: Key, obj: Mapping[str, Any], claimed: Key | None) -> None:
        token = token_of(obj)
        pinned = None if token is None else token_key(key[0], token)
        if (pinned is not None and claimed is not None and pinned in self.memory.pin_tokens
                and self.memory.state.repin(pinned, key, claimed)):
            # Pinned by the pod webhook as it was created: its pin now goes by its name
            # (only a pod of the gang it was made for takes it: the annotation is anyone's
            # to write; a pin no pod took lapses).
            del self.memory.pin_tokens[pinned]
            self.memory.lifted.pop(pinned, None)
            self.memory.pods_pinned["created"] += 1

    def _gate_or_lift(self, key: Key, obj: Mapping[str, Any], claimed: Key | None,
                      gone: bool) -> None:
        """A gang's pod still gated (placement.py), or let onto a node and not bound."""
        gated = None if gone or claimed is None else gated_pod(obj, claimed)
        if gated is not None:
            self.memory.gated[key] = gated
        else:
            self.memory.gated.pop(key, None)  # its pin, if any, stays until it binds
        lifted = None if gone or claimed is None or gated is not None else _lifted(obj)
        if (lifted is not None and claimed is not None and self.memory.state.pinned(key) is None
                and self.memory.ownership.disproves(obj, claimed)):
            lifted = None  # its label is all it has: it holds no room of the gang's
        if lifted is None:
            self.memory.lifted.pop(key, None)
            return
        assert claimed is not None
        self.memory.lifted[key] = (claimed, *lifted)
        t = self.memory.tracked.get(claimed)
        if t is not None and t.phase == "running" and self.memory.state.pinned(key) is None:
            self.memory.hold_again(t)  # let go by an earlier run: hold its room again
        strand(self.memory, claimed, lifted[0])

    def _remember(self, key: Key, obj: Mapping[str, Any], claimed: Key | None,
                  gone: bool) -> Key | None:
        """The pod in memory (or out of it); the wrapper it is proven to belong to."""
        if gone:
            self.memory.pods.pop(key, None)
            if self.memory.leftovers:
                self.memory.pod_gone(key)
            self.memory.ownership.drop_pod(key)
            self._pending_buckets.pop(key, None)
            return None
        self.memory.pods[key] = claimed
        if claimed is None or not self._counts_pods(claimed):
            return None
        proven = self.memory.ownership.owner_of(obj, claimed)
        owner = proven if isinstance(proven, tuple) and proven == claimed else None
        if owner is None:
            # Not proven yet, or not by what is known now: an item adopted later
            # (after a restart) may prove it; keep its phase for then.
            self._pending_buckets[key] = (pod_bucket(dict(obj)), held_by_job(obj))
        else:
            self._pending_buckets.pop(key, None)
        return owner

    def _bind(self, key: Key, obj: Mapping[str, Any], owner: Key | None, gone: bool) -> bool:
        """The pod's place in the cluster state; whether it changed."""
        bound = None if gone else bound_pod_from_object(obj)
        if bound is not None:
            # Only a proven member takes a planned pod off its gang's reservation.
            bound = dataclasses.replace(bound, appwrapper=owner[1] if owner else None)
        before = self.memory.state.pod(key)
        if before == bound and not self.memory.state.unreadable(key):
            return False
        self.memory.state.upsert_pod(key, bound)
        if bound is None and before is not None:
            self._lost(before, (obj.get("status") or {}).get("phase"))
        return True

    def _lost(self, pod: BoundPod, phase: str | None) -> None:
        """A proven member stopped holding its node unfinished: whatever replaces it (the
        Job's next pod, the operator's restart) is owed the capacity it held, or a wrapper
        admitted meanwhile would find its promise taken (found by the node-deletion fault
        test: a lost pod's replacement left a newer gang half-bound)."""
        if phase == "Succeeded" or pod.appwrapper is None:
            return
        t = self.memory.tracked.get((pod.namespace, pod.appwrapper))
        if (t is None or t.phase not in ACTIVE or t.teardown_due
                or t.key in self.requeues_due or scaled_in(t, self.memory.state)):
            return
        self.memory.lost_pod(t, pod.request)

    def _counts_pods(self, claimed: Key) -> bool:
        """Only a gang that is dispatched, running or being torn down counts its pods
        (a finished or queued one needs no proof of what is left of it)."""
        t = self.memory.tracked.get(claimed)
        return t is not None and (t.phase in ACTIVE or t.teardown_due)

    def _count(self, t: Tracked, pod: str, bucket: Bucket | None,
               held: bool = False) -> bool:
        before = t.pods.get(pod)
        if bucket is None:
            t.pods.pop(pod, None)
        else:
            t.pods[pod] = bucket
        was_held = pod in t.reading.unsettled
        if held and bucket in ("succeeded", "failed"):
            t.reading.unsettled.add(pod)
        else:
            t.reading.unsettled.discard(pod)
        if bucket != before:
            # What a wrapped object reports changes when a pod of it ends or goes, not
            # when one starts (a read per start would be a GET per pod). A success while
            # others of the gang still wait or run is read with the last of them to end
            # (an object that finished early on a success ends or removes the rest, which
            # is read): one read per gang, not one per pod. Nor while a Job controller
            # still holds an ended pod: read when it lets go.
            if bucket == "failed" or bucket is None or (
                    bucket == "succeeded" and not t.counts().active and not t.reading.unsettled):
                t.reading.stale = True
            return True
        if was_held and not t.reading.unsettled and not t.counts().active:
            # The Job controller let go of the last ended pod (it counted it, removed its
            # finalizer, and writes the Job's status next): read it now; if that status
            # is not there yet, the quick re-read (reading.soon) finds it.
            t.reading.stale = True
            return True
        return False

    def proven(self, decided: Mapping[tuple[str, str], Key | None]) -> None:
        """Owner lookups finished (in the loop): count the pods now proven."""
        for key, owner in decided.items():
            if owner is None:
                continue  # its phase stays kept: a later item may still prove it
            bucket, held = self._pending_buckets.pop(key, (None, False))
            bound = self.memory.state.pod(key)
            if bound is not None:
                self.memory.state.upsert_pod(key, dataclasses.replace(bound, appwrapper=owner[1]))
            self.memory.attention.touch(owner)
            t = self.memory.tracked.get(owner)
            if t is not None:
                self._count(t, key[1], bucket, held)
        self.memory.wake.set()

    def relisted(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """A complete listing of pods: those not in it any more are gone."""
        listed = list(objs)
        present = {key_of(o) for o in listed}
        for key in [k for k in self.memory.pods if k not in present]:
            labels = _claim_labels(self.memory.pods[key])
            self.on_pod("DELETED", {"metadata": {"namespace": key[0], "name": key[1],
                                                 "labels": labels}})
        for o in listed:
            self.on_pod("ADDED", o)


def strand(memory: Memory, claimed: Key, node: str) -> None:
    """A pod let onto `node` that is gone can never bind: a gang not running yet is
    requeued at once (runtime), not left waiting for its requeuing timer."""
    t = memory.tracked.get(claimed)
    if t is not None and t.phase == "dispatched" and node not in memory.state.nodes:
        t.room.stranded = "a pod of it was let onto a node that went away before it was bound"


def _claim_labels(claimed: Key | None) -> dict[str, str]:
    return {APPWRAPPER_LABEL: claimed[1]} if claimed is not None else {}


def gated_pod(obj: Mapping[str, Any], claimed: Key) -> GatedPod | None:
    """The pod as waiting at the placement gate, or None: it carries no such gate."""
    spec = obj.get("spec") or {}
    gates = spec.get("schedulingGates") or []
    if not any(ours(g) for g in gates):
        return None
    try:
        constraints: PodConstraints | None = constraints_of(spec)
    except InvalidItem:
        constraints = None
    return GatedPod(claimed, obj, dict(pod_request(spec)), constraints)


def _lifted(obj: Mapping[str, Any]) -> tuple[str, dict[str, int]] | None:
    """The node a pod was let onto and its request, while it is not bound and not
    finished; None otherwise."""
    spec = obj.get("spec") or {}
    if spec.get("nodeName") or is_terminal(obj):
        return None
    node = let_onto(spec)
    return None if node is None else (node, dict(pod_request(spec)))
