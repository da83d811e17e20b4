"""What the dispatcher follows of an AppWrapper it tracks, worked out at intake: when it
arrived, the status it carries, its gang's pods and the items it reads, and the timers of
a v1beta2 wrapper that ended."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from dispatcher.api.conditions import latest
from dispatcher.api.models import AppWrapper, AppWrapperStatus
from dispatcher.controller.items.scaling import follow_size
from dispatcher.controller.record.tracked import Tracked
from dispatcher.kinds.checks import pods_made
from dispatcher.kinds.completion import deciding_items
from dispatcher.lifecycle import Timing, fault_tolerance_for
from dispatcher.queue import QueuedWrapper


def first_seen(recorded: datetime | None, created: datetime | None, now: float) -> float:
    """The queue's arrival time. creationTimestamp has whole seconds only, so wrappers
    created within one second would tie (and be ordered by uid); within its creation
    second, the moment this dispatcher first saw it keeps the order they arrived in."""
    if recorded is not None:
        return recorded.timestamp()
    if created is None:
        return now
    second = created.timestamp()
    return min(max(now, second), second + 0.999_999)


def status_of(obj: Mapping[str, Any]) -> AppWrapperStatus:
    try:
        return AppWrapperStatus.model_validate(obj.get("status") or {})
    except ValueError:
        return AppWrapperStatus()


def follow(t: Tracked, aw: AppWrapper, queued: QueuedWrapper, timing: Timing) -> None:
    """What the dispatcher follows of it: its queue entry, pods, items with an outcome."""
    t.queued = queued
    t.expected_pods = sum(g.pod_set.count for g in queued.gang)
    t.made_pods, t.pods_countable = pods_made(aw)
    follow_size(t)  # an elastic gang's pods follow its size
    t.completable = deciding_items(
        [(item.generictemplate, item.completionstatus)
         for item in aw.spec.resources.GenericItems])
    t.written_as_v1beta2 = fault_tolerance_for(aw.metadata.annotations,
                                               timing) is not None
    t.watched = tuple(range(len(aw.spec.resources.GenericItems))) \
        if t.written_as_v1beta2 else t.completable


def set_ended_timers(t: Tracked, annotations: Mapping[str, str], timing: Timing) -> None:
    """A v1beta2 wrapper's timers once it ended, from when it ended: the deletion of
    a succeeded one (its success TTL), the teardown of a failed one (its
    deletion-on-failure grace)."""
    ft = fault_tolerance_for(annotations, timing)
    last = latest(t.status.conditions)
    stamp = last.lastTransitionMicroTime if last is not None else None
    if ft is None or stamp is None:
        return
    if t.status.state == "Completed":
        t.timers.delete_at = stamp.timestamp() + ft.success_ttl
    elif t.teardown_due and ft.deletion_on_failure_grace:
        t.timers.teardown_at = stamp.timestamp() + ft.deletion_on_failure_grace
