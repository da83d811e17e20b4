"""`dispatcher simulate --elastic`: the same trace rigid and elastic, side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatcher.cli import main
from dispatcher.policy_files import load_policy
from dispatcher.simulate import simulate
from dispatcher.simulate.elastic import elastic_trace
from dispatcher.simulate.traces import read_csv

from .test_simulate import HEADER, simulate_json, trace

# 2 nodes of 8 GPUs. `one` (8 GPUs) runs 0-100. `two` (16 GPUs, 2 pods) arrives at 1:
# rigid, it waits for `one` and runs 100-200 (waited 99); elastic, it starts at 1 on one
# pod (half speed: 49.5 s of its 100 done by 100), grows to 2 pods when `one` ends and
# finishes the other 50.5 s at 150.5 (waited 0).
JOBS = (("one", 0, 100, 8), ("two", 1, 100, 16))


def test_an_elastic_job_starts_at_its_minimum_and_grows_when_room_frees() -> None:
    text = HEADER + "".join(f"{j},{s},{d},{g}\n" for j, s, d, g in JOBS)
    stretchy, made = elastic_trace(read_csv(text, "t.csv"))
    assert made == 1
    run = simulate(stretchy.jobs, 2, 8, load_policy("fifo"))
    two = run.jobs[1]
    assert (two.started, two.finished, two.scale_outs) == (1, 150.5, 1)
    assert two.gpu_seconds == pytest.approx(8 * 99 + 16 * 50.5)


def test_the_comparison_names_its_assumption_and_both_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = trace(tmp_path, *JOBS)
    out = simulate_json(capsys, "--trace", path, "--nodes", "2", "--elastic")
    assert out["assumption"].startswith("elastic: a job of N GPUs runs on ceil(N/2) to N")
    assert (out["rigid"]["delays"]["maxSeconds"], out["elastic"]["delays"]["maxSeconds"]) == (
        99, 0)
    assert (out["elasticJobs"], out["scaleOuts"], out["scaleIns"]) == (1, 1, 0)
    assert main(["simulate", "--trace", path, "--nodes", "2", "--elastic"]) == 0
    table = capsys.readouterr().out
    assert "1 of 2 jobs elastic; 1 scale-out, 0 scale-ins" in table
    assert "rigid" in table and "elastic" in table


def test_a_high_priority_job_shrinks_an_elastic_one_instead_of_waiting(
        tmp_path: Path) -> None:
    """`big` (16 GPUs) fills both nodes from 0; `urgent` (8 GPUs, priority 10) arrives at
    10: under the priority policy `big` gives back one pod at once."""
    text = HEADER + "big,0,100,16\nurgent,10,50,8\n"
    stretchy, _ = elastic_trace(read_csv(text, "t.csv"))
    jobs = list(stretchy.jobs)
    jobs[1] = jobs[1].__class__(**{**jobs[1].__dict__, "wrapper": jobs[1].wrapper.__class__(
        **{**jobs[1].wrapper.__dict__, "priority": 10})})
    run = simulate(jobs, 2, 8, load_policy("priority"))
    big, urgent = run.jobs
    assert urgent.started == 10 and big.scale_ins == 1 and big.preemptions == 0
