"""`make test`: every suite, each started as soon as what it needs is there.

On a machine that never saw the project, the Go build of the local cluster is most of the
wait; staging the suites after it (lint, unit, the wheel, then the build, then the cluster
tests, then the conformance suites) left both cores idle or busy with one thing at a time.
Here the build starts first and the Python checks run beside it; the binaries only the
last phases use (Kueue and codeflare's controller for the peer tests, kuttl and codeflare's
e2e suite for the conformance suites) are built while the cluster tests run.

    0  go build: what the cluster tests need         | apt installs, lint, unit, the wheel
    1  go build: what the last phases need            | the cluster tests (not the peers')
    2  the peer tests, MCAD's kuttl suites, codeflare's e2e suite

Every suite runs whatever another one gave (a failure stops only what needs its output: a
failed build, the suites that run on it) and the run ends with each phase's minutes and
the first failure. The suites print as they go; a build's output is printed when it
ends (also in .test-logs/), so that it never interleaves with theirs.

Usage: python -m tests.pipeline [--dry-run]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from localcluster.versions import BUILD_ORDER

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
VENV_BIN = Path(PY).parent

#: Built while the cluster tests run: only the peer tests and the conformance suites use them.
LATE_BUILDS = ("kueue", "appwrapper", "kuttl")
EARLY_BUILDS = tuple(n for n in BUILD_ORDER if n not in LATE_BUILDS)
#: The cluster tests that run a peer (Kueue, codeflare's controller): after LATE_BUILDS.
PEER_TESTS = ("tests/cluster/test_peers.py", "tests/cluster/test_peers_appwrapper.py")


@dataclass
class Step:
    """One command of the run, and what became of it."""

    name: str
    argv: list[str]
    needs: tuple[str, ...] = ()
    #: Its output kept in its log and printed whole when it ends (the builds, which run
    #: beside the suites), instead of as it comes.
    logged: bool = False
    started: float = 0.0
    seconds: float = 0.0
    rc: int | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def failed(self) -> bool:
        return self.rc not in (None, 0)


def steps() -> dict[str, Step]:
    """Every step of `make test`, by name; `needs` names the steps whose success it needs."""
    pytest = [str(VENV_BIN / "pytest"), "-q"]
    build = [PY, "-m", "localcluster", "build"]
    ignore_peers = [f"--ignore={t}" for t in PEER_TESTS]
    listed = [
        Step("build", [*build, *EARLY_BUILDS], logged=True),
        Step("apt", ["make", "--no-print-directory", "browser", "node-packages"]),
        Step("lint", ["make", "--no-print-directory", "lint"]),
        Step("unit", [*pytest, "tests/unit"], needs=("apt",)),
        Step("packaging", [*pytest, "tests/packaging"], needs=("apt",)),
        Step("build-late", [*build, *LATE_BUILDS], needs=("build",), logged=True),
        Step("cluster", [*pytest, "--durations=40", "tests/cluster", *ignore_peers],
             needs=("build", "apt")),
        Step("peers", [*pytest, *PEER_TESTS], needs=("build", "build-late", "apt")),
        Step("kuttl", [PY, "-m", "tests.conformance.mcad_kuttl"],
             needs=("build", "build-late", "apt")),
        Step("e2e", [PY, "-m", "tests.conformance.appwrapper_e2e"],
             needs=("build", "build-late", "apt")),
    ]
    return {s.name: s for s in listed}


#: Steps run one after another in each lane; the lanes run side by side. A lane waits for
#: a step of another lane only where `needs` says so.
LANES: tuple[tuple[str, ...], ...] = (
    ("build", "build-late"),
    ("apt", "lint", "unit", "packaging", "cluster", "peers", "kuttl", "e2e"),
)


class Run:
    def __init__(self, plan: dict[str, Step], out: Path) -> None:
        self.plan = plan
        self.out = out
        self.t0 = time.monotonic()

    def clock(self) -> str:
        s = int(time.monotonic() - self.t0)
        return f"{s // 60:02d}:{s % 60:02d}"

    def say(self, text: str) -> None:
        print(f"[make test {self.clock()}] {text}", flush=True)

    def start(self, step: Step) -> None:
        step.started = time.monotonic() - self.t0
        self.say(f"{step.name}: {' '.join(step.argv)}")
        log = (self.out / f"{step.name}.log").open("wb") if step.logged else None
        step.process = subprocess.Popen(step.argv, cwd=REPO, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def finish(self, step: Step) -> None:
        assert step.process is not None
        step.rc = step.process.wait()
        step.seconds = time.monotonic() - self.t0 - step.started
        if step.logged:
            sys.stdout.write((self.out / f"{step.name}.log").read_text(errors="replace"))
        verdict = "passed" if step.rc == 0 else f"FAILED (exit {step.rc})"
        self.say(f"{step.name}: {verdict} in {step.seconds / 60:.1f} min")

    def blocked_by(self, step: Step) -> str | None:
        for need in step.needs:
            if self.plan[need].failed:
                return need
        return None

    def ready(self, step: Step) -> bool:
        return all(self.plan[n].rc is not None for n in step.needs)


class Stopped(Exception):
    """The run was told to stop (SIGTERM, or SIGINT: Ctrl-C)."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


