"""Backfill with reservations (`backfill: reserve`): the head of the line gets the time
and the nodes where the replay of expected durations starts it; a wrapper behind it
dispatches only if it keeps off those nodes or is expected to end before then."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dispatcher.admission import WAITS_FOR_RESERVATION, Decision, admit
from dispatcher.api import parse_appwrapper
from dispatcher.api.models import AppWrapper
from dispatcher.cli import main
from dispatcher.cluster.state import PlannedPod
from dispatcher.eta import RunningWrapper, forecast
from dispatcher.eta.reserve import planner, reservations
from dispatcher.fit.capacity import Capacity
from dispatcher.fit.gang import place
from dispatcher.lifecycle import PodCounts, Timing, judge
from dispatcher.policy_files import load_policy
from dispatcher.queue import AdmissionQueue, Policy, PolicyError, QueuedWrapper, WrapperKey
from dispatcher.queue.policy import policy_from_mapping
from dispatcher.queue.reservation import Reservation, Reservations, clock_time
from dispatcher.simulate import Run, Simulation, gpu_nodes, simulate
from dispatcher.simulate.reserving import Durations, ExactDurations, PredictedDurations
from dispatcher.simulate.traces import TraceJob, gpu_gang

NOW = 1_800_000_000.0
RESERVE = load_policy("reserve")
GREEDY = Policy("backfill-unguarded", backfill=True)


def wrapper(name: str, gpus: int, first_seen: float = 0.0) -> QueuedWrapper:
    return QueuedWrapper("team-a", name, f"uid-{name}", first_seen, gpu_gang(gpus, 8))


def start(cap: Capacity, w: QueuedWrapper, ends_at: float) -> RunningWrapper:
    placed = place(w.gang, cap)
    assert isinstance(placed, list)
    return RunningWrapper(w.key, tuple(PlannedPod(p.node, p.request) for p in placed
                                       if p.node is not None), ends_at)


def cycle(queued: Sequence[QueuedWrapper], running: Sequence[RunningWrapper], cap: Capacity,
          policy: Policy, durations: Mapping[WrapperKey, float]
          ) -> tuple[dict[str, Decision], Reservations | None]:
    queue = AdmissionQueue(policy)
    for w in queued:
        queue.put(w)
    ordered = queue.ordered(NOW)
    planned = (reservations(ordered, running, cap, policy, NOW, durations)
               if policy.reserve else None)
    decisions = admit(ordered, cap, policy, NOW, reservations=planned)
    return {d.name: d for d in decisions}, planned


def two_nodes_one_busy() -> tuple[Capacity, list[RunningWrapper]]:
    """Two 8-GPU nodes; one is busy for another 10 minutes."""
    cap = Capacity.empty(gpu_nodes(2, 8))
    return cap, [start(cap, wrapper("running", 8), NOW + 600)]


def test_the_reserve_policy_file_backfills_with_reservations() -> None:
    assert RESERVE.reserve and RESERVE.backfill and RESERVE.max_head_wait_seconds is None
    assert not load_policy("backfill").reserve


def test_backfill_takes_true_false_or_reserve() -> None:
    with pytest.raises(PolicyError, match="'backfill' must be true, false or reserve"):
        policy_from_mapping({"name": "x", "backfill": "yes"})


def test_the_head_is_reserved_where_and_when_the_replay_starts_it() -> None:
    cap, running = two_nodes_one_busy()
    big = wrapper("big", 16, first_seen=1)
    decisions, planned = cycle([big], running, cap, RESERVE, {big.key: 3600})
    assert planned is not None and len(planned.held) == 1
    r = planned.held[0]
    assert (r.key, r.at, r.nodes) == (big.key, NOW + 600, frozenset({"node-0", "node-1"}))
    d = decisions["big"]
    assert d.decision == "wait"
    assert d.message.startswith(
        f"reserved: starts at {clock_time(NOW + 600, NOW)} on nodes node-0, node-1; ")


def test_a_short_job_backfills_and_a_long_one_waits_for_the_reservation() -> None:
    cap, running = two_nodes_one_busy()
    big, long, short = (wrapper("big", 16, 1), wrapper("long", 8, 2), wrapper("short", 8, 3))
    durations = {big.key: 3600.0, long.key: 3600.0, short.key: 300.0}
    decisions, _ = cycle([big, long, short], running, cap, RESERVE, durations)
    assert decisions["long"].decision == "wait"
    assert decisions["long"].reason == WAITS_FOR_RESERVATION
    assert "reserved for team-a/big" in decisions["long"].message
    assert decisions["short"].decision == "dispatch"
    assert decisions["short"].message.startswith(
        "backfilled: expected to end before the reservation of team-a/big at "
        f"{clock_time(NOW + 600, NOW)}")


def test_greedy_backfill_lets_the_long_job_take_the_heads_room() -> None:
    cap, running = two_nodes_one_busy()
    big, long, short = (wrapper("big", 16, 1), wrapper("long", 8, 2), wrapper("short", 8, 3))
    decisions, _ = cycle([big, long, short], running, cap, GREEDY, {})
    assert decisions["long"].decision == "dispatch"


def test_a_long_job_backfills_beside_the_reserved_nodes() -> None:
    cap = Capacity.empty(gpu_nodes(2, 8))
    running = [start(cap, wrapper("running", 4), NOW + 600)]
    assert running[0].holdings[0].node == "node-0"
    big, long = wrapper("big", 16, 1), wrapper("long", 4, 2)
    # Best fit would put `long` on node-0, the fuller node: the one reserved.
    held = Reservations((Reservation(big.key, NOW + 600, frozenset({"node-0"})),),
                        {big.key: 3600.0, long.key: 7200.0})
    decisions = {d.name: d for d in admit([big, long], cap, RESERVE, NOW, reservations=held)}
    assert decisions["long"].decision == "dispatch"
    assert decisions["long"].message.startswith("backfilled: beside the nodes reserved for "
                                                "team-a/big")
    assert {p.node for p in decisions["long"].placements} == {"node-1"}
    assert cap.free_of("node-0")["nvidia.com/gpu"] == 4


def test_a_wrapper_without_an_expected_duration_never_backfills_onto_reserved_nodes() -> None:
    cap, running = two_nodes_one_busy()
    big, other = wrapper("big", 16, 1), wrapper("other", 8, 2)
    durations = {big.key: 3600.0}
    decisions, _ = cycle([big, other], running, cap, RESERVE,
                         {**durations, other.key: 60.0})
    assert decisions["other"].decision == "dispatch"
    cap, running = two_nodes_one_busy()
    planned = reservations([big, other], running, cap, RESERVE, NOW, durations | {
        other.key: 60.0})
    unknown = Reservations(planned.held, durations)
    d = {x.name: x for x in admit([big, other], cap, RESERVE, NOW, reservations=unknown)}
    assert d["other"].reason == WAITS_FOR_RESERVATION


# --- with exact durations, no backfill delays a reservation ------------------------------

jobs = st.lists(st.tuples(st.sampled_from([1, 2, 4, 8, 12, 16, 24]),
                          st.integers(min_value=1, max_value=100)), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(nodes=st.integers(min_value=1, max_value=4), busy=jobs, queued=jobs,
       first=st.integers(min_value=1, max_value=4))
# Under reserveFirst > 1 a backfill that keeps every reservation's time and nodes can still
# change where an earlier reserved wrapper lands when it starts (a tie between two nodes
# freed at once), and so delay a later reservation: here q-1 goes to n0 at +3 instead of
# n1, and q-2's reservation at +4 on n0 becomes +5. The head's never moves.
@example(nodes=2, busy=[(1, 4), (1, 4), (4, 3), (4, 3), (4, 5)],
         queued=[(1, 4), (2, 2), (8, 1), (1, 4)], first=2)
def test_a_backfilled_wrapper_never_delays_a_reservation(
        nodes: int, busy: list[tuple[int, int]], queued: list[tuple[int, int]],
        first: int) -> None:
    cap = Capacity.empty(gpu_nodes(nodes, 8))
    running: list[RunningWrapper] = []
    for i, (gpus, left) in enumerate(busy):
        w = wrapper(f"busy-{i}", gpus)
        placed = place(w.gang, cap)
        if isinstance(placed, list):
            running.append(RunningWrapper(w.key, tuple(PlannedPod(p.node, p.request)
                                                       for p in placed if p.node), NOW + left))
    waiting = [wrapper(f"q-{i}", gpus, first_seen=i) for i, (gpus, _) in enumerate(queued)]
    durations = {w.key: float(d) for w, (_, d) in zip(waiting, queued, strict=True)}
    policy = dataclasses.replace(RESERVE, reserve_first=first)
    decisions, planned = cycle(waiting, running, cap, policy, durations)
    assert planned is not None and len(planned.held) <= first
    # Everything dispatched now runs exactly its expected duration.
    after = running + [
        RunningWrapper(w.key, tuple(PlannedPod(p.node, p.request)
                                    for p in decisions[w.name].placements if p.node),
                       NOW + durations[w.key])
        for w in waiting if decisions[w.name].decision == "dispatch"]
    left = [w for w in waiting if decisions[w.name].decision != "dispatch"]
    strict = Policy("strict", order=RESERVE.order)
    # The head's reservation (the first), if still waiting, starts no later than reserved
    # when nothing passes it any more (see the example above for the later ones).
    again = forecast(left, after, cap.copy(), strict, NOW, durations)
    for r in planned.held[:1]:
        if decisions[r.key[1]].decision != "dispatch":
            started = again.start_of(r.key)
            assert started is not None and started <= r.at


# --- in the simulator --------------------------------------------------------------------

def stream_behind_a_big_gang() -> list[TraceJob]:
    """Two 8-GPU nodes: one busy for 100 s, then a 16-GPU gang, then a stream of 8-GPU
    jobs of 100 s, one every 50 s, for an hour."""
    jobs = [TraceJob(wrapper("first", 8, 0.0), 0.0, 100.0, "t:1"),
            TraceJob(wrapper("big", 16, 1.0), 1.0, 100.0, "t:2")]
    for i in range(72):
        at = 2.0 + 50.0 * i
        jobs.append(TraceJob(wrapper(f"small-{i}", 8, at), at, 100.0, f"t:{i + 3}"))
    return jobs


def start_of(run: Run, name: str) -> float | None:
    return next(r.started for r in run.jobs if r.job.wrapper.name == name)


@pytest.mark.parametrize("durations", [ExactDurations(), PredictedDurations()])
def test_the_simulated_big_gang_starts_when_reserved_under_reserve(durations: Durations
                                                                   ) -> None:
    jobs = stream_behind_a_big_gang()
    greedy = simulate(jobs, 2, 8, GREEDY)
    reserved = simulate(jobs, 2, 8, RESERVE, durations=durations)
    late = start_of(greedy, "big")
    assert late is not None and late > 3000
    # Predicted durations start at the default hour: no small job backfills beside it.
    assert start_of(reserved, "big") == 100.0
    assert all(r.started is not None for r in reserved.jobs)


def test_a_reserving_policy_is_simulated_with_per_node_fit_only() -> None:
    with pytest.raises(ValueError, match="reserves nodes: simulate it with per-node fit"):
        simulate(stream_behind_a_big_gang(), 2, 8, RESERVE, fit="aggregate")


def test_dispatcher_simulate_runs_the_reserve_policy(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 1 node of 8 GPUs: a holds half of it until 100; b needs the whole node; c (500 s)
    # and d (50 s) fit now beside a.
    path = tmp_path / "t.csv"
    path.write_text("job_id,submission_time,duration,num_gpu\n"
                    "a,0,100,4\nb,1,10,8\nc,2,500,4\nd,3,50,4\n")

    def b_waits(*argv: str) -> float:
        assert main(["simulate", "--trace", str(path), "--nodes", "1", "-o", "json",
                     *argv]) == 0
        out = json.loads(capsys.readouterr().out)
        wait: float = next(r["maxSeconds"] for r in out["queueingDelayByGangSize"]
                           if r["gpus"] == 8)
        return wait

    assert b_waits("--policy", "backfill") == 501  # c took b's room for 500 s
    assert b_waits("--policy", "reserve", "--durations", "exact") == 99
    assert main(["simulate", "--trace", str(path), "--nodes", "1", "--policy", "reserve",
                 "--fit", "aggregate"]) != 0
    assert "reserves nodes: simulate it with --fit per-node" in capsys.readouterr().err


def test_start_estimates_under_reserve_replay_the_reservations(tmp_path: Path) -> None:
    # 1 node of 8 GPUs: a holds half until 100; b needs the whole node; c (500 s) and d
    # (50 s) fit beside a. Under reserve d backfills, c waits for b: b at 100, c at 110.
    jobs = [TraceJob(wrapper(n, g, at), at, d, f"t:{i}")
            for i, (n, at, d, g) in enumerate([("a", 0, 100, 4), ("b", 1, 10, 8),
                                               ("c", 2, 500, 4), ("d", 3, 50, 4)])]
    taken: list[dict[str, float | None]] = []

    def observe(t: float, sim: Simulation) -> None:
        if t != 3:
            return
        queued = list(sim.queue.ordered(t))
        exact = {r.job.wrapper.key: r.job.duration for r in sim.runs}
        running = [RunningWrapper(r.key, r.holdings, r.dispatched_at + exact[r.key])
                   for r in sim.admitted()]
        durations = {w.key: exact[w.key] for w in queued}
        for plan in (planner(RESERVE), None):
            found = forecast(queued, running, sim.cluster.copy(), RESERVE, t, durations,
                             planner=plan)
            taken.append({w.name: found.start_of(w.key) for w in queued})

    run = Simulation(jobs, gpu_nodes(1, 8), RESERVE, observe=observe,
                     durations=ExactDurations()).run()
    actual = {r.job.wrapper.name: r.started for r in run.jobs}
    assert actual == {"a": 0, "b": 100, "c": 110, "d": 3}
    with_reservations, without = taken
    assert with_reservations == {"b": 100, "c": 110}
    assert without != with_reservations  # replayed as plain backfill, c would pass b


# --- a backfill that overruns ------------------------------------------------------------

def dispatched_aw(message: str, limit: int | None = None) -> AppWrapper:
    scheduling = {"dispatchDuration": {"limit": limit}} if limit else {}
    return parse_appwrapper({
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": "a", "namespace": "n"},
        "spec": {"schedulingSpec": scheduling, "resources": {"GenericItems": [
            {"generictemplate": {"apiVersion": "batch/v1", "kind": "Job",
                                 "metadata": {"name": "j"}}}]}},
        "status": {"conditions": [{"type": "Dispatched", "status": "True",
                                   "reason": "AppWrapperRunnable", "message": message}]},
    })


BACKFILL = "backfilled: expected to end before the reservation of team-a/big at 14:32 UTC"


def test_a_backfill_past_the_policys_backfill_limit_fails_as_past_its_own_limit() -> None:
    timing = Timing(backfill_limit=600)

    def verdict(w: AppWrapper, now: float) -> tuple[str, str]:
        v = judge(w, PodCounts(running=1), 1, "running", 0, True, now, timing)
        return v.action, v.message

    assert verdict(dispatched_aw(BACKFILL), 599)[0] == "running"
    assert verdict(dispatched_aw(BACKFILL), 600) == (
        "failed", "still not finished 10m after dispatch (the policy's backfillLimitSeconds: "
        "it was dispatched as a backfill)")
    # Not a backfill: only its own limit counts; a shorter own limit wins.
    assert verdict(dispatched_aw("all 1 pods fit: on n1"), 10_000)[0] == "running"
    assert verdict(dispatched_aw(BACKFILL, limit=300), 300) == (
        "failed", "still not finished 5m after dispatch "
        "(spec.schedulingSpec.dispatchDuration.limit)")


def test_backfill_limit_seconds_in_a_policy_file() -> None:
    p = policy_from_mapping({"name": "r", "backfill": "reserve", "backfillLimitSeconds": 7200})
    assert p.backfill_limit_seconds == 7200.0
    for bad in ({"backfill": True, "backfillLimitSeconds": 60},
                {"backfill": "reserve", "backfillLimitSeconds": 0}):
        with pytest.raises(PolicyError, match="backfillLimitSeconds must be a number > 0, "
                                              "with backfill: reserve"):
            policy_from_mapping({"name": "r", **bad})


def test_backfill_limit_action_and_reserve_first_in_a_policy_file() -> None:
    p = policy_from_mapping({"name": "r", "backfill": "reserve", "backfillLimitSeconds": 60,
                             "backfillLimitAction": "requeue", "reserveFirst": 4})
    assert (p.backfill_limit_action, p.reserve_first) == ("requeue", 4)
    assert policy_from_mapping({"name": "r", "backfill": "reserve"}).reserve_first == 1
    for bad in ({"backfill": "reserve", "backfillLimitAction": "requeue"},
                {"backfill": "reserve", "backfillLimitSeconds": 60,
                 "backfillLimitAction": "preempt"}):
        with pytest.raises(PolicyError, match="backfillLimitAction must be fail or requeue"):
            policy_from_mapping({"name": "r", **bad})
    for bad in ({"backfill": True, "reserveFirst": 2}, {"backfill": "reserve", "reserveFirst": 0},
                {"backfill": "reserve", "reserveFirst": True}):
        with pytest.raises(PolicyError, match="reserveFirst must be a whole number >= 1"):
            policy_from_mapping({"name": "r", **bad})


def test_reserve_first_reserves_the_next_wrappers_that_do_not_fit_now() -> None:
    # Two 8-GPU nodes, both busy for 10 min; then a 16-GPU gang, a 1-GPU job that does not
    # fit now either, and another 16-GPU gang.
    cap = Capacity.empty(gpu_nodes(2, 8))
    running = [start(cap, wrapper("running", 16), NOW + 600)]
    big, small, other = wrapper("big", 16, 1), wrapper("small", 1, 2), wrapper("other", 16, 3)
    durations = {big.key: 600.0, small.key: 600.0, other.key: 600.0}
    policy = dataclasses.replace(RESERVE, reserve_first=3)
    decisions, planned = cycle([big, small, other], running, cap, policy, durations)
    assert planned is not None
    assert [(r.key[1], r.at) for r in planned.held] == [
        ("big", NOW + 600), ("small", NOW + 1200), ("other", NOW + 1800)]
    assert decisions["other"].message.startswith(
        f"reserved: starts at {clock_time(NOW + 1800, NOW)} on nodes node-0, node-1; ")
    _, one = cycle([big, small, other], running, two_busy(), RESERVE, durations)
    assert one is not None and [r.key[1] for r in one.held] == ["big"]


def two_busy() -> Capacity:
    cap = Capacity.empty(gpu_nodes(2, 8))
    start(cap, wrapper("running", 16), NOW + 600)
    return cap


def test_a_backfill_keeps_off_the_nodes_of_every_reservation() -> None:
    # Three 8-GPU nodes: node-0 and node-1 busy for 10 min, half of node-2 for 100 s. h1
    # (16 GPUs) is reserved node-0 and node-1 at 10 min; h2 (8 GPUs) does not fit now
    # either, and under reserveFirst: 2 gets node-2 at 10 min; c (4 GPUs, 1 h) fits now on
    # node-2 only.
    def decide(first: int) -> tuple[Decision, Reservations | None]:
        cap = Capacity.empty(gpu_nodes(3, 8))
        running = [start(cap, wrapper(n, g), NOW + left)
                   for n, g, left in (("r0", 8, 600), ("r1", 8, 600), ("r2", 4, 100))]
        h1, h2, c = wrapper("h1", 16, 1), wrapper("h2", 8, 2), wrapper("c", 4, 3)
        durations = {h1.key: 600.0, h2.key: 600.0, c.key: 3600.0}
        decisions, planned = cycle([h1, h2, c], running, cap,
                                   dataclasses.replace(RESERVE, reserve_first=first), durations)
        return decisions["c"], planned

    c, planned = decide(1)
    assert c.decision == "dispatch" and planned is not None and len(planned.held) == 1
    c, planned = decide(2)
    assert planned is not None
    assert [(r.key[1], sorted(r.nodes)) for r in planned.held] == [
        ("h1", ["node-0", "node-1"]), ("h2", ["node-2"])]
    assert c.decision == "wait" and c.reason == WAITS_FOR_RESERVATION
    assert c.message.startswith(f"fits now only on nodes reserved for team-a/h2, which is to "
                                f"start at {clock_time(NOW + 600, NOW)} on node-2")


@pytest.mark.parametrize(("action", "stops"), [("fail", 1), ("requeue", 2)])
def test_simulate_ends_or_requeues_a_backfill_at_the_policys_limit_and_reports_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], action: str, stops: int) -> None:
    # 2 nodes of 8 GPUs: a holds one until 2000; b needs both (reserved for 2000); c (4 GPUs,
    # 1,000 s) backfills beside a, expected to end before b's reservation. The policy bounds
    # backfills at 600 s: c is ended there (fail), or queued again, backfilled once more
    # (602 + 1,000 < 2,000), stopped again at 1,202, and then, as it could no longer end
    # before b, runs in full after b (requeue).
    trace = tmp_path / "t.csv"
    trace.write_text("job_id,submission_time,duration,num_gpu\n"
                     "a,0,2000,8\nb,1,10,16\nc,2,1000,4\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text("name: bounded\nbackfill: reserve\nbackfillLimitSeconds: 600\n"
                      f"backfillLimitAction: {action}\n")
    argv = ["simulate", "--trace", str(trace), "--nodes", "2", "--policy", str(policy),
            "--durations", "exact"]
    assert main([*argv, "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["backfillLimit"] == {"seconds": 600.0, "action": action, "jobs": 1,
                                    "stops": stops, "lostGpuSeconds": 4 * 600.0 * stops}
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert (f"backfill limit   10m for a job dispatched as a backfill: 1 job "
            f"{'ended there' if action == 'fail' else 'torn down there and queued again'}"
            ) in table
    assert f"{4 * 600 * stops:,} GPU-seconds of work lost" in table
    # Ended at the limit is not finished: under fail, c never ran to completion.
    assert out["jobs"]["finished"] == (2 if action == "fail" else 3)


def test_the_shipped_reserve_policy_ends_a_backfill_that_overruns_and_says_so() -> None:
    """A wrapper that claims 5 minutes and then runs for ever must not keep the reserved
    head waiting for ever: the shipped policy has a backfill limit, and the backfill's
    status names it when it dispatches."""
    assert RESERVE.backfill_limit_seconds == 4 * 3600
    cap, running = two_nodes_one_busy()
    big, short = wrapper("big", 16, 1), wrapper("short", 8, 3)
    decisions, _ = cycle([big, short], running, cap, RESERVE,
                         {big.key: 3600.0, short.key: 300.0})
    message = decisions["short"].message
    assert decisions["short"].decision == "dispatch" and message.startswith(BACKFILL[:50])
    assert ("; torn down and queued again if still running 4h after dispatch (the policy's "
            "backfillLimitSeconds)") in message
    timing = Timing(backfill_limit=RESERVE.backfill_limit_seconds,
                    backfill_limit_action=RESERVE.backfill_limit_action)
    liar = dispatched_aw(message)
    assert judge(liar, PodCounts(running=1), 1, "running", 0, True, 4 * 3600 - 1,
                 timing).action == "running"
    late = judge(liar, PodCounts(running=1), 1, "running", 0, True, 4 * 3600, timing)
    assert (late.action, late.reason) == ("requeue", "DispatchDeadlineExceeded")
