"""A new user's first commands, run as they type them (the installed `dispatcher` and
`kubectl-appwrapper`): each mistake said in one line naming the file, exit 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


def test_simulate_says_why_jobs_never_started_counted_in_the_cores_words() -> None:
    """The example's quota file labels no job of the example's trace: plan says "no label
    quota_gpu", and so does simulate now, counted, instead of a bare "3 never started"."""
    done = run("dispatcher", "simulate", "--trace", EXAMPLES / "simulate" / "trace.yaml",
               "--quota", EXAMPLES / "simulate" / "quota.yaml", "--nodes", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    jobs = next(i for i, line in enumerate(lines) if line.startswith("jobs "))
    assert lines[jobs].endswith("3 never started")
    assert lines[jobs + 2] == (
        "    why          3 UnknownQuotaNode (e.g. team-a/ray-small: no label quota_gpu: "
        "quota tree quota_gpu has no leaf named default for wrappers without one; label "
        "the AppWrapper quota_gpu: <one of team-a, team-b, team-c>)")
    planned = run("dispatcher", "plan", "--cluster", EXAMPLES / "plan" / "cluster.yaml",
                  EXAMPLES / "simulate" / "quota.yaml", EXAMPLES / "plan" / "appwrappers.yaml")
    assert "UnknownQuotaNode  -      no label quota_gpu: quota tree quota_gpu has no leaf " \
        "named default" in planned.stdout


def test_simulate_counts_the_jobs_left_behind_a_head_that_never_starts(
        tmp_path: Path) -> None:
    """A head over its whole tree's quota holds the line: the jobs behind it (which the
    simulator stops feeding to the cycle) are said to wait behind it."""
    from .quota_world import appwrapper, subtree

    labels = {"gpu": "team-a"}
    trace = tmp_path / "trace.yaml"
    trace.write_text(yaml.safe_dump([
        {"submitTime": t, "duration": 60, "appwrapper": appwrapper(
            name, labels, gpu=gpu, pods=pods, namespace="team-a")}
        for name, t, gpu, pods in (("big", 0, 8, 2), ("small-1", 10, 1, 1),
                                   ("small-2", 20, 1, 1))]))
    quota = tmp_path / "quota.yaml"
    quota.write_text(yaml.safe_dump_all([
        subtree("root", "gpu", [("root", {"nvidia.com/gpu": 8}, False)]),
        subtree("teams", "gpu", [("team-a", {"nvidia.com/gpu": 8}, False)],
                parent="root")]))
    done = run("dispatcher", "simulate", "--trace", trace, "--quota", quota, "--nodes", "4")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    why = next(i for i, line in enumerate(lines) if line.startswith("    why "))
    assert lines[why].startswith("    why          2 BehindHeadOfLine (e.g. team-a/small-1: "
                                 "waiting behind team-a/big at the head of the line (fifo "
                                 "policy))"), done.stdout
    assert lines[why + 1].startswith(" " * 17 + "1 QuotaExceeded (e.g. team-a/big: ")


def _suggested(example: Path) -> list[list[str]]:
    """The commands an example's opening comment suggests, continuation lines joined."""
    text, command = [], ""
    for line in example.read_text().splitlines():
        if not line.startswith("#"):
            break
        words = line.lstrip("# ").rstrip()
        if words.startswith("dispatcher ") or command:
            command += " " + words.removesuffix("\\")
            if not words.endswith("\\"):
                text.append(command.split())
                command = ""
    return text


def test_the_examples_backfill_command_shows_backfill_passing_the_head() -> None:
    example = EXAMPLES / "plan" / "appwrappers.yaml"
    backfill = [c for c in _suggested(example) if "backfill" in c]
    assert backfill, "the example suggests a backfill command"
    done = subprocess.run([str(BIN / "dispatcher"), *backfill[0][1:]], cwd=example.parent,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "policy backfill, per-node fit: 2 dispatch, 1 wait, 0 invalid"
    assert "team-b/pytorch-16  wait (head)" in lines[2]
    assert [line.split()[2] for line in lines[3:5]] == ["dispatch", "dispatch"]


def test_past_the_starvation_guard_the_wait_says_so() -> None:
    done = run("dispatcher", "plan", "--cluster", EXAMPLES / "plan" / "cluster.yaml",
               "--policy", "backfill", EXAMPLES / "plan" / "appwrappers.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(
        "BehindHeadOfLine       waiting behind team-b/pytorch-16 at the head of the line "
        "(backfill policy): the head has waited over 30m, past the starvation guard: "
        "nothing passes it until it starts\n") == 2


@pytest.mark.parametrize("command", [["run"], ["simulate"], ["plan"]])
def test_every_policy_flag_lists_the_built_in_policies(command: list[str]) -> None:
    from dispatcher.policy_files import builtin_names

    done = run("dispatcher", *command, "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    listed = text[text.index("--policy POLICY f") + len("--policy POLICY"):].split("(default")[0]
    for name in builtin_names():
        assert f"{name}," in listed or f"{name} " in listed, (name, listed)


def test_offline_plan_names_the_victims_the_live_status_does_not() -> None:
    """Offline the user gave the whole snapshot: the victim in another namespace is named.
    A status (read in the preemptor's namespace) still only counts it."""
    from dispatcher.preemption import named_in

    done = run("dispatcher", "plan", "--cluster", EXAMPLES / "plan" / "quota" / "cluster.yaml",
               "--policy", "priority-preemption", "--now", "2026-11-01T10:15:00Z",
               EXAMPLES / "plan" / "quota" / "appwrappers.yaml")
    assert done.returncode == 0, done.stderr
    assert "dispatch after preempting team-b/train-big (reclaiming the quota it borrows)" \
        in done.stdout
    assert "another namespace" not in done.stdout
    keys = [("team-b", "train-big"), ("team-a", "old")]
    assert named_in("team-a", keys) == ["team-a/old", "an AppWrapper in another namespace"]
    assert named_in(None, keys) == ["team-b/train-big", "team-a/old"]


def test_counts_of_one_are_singular() -> None:
    from dispatcher.simulate.clusters import table

    assert table([], 2, 1).splitlines()[0] == "2 clusters; 1 job larger than one cluster left out"
