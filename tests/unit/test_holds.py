"""Hold, release and cancel, as the controller carries them out: a held AppWrapper stays
queued and is never dispatched, released it is back in its place; a cancelled one fails
for good and what it created goes."""

from __future__ import annotations

import copy
from typing import Any

from dispatcher.api.labels import CANCELLED_BY_ANNOTATION, HELD_BY_ANNOTATION
from dispatcher.controller.loop.runtime import Dispatcher

from .fake_kube import FakeKube
from .test_runtime import Clock, appwrapper, aw_status, job, node, run, started, types

AW = "workload.codeflare.dev/v1beta1"


def annotate(kube: FakeKube, d: Dispatcher, name: str, **annotations: str | None) -> None:
    """Set (a value) or remove (None) annotations, as `kubectl annotate` would."""
    obj = kube.get(AW, "AppWrapper", "team", name)
    assert obj is not None
    have = obj["metadata"].setdefault("annotations", {})
    for key, value in annotations.items():
        if value is None:
            have.pop(key, None)
        else:
            have[key] = value
    d.on_appwrapper("MODIFIED", copy.deepcopy(obj))


def delete(kube: FakeKube, d: Dispatcher, name: str) -> None:
    obj = kube.objects.pop(f"/apis/{AW}/namespaces/team/appwrappers/{name}")
    d.on_appwrapper("DELETED", obj)


def last(kube: FakeKube, name: str) -> tuple[str, str, str]:
    c = aw_status(kube, name)["conditions"][-1]
    return c["type"], c["reason"], c["message"]


def hold(by: str) -> dict[str, Any]:
    return {HELD_BY_ANNOTATION: by}


def test_a_held_wrapper_is_not_dispatched_and_released_is_back_in_its_place() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        for i, name in enumerate(("blocker", "first", "second", "third"), start=1):
            kube.put(appwrapper(name, job(name, 1, 8), created=i))
        d = await started(kube, clock)
        await d.cycle()
        assert aw_status(kube, "first")["queuePosition"] == 1
        annotate(kube, d, "first", **hold("alice"))
        await d.cycle()
        assert last(kube, "first") == (
            "Queueing", "Held", "held by alice: it keeps its place in the queue and is not "
            "dispatched until released (kubectl appwrapper release first)")
        first = aw_status(kube, "first")
        assert first["state"] == "Pending" and "queuePosition" not in first
        # Room frees: the next one goes, not the held one.
        delete(kube, d, "blocker")
        clock.now += 1
        await d.cycle()
        assert types(kube, "second")[-1] == "Dispatched"
        assert kube.get("batch/v1", "Job", "team", "first") is None
        assert last(kube, "first")[1] == "Held"
        # Released: ahead of `third`, which came after it.
        annotate(kube, d, "first", **{HELD_BY_ANNOTATION: None})
        clock.now += 1
        await d.cycle()
        assert aw_status(kube, "first")["queuePosition"] == 1
        assert d.tracked[("team", "third")].status.queuePosition == 2
        assert last(kube, "first")[:2] == ("Backoff", "AppWrapperNotRunnable")

    run(scenario)


def test_a_cancelled_queued_wrapper_fails_for_good() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("blocker", job("blocker", 1, 8), created=1))
        kube.put(appwrapper("waiting", job("waiting", 1, 8), created=2))
        d = await started(kube, clock)
        await d.cycle()
        annotate(kube, d, "waiting", **{CANCELLED_BY_ANNOTATION: "alice"})
        await d.cycle()
        status = aw_status(kube, "waiting")
        assert status["state"] == "Failed" and "queuePosition" not in status
        assert last(kube, "waiting") == (
            "Failed", "Cancelled", "cancelled by alice: it will not be dispatched")
        # An edit of its spec does not bring it back, as it would a failed one.
        obj = kube.get(AW, "AppWrapper", "team", "waiting")
        assert obj is not None
        obj["spec"]["priority"] = 3
        obj["metadata"]["generation"] = 2
        d.on_appwrapper("MODIFIED", copy.deepcopy(obj))
        delete(kube, d, "blocker")
        clock.now += 1
        await d.cycle()
        assert aw_status(kube, "waiting")["state"] == "Failed"
        assert kube.get("batch/v1", "Job", "team", "waiting") is None

    run(scenario)


def test_a_cancelled_running_wrapper_fails_and_what_it_created_is_deleted() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("train", job("train", 1, 8), created=1))
        kube.put(appwrapper("next", job("next", 1, 8), created=2))
        d = await started(kube, clock)
        await d.cycle()
        assert kube.get("batch/v1", "Job", "team", "train") is not None
        annotate(kube, d, "train", **{CANCELLED_BY_ANNOTATION: "alice"})
        clock.now += 1
        await d.cycle()
        assert aw_status(kube, "train")["state"] == "Failed"
        assert last(kube, "train") == (
            "Failed", "Cancelled", "cancelled by alice: what it created is deleted")
        assert kube.get("batch/v1", "Job", "team", "train") is None
        # Its room is free: the next one goes.
        clock.now += 1
        await d.cycle()
        assert types(kube, "next")[-1] == "Dispatched"

    run(scenario)


def test_a_hold_set_before_the_dispatcher_starts_is_honoured() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        held = appwrapper("held", job("held", 1, 8), created=1)
        held["metadata"]["annotations"] = hold("")  # no name given
        kube.put(held)
        d = await started(kube, clock)
        await d.cycle()
        assert kube.get("batch/v1", "Job", "team", "held") is None
        assert last(kube, "held")[:2] == ("Queueing", "Held")
        assert last(kube, "held")[2].startswith("held by someone:")

    run(scenario)


def test_escapes_and_line_breaks_in_who_holds_or_cancels_never_reach_the_status() -> None:
    """A tenant's held-by and cancelled-by text is copied into the status message and
    the conditions, which `kubectl get -o wide` and describe print as they are: escape
    sequences and control characters are removed before it is written."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("blocker", job("blocker", 1, 8), created=1))
        kube.put(appwrapper("first", job("first", 1, 8), created=2))
        kube.put(appwrapper("second", job("second", 1, 8), created=3))
        d = await started(kube, clock)
        await d.cycle()
        annotate(kube, d, "first", **hold("\x1b[2J\x1b]8;;http://x\x07mallory\r\nOK\x9b1m"))
        annotate(kube, d, "second", **{CANCELLED_BY_ANNOTATION: "eve\x1b[8m\u202e"})
        await d.cycle()
        assert last(kube, "first")[2].startswith("held by mallory  OK1m: it keeps")
        assert aw_status(kube, "first")["message"].startswith("held by mallory  OK1m:")
        assert last(kube, "second")[2] == "cancelled by eve: it will not be dispatched"

    run(scenario)
