"""`dispatcher simulate`: small traces whose outcome is worked out by hand."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from dispatcher.cli import main
from dispatcher.policy_files import load_policy
from dispatcher.simulate import Simulation, gpu_nodes
from dispatcher.simulate.traces import read_csv

HEADER = "job_id,submission_time,duration,num_gpu\n"
EXAMPLE = Path(__file__).parents[2] / "examples" / "simulate" / "trace.yaml"


def trace(tmp: Path, *jobs: tuple[str, float, float, int], name: str = "t.csv") -> str:
    path = tmp / name
    path.write_text(HEADER + "".join(f"{j},{s},{d},{g}\n" for j, s, d, g in jobs))
    return str(path)


def simulate_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(["simulate", "-o", "json", *argv]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def by_size(out: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
    return {(r["gpus"], r["pods"]): r for r in out["queueingDelayByGangSize"]}


def test_one_node_jobs_of_8_4_4_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 1 node of 8 GPUs. a (8 GPUs) runs 0-100; b and c (4 each) wait for it and then
    # share the node: b 100-150 (waited 90), c 100-200 (waited 80).
    path = trace(tmp_path, ("a", 0, 100, 8), ("b", 10, 50, 4), ("c", 20, 100, 4))
    out = simulate_json(capsys, "--trace", path, "--nodes", "1")
    assert out["cluster"] == {"nodes": 1, "gpusPerNode": 8, "gpus": 8}
    assert out["jobs"] == {"total": 3, "started": 3, "finished": 3, "neverFit": 0,
                           "neverStarted": 0}
    assert out["makespanSeconds"] == 200
    # (8 x 100 + 4 x 50 + 4 x 100) GPU-seconds over 8 GPUs x 200 s
    assert out["gpuUtilisation"] == pytest.approx(1400 / 1600)
    d = out["queueingDelay"]
    assert (d["jobs"], d["waited"]) == (3, 2)
    assert d["meanSeconds"] == pytest.approx(170 / 3, abs=1e-3)
    assert (d["medianSeconds"], d["maxSeconds"]) == (80, 90)
    assert d["p95Seconds"] == pytest.approx(89)  # 80 + 0.9 x (90 - 80)
    sizes = by_size(out)
    assert sorted(sizes) == [(4, 1), (8, 1)]
    assert sizes[(4, 1)]["meanSeconds"] == 85 and sizes[(4, 1)]["maxSeconds"] == 90
    assert sizes[(8, 1)]["maxSeconds"] == 0
    assert out["starvation"]["job"] == "b" and out["starvation"]["waitSeconds"] == 90
    assert out["starvation"]["overtakenBy"] == 0
    # Nothing was free while b and c waited: no fragmentation.
    assert out["fragmentation"] == {"jobs": 0, "gpuHours": 0}
    assert out["run"]["events"] == 6


def test_table_output_says_what_was_assumed(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = trace(tmp_path, ("a", 0, 100, 8), ("b", 10, 50, 4), ("c", 20, 100, 4))
    assert main(["simulate", "--trace", path, "--nodes", "1"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "1 node x 8 GPUs (8 GPUs)" in out
    assert "a job of N GPUs is a gang of ceil(N/8) pods of min(N, 8) GPUs" in out
    assert "only GPUs and the pod limit bind" in out
    assert "GPU utilisation  87.5% of 8 GPUs" in out
    assert "mean 57s, median 1m20s, p95 1m29s, max 1m30s" in out
    assert "longest wait: b (4 GPUs in 1 pod) waited 1m30s" in out
    assert captured.err == ""  # no progress bar: stderr is not a terminal


def congested(tmp: Path) -> str:
    # 1 node of 8 GPUs: a holds half of it until 100; b needs the whole node; c fits now.
    return trace(tmp, ("a", 0, 100, 4), ("b", 1, 10, 8), ("c", 2, 10, 4))


def test_fifo_holds_the_line_backfill_lets_the_small_job_pass(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = congested(tmp_path)
    fifo = simulate_json(capsys, "--trace", path, "--nodes", "1", "--policy", "fifo")
    backfill = simulate_json(capsys, "--trace", path, "--nodes", "1", "--policy", "backfill")
    # fifo: b starts when a ends (100), c behind it when b ends (110).
    assert by_size(fifo)[(8, 1)]["maxSeconds"] == 99
    assert by_size(fifo)[(4, 1)]["maxSeconds"] == 108
    assert fifo["makespanSeconds"] == 120
    # backfill: c passes the waiting head at once; b still starts at 100.
    assert by_size(backfill)[(8, 1)]["maxSeconds"] == 99
    assert by_size(backfill)[(4, 1)]["maxSeconds"] == 0
    assert backfill["makespanSeconds"] == 110
    assert backfill["starvation"]["job"] == "b"
    assert backfill["starvation"]["overtakenBy"] == 1


def test_backfill_starvation_guard_from_a_policy_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "impatient.yaml"
    policy.write_text("name: impatient\norder: priority\nbackfill: true\n"
                      "starvationGuard: {maxHeadWaitSeconds: 0}\n")
    out = simulate_json(capsys, "--trace", congested(tmp_path), "--nodes", "1",
                        "--policy", str(policy))
    # b has waited 1 s > 0 when c arrives: the guard makes it block, as under fifo.
    assert out["policy"] == "impatient"
    assert by_size(out)[(4, 1)]["maxSeconds"] == 108


def test_jobs_larger_than_the_cluster_are_reported_not_dropped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = trace(tmp_path, ("small", 0, 10, 8), ("huge", 5, 10, 32), ("after", 6, 10, 16))
    for fit in ("per-node", "aggregate"):
        out = simulate_json(capsys, "--trace", path, "--nodes", "2", "--fit", fit)
        assert out["jobs"]["neverFit"] == 1 and out["jobs"]["started"] == 2
        (huge,) = out["neverFit"]
        assert (huge["job"], huge["gpus"], huge["pods"]) == ("huge", 32, 4)
        assert huge["where"].endswith("t.csv:3")
        assert "would not fit even on an empty cluster" in huge["reason"]
        # It holds nobody up: the 16-GPU job behind it starts when "small" ends.
        assert by_size(out)[(16, 2)]["maxSeconds"] == 4
    main(["simulate", "--trace", path, "--nodes", "2"])
    table = capsys.readouterr().out
    assert "1 never fit the cluster" in table
    assert "huge, 32 GPUs in 4 pods: would not fit even on an empty cluster" in table


def fragmented_trace(tmp: Path) -> str:
    # 3 nodes of 8 GPUs. Best fit packs a,b on node-0 and c,d on node-1; a and d end at
    # 50, leaving 4 + 4 + 8 GPUs free: 16 in total, but only one node with 8. Then e
    # asks for 16 GPUs, a gang of 2 pods of 8.
    return trace(tmp, ("a", 0, 50, 4), ("b", 0, 1000, 4), ("c", 0, 1000, 4),
                 ("d", 0, 50, 4), ("e", 60, 100, 16))


def test_aggregate_fit_makes_a_partial_gang_per_node_fit_does_not(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = fragmented_trace(tmp_path)
    agg = simulate_json(capsys, "--trace", path, "--nodes", "3", "--fit", "aggregate")
    partial = agg["partialGangs"]
    assert (partial["unplacedAtDispatch"], partial["holdingIdleGpus"]) == (1, 1)
    (e,) = partial["jobs"]
    # Dispatched at 60 with one pod on node-2; its second pod has no node until b and c
    # end at 1000. Its 8 placed GPUs sit idle all that time.
    assert (e["job"], e["dispatched"], e["started"]) == ("e", 60, 1000)
    assert (e["pods"], e["podsBoundAtDispatch"], e["podsBound"]) == (2, 1, 2)
    assert e["pendingSeconds"] == 940
    assert e["heldGpuHours"] == pytest.approx(8 * 940 / 3600, abs=1e-3)
    assert agg["gpuHeldByPartialGangs"] == pytest.approx(8 * 940 / (24 * 1100), abs=1e-5)
    assert agg["fragmentation"] is None

    per_node = simulate_json(capsys, "--trace", path, "--nodes", "3")
    assert per_node["partialGangs"] is None
    # e waits in the queue instead, holding nothing, for the same 940 s: the aggregate
    # rule would have admitted it (16 GPUs free in total) all along.
    assert by_size(per_node)[(16, 2)]["maxSeconds"] == 940
    assert per_node["fragmentation"] == {"jobs": 1,
                                         "gpuHours": pytest.approx(16 * 940 / 3600, abs=1e-3)}
    assert per_node["makespanSeconds"] == agg["makespanSeconds"] == 1100
    main(["simulate", "--trace", path, "--nodes", "3", "--fit", "aggregate"])
    table = capsys.readouterr().out
    assert "1 of them held the GPUs of their placed pods idle" in table


def test_waiting_for_gpus_taken_in_the_same_cycle_is_not_fragmentation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # x and y arrive together on one empty 8-GPU node: x takes it all, y waits. Before
    # x's dispatch 8 GPUs were free, enough for y -- but not after it: no fragmentation.
    path = trace(tmp_path, ("x", 0, 100, 8), ("y", 0, 100, 8))
    out = simulate_json(capsys, "--trace", path, "--nodes", "1")
    assert out["queueingDelay"]["maxSeconds"] == 100
    assert out["fragmentation"] == {"jobs": 0, "gpuHours": 0}


def yaml_job(name: str, submit: float, duration: float, gpus: int, pods: int = 1) -> str:
    return f"""
