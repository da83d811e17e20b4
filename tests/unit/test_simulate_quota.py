"""`dispatcher simulate` with teams, quota trees and preemption: small traces worked by hand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.cli import main
from dispatcher.simulate.teams import HIGH_PRIORITY, TeamRule, assign, parse_teams
from dispatcher.simulate.traces import TraceError, read_csv

from .quota_world import appwrapper, subtree
from .test_simulate import simulate_json

GPU = "nvidia.com/gpu"
HEADER = "job_id,submission_time,duration,num_gpu\n"


def yaml_trace(tmp: Path, *entries: tuple[dict[str, Any], float, float]) -> str:
    path = tmp / "trace.yaml"
    path.write_text(yaml.safe_dump([{"submitTime": t, "duration": d, "appwrapper": aw}
                                    for aw, t, d in entries]))
    return str(path)


def quota_file(tmp: Path, team_a: int, team_b: int, root: int, hard_a: bool = False) -> str:
    path = tmp / "quota.yaml"
    path.write_text(yaml.safe_dump_all([
        subtree("root", "gpu", [("root", {GPU: root}, False)]),
        subtree("teams", "gpu", [("team-a", {GPU: team_a}, hard_a),
                                 ("team-b", {GPU: team_b}, False)], parent="root"),
    ]))
    return str(path)


def test_a_team_at_its_quota_waits_while_another_team_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """16 GPUs; team-a has 8 and may not borrow: its second job waits for the first
    (0-100) although 8 GPUs are free, and holds the line for team-a only: team-b's job,
    submitted after it under fifo, runs at once."""
    path = yaml_trace(tmp_path,
                      (appwrapper("a1", {"gpu": "team-a"}, gpu=8), 0, 100),
                      (appwrapper("a2", {"gpu": "team-a"}, gpu=8), 1, 100),
                      (appwrapper("b1", {"gpu": "team-b"}, gpu=4), 2, 50))
    out = simulate_json(capsys, "--trace", path, "--nodes", "2",
                   "--quota", quota_file(tmp_path, 8, 8, 16, hard_a=True))
    teams = {t["team"]: t for t in out["teams"]}
    assert teams["team-a"]["queueingDelay"]["maxSeconds"] == 99  # a2: submitted 1, ran 100
    assert teams["team-b"]["queueingDelay"]["maxSeconds"] == 0
    assert teams["team-a"]["quotaGpus"] == 8
    assert teams["team-a"]["gpuHours"] == round(8 * 200 / 3600, 3)
    # team-a ran 1,600 GPU-seconds against 8 GPUs x the 200 s makespan.
    assert teams["team-a"]["quotaUse"] == pytest.approx(1.0)


def test_borrowed_quota_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = yaml_trace(tmp_path, (appwrapper("big", {"gpu": "team-a"}, gpu=8, pods=2), 0, 360))
    out = simulate_json(capsys, "--trace", path, "--nodes", "2",
                   "--quota", quota_file(tmp_path, 8, 8, 16))
    team = next(t for t in out["teams"] if t["team"] == "team-a")
    assert team["borrowedGpuHours"] == 16 * 360 / 3600


def test_a_high_priority_job_preempts_and_the_victim_starts_over(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """1 node of 8 GPUs: low (8 GPUs, 0-) is preempted at 30 by high (priority 10, 100 s);
    low restarts at 130 and runs its full 100 s again: 30 s x 8 GPUs of work lost."""
    path = yaml_trace(tmp_path,
                      (appwrapper("low", gpu=8), 0, 100),
                      (appwrapper("high", gpu=8, priority=10), 30, 100))
    out = simulate_json(capsys, "--trace", path, "--nodes", "1", "--policy", "priority-preemption")
    assert out["preemption"] == {"preemptions": 1, "jobsPreempted": 1,
                                 "lostGpuHours": round(8 * 30 / 3600, 3)}
    assert out["makespanSeconds"] == 230
    prios = {p["priority"]: p for p in out["queueingDelayByPriority"]}
    assert prios[10]["maxSeconds"] == 0 and prios[0]["maxSeconds"] == 0  # low first started at 0


def test_the_table_shows_teams_priorities_and_preemptions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = yaml_trace(tmp_path,
                      (appwrapper("low", {"gpu": "team-b"}, gpu=8), 0, 100),
                      (appwrapper("high", {"gpu": "team-a"}, gpu=8, priority=10), 30, 100))
    assert main(["simulate", "--trace", path, "--nodes", "1", "--policy",
                 "priority-preemption", "--quota", quota_file(tmp_path, 4, 4, 8)]) == 0
    text = capsys.readouterr().out
    assert "preemption       1 preemption of 1 job: 0.1 GPU-hours of work lost" in text
    assert "priority 10      1 job: mean wait 0s" in text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["TEAM", "JOBS"])
    assert lines[header + 2].split()[:2] == ["team-b", "1"]
    assert lines[header + 2].split()[-2:] == ["1", "0.1"]


def test_teams_and_priorities_are_assigned_by_hash_and_stay_put() -> None:
    text = HEADER + "".join(f"job-{i},{i},10,1\n" for i in range(2000))
    trace = read_csv(text, "t.csv")
    rule = TeamRule(parse_teams("team-a=2,team-b,team-c"), high_priority=0.2)
    one, two = assign(trace, rule, ("gpu",)), assign(trace, rule, ("gpu",))
    assert [j.team for j in one.jobs] == [j.team for j in two.jobs]
    counts = {t: sum(j.team == t for j in one.jobs) for t in ("team-a", "team-b", "team-c")}
    assert 900 < counts["team-a"] < 1100 and 400 < counts["team-b"] < 600
    high = sum(j.wrapper.priority == HIGH_PRIORITY for j in one.jobs)
    assert 320 < high < 480
    assert one.jobs[0].wrapper.labels == (("gpu", one.jobs[0].team),)
    assert "20% of them, also by hash, at priority 10" in one.notes[-1]


@pytest.mark.parametrize(("argv", "message"), [
    (["--teams", "team-a=0"], "--teams: 'team-a=0' is not TEAM or TEAM=WEIGHT"),
    (["--teams", "a,a"], "--teams: team a is given twice"),
    (["--high-priority", "2"], "--high-priority must be a fraction between 0 and 1, got 2.0"),
    (["--policy", "priority-preemption", "--fit", "aggregate"],
     "policy priority-preemption preempts: simulate it with --fit per-node"),
])
def test_bad_team_and_preemption_options_say_what_to_fix(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
        message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "a,0,10,1\n")
    assert main(["simulate", "--trace", str(path), "--nodes", "1", *argv]) == 2
    assert message in capsys.readouterr().err


def test_teams_apply_to_csv_traces_only_and_quota_files_are_checked(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = yaml_trace(tmp_path, (appwrapper("x", gpu=1), 0, 10))
    assert main(["simulate", "--trace", path, "--nodes", "1", "--teams", "a,b"]) == 2
    assert "--teams and --high-priority apply to CSV traces" in capsys.readouterr().err
    bad = tmp_path / "q.yaml"
    bad.write_text(yaml.safe_dump(subtree("kids", "gpu", [("a", {GPU: 1}, False)],
                                          parent="nowhere")))
    assert main(["simulate", "--trace", path, "--nodes", "1", "--quota", str(bad)]) == 2
    assert "parent nowhere is not a node of tree gpu" in capsys.readouterr().err


def test_parse_teams_defaults_weights_to_one() -> None:
    assert parse_teams("a=3, b") == (("a", 3), ("b", 1))
    with pytest.raises(TraceError):
        parse_teams("")


def test_a_preemptor_queued_behind_its_victim_still_dispatches(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """team-a borrows: `big` (16 GPUs of its 8) runs; `small` (1 GPU, team-a) comes and
    reclaims the quota `big` borrows. Requeued, `big` is first in line again (it came
    first) and waits, root full, holding the line: `small` must still pass it into the
    room held for it, at once, and `big` run again after it."""
    path = yaml_trace(tmp_path,
                      (appwrapper("big", {"gpu": "team-a"}, gpu=8, pods=2), 0, 1000),
                      (appwrapper("small", {"gpu": "team-a"}, gpu=1), 10, 5))
    out = simulate_json(capsys, "--trace", path, "--nodes", "2", "--policy",
                        "priority-preemption", "--quota", quota_file(tmp_path, 8, 8, 16))
    assert out["jobs"]["finished"] == 2 and out["jobs"]["neverStarted"] == 0
    assert out["preemption"]["preemptions"] == 1
    assert out["makespanSeconds"] == 1015  # small 10-15, big again 15-1015
