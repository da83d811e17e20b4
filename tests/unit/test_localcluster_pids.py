"""A component the local cluster starts again is one kwokctl still knows as running."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from localcluster.cluster import Cluster


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
