"""A plain `pip install` of the built wheel works: the CLI finds everything it reads.

Builds the wheel from a copy of the sources (so nothing of the checkout, not even a stale
build/ folder, leaks in), installs it into a fresh venv with its dependencies from PyPI,
and runs the commands from a directory outside the checkout. One venv per session: the
install takes most of the time (numpy, pydantic).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SOURCES = ("pyproject.toml", "README.md", "dispatcher", "localcluster")

Run = Callable[..., subprocess.CompletedProcess[str]]


def _run(*argv: str | Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, argv))} exited {done.returncode}:\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def _clean_environment() -> dict[str, str]:
    """Only the wheel and the venv: no PYTHONPATH, no policies folder from the environment."""
    return {k: v for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "DISPATCHER_POLICIES_DIR", "VIRTUAL_ENV")}


@dataclass(frozen=True)
class Built:
    root: Path
    wheel: Path
    log: str  # what the build backend printed


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp("packaging")
    src, dist = root / "src", root / "dist"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(REPO / name, src / name)
    env = _clean_environment()
    # -v: the build backend's own output, where setuptools prints its deprecations.
    done = _run(sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", dist, src,
                cwd=root, env=env)
    (wheel,) = dist.glob("dispatcher-*.whl")
    shutil.rmtree(src)  # the installed package must not need its sources
    return Built(root, wheel, done.stdout + done.stderr)


@pytest.fixture(scope="session")
def installed(built: Built) -> Run:
    root = built.root
    venv, work = root / "venv", root / "work"
    work.mkdir()
    env = _clean_environment()
    _run(sys.executable, "-m", "venv", venv, cwd=root, env=env)
    _run(venv / "bin" / "python", "-m", "pip", "install", "-q", built.wheel, cwd=root, env=env)

    def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
        return _run(venv / "bin" / argv[0], *argv[1:], cwd=work, env=env)

    return run


def test_building_the_wheel_warns_of_nothing_deprecated(built: Built) -> None:
    """setuptools refuses deprecated pyproject fields (a `license` table) after 2027-02-18:
    what warns today fails to install then."""
    warnings = [line.strip() for line in built.log.splitlines()
                if "DeprecationWarning" in line or "BuildBackendWarning" in line]
    assert warnings == []


def test_the_wheel_is_what_runs(installed: Run) -> None:
    where = installed("python", "-c", "import dispatcher; print(dispatcher.__file__)").stdout
    assert "site-packages" in where and str(REPO) not in where


def test_installed_plan_finds_its_built_in_policies(installed: Run) -> None:
    for policy in ("fifo", "priority", "backfill"):
        out = installed("dispatcher", "plan", "--policy", policy, "-o", "json",
                        "--now", "2026-11-01T10:15:00Z",
                        "--cluster", EXAMPLES / "plan" / "cluster.yaml",
                        EXAMPLES / "plan" / "appwrappers.yaml").stdout
        result: dict[str, Any] = json.loads(out)
        assert result["policy"] == policy
        assert {d["name"] for d in result["decisions"]} == {
            "ray-small", "pytorch-16", "batch-1gpu"}
        if policy == "fifo":  # README's example
            assert [d["decision"] for d in result["decisions"]] == ["dispatch", "wait", "wait"]


def test_installed_simulate_replays_a_trace(installed: Run) -> None:
    out = installed("dispatcher", "simulate", "--trace", EXAMPLES / "simulate" / "trace.yaml",
                    "--nodes", "2", "-o", "json").stdout
    summary: dict[str, Any] = json.loads(out)
    assert summary["policy"] == "fifo"
    assert summary["jobs"]["finished"] == summary["jobs"]["total"] == 3
