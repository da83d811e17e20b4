"""Start estimates in the core: the forecast replays the queue through `admit` exactly as
the simulator does; durations come from what a wrapper declares, then history, then a
default; the work is bounded; the words for a status message."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api.durations import (
    EXPECTED_DURATION_ANNOTATION,
    DeclaredDuration,
    declared_duration,
)
from dispatcher.api.models import parse_appwrapper
from dispatcher.cluster.state import PlannedPod
from dispatcher.eta import (
    DurationHistory,
    DurationRule,
    Limits,
    RunningWrapper,
    forecast,
    shape_of,
)
from dispatcher.eta.replay import Forecast
from dispatcher.eta.text import about, describe
from dispatcher.fit.capacity import Capacity
from dispatcher.kinds.checks import warnings
from dispatcher.policy_files import load_policy
from dispatcher.preemption import AdmittedWrapper
from dispatcher.queue import Policy, QueuedWrapper
from dispatcher.quota import QuotaForest
from dispatcher.simulate import Simulation, gpu_nodes
from dispatcher.simulate.traces import GPU, TraceJob, gpu_gang

from .quota_world import subtree

DAY = 86400.0
FIFO = load_policy("fifo")
POLICIES = [FIFO, load_policy("priority"), load_policy("backfill"),
            Policy("backfill-unguarded", backfill=True),
            Policy("backfill-short-guard", backfill=True, max_head_wait_seconds=50.0)]
PREEMPTING = [load_policy("priority-preemption"), Policy("reclaim", preemption="reclaim")]


def wrapper(name: str, gpus: int, first_seen: float = 0.0, priority: int = 0,
            team: str | None = None) -> QueuedWrapper:
    labels = (("quota_gpu", team),) if team else ()
    return QueuedWrapper("ns", name, f"uid-{name}", first_seen, gpu_gang(gpus, 8),
                         priority=priority, labels=labels)


# --- the forecast is the simulator's future ---------------------------------------------

def sample_after_arrivals(jobs: Sequence[TraceJob], nodes: int, policy: Policy,
                          forest: QuotaForest | None = None) -> tuple[Forecast, dict[str, float]]:
    """Simulate; right after the last arrival, estimate every queued job's start with the
    exact durations; return the estimates and the starts the simulation then gave."""
    last = max(j.submit for j in jobs)
    taken: list[Forecast] = []

    def observe(t: float, sim: Simulation) -> None:
        if t < last or taken:
            return
        by_key = {r.job.wrapper.key: r for r in sim.runs}
        running = []
        for record in sim.admitted():
            run = by_key[record.key]
            assert run.running_since is not None
            running.append(RunningWrapper(record.key, record.holdings,
                                          run.running_since + run.job.duration, record,
                                          run.job.wrapper, run.job.duration))
        queued = list(sim.queue.ordered(t))
        taken.append(forecast(queued, running, sim.cluster.copy(), policy, t,
                              {w.key: by_key[w.key].job.duration for w in queued},
                              forest=forest, holds=sim.holds))

    sim = Simulation(jobs, gpu_nodes(nodes, 8), policy, observe=observe, forest=forest)
    result = sim.run()
    (f,) = taken
    starts = {r.job.wrapper.name: r.started for r in result.jobs if r.started is not None}
    return f, starts


job_st = st.tuples(st.sampled_from([1, 2, 4, 8, 12, 16, 24, 40]),  # GPUs (40: never fits)
                   st.integers(0, 300),  # submitted
                   st.integers(1, 2000),  # runs
                   st.integers(0, 3),  # priority
                   st.sampled_from(["team-a", "team-b"]))


def teams(nodes: int) -> QuotaForest:
    return QuotaForest.from_objects([
        subtree("root", "quota_gpu", [("root", {GPU: nodes * 8}, False)]),
        subtree("teams", "quota_gpu", [("team-a", {GPU: 8}, False),
                                       ("team-b", {GPU: 8}, True)], parent="root")])


def trace_jobs(specs: list[tuple[int, int, int, int, str]]) -> list[TraceJob]:
    return [TraceJob(wrapper(f"j{i}", g, s, p, team), s, d, f"t:{i}")
            for i, (g, s, d, p, team) in enumerate(specs)]


@settings(max_examples=150, deadline=None)
@given(st.lists(job_st, min_size=1, max_size=25), st.integers(1, 4),
       st.sampled_from(POLICIES), st.booleans())
def test_with_exact_durations_and_no_arrivals_the_estimate_is_the_simulated_start(
        specs: list[tuple[int, int, int, int, str]], nodes: int, policy: Policy,
        quotas: bool) -> None:
    f, starts = sample_after_arrivals(trace_jobs(specs), nodes, policy,
                                      teams(nodes) if quotas else None)
    for (_, name), e in f.estimates.items():
        if e.outcome == "start":
            assert e.at is not None and e.at >= f.now
            assert starts.get(name) == e.at, (name, e, starts.get(name))
        elif e.outcome == "never":
            assert name not in starts and "would not fit even on an empty cluster" in e.reason
        else:
            # Nothing ran out of budget or horizon here: the simulation ends before.
            assert e.outcome == "stuck" and name not in starts, (name, e)


@settings(max_examples=100, deadline=None)
@given(st.lists(job_st, min_size=1, max_size=25), st.integers(1, 4),
       st.sampled_from(PREEMPTING), st.booleans())
def test_with_preemption_every_waiting_wrapper_gets_one_estimate_never_before_now(
        specs: list[tuple[int, int, int, int, str]], nodes: int, policy: Policy,
        quotas: bool) -> None:
    """The replay preempts when the controller's next cycle would (the simulator only
    at its next event), so its starts may come earlier than the simulation's."""
    jobs = trace_jobs(specs)
    f, starts = sample_after_arrivals(jobs, nodes, policy, teams(nodes) if quotas else None)
    for (_, name), e in f.estimates.items():
        assert e.outcome in ("start", "never", "stuck"), (name, e)
        if e.outcome == "start":
            assert e.at is not None and e.at >= f.now
        if e.outcome == "never":
            assert name not in starts


