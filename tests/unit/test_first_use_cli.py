"""A new user's first commands, run as they type them (the installed `dispatcher` and
`kubectl-appwrapper`): each mistake said in one line naming the file, exit 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .test_plan import aw, node, write

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
BIN = Path(sys.executable).parent
#: "café" in Latin-1: the é is byte 0xe9, not UTF-8.
LATIN1 = "job_id,submit_time,duration,gpus\n1,0,60,1\n2,0,60,1 # caf\u00e9\n".encode("latin-1")
BINARY = b"\x7fELF\x02\x01\x01\x00" + bytes(range(256))


def run(*argv: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / str(argv[0])), *map(str, argv[1:])], capture_output=True,
                          text=True, timeout=timeout, check=False)


def _offset(data: bytes) -> int:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start
    raise AssertionError("the test's bytes are UTF-8")


def _said_plainly(done: subprocess.CompletedProcess[str], path: Path, data: bytes) -> None:
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "UnicodeDecodeError" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert str(path) in lines[0]
    assert f"not UTF-8 text: byte 0x{data[_offset(data)]:02x} at offset {_offset(data)}" \
        in lines[0]
    assert "--now" not in lines[0]


@pytest.mark.parametrize(("flag", "data"), [
    ("--cluster", BINARY), ("APPWRAPPERS", BINARY), ("APPWRAPPERS", LATIN1),
    ("--policy", BINARY), ("--config", BINARY)],
    ids=["cluster", "appwrappers", "appwrappers-latin1", "policy", "config"])
def test_plan_names_a_file_that_is_not_text_and_where(tmp_path: Path, flag: str,
                                                      data: bytes) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(data)
    files = {"--cluster": write(tmp_path, "c.yaml", node("n1")),
             "APPWRAPPERS": write(tmp_path, "a.yaml", aw("a", 1, 1))}
    files[flag] = str(bad)
    extra = [flag, str(bad)] if flag in ("--policy", "--config") else []
    done = run("dispatcher", "plan", "--cluster", files["--cluster"], *extra,
               files["APPWRAPPERS"])
    _said_plainly(done, bad, data)


def test_plan_live_names_a_file_that_is_not_text(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(BINARY)
    done = run("kubectl-appwrapper", "plan", "-f", bad,
               "--kubeconfig", tmp_path / "no-such-kubeconfig")
    _said_plainly(done, bad, BINARY)


def test_plan_still_says_a_bad_now_is_a_bad_now(tmp_path: Path) -> None:
    cluster = write(tmp_path, "c.yaml", node("n1"))
    done = run("dispatcher", "plan", "--cluster", cluster, "--now", "yesterday",
               write(tmp_path, "a.yaml", aw("a", 1, 1)))
    assert done.returncode == 2
    assert done.stderr.startswith("dispatcher plan: --now: ") and "ISO 8601" in done.stderr


@pytest.mark.parametrize(("flag", "data"), [
    ("--trace", LATIN1), ("--trace", BINARY), ("--trace-yaml", BINARY),
    ("--topology", BINARY), ("--quota", BINARY), ("--policy", BINARY)],
    ids=["csv-latin1", "csv", "yaml", "topology", "quota", "policy"])
def test_simulate_names_a_file_that_is_not_text_and_where(tmp_path: Path, flag: str,
                                                          data: bytes) -> None:
    bad = tmp_path / ("bad.csv" if flag == "--trace" else "bad.yaml")
    bad.write_bytes(data)
    trace = bad if flag.startswith("--trace") else EXAMPLES / "simulate" / "trace.yaml"
    extra = [] if flag.startswith("--trace") else [flag, bad]
    done = run("dispatcher", "simulate", "--nodes", "2", "--trace", trace, *extra)
    _said_plainly(done, bad, data)


def test_dashboard_without_a_kubeconfig_says_so_as_the_other_verbs_do(tmp_path: Path) -> None:
    """Not "no Service dispatcher-metrics ... is the dispatcher installed there?"."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    env["HOME"] = str(tmp_path)
    missing = tmp_path / ".kube" / "config"
    said = {}
    for verb in ("dashboard", "why"):
        done = subprocess.run([str(BIN / "kubectl-appwrapper"), verb,
                               *(["x"] if verb == "why" else [])], capture_output=True,
                              text=True, timeout=120, check=False, env=env)
        assert done.returncode == 1, done.stderr
        said[verb] = done.stderr.removeprefix(f"kubectl appwrapper {verb}: ")
    assert said["dashboard"] == said["why"]
    assert said["dashboard"].startswith(f"no kubeconfig: {missing} does not exist; pass "
                                        "--kubeconfig FILE")
    done = run("kubectl-appwrapper", "dashboard", "--kubeconfig", tmp_path / "nope")
    assert done.returncode == 1
    assert done.stderr == (f"kubectl appwrapper dashboard: kubeconfig {tmp_path / 'nope'} does "
                           "not exist: pass the path of a kubeconfig file (kubectl config "
                           "view --raw > FILE)\n")
