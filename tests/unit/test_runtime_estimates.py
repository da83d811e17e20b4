"""Start estimates in the controller, on an in-memory API: what a waiting wrapper's status
says of its start, that estimates do not turn into a stream of writes, the history of
durations rebuilt from Completed AppWrappers, and the error metric once a wrapper starts.
The estimator itself: tests/unit/test_eta.py."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from dispatcher.api.durations import EXPECTED_DURATION_ANNOTATION
from dispatcher.controller.kube.client import Resource
from dispatcher.controller.loop.estimate_round import EstimateSettings
from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.controller.metrics.prometheus import PrometheusObserver
from dispatcher.controller.record.tracked import now_dt
from dispatcher.policy_files import load_policy
from dispatcher.queue import Policy

from .fake_kube import FakeKube
from .test_metrics import scrape, value
from .test_runtime import FIFO, Clock, appwrapper, aw_status, created_job, job, node, pod, run

APPWRAPPERS = Resource("workload.codeflare.dev/v1beta1", "AppWrapper", "appwrappers", True)
# T0 of test_runtime is 2027-01-15T08:00:00Z.


async def start(kube: FakeKube, clock: Clock, observer: PrometheusObserver | None = None,
                settings: EstimateSettings | None = None) -> Dispatcher:
    """A dispatcher that has listed the cluster, as `dispatcher run` does after a start."""
    d = Dispatcher(kube, FIFO, clock=clock, observer=observer,  # type: ignore[arg-type]
                   estimates=settings or EstimateSettings())
    d.relisted("Node", await kube.list(Resource("v1", "Node", "nodes", False)))
    d.relisted("AppWrapper", await kube.list(APPWRAPPERS))
    d.relisted("Pod", await kube.list(Resource("v1", "Pod", "pods", True)))
    return d


async def settle(d: Dispatcher, clock: Clock, seconds: float = 10.0) -> None:
    """A cycle, its round of estimates, then `seconds` later a cycle that writes them."""
    await d.cycle()
    await d.estimates.wait()
    clock.now += seconds
    await d.cycle()


def annotated(aw: dict[str, Any], seconds: str) -> dict[str, Any]:
    aw["metadata"]["annotations"] = {EXPECTED_DURATION_ANNOTATION: seconds}
    return aw


async def behind_an_hour(kube: FakeKube, clock: Clock, *more: dict[str, Any]) -> Dispatcher:
    """One 8-GPU node; `first` (8 GPUs) says it runs an hour and is dispatched, `second`
    (8 GPUs) and then `more` wait; their estimates are written."""
    kube.put(node("n1"))
    kube.put(annotated(appwrapper("first", job("first", 2, 4), created=1), "3600"))
    kube.put(appwrapper("second", job("second", 2, 4), created=2))
    for aw in more:
        kube.put(aw)
    d = await start(kube, clock)
    await settle(d, clock)
    return d


def test_a_waiting_wrapper_is_told_when_it_will_start() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("first", job("first", 2, 4), created=1,
                            schedulingSpec={"dispatchDuration": {"expected": 7800}}))
        kube.put(appwrapper("second", job("second", 2, 4), created=2))
        kube.put(appwrapper("huge", job("huge", 1, 16), created=3))
        d = await start(kube, clock)
        await settle(d, clock)
        second = aw_status(kube, "second")
        assert second["estimatedStart"] == "2027-01-15T10:10:00Z"
        # first's pods are not bound yet: its room is held, not lacking.
        assert second["message"] == (
            "InsufficientResources: the room it needs is held for gangs dispatched but not "
            "running yet, or for preemptors: needs 8 nvidia.com/gpu, 0 nvidia.com/gpu free "
            "and 8 nvidia.com/gpu held; estimated start in about 2h10m (at 10:10 UTC)")
        assert second["conditions"][-1]["message"] == second["message"]
        # A wrapper that cannot fit this cluster gets no estimate, only its reason.
        huge = aw_status(kube, "huge")
        assert "estimatedStart" not in huge and "estimated" not in huge["message"]
        assert "estimatedStart" not in aw_status(kube, "first")

    run(scenario)


def test_estimates_do_not_rewrite_status_while_nothing_changes() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d = await behind_an_hour(kube, clock)
        assert aw_status(kube, "second")["estimatedStart"] == "2027-01-15T09:00:00Z"
        writes = kube.status_writes("second")
        # The first gang's pods start: the room second waits for is no longer held for
        # a gang not running yet but used (its message says so, once: a minor write).
        j = created_job(kube, "first")
        d.on_pod("ADDED", pod("first", "first-0", "n1", "Running", 4, j))
        d.on_pod("ADDED", pod("first", "first-1", "n1", "Running", 4, j))
        # Ten minutes of cycles and rounds of estimates: the estimate stays, and nothing
        # else is written.
        for _ in range(20):
            await settle(d, clock, 30.0)
        assert aw_status(kube, "first")["state"] == "Running"
        assert d.estimates.rounds >= 20
        assert "held" not in aw_status(kube, "second")["message"]
        assert kube.status_writes("second") == writes + 1
        writes = kube.status_writes("second")
        # The first says it needs 30 s more: less than the threshold, still nothing.
        first = kube.get("workload.codeflare.dev/v1beta1", "AppWrapper", "team", "first")
        assert first is not None
        edited = annotated(first, "3630")
        d.on_appwrapper("MODIFIED", kube.put(edited))
        await settle(d, clock)
        assert kube.status_writes("second") == writes
        # Two hours more: that is news for the second, written once.
        d.on_appwrapper("MODIFIED", kube.put(annotated(edited, "10800")))
        await settle(d, clock)
        await settle(d, clock)
        assert kube.status_writes("second") == writes + 1
        second = aw_status(kube, "second")
        assert second["estimatedStart"] == "2027-01-15T11:00:00Z"
        assert "estimated start in about 2h50m (at 11:00 UTC)" in second["message"]

    run(scenario)


def test_an_estimate_shown_while_a_status_write_is_under_way_is_written_after_it() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 16)))
        d = await start(kube, clock)
        t = d.tracked[("team", "a")]
        answer = asyncio.Event()
        request = kube.request

        async def slow(method: str, path: str, body: Any = None, **kw: Any) -> Any:
            if method == "PATCH":
                await answer.wait()
            return await request(method, path, body, **kw)

        kube.request = slow  # type: ignore[method-assign]
        write = asyncio.create_task(d.writer.write(t, clock.now, force=True))
        await asyncio.sleep(0)  # the PATCH is on its way
        t.status.estimatedStart = now_dt(clock.now + 600)  # as a round of estimates does
        d.writer.owe(t)
        answer.set()
        await write
        assert "estimatedStart" not in aw_status(kube, "a")
        assert t.writes.minor_due_at is not None  # still owed: written once due
        clock.now += 10
        due_at = d.writer.due_at(t)
        assert due_at is not None and clock.now >= due_at
        await d.writer.write(t, clock.now)
        assert aw_status(kube, "a")["estimatedStart"] == "2027-01-15T08:10:00Z"

    run(scenario)


def test_a_restart_rewrites_no_estimate_that_still_holds() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d = await behind_an_hour(kube, clock, appwrapper("third", job("third", 1, 1), created=3))
        # first's pods are made and bound (not running yet): without them it would be
        # requeued for having none, and what second waits for would change meanwhile.
        j = created_job(kube, "first")
        for i in range(2):
            d.on_pod("ADDED", kube.put(pod("first", f"first-{i}", "n1", "Pending", 4, j)))
        await settle(d, clock, 61.0)
        shown = {n: aw_status(kube, n) for n in ("second", "third")}
        assert all("estimated start in about" in st["message"] for st in shown.values())
        await d.stop()
        clock.now += 30
        sent: list[tuple[str, dict[str, Any]]] = []
        request = kube.request

        async def recorded(method: str, path: str, body: Any = None, **kw: Any) -> Any:
            if method == "PATCH" and path.endswith("/status"):
                sent.append((path.split("/")[-2], body["status"]))
            return await request(method, path, body, **kw)

        kube.request = recorded  # type: ignore[method-assign]
        again = await start(kube, clock)  # a new process lists the cluster
        for _ in range(3):
            await settle(again, clock, 30.0)
        assert again.estimates.rounds >= 3
        # `first` finds no pods after the restart and is requeued ahead of them: their
        # queue positions move, and nothing else.
        moved = {"queuePosition", "quotaPositions"}
        for name, body in sent:
            if name in shown:
                assert {k: v for k, v in body.items() if k not in moved and v is not None} \
                    == {k: v for k, v in shown[name].items() if k not in moved}
        assert {n: aw_status(kube, n) for n in shown} == shown

    run(scenario)


def test_the_estimate_error_is_measured_when_the_wrapper_starts() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(annotated(appwrapper("first", job("first", 1, 8), created=1), "3600"))
        kube.put(appwrapper("second", job("second", 1, 8), created=2))
        observer = PrometheusObserver()
        # One round only: the estimates measured are those of the first 20 minutes.
        d = await start(kube, clock, observer, EstimateSettings(interval=3600))
        await settle(d, clock)
        assert aw_status(kube, "second")["estimatedStart"] == "2027-01-15T09:00:00Z"
        # The first finishes after 20 minutes, 40 minutes early: the second starts then.
        j = created_job(kube, "first")
        j["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        d.on_pod("ADDED", pod("first", "first-0", "n1", "Succeeded", 8, j))
        clock.now = 1_800_000_000.0 + 1200
        await d.cycle()
        await d.cycle()
        second = aw_status(kube, "second")
        assert second["conditions"][-1]["type"] == "Dispatched"
        assert "estimatedStart" not in second  # cleared in the Dispatched write
        m = scrape(observer)
        for which in ("initial", "shown"):
            assert value(m, "dispatcher_start_estimate_error_seconds_count",
                         estimate=which) == 1
            assert value(m, "dispatcher_start_estimate_error_seconds_sum",
                         estimate=which) == 2400

    run(scenario)


def completed(name: str, gpus: int, dispatched: str, done: str) -> dict[str, Any]:
    aw = appwrapper(name, job(name, 1, gpus))
    aw["status"] = {"state": "Completed", "queuejobstate": "Completed", "conditions": [
        {"type": "Dispatched", "reason": "AppWrapperRunnable",
         "lastTransitionMicroTime": dispatched, "lastUpdateMicroTime": dispatched},
        {"type": "Completed", "reason": "PodsCompleted",
         "lastTransitionMicroTime": done, "lastUpdateMicroTime": done}]}
    return aw


def test_durations_are_learnt_from_completed_appwrappers_after_a_restart() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        # Two that ran 10 and 20 minutes with the same shape (1 pod of 8 GPUs), one of
        # another shape that ran for a day.
        kube.put(completed("old-1", 8, "2027-01-14T07:00:00.000000Z",
                           "2027-01-14T07:10:00.000000Z"))
        kube.put(completed("old-2", 8, "2027-01-14T08:00:00.000000Z",
                           "2027-01-14T08:20:00.000000Z"))
        kube.put(completed("old-big", 4, "2027-01-13T08:00:00.000000Z",
                           "2027-01-14T08:00:00.000000Z"))
        kube.put(appwrapper("first", job("first", 1, 8), created=1))
        kube.put(appwrapper("second", job("second", 1, 8), created=2))
        kube.put(appwrapper("third", job("third", 1, 8), created=3))
        d = await start(kube, clock)
        await settle(d, clock)
        # first: the median of those that ran longer than it has (nothing yet): 15 m;
        # second then 15 m more.
        assert aw_status(kube, "second")["estimatedStart"] == "2027-01-15T08:15:00Z"
        assert aw_status(kube, "third")["estimatedStart"] == "2027-01-15T08:30:00Z"
        assert len(d.estimates.history) == 3

    run(scenario)


def test_dispatcher_run_takes_the_estimate_flags(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from .test_kube_client import run_settings

    (settings,) = run_settings(monkeypatch, "--estimate-interval", "30", "--default-duration",
                               "600", "--estimate-horizon", "86400")
    assert settings.estimates.interval == 30
    assert settings.estimates.rule.default_seconds == 600
    assert settings.estimates.limits.horizon_seconds == 86400
    assert run_settings(monkeypatch, "--estimate-interval", "-1", "--default-duration", "0") == []
    err = capsys.readouterr().err
    assert "--estimate-interval must be ≥ 0" in err
    assert "--default-duration must be a number of seconds above 0" in err


# --- backfill with reservations (`backfill: reserve`) --------------------------------

async def behind_a_reserved_gang(kube: FakeKube, clock: Clock, policy: Policy,
                                 *more: dict[str, Any]) -> Dispatcher:
    """Three 8-GPU nodes; `first` takes one for 10 minutes, `big` needs all three, then
    `more`; the cycle and its statuses written."""
    for name in ("n1", "n2", "n3"):
        kube.put(node(name))
    kube.put(annotated(appwrapper("first", job("first", 2, 4), created=1), "600"))
    kube.put(appwrapper("big", job("big", 6, 4), created=2))
    for aw in more:
        kube.put(aw)
    d = Dispatcher(kube, policy, clock=clock,  # type: ignore[arg-type]
                   estimates=EstimateSettings())
    d.relisted("Node", await kube.list(Resource("v1", "Node", "nodes", False)))
    d.relisted("AppWrapper", await kube.list(APPWRAPPERS))
    await settle(d, clock)
    return d


def test_the_controller_reserves_for_the_head_and_backfills_only_what_ends_before() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        await behind_a_reserved_gang(
            kube, clock, load_policy("reserve"),
            annotated(appwrapper("long", job("long", 2, 4), created=3), "7200"),
            annotated(appwrapper("short", job("short", 2, 4), created=4), "60"))
        assert aw_status(kube, "first")["state"] == "Running"
        assert aw_status(kube, "short")["state"] == "Running"
        assert aw_status(kube, "big")["message"].startswith(
            "InsufficientResources: reserved: starts at 08:10:00 UTC on nodes n1, n2, n3; ")
        assert aw_status(kube, "long")["message"].startswith(
            "WaitingForReservation: fits now only on nodes reserved for team/big, which is "
            "to start at 08:10:00 UTC on n1, n2, n3, and is expected to run past that")
        assert aw_status(kube, "long").get("state") != "Running"

    run(scenario)


def test_a_backfill_that_overruns_the_policys_backfill_limit_fails() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        policy = dataclasses.replace(load_policy("reserve"), backfill_limit_seconds=120)
        d = await behind_a_reserved_gang(
            kube, clock, policy,
            annotated(appwrapper("short", job("short", 2, 4), created=4), "60"))
        assert aw_status(kube, "short")["state"] == "Running"
        for name, where in (("first", "n1"), ("short", "n2")):
            j = created_job(kube, name)
            for i in range(2):
                d.on_pod("ADDED", kube.put(pod(name, f"{name}-{i}", where, "Running", 4, j)))
        await d.cycle()  # their pods run
        clock.now += 200
        for _ in range(3):
            await d.cycle()
            await asyncio.sleep(0)
        short, first = aw_status(kube, "short"), aw_status(kube, "first")
        reasons = [c["reason"] for c in short["conditions"]]
        assert "DispatchDeadlineExceeded" in reasons
        ended = next(c for c in short["conditions"] if c["reason"] == "DispatchDeadlineExceeded")
        assert "backfillLimitSeconds" in ended["message"]
        assert first["state"] == "Running"  # not a backfill: no such limit

    run(scenario)


def test_a_backfill_past_the_limit_is_requeued_when_the_policy_says_so() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        policy = dataclasses.replace(load_policy("reserve"), backfill_limit_seconds=120,
                                     backfill_limit_action="requeue")
        d = await behind_a_reserved_gang(
            kube, clock, policy,
            annotated(appwrapper("short", job("short", 2, 4), created=4), "60"))
        j = created_job(kube, "short")
        for i in range(2):
            d.on_pod("ADDED", kube.put(pod("short", f"short-{i}", "n2", "Running", 4, j)))
        await d.cycle()
        clock.now += 200
        for _ in range(3):
            await d.cycle()
            await asyncio.sleep(0)
        short = aw_status(kube, "short")
        ended = next(c for c in short["conditions"] if c["reason"] == "DispatchDeadlineExceeded")
        assert ended["type"] == "PreemptCandidate"
        assert ended["message"].endswith("(the policy's backfillLimitSeconds: it was dispatched "
                                         "as a backfill): torn down and queued again")
        assert short["numberOfRequeueings"] == 1
        assert short["state"] != "Failed"

    run(scenario)
