"""Client-side pacing: requests wait for tokens, the most urgent first."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from dispatcher.controller.kube.pacing import EVENT, STATUS, URGENT, TokenBucket

if TYPE_CHECKING:
    from dispatcher.controller.loop.runtime import Dispatcher

    from .fake_kube import FakeKube
    from .test_runtime import Clock


async def a_running_b_waiting(kube: FakeKube, clock: Clock) -> tuple[Dispatcher, dict[str, Any]]:
    """One 8-GPU node: "a" dispatched, its pod running; "b" (8 GPUs) waiting in Backoff.
    Returns the dispatcher and a's Job."""
    from .test_runtime import appwrapper, created_job, job, node, pod, started, types

    kube.put(node("n1", gpus=8))
    kube.put(appwrapper("a", job("a", 1, 8), created=1))
    kube.put(appwrapper("b", job("b", 1, 8), created=2))
    d = await started(kube, clock)
    await d.cycle()
    assert types(kube, "b")[-1] == "Backoff"
    j = created_job(kube, "a")
    d.on_pod("ADDED", pod("a", "a-0", "n1", "Running", 8, j))
    return d, j


def test_waiting_dispatches_go_before_waiting_status_writes_and_events() -> None:
    async def scenario() -> list[str]:
        bucket = TokenBucket(qps=200, burst=1)
        order: list[str] = []

        async def request(name: str, priority: int) -> None:
            await bucket.take(priority)
            order.append(name)

        # A wave's Events and status writes are waiting when the next wave's dispatches
        # (a Dispatched write, then its items) arrive.
        tasks = [asyncio.create_task(request(f"event-{i}", EVENT)) for i in range(3)]
        tasks += [asyncio.create_task(request(f"status-{i}", STATUS)) for i in range(3)]
        await asyncio.sleep(0)
        tasks += [asyncio.create_task(request(f"dispatch-{i}", URGENT)) for i in range(3)]
        await asyncio.gather(*tasks)
        return order

    order = asyncio.run(scenario())
    # The first event had the burst token and the second was already waiting for the
    # next one; the rest wait in priority order, FIFO within a priority.
    assert order == ["event-0", "event-1", "dispatch-0", "dispatch-1", "dispatch-2",
                     "status-0", "status-1", "status-2", "event-2"]


def test_a_cancelled_waiter_does_not_stall_the_ones_behind_it() -> None:
    async def scenario() -> int:
        bucket = TokenBucket(qps=100, burst=1)
        done = 0

        async def request() -> None:
            nonlocal done
            await bucket.take(STATUS)
            done += 1

        # The first takes the burst token, the second waits for the next token, the
        # others queue; one queued and the one waiting for its token are cancelled.
        tasks = [asyncio.create_task(request()) for _ in range(5)]
        await asyncio.sleep(0)
        tasks[2].cancel()
        tasks[1].cancel()
        await asyncio.wait_for(asyncio.gather(tasks[0], tasks[3], tasks[4]), 5)
        return done

    assert asyncio.run(scenario()) == 3


def test_pacing_holds_the_rate() -> None:
    async def scenario() -> float:
        bucket = TokenBucket(qps=100, burst=1)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await asyncio.gather(*(bucket.take(i % 3) for i in range(11)))
        return loop.time() - t0

    # 10 tokens after the burst at 100/s: at least 0.1 s (a lower bound, not a timing).
    assert asyncio.run(scenario()) >= 0.095


def test_events_are_dropped_when_too_many_wait_and_statuses_still_written() -> None:
    from dispatcher.controller.record.status import EVENTS_QUEUED_MAX

    from .test_runtime import appwrapper, job, node, run, started, types

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))
        kube.put(appwrapper("a", job("a", 1, 8), created=1))
        kube.queued_events = EVENTS_QUEUED_MAX  # a saturated client
        d = await started(kube, clock)
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"
        assert kube.of_kind("Event") == []
        assert d.writer.events_dropped == 1
        kube.queued_events = 0
        kube.put(appwrapper("b", job("b", 1, 8), created=2))
        d.on_appwrapper("ADDED", kube.get("workload.codeflare.dev/v1beta1", "AppWrapper",
                                          "team", "b"))
        await d.cycle()
        assert [e["reason"] for e in kube.of_kind("Event")] == ["AppWrapperNotRunnable"]

    run(scenario)


def test_the_head_is_dispatched_though_its_waiting_message_is_still_queued() -> None:
    from .test_runtime import node, pod, run, types

    b_status = "/apis/workload.codeflare.dev/v1beta1/namespaces/team/appwrappers/b/status"

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, j = await a_running_b_waiting(kube, clock)
        # b's next status write (a new number in why it waits) waits for a token of
        # the API client, behind other wrappers' writes.
        kube.unsent[("PATCH", b_status)] = [True]
        clock.now += 120
        d.on_node("ADDED", node("n2", gpus=4))
        await d.cycle(wait=False)
        await asyncio.sleep(0.01)
        assert ("team", "b") in d.tasks.busy
        # a finishes: b fits, and is dispatched now, not once its old message is written.
        d.on_pod("MODIFIED", pod("a", "a-0", "n1", "Succeeded", 8, j))
        await d.cycle(wait=False)
        for _ in range(100):
            await asyncio.sleep(0.01)
            if kube.get("batch/v1", "Job", "team", "b") is not None:
                break
        assert types(kube, "b")[-1] == "Dispatched"
        assert kube.get("batch/v1", "Job", "team", "b") is not None
        await d.stop(grace=0)

    run(scenario)


def test_a_message_due_without_a_token_lets_the_loop_sleep_until_the_next_token() -> None:
    """Before: a minor write that was due while the shared rate had no token made the
    loop wake at once, run a cycle that could write nothing, and do so again: with
    hundreds of waiting wrappers the dispatcher spun (most of its CPU in the e2e bench)."""
    from .test_runtime import node, run

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, _ = await a_running_b_waiting(kube, clock)
        d.on_node("ADDED", node("n2", gpus=4))  # b's message: another number
        await d.cycle()
        assert d.memory.tracked[("team", "b")].writes.minor_due_at is not None
        clock.now += 120  # b's message is due
        d.writer._tokens, d.writer._tokens_at = 0.0, clock.now  # and the rate is spent
        assert d._next_timer() >= 0.9 / d.writer.minor_rate
        clock.now += 1.0 / d.writer.minor_rate
        assert d._next_timer() == 0.0
        await d.cycle()
        assert "4 nvidia.com/gpu" in kube.get(
            "workload.codeflare.dev/v1beta1", "AppWrapper", "team", "b")["status"]["message"]

    run(scenario)