- submitTime: {submit}
  duration: {duration}
  appwrapper:
    apiVersion: workload.codeflare.dev/v1beta1
    kind: AppWrapper
    metadata: {{name: {name}, namespace: team}}
    spec:
      resources:
        GenericItems:
        - custompodresources: [{{replicas: {pods}, requests: {{nvidia.com/gpu: {gpus}}}}}]
          generictemplate:
            apiVersion: batch/v1
            kind: Job
            metadata: {{name: {name}}}
            spec: {{template: {{spec: {{containers: [{{name: c}}]}}}}}}
"""


def test_aggregate_rule_can_dispatch_a_gang_that_never_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A pod of 16 GPUs on nodes of 8: 16 GPUs exist in total, so MCAD's rule admits it;
    # no node can ever hold the pod, and its reservation starves the job behind it.
    path = tmp_path / "t.yaml"
    path.write_text(yaml_job("big-pod", 0, 10, 16) + yaml_job("small", 1, 10, 1))
    agg = simulate_json(capsys, "--trace", str(path), "--nodes", "2", "--fit", "aggregate")
    assert agg["jobs"]["neverStarted"] == 2
    assert [j["job"] for j in agg["neverStarted"]] == ["team/big-pod", "team/small"]
    assert agg["starvation"]["stillWaiting"] is True
    per_node = simulate_json(capsys, "--trace", str(path), "--nodes", "2")
    assert [j["job"] for j in per_node["neverFit"]] == ["team/big-pod"]
    assert per_node["jobs"]["started"] == 1 and per_node["jobs"]["neverStarted"] == 0


def test_priority_policy_starts_the_higher_priority_job_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    low = yaml_job("low", 1, 10, 8).replace("spec:\n      resources",
                                             "spec:\n      priority: 1\n      resources")
    high = yaml_job("high", 2, 10, 8).replace("spec:\n      resources",
                                               "spec:\n      priority: 9\n      resources")
    path = tmp_path / "t.yaml"
    path.write_text(yaml_job("first", 0, 100, 8) + low + high)
    fifo = simulate_json(capsys, "--trace", str(path), "--nodes", "1", "--policy", "fifo")
    prio = simulate_json(capsys, "--trace", str(path), "--nodes", "1", "--policy", "priority")
    # first runs 0-100; then fifo runs low (100-110) before high, priority the reverse.
    assert fifo["starvation"]["job"] == "team/high"
    assert fifo["starvation"]["waitSeconds"] == 108
    assert prio["starvation"]["job"] == "team/low"
    assert prio["starvation"]["waitSeconds"] == 109


def test_gpus_per_node_changes_the_gangs_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = trace(tmp_path, ("a", 0, 10, 8), ("b", 0, 10, 2))
    out = simulate_json(capsys, "--trace", path, "--nodes", "3", "--gpus-per-node", "6")
    assert sorted(by_size(out)) == [(2, 1), (12, 2)]  # 8 GPUs: 2 pods of 6
    assert "a job of N GPUs is a gang of ceil(N/6) pods of min(N, 6) GPUs" in out["notes"]
    assert any("1 job asked for more than 6 GPUs" in n for n in out["notes"])


def test_skipping_the_queue_behind_a_blocked_head_changes_no_outcome() -> None:
    rng = random.Random(3)
    rows = [f"j{i},{i * 50},{rng.randint(10, 2000)},{rng.choice([1, 2, 4, 8, 8, 16, 24])}"
            for i in range(300)]
    jobs = read_csv(HEADER + "\n".join(rows), "random.csv").jobs
    for name in ("fifo", "backfill"):
        policy = load_policy(name)
        runs = [Simulation(jobs, gpu_nodes(4, 8), policy, skip_behind_head=skip).run()
                for skip in (True, False)]
        fast, full = ([(r.dispatched, r.started, r.fragmented_seconds) for r in run.jobs]
                      for run in runs)
        assert fast == full
        assert sum(r.wait or 0 for r in runs[0].jobs) > 0  # the test trace does queue


def test_progress_bar_on_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = trace(tmp_path, ("a", 0, 100, 8), ("b", 10, 50, 4))
    assert main(["simulate", "--trace", path, "--nodes", "1", "--progress"]) == 0
    err = capsys.readouterr().err
    assert "100% 2/2 jobs arrived" in err and err.endswith("\n")


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "run.png"
    path = fragmented_trace(tmp_path)
    assert main(["simulate", "--trace", path, "--nodes", "3", "--fit", "aggregate",
                 "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_fails_before_simulating(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    path = trace(tmp_path, ("a", 0, 100, 8))
    code = main(["simulate", "--trace", path, "--nodes", "1", "--plot",
                 str(tmp_path / "x.png")])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert "--plot needs matplotlib" in captured.err
    assert "pip install 'appwrapper-dispatcher[plot]'" in captured.err


@pytest.mark.parametrize(("argv", "message"), [
    (["--nodes", "0"], "--nodes must be at least 1"),
    (["--nodes", "1", "--gpus-per-node", "0"], "--gpus-per-node must be at least 1"),
    (["--nodes", "1", "--policy", "nope"], "unknown policy 'nope'"),
    (["--nodes", "1", "--cycle-interval", "0"], "--cycle-interval must be"),
])
def test_bad_flags_exit_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         argv: list[str], message: str) -> None:
    path = trace(tmp_path, ("a", 0, 100, 8))
    assert main(["simulate", "--trace", path, *argv]) == 2
    assert message in capsys.readouterr().err


def test_cycle_interval_runs_extra_cycles_for_dynamic_priorities(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Under strict priority, "old" (priority 0, slope 1/s, submitted at 2) waits behind
    # "big" (priority 50), which needs the whole node; "old" would fit beside the running
    # job. After time 52 its effective priority passes big's and it becomes the head --
    # but that only matters if a cycle runs: nothing else happens until "first" ends at
    # 1000. With a cycle every 10 s (12, 22, ..., 62) it dispatches at 62.
    def with_priority(text: str, spec: str) -> str:
        return text.replace("spec:\n      resources", f"spec:\n      {spec}\n      resources")

    path = tmp_path / "t.yaml"
    path.write_text(yaml_job("first", 0, 1000, 4)
                    + with_priority(yaml_job("big", 1, 10, 8), "priority: 50")
                    + with_priority(yaml_job("old", 2, 10, 4), "priorityslope: 1"))
    plain = simulate_json(capsys, "--trace", str(path), "--nodes", "1", "--policy",
                          "priority")
    ticking = simulate_json(capsys, "--trace", str(path), "--nodes", "1", "--policy",
                            "priority", "--cycle-interval", "10")
    assert by_size(plain)[(4, 1)]["maxSeconds"] == 998
    assert by_size(ticking)[(4, 1)]["maxSeconds"] == 60


@pytest.mark.parametrize(("policy", "batch_wait"), [("fifo", 5280), ("backfill", 0)])
def test_the_shipped_example_does_what_its_comments_say(
        capsys: pytest.CaptureFixture[str], policy: str, batch_wait: int) -> None:
    out = simulate_json(capsys, "--trace", str(EXAMPLE), "--nodes", "2", "--policy", policy)
    sizes = by_size(out)
    # ray-small: head + 2 workers of 4 GPUs; pytorch-16: 2 x 8; batch-eval: 2 x 2.
    assert sorted(sizes) == [(4, 2), (8, 3), (16, 2)]
    assert sizes[(16, 2)]["maxSeconds"] == 3540  # starts at 3600 either way
    assert sizes[(4, 2)]["maxSeconds"] == batch_wait


def test_start_estimates_are_measured_against_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One node: a (8 GPUs, 0-1000) runs; b, c and d (8 each) queue behind it. The one
    moment is the middle of the submissions, taken at the next event (d's arrival, 999).
    Durations known exactly: b at 1000, c 1100, d 1150, no error. From history: nothing
    has completed yet, so the default hour each: a ends at 3600, then b, c, d an hour apart
    (errors 2600, 6100 and 9650 s)."""
    path = trace(tmp_path, ("a", 0, 1000, 8), ("b", 1, 100, 8), ("c", 2, 50, 8),
                 ("d", 999, 10, 8))
    out = simulate_json(capsys, "--trace", path, "--nodes", "1", "--eta", "1")
    exact, history = out["startEstimates"]
    assert exact["durations"] == "exact" and exact["samples"] == 1
    assert (exact["estimates"], exact["medianErrorSeconds"], exact["p90ErrorSeconds"]) == (
        3, 0, 0)
    assert (history["estimates"], history["medianErrorSeconds"],
            history["p90ErrorSeconds"]) == (3, 6100, 9650)
    # Relative to the wait left at the moment: 2600 / 1, 6100 / 101, 9650 / 151.
    assert history["medianRelativeError"] == pytest.approx(9650 / 151, abs=1e-3)
    assert main(["simulate", "--trace", path, "--nodes", "1", "--eta", "1"]) == 0
    table = capsys.readouterr().out
    assert "start estimates: every queued job's, at 1 moment spread" in table
    assert table.splitlines()[-1].split()[:5] == ["history", "1", "3", "1h41m", "2h40m"]
    assert main(["simulate", "--trace", path, "--nodes", "1", "--eta", "1",
                 "--fit", "aggregate"]) == 2
    assert "--eta measures start estimates with --fit per-node only" in capsys.readouterr().err