def test_a_queue_behind_running_gangs_is_estimated_by_hand() -> None:
    """Two nodes of 8 GPUs: `a` (16 GPUs) ends at 1000, `b` (8) at 400. Queue in order:
    c (16 GPUs, 300 s), d (8, 100 s), e (8, 50 s). Under fifo c waits for both nodes
    (1000), then d and e at 1300; under backfill d takes b's node at 400 (its 100 s end
    before `a` does), e right after it at 500."""
    nodes = gpu_nodes(2, 8)
    cap = Capacity.empty(nodes)
    running = []
    for name, holdings, ends in (("a", ("node-0",), 1000.0), ("b", ("node-1",), 400.0)):
        pods = tuple(PlannedPod(n, {GPU: 8, "pods": 1}) for n in holdings)
        for p in pods:
            cap.take(p.node, p.request)
        running.append(RunningWrapper(("ns", name), pods, ends))
    queue = [wrapper("c", 16, 1), wrapper("d", 8, 2), wrapper("e", 8, 3)]
    durations = {("ns", "c"): 300.0, ("ns", "d"): 100.0, ("ns", "e"): 50.0}
    fifo = forecast(queue, running, cap.copy(), FIFO, 0.0, durations)
    assert {k[1]: e.at for k, e in fifo.estimates.items()} == {"c": 1000, "d": 1300,
                                                                 "e": 1300}
    backfill = forecast(queue, running, cap.copy(), Policy("bf", backfill=True), 0.0,
                        durations)
    assert {k[1]: e.at for k, e in backfill.estimates.items()} == {"c": 1000, "d": 400,
                                                                     "e": 500}
    # Finishes at 400, 1000 and 1300; no cycle where the head surely waits (0 and 400).
    assert (fifo.stopped, fifo.events, fifo.cycles) == ("", 3, 2)


def test_a_running_wrapper_past_its_end_ends_now_not_in_the_past() -> None:
    cap = Capacity.empty(gpu_nodes(1, 8))
    pod = PlannedPod("node-0", {GPU: 8, "pods": 1})
    cap.take(pod.node, pod.request)
    f = forecast([wrapper("w", 8)], [RunningWrapper(("ns", "old"), (pod,), 50.0)], cap,
                 FIFO, 100.0, {("ns", "w"): 10.0})
    assert f.start_of(("ns", "w")) == 100.0


