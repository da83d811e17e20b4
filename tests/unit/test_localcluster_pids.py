"""Processes the local cluster starts: pid files kwokctl can read, logs appended to."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from localcluster.cluster import Cluster
from localcluster.procs import spawn


def test_a_started_again_component_has_a_pid_file_kwokctl_can_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # kwokctl parses pid files with Go's strconv.Atoi: digits only. With a trailing newline
    # it took kube-apiserver for stopped and `kwokctl start cluster` started a second one.
    monkeypatch.setenv("DISPATCHER_STATE", str(tmp_path))
    cluster = Cluster(name="pids")
    (cluster.dir / "pids").mkdir(parents=True)
    cluster.logs.mkdir(parents=True)

    cluster._respawn("kube-apiserver", {"argv": [sys.executable, "-c", "pass"],
                                        "cwd": str(tmp_path)})

    text = (cluster.dir / "pids" / "kube-apiserver.pid").read_text()
    assert re.fullmatch(r"[0-9]+", text), repr(text)
    assert cluster.component_pids() == {"kube-apiserver": int(text)}


def test_a_spawned_process_runs_in_its_own_session_and_appends_to_its_log(
        tmp_path: Path) -> None:
    log = tmp_path / "logs" / "one.log"
    log.parent.mkdir()
    log.write_text("earlier run\n")
    pid_file = tmp_path / "pids" / "one.pid"

    proc = spawn([sys.executable, "-c", "import os; print(os.getsid(0) == os.getpid())"],
                 log, pid_file, tmp_path)
    proc.wait(60)

    assert pid_file.read_text() == str(proc.pid)
    assert log.read_text() == "earlier run\nTrue\n"
