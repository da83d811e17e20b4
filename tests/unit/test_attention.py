"""Which wrappers a cycle looks at: those touched, those whose alarm rang, all of them
now and then — never every running wrapper at every cycle."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dispatcher.controller.record.attention import SWEEP_SECONDS, Alarms, Attention

from .fake_kube import FakeKube
from .test_runtime import T0, Clock, appwrapper, node, started

KEYS = [("team", n) for n in "abcde"]

steps = st.lists(st.one_of(
    st.tuples(st.just("touch"), st.sampled_from(KEYS)),
    st.tuples(st.just("alarm"), st.sampled_from(KEYS),
              st.one_of(st.none(), st.floats(0, 100, allow_nan=False))),
    st.tuples(st.just("take"), st.floats(0, 100, allow_nan=False)),
), max_size=40)


@given(steps)
def test_a_cycle_looks_at_what_was_touched_or_rang_and_sweeps_now_and_then(
        script: list[tuple[Any, ...]]) -> None:
    attention = Attention(sweep_seconds=50.0)
    touched: set[tuple[str, str]] = set()
    alarms: dict[tuple[str, str], float] = {}
    swept_at: float | None = None
    now = 0.0
    for step in script:
        if step[0] == "touch":
            attention.touch(step[1])
            touched.add(step[1])
        elif step[0] == "alarm":
            attention.quiet.set(step[1], step[2])
            if step[2] is None:
                alarms.pop(step[1], None)
            else:
                alarms[step[1]] = step[2]
        else:
            now = max(now, step[1])  # the clock does not go back
            looked = set(attention.take(now, KEYS))
            rung = {k for k, at in alarms.items() if at <= now}
            if swept_at is None or now - swept_at >= 50.0:
                swept_at = now
                assert looked == set(KEYS)
            else:
                assert looked == touched | rung
            touched.clear()
            for k in rung:
                del alarms[k]  # an alarm rings once


@given(st.lists(st.tuples(st.sampled_from(KEYS),
                          st.one_of(st.none(), st.floats(0, 100, allow_nan=False)))))
def test_the_next_alarm_is_the_soonest_one_still_set(sets: list[tuple[Any, Any]]) -> None:
    alarms = Alarms()
    last: dict[tuple[str, str], float] = {}
    for key, at in sets:
        alarms.set(key, at)
        if at is None:
            last.pop(key, None)
        else:
            last[key] = at
    assert alarms.next_at() == min(last.values(), default=None)


def test_a_cycle_woken_by_one_wrapper_looks_at_that_one_not_at_every_running_one() -> None:
    def cm(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}

    async def scenario() -> tuple[int, int, int]:
        clock = Clock()
        kube = FakeKube(clock)
        kube.put(node("n1"))
        for i in range(200):
            kube.put(appwrapper(f"aw{i}", cm(f"aw{i}"), created=i % 60))
        d = await started(kube, clock)
        await d.cycle()
        running = sum(t.phase == "running" for t in d.memory.tracked.values())
        clock.now += 1.0
        await d.cycle()  # the dispatches' own steps came back: each looked at once
        before = d.due_steps.looked_at
        clock.now += 1.0
        late = kube.put(appwrapper("late", cm("late"), created=59))
        d.on_appwrapper("ADDED", late)
        await d.cycle()
        return running, d.due_steps.looked_at - before, \
            sum(t.phase == "running" for t in d.memory.tracked.values())

    running, looked, after = asyncio.run(scenario())
    assert running == 200 and after == 201
    assert looked <= 2  # the new one (and its own step's end), not the 200 running


def test_a_running_wrapper_is_still_judged_at_the_idle_pace_with_nothing_happening() -> None:
    async def scenario() -> tuple[float, float]:
        clock = Clock()
        kube = FakeKube(clock)
        kube.put(node("n1"))
        kube.put(appwrapper("a", {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "a"}}))
        d = await started(kube, clock)
        await d.cycle()
        t = d.memory.tracked[("team", "a")]
        first = t.timers.stepped_at
        for _ in range(int(SWEEP_SECONDS * 3)):
            clock.now += 1.0
            await d.cycle()
        return first, t.timers.stepped_at

    first, last = asyncio.run(scenario())
    assert first == T0
    assert last >= T0 + SWEEP_SECONDS * 2  # stepped again since, by its alarm or a sweep


def test_a_ripe_minor_write_of_a_busy_wrapper_does_not_make_the_loop_spin() -> None:
    """Its write waits for its step to end (which wakes the loop); the loop does not wake
    at once, cycle after cycle, for a write it cannot start."""
    from .test_runtime import job

    async def scenario() -> tuple[float, int]:
        clock = Clock()
        kube = FakeKube(clock)
        kube.put(node("n1"))
        kube.put(appwrapper("w", job("w", 1, 1)))
        d = await started(kube, clock)
        await d.cycle()
        t = d.memory.tracked[("team", "w")]
        t.status.pending = 7  # a minor change (a count): owed, ripe once its interval passed
        d.writer.owe(t)
        assert t.writes.minor_due_at is not None
        clock.now = t.writes.minor_due_at + 1
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        d.tasks.busy[t.key] = asyncio.ensure_future(never)
        d._flush(clock.now)
        waits = d._next_timer()
        d.tasks.busy.pop(t.key).cancel()
        before = d.writer.patches
        clock.now += 1.0
        d._flush(clock.now)  # its step ended: the write goes now
        await d.settle()
        return waits, d.writer.patches - before

    waits, written = asyncio.run(scenario())
    assert waits > 0
    assert written == 1