def test_preemption_in_the_forecast_starts_the_preemptor_now() -> None:
    cap = Capacity.empty(gpu_nodes(1, 8))
    pod = PlannedPod("node-0", {GPU: 8, "pods": 1})
    cap.take(pod.node, pod.request)
    low = wrapper("low", 8, priority=0)
    record = AdmittedWrapper("ns", "low", "uid-low", 0.0, low.demand, (pod,), 0.0)
    running = [RunningWrapper(low.key, (pod,), 8 * DAY, record, low, 8 * DAY)]
    urgent = wrapper("urgent", 8, 10.0, priority=10)
    f = forecast([urgent, wrapper("later", 8, 20.0)], running, cap,
                 load_policy("priority-preemption"), 100.0,
                 {urgent.key: 600.0, ("ns", "later"): 60.0})
    assert f.start_of(urgent.key) == 100.0
    # `later` (priority 0) is behind the victim, which starts over at 700 for 8 days.
    assert f.estimates[("ns", "later")].outcome == "beyond"
    assert ("ns", "low") not in f.estimates


# --- what cannot be estimated, and bounded work -------------------------------------------

def test_beyond_the_horizon_never_fits_invalid_and_stuck_are_said() -> None:
    nodes = gpu_nodes(1, 8)
    cap = Capacity.empty(nodes)
    pod = PlannedPod("node-0", {GPU: 8, "pods": 1})
    cap.take(pod.node, pod.request)
    long_run = [RunningWrapper(("ns", "long"), (pod,), 10 * DAY)]
    queue = [wrapper("next", 8), wrapper("huge", 16),
             replace(wrapper("bad", 1), invalid="spec.resources: no items")]
    f = forecast(queue, long_run, cap.copy(), FIFO, 0.0,
                 {("ns", "next"): 1.0, ("ns", "huge"): 1.0, ("ns", "bad"): 1.0})
    assert f.stopped == "horizon"
    nxt = f.estimates[("ns", "next")]
    assert (nxt.outcome, nxt.at) == ("beyond", 7 * DAY)
    assert describe(nxt, 0.0) == "no start estimated within 7d"
    huge = f.estimates[("ns", "huge")]
    assert huge.outcome == "never" and huge.reason.startswith(
        "would not fit even on an empty cluster")
    assert describe(huge, 0.0) == ""
    assert f.estimates[("ns", "bad")].outcome == "invalid"
    # Pods of no wrapper hold their node for ever: nothing will free it.
    stuck = forecast([wrapper("next", 8)], [], cap.copy(), FIFO, 0.0, {("ns", "next"): 1.0})
    assert stuck.estimates[("ns", "next")].outcome == "stuck" and stuck.stopped == "idle"


def test_the_computation_budget_stops_the_replay_and_says_so() -> None:
    ticks = iter(range(10_000))
    nodes = gpu_nodes(1, 8)
    queue = [wrapper(f"w{i}", 8, i) for i in range(50)]
    f = forecast(queue, [], Capacity.empty(nodes), FIFO, 0.0,
                 {w.key: 100.0 for w in queue},
                 limits=Limits(budget_seconds=10.5), clock=lambda: float(next(ticks)))
    assert f.stopped == "budget"
    starts = [f.start_of(w.key) for w in queue]
    assert starts[:10] == [100.0 * i for i in range(10)]
    last = f.estimates[queue[-1].key]
    assert last.outcome == "budget" and last.at == f.reached
    assert describe(last, 0.0).startswith("estimated start: not before ")
    capped = forecast(queue, [], Capacity.empty(nodes), FIFO, 0.0,
                      {w.key: 100.0 for w in queue}, limits=Limits(max_cycles=5))
    assert capped.stopped == "cycles" and capped.cycles == 5


def test_a_queued_wrapper_without_a_duration_is_an_error() -> None:
    with pytest.raises(ValueError, match="no expected duration given for ns/w"):
        forecast([wrapper("w", 8)], [], Capacity.empty(gpu_nodes(1, 8)), FIFO, 0.0, {})


# --- expected durations -----------------------------------------------------------------

