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
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "dispatcher", "localcluster")

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
    sdist: Path


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
    builder = root / "build-venv"
    _run(sys.executable, "-m", "venv", builder, cwd=root, env=env)
    _run(builder / "bin" / "python", "-m", "pip", "install", "-q", "build", cwd=root, env=env)
    _run(builder / "bin" / "python", "-m", "build", "--sdist", "-o", dist, src, cwd=root,
         env=env)
    (sdist,) = dist.glob("*.tar.gz")
    shutil.rmtree(src)  # the installed package must not need its sources
    return Wheel(path, built.stdout + built.stderr, env, sdist)


@pytest.fixture(scope="session")
def installed(wheel: Wheel, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A plain `pip install` of the wheel: no extra."""
    root = tmp_path_factory.mktemp("installed")
    venv, work, env = root / "venv", root / "work", wheel.env
    work.mkdir()
    _run(sys.executable, "-m", "venv", venv, cwd=root, env=env)
    _run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheel.path, cwd=root, env=env)

    def run(*argv: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _run(venv / "bin" / argv[0], *argv[1:], cwd=work, env=env, check=check)

    return run


def unreachable_kubeconfig(where: Path) -> Path:
    """A kubeconfig naming a server nothing listens on (port 1 of this machine)."""
    path = where / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u",
                                               "namespace": "team-a"}}]}))
    return path


#: Every installed command that talks to a cluster, as a user types it.
CLUSTER_COMMANDS = (
    ("dispatcher", "queue"), ("dispatcher", "why", "x"), ("dispatcher", "hold", "x"),
    ("dispatcher", "release", "x"), ("dispatcher", "cancel", "x"),
    ("dispatcher", "plan", "--live", "-f", str(EXAMPLES / "demo" / "07-job.yaml")),
    ("kubectl-appwrapper", "queue"), ("kubectl-appwrapper", "why", "x"),
    ("kubectl-appwrapper", "hold", "x"),
    ("kubectl-appwrapper", "plan", "-f", str(EXAMPLES / "demo" / "07-job.yaml")),
)


def test_a_plain_install_runs_every_cluster_command(installed: Run, tmp_path: Path) -> None:
    """No extra: each command gets as far as the API server and says, in one line, that it
    cannot reach it; none ends in an import's traceback."""
    kubeconfig = unreachable_kubeconfig(tmp_path)
    for argv in CLUSTER_COMMANDS:
        done = installed(*argv, "--kubeconfig", kubeconfig, check=False)
        assert done.returncode == 1, (argv, done.stderr)
        assert "Traceback" not in done.stderr and "ModuleNotFoundError" not in done.stderr, (
            argv, done.stderr)
        assert "cannot reach the API server at https://127.0.0.1:1" in done.stderr, (
            argv, done.stderr)
    for argv in (("dispatcher", "run", "--metrics-port", "0"), ("dispatcher", "webhook")):
        done = installed(*argv, "--kubeconfig", tmp_path / "none", check=False)
        assert done.returncode == 2, (argv, done.stderr)
        assert "Traceback" not in done.stderr, (argv, done.stderr)
        assert f"kubeconfig {tmp_path / 'none'} does not exist" in done.stderr, done.stderr


def test_the_wheel_and_the_sdist_carry_the_license_and_the_project_metadata(
        wheel: Wheel, installed: Run) -> None:
    import tarfile
    import zipfile

    license_text = (REPO / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0" in license_text
    with zipfile.ZipFile(wheel.path) as whl:
        (licensed,) = [n for n in whl.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert whl.read(licensed).decode() == license_text
    with tarfile.open(wheel.sdist) as sdist:
        (licensed,) = [m for m in sdist.getmembers() if m.name.endswith("/LICENSE")
                       and m.name.count("/") == 1]
        member = sdist.extractfile(licensed)
        assert member is not None and member.read().decode() == license_text
    metadata = json.loads(installed(
        "python", "-c", "import json; from importlib.metadata import metadata; "
        f"m = metadata({DISTRIBUTION!r}); print(json.dumps({{k: m.get_all(k) for k in "
        "('License-File', 'Author', 'Classifier')}))").stdout)
    assert metadata["License-File"] == ["LICENSE"]
    assert metadata["Author"] == ["The dispatcher authors"]
    assert "Topic :: System :: Distributed Computing" in metadata["Classifier"]


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


def _readme_install_block() -> list[str]:
    """The first shell block of README's "Install on a real cluster": the commands."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Install on a real cluster", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines()]


def test_the_readme_install_runs_as_written_from_a_clone(wheel: Wheel,
                                                          tmp_path: Path) -> None:
    """README's commands, typed in a copy of the repository with a home of its own, up to
    the first that needs a cluster; that one then says it cannot reach it."""
    lines = _readme_install_block()
    assert lines[:4] == [
        "python3 -m venv ~/.venvs/dispatcher", "~/.venvs/dispatcher/bin/pip install .",
        'export PATH="$HOME/.venvs/dispatcher/bin:$PATH"', "dispatcher --version"]
    clone, home = tmp_path / "clone", tmp_path / "home"
    home.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, clone / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    kubeconfig = unreachable_kubeconfig(tmp_path)
    env = {**wheel.env, "HOME": str(home), "KUBECONFIG": str(kubeconfig)}
    script = "set -e\n" + "\n".join(lines[:4]) + "\nkubectl-appwrapper queue -A || echo rc=$?\n"
    done = _run("bash", "-c", script, cwd=clone, env=env)
    assert f"dispatcher {VERSION}" in done.stdout.splitlines(), done.stdout[-3000:]
    assert "Successfully installed" in done.stdout and "Traceback" not in done.stderr
    assert "cannot reach the API server at https://127.0.0.1:1" in done.stderr, done.stderr
    assert done.stdout.splitlines()[-1] == "rc=1"
    # Only the released package is promised from the package index.
    text = (REPO / "README.md").read_text()
    assert "pipx install 'appwrapper-dispatcher[controller]'" not in text
    assert "Once released: `pipx install appwrapper-dispatcher`" in text


def test_the_wheel_ships_the_dashboards_pages(installed: Run) -> None:
    # The pages' files (the controller's and the manager's) are looked up beside the
    # installed package.
    out = installed("python", "-c", "import dispatcher, pathlib; page = pathlib.Path("
                    "dispatcher.__file__).parent / 'dashboard_page';"
                    "print(*sorted(p.name for p in page.iterdir()))").stdout
    assert out.split() == ["app.js", "clusters.html", "clusters.js", "index.html",
                           "style.css"]
