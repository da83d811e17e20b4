"""`make test`'s pipeline (tests/pipeline.py): lanes side by side, a step after what it needs,
a failure stopping only what needs it, and the run failing if any step failed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import pipeline
from tests.pipeline import Step, execute


def _step(name: str, code: str, needs: tuple[str, ...] = ()) -> Step:
    return Step(name, [sys.executable, "-c", code], needs=needs, logged=True)


def _mark(path: Path, name: str) -> str:
    """Code that appends `name` to `path` when the step runs."""
    return f"open({str(path)!r}, 'a').write({name!r} + '\\n')"


def test_a_step_waits_for_what_it_needs_in_another_lane(tmp_path: Path) -> None:
    order = tmp_path / "order"
    plan = {
        "build": _step("build", f"import time; time.sleep(1); {_mark(order, 'build')}"),
        "lint": _step("lint", _mark(order, "lint")),
        "cluster": _step("cluster", _mark(order, "cluster"), needs=("build",)),
    }
    assert execute(plan, [("build",), ("lint", "cluster")], tmp_path) == 0
    # lint ran beside the build, the cluster tests after it.
    assert order.read_text().split() == ["lint", "build", "cluster"]
    assert all(s.rc == 0 for s in plan.values())


def test_a_failed_build_stops_only_what_needs_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = {
        "build": _step("build", "print('go: compile error'); raise SystemExit(2)"),
        "late": _step("late", "pass", needs=("build",)),
        "unit": _step("unit", "print('unit ok')"),
        "cluster": _step("cluster", "pass", needs=("build",)),
        "kuttl": _step("kuttl", "pass"),
    }
    assert execute(plan, [("build", "late"), ("unit", "cluster", "kuttl")], tmp_path) == 1
    assert [plan[n].rc for n in ("build", "late", "unit", "cluster", "kuttl")] == [
        2, 125, 0, 125, 0]
    out = capsys.readouterr().out
    assert "go: compile error" in out and "unit ok" in out
    assert "cluster: not run, build failed" in out
    assert "FAILED: build, late, cluster" in out


def test_the_shipped_plan_builds_everything_and_runs_every_suite() -> None:
    plan = pipeline.steps()
    built = {*pipeline.EARLY_BUILDS, *pipeline.LATE_BUILDS}
    assert built == set(pipeline.BUILD_ORDER)
    # The peers and the conformance suites use the late builds; the cluster tests only
    # the early ones, and skip no test module but the peers' (run after them).
    assert set(plan["peers"].needs) >= {"build", "build-late"}
    assert set(plan["kuttl"].needs) >= {"build-late"} and set(plan["e2e"].needs) >= {"build-late"}
    cluster_argv = plan["cluster"].argv
    assert "tests/cluster" in cluster_argv
    ignored = {a.removeprefix("--ignore=") for a in cluster_argv if a.startswith("--ignore=")}
    assert ignored == set(pipeline.PEER_TESTS) == {
        a for a in plan["peers"].argv if a.startswith("tests/cluster/")}
    assert {n for lane in pipeline.LANES for n in lane} == set(plan)


def test_stopped_it_stops_every_step_under_way_and_their_children(tmp_path: Path) -> None:
    # The steps run in sessions of their own (a build's go processes, a suite's cluster):
    # stopping `make test` must stop them too, not leave them running.
    child_pid = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"open({str(child_pid)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    runner = (
        "import sys\n"
        "from pathlib import Path\n"
        "from tests.pipeline import Step, execute\n"
        f"plan = {{'build': Step('build', [sys.executable, '-c', {script!r}], logged=True)}}\n"
        f"sys.exit(execute(plan, [('build',)], Path({str(tmp_path)!r})))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", runner], cwd=pipeline.REPO,
                            stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (child_pid.exists() and child_pid.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None, "the step never started"
        time.sleep(0.1)
    pid = int(child_pid.read_text())
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "stopped (SIGTERM): stopping build" in out
    deadline = time.monotonic() + 30
    while _alive(pid):
        assert time.monotonic() < deadline, "the step's child is still running"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (stopped, not yet reaped by its parent) is not running.
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] != "Z"