def appwrapper(annotation: str | None = None, **duration: int) -> dict[str, object]:
    meta: dict[str, object] = {"name": "aw", "namespace": "ns"}
    if annotation is not None:
        meta["annotations"] = {EXPECTED_DURATION_ANNOTATION: annotation}
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": meta,
            "spec": {"schedulingSpec": {"dispatchDuration": duration},
                     "resources": {"GenericItems": [{"generictemplate": {
                         "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                         "spec": {"containers": [{"name": "c"}]}}}]}}}


def test_declared_durations_spec_first_then_the_annotation() -> None:
    both = declared_duration(parse_appwrapper(appwrapper("60", expected=7200, limit=9000)))
    assert (both.expected, both.source, both.limit) == (7200.0, "spec", 9000.0)
    note = declared_duration(parse_appwrapper(appwrapper("90.5")))
    assert (note.expected, note.source, note.limit) == (90.5, "annotation", None)
    bad = parse_appwrapper(appwrapper("an hour"))
    assert declared_duration(bad).expected is None
    (warning,) = warnings(bad)
    assert warning.startswith(f"metadata.annotations[{EXPECTED_DURATION_ANNOTATION!r}]: "
                              "'an hour' is not a number of seconds")
    assert warnings(parse_appwrapper(appwrapper("90"))) == []


SHAPE = shape_of({GPU: 8, "pods": 1})


def test_expected_duration_declared_then_history_then_default_capped_by_the_limit() -> None:
    rule = DurationRule(default_seconds=3600)
    history = DurationHistory()
    declared = declared_duration(parse_appwrapper(appwrapper(limit=1800)))
    assert rule.expected(declared, "ns", SHAPE, history).seconds == 1800  # default, capped
    for i, seconds in enumerate((100, 300, 1000)):
        history.record("ns", SHAPE, seconds, finished_at=i, uid=f"u{i}")
    by_history = rule.expected(undeclared(), "ns", SHAPE, history)
    assert (by_history.seconds, by_history.basis) == (300, "history")
    assert rule.expected(declared_duration(parse_appwrapper(appwrapper("42"))), "ns", SHAPE,
                         history).seconds == 42
    # Another namespace or shape has no history: the default.
    assert rule.expected(undeclared(), "other", SHAPE, history).basis == "default"


def undeclared() -> DeclaredDuration:
    return declared_duration(parse_appwrapper(appwrapper()))


def test_the_time_left_of_a_running_wrapper() -> None:
    rule = DurationRule(default_seconds=3600, overdue_fraction=0.1, min_remaining=60)
    history = DurationHistory()
    for i, seconds in enumerate((100, 300, 1000, 5000)):
        history.record("ns", SHAPE, seconds, finished_at=i, uid=f"u{i}")
    expected = rule.expected(undeclared(), "ns", SHAPE, history)
    # Having run 400 s, it is one of the two that ran longer: (600 + 4600) / 2 left.
    assert rule.remaining(expected, 400, "ns", SHAPE, history) == 2600
    # Past all of them: another tenth of its running time.
    assert rule.remaining(expected, 6000, "ns", SHAPE, history) == 600
    declared = rule.expected(declared_duration(parse_appwrapper(appwrapper(
        expected=1000, limit=1200))), "ns", SHAPE)
    assert rule.remaining(declared, 400, "ns", SHAPE) == 600
    assert rule.remaining(declared, 1100, "ns", SHAPE) == 100  # overdue, but the limit
    assert rule.remaining(declared, 1300, "ns", SHAPE) == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.floats(0, 1e6)), max_size=60),
       st.lists(st.integers(0, 59), max_size=200), st.integers(1, 8), st.integers(1, 3))
def test_the_history_is_bounded_and_counts_a_completion_once(
        completions: list[tuple[str, float]], order: list[int], per_shape: int,
        max_shapes: int) -> None:
    """Completions (namespace, seconds; finished at their index) offered in any order, some
    more than once, as watch events and relistings offer them."""
    offered = [(i, *completions[i]) for i in order if i < len(completions)]
    history = DurationHistory(per_shape, max_shapes)
    fed: dict[str, list[float]] = {}
    for i, ns, seconds in offered:
        history.record(ns, SHAPE, seconds, i, f"u{i}")
        fed.setdefault(ns, []).append(seconds)
    assert len(history) <= per_shape * max_shapes
    assert sum(1 for ns in fed if history.durations(ns, SHAPE)) <= max_shapes
    for ns, seconds in fed.items():
        got = history.durations(ns, SHAPE)
        assert len(got) <= per_shape and all(s in seconds for s in got)
    if offered:
        assert history.durations(offered[-1][1], SHAPE)  # the pair fed last is kept
    # Offered again (a relisting), the same completions change nothing.
    before = {ns: history.durations(ns, SHAPE) for ns in fed}
    if len(fed) <= max_shapes:
        for i, ns, seconds in offered:
            history.record(ns, SHAPE, seconds, i, f"u{i}")
        assert {ns: history.durations(ns, SHAPE) for ns in fed} == before


def test_the_history_keeps_the_latest_completions() -> None:
    history = DurationHistory(per_shape=3)
    for i in range(10):
        history.record("ns", SHAPE, float(i), finished_at=100 + i, uid=f"u{i}")
    assert history.durations("ns", SHAPE) == [7, 8, 9]
    assert not history.record("ns", SHAPE, 99.0, finished_at=50, uid="old")  # older
    assert history.median("ns", SHAPE) == 8 and history.median("other", SHAPE) is None


# --- words ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("seconds", "text"), [
    (0, "less than a minute"), (59, "less than a minute"), (90, "2m"), (3569, "59m"),
    (3599, "1h"), (3600, "1h"), (7800, "2h10m"), (86399, "1d"), (93600, "1d2h"),
])
def test_spans_in_words(seconds: float, text: str) -> None:
    assert about(seconds) == text


