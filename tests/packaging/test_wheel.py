"""A plain `pip install` of the built wheel works: the CLI finds everything it reads.

Builds the wheel from a copy of the sources (so nothing of the checkout, not even a stale
build/ folder, leaks in), installs it into a fresh venv with its dependencies from PyPI,
and runs the commands from a directory outside the checkout. One venv per session: the
install takes most of the time (numpy, pydantic). The kubectl plugin is installed as users
install it, with pipx (itself installed into a venv of its own).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatcher import DISTRIBUTION

pytestmark = pytest.mark.packaging

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SOURCES = ("pyproject.toml", "README.md", "dispatcher", "localcluster")

Run = Callable[..., subprocess.CompletedProcess[str]]


def _run(*argv: str | Path, cwd: Path, env: dict[str, str], check: bool = True
         ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, argv))} exited {done.returncode}:\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


@dataclass
class Wheel:
    path: Path
    build_output: str  # what the build backend printed
    env: dict[str, str]


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Wheel:
    root = tmp_path_factory.mktemp("packaging")
    src, dist = root / "src", root / "dist"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(REPO / name, src / name)
    # Only the wheel and the venv: no PYTHONPATH, no policies folder from the environment.
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "DISPATCHER_POLICIES_DIR", "VIRTUAL_ENV")}
    built = _run(sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "-w", dist, src,
                 cwd=root, env=env)
    (path,) = dist.glob("*.whl")
    shutil.rmtree(src)  # the installed package must not need its sources
    return Wheel(path, built.stdout + built.stderr, env)


@pytest.fixture(scope="session")
def installed(wheel: Wheel, tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("installed")
    venv, work, env = root / "venv", root / "work", wheel.env
    work.mkdir()
    _run(sys.executable, "-m", "venv", venv, cwd=root, env=env)
    _run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheel.path, cwd=root, env=env)

    def run(*argv: str | Path) -> subprocess.CompletedProcess[str]:
        return _run(venv / "bin" / argv[0], *argv[1:], cwd=work, env=env)

    return run


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


VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_the_wheel_is_named_for_the_package_index_and_builds_without_warnings(
        wheel: Wheel, installed: Run) -> None:
    assert wheel.path.name == f"{DISTRIBUTION.replace('-', '_')}-{VERSION}-py3-none-any.whl"
    metadata = installed("python", "-c", "from importlib.metadata import metadata; "
                         f"m = metadata({DISTRIBUTION!r}); "
                         "print(m['Name'], m['License-Expression'])").stdout.split()
    assert metadata == [DISTRIBUTION, "Apache-2.0"]
    # A license table, or one the setuptools in use cannot read, is a deprecation warning
    # today and an error after 2027-02-18.
    assert "deprecat" not in wheel.build_output.lower(), wheel.build_output[-3000:]
    # The version the metrics report (dispatcher_build_info) is the distribution's.
    assert installed("python", "-c", "import dispatcher; print(dispatcher.version())"
                     ).stdout.strip() == VERSION


def test_pipx_installs_the_kubectl_plugin_with_what_it_needs(
        wheel: Wheel, tmp_path: Path) -> None:
    """`pipx install 'appwrapper-dispatcher[controller]'` (the wheel here): kubectl finds
    `kubectl-appwrapper` on the PATH, and it has the Kubernetes client it lists with."""
    tools, home = tmp_path / "pipx-venv", tmp_path / "pipx"
    env = {**wheel.env, "PIPX_HOME": str(home), "PIPX_BIN_DIR": str(home / "bin"),
           "PIPX_MAN_DIR": str(home / "man")}
    _run(sys.executable, "-m", "venv", tools, cwd=tmp_path, env=env)
    _run(tools / "bin" / "python", "-m", "pip", "install", "-q", "pipx", cwd=tmp_path, env=env)
    _run(tools / "bin" / "python", "-m", "pipx", "install", f"{wheel.path}[controller]",
         cwd=tmp_path, env=env)
    plugin = home / "bin" / "kubectl-appwrapper"
    assert "kubectl appwrapper queue" in _run(plugin, "queue", "--help", cwd=tmp_path,
                                              env=env).stdout
    # It gets as far as reading the kubeconfig: the client libraries are there.
    done = _run(plugin, "queue", "--kubeconfig", tmp_path / "none", cwd=tmp_path, env=env,
                check=False)
    assert done.returncode == 1
    assert "kubectl appwrapper queue: " in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_the_wheel_ships_the_dashboards_page(installed: Run) -> None:
    # Without the controller's extras installed: the files are looked up beside the package.
    out = installed("python", "-c", "import dispatcher, pathlib; page = pathlib.Path("
                    "dispatcher.__file__).parent / 'dashboard_page';"
                    "print(*sorted(p.name for p in page.iterdir()))").stdout
    assert out.split() == ["app.js", "index.html", "style.css"]
