"""Client-side pacing: requests wait for tokens, the most urgent first."""

from __future__ import annotations

import asyncio

from dispatcher.controller.kube import EVENT, STATUS, URGENT, TokenBucket


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