def test_an_estimate_in_words() -> None:
    f = forecast([wrapper("w", 8)], [], Capacity.empty(gpu_nodes(1, 8)), FIFO,
                 1_800_000_000.0, {("ns", "w"): 1.0})
    e = f.estimates[("ns", "w")]
    assert describe(e, e.at or 0) == "estimated start: at the next admission cycle"
    later = replace(e, at=1_800_000_000.0 + 7800)
    assert describe(later, 1_800_000_000.0) == (
        "estimated start in about 2h10m (at 10:10 UTC)")
    assert describe(replace(e, at=1_800_000_000.0 + 2 * DAY), 1_800_000_000.0) == (
        "estimated start in about 2d (at 2027-01-17 08:00 UTC)")
    # Within the hour, to the second.
    assert describe(replace(e, at=1_800_000_000.0 + 45), 1_800_000_000.0) == (
        "estimated start in less than a minute (at 08:00:45 UTC)")
    assert describe(replace(e, at=1_800_000_000.0 + 1530), 1_800_000_000.0) == (
        "estimated start in about 26m (at 08:25:30 UTC)")
    assert not math.isnan(f.seconds)


def test_an_overdue_wrapper_is_expected_to_run_what_long_runs_of_any_kind_ran_beyond() -> None:
    rule = DurationRule(default_seconds=3600, overdue_fraction=0.1, min_remaining=60)
    history = DurationHistory()
    gpu1 = shape_of({"nvidia.com/gpu": 1})
    for seconds in (600, 700, 800):
        history.record("team", gpu1, seconds, 0)
    for i, seconds in enumerate((100, 20_000, 30_000, 40_000)):
        history.record("other", shape_of({"nvidia.com/gpu": 8}), seconds, i)
    expected = rule.expected(DeclaredDuration(), "team", gpu1, history)
    assert expected.basis == "history"
    # Past every run of its kind: those of any kind that ran 10,000 s took 20,000 more
    # (the median of 10,000, 20,000 and 30,000), not 10% of its run time.
    assert rule.remaining(expected, 10_000, "team", gpu1, history) == 20_000
    # Past every run of any kind: the fraction of its run time.
    assert rule.remaining(expected, 50_000, "team", gpu1, history) == 5_000
    # A wrapper on the default duration past it, too.
    default = rule.expected(DeclaredDuration(), "new", gpu1, None)
    assert rule.remaining(default, 25_000, "new", gpu1, history) == 10_000