def execute(plan: dict[str, Step], lanes: Sequence[Sequence[str]], out: Path) -> int:
    """Run `plan`'s steps lane by lane; stopped, it stops every step under way (each runs
    in a session of its own, so its whole process group) before it returns."""
    running: list[Step] = []
    previous = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _steps(Run(plan, out), lanes, running)
    except Stopped as e:
        print(f"[make test] stopped ({e}): stopping "
              f"{', '.join(s.name for s in running) or 'nothing'}", flush=True)
        for step in running:
            assert step.process is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(step.process.pid, signal.SIGTERM)
        for step in running:
            assert step.process is not None
            step.process.wait()
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _steps(run: Run, lanes: Sequence[Sequence[str]], running: list[Step]) -> int:
    plan = run.plan
    queues = [list(lane) for lane in lanes]
    while queues or running:
        for queue in queues:
            busy = any(s.name in lane for s in running for lane in lanes if queue[0] in lane)
            if busy or not run.ready(plan[queue[0]]):
                continue
            step = plan[queue.pop(0)]
            blocker = run.blocked_by(step)
            if blocker is None:
                run.start(step)
                running.append(step)
            else:
                step.rc = 125
                run.say(f"{step.name}: not run, {blocker} failed")
        queues = [q for q in queues if q]
        for step in list(running):
            assert step.process is not None
            if step.process.poll() is not None:
                run.finish(step)
                running.remove(step)
        time.sleep(0.5)
    return summary(run)


def summary(run: Run) -> int:
    run.say("each step: started at, minutes, result")
    for step in run.plan.values():
        start = f"{int(step.started) // 60:02d}:{int(step.started) % 60:02d}"
        result = {None: "not run", 0: "passed", 125: "not run"}.get(step.rc, "FAILED")
        print(f"  {step.name:11} {start}  {step.seconds / 60:5.1f}  {result}")
    failed = [s.name for s in run.plan.values() if s.failed]
    if failed:
        run.say(f"FAILED: {', '.join(failed)} (their output is above)")
        return 1
    run.say("every suite passed")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.pipeline", description=__doc__)
    ap.add_argument("--dry-run", action="store_true", help="print the steps and lanes only")
    args = ap.parse_args(argv)
    plan = steps()
    if args.dry_run:
        for lane in LANES:
            print(" -> ".join(n + (f" (after {', '.join(plan[n].needs)})" if plan[n].needs
                                   else "") for n in lane))
        return 0
    out = REPO / ".test-logs"
    out.mkdir(exist_ok=True)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    return execute(plan, LANES, out)


if __name__ == "__main__":
    sys.exit(main())
