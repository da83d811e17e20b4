"""`localcluster build` builds two wrapper modules at a time, the longest first."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from localcluster import build, versions


class FakeBuilds:
    def __init__(self, fail: str | None = None) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.started: list[str] = []
        self.fail = fail

    def __call__(self, w: versions.Wrapper, force: bool = False) -> build.BuildResult:
        with self.lock:
            self.started.append(w.name)
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.05)
            if w.name == self.fail:
                raise build.BuildError(f"{w.name} did not build")
            return build.BuildResult(w.name, Path("/x") / w.name, 1.0, False)
        finally:
            with self.lock:
                self.running -= 1


def test_two_builds_at_a_time_the_longest_first(monkeypatch: pytest.MonkeyPatch,
                                                capsys: Any) -> None:
    fake = FakeBuilds()
    monkeypatch.setattr(build, "build_wrapper", fake)
    results = build.build_all()
    assert fake.most == 2
    assert fake.started[0] == build.LONGEST
    # Results come back in BUILD_ORDER, each with its time, also printed.
    assert [r.wrapper for r in results] == list(versions.BUILD_ORDER)
    err = capsys.readouterr().err
    for name in versions.BUILD_ORDER:
        assert f"{name}: built in 1s" in err
    assert "2 at a time" in err


def test_a_failed_build_fails_the_build_and_starts_nothing_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeBuilds(fail=build.LONGEST)
    monkeypatch.setattr(build, "build_wrapper", fake)
    with pytest.raises(build.BuildError, match="did not build"):
        build.build_all(jobs=1)
    assert fake.started == [build.LONGEST]


def test_an_operator_whose_port_was_taken_meanwhile_starts_again_on_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from localcluster import cluster
    from localcluster.cluster import Cluster, ClusterError

    monkeypatch.setattr(cluster.jobset, "arguments", lambda *a: [])  # reads the cluster's CA
    c = Cluster("unit-ports")
    ops = {o.name: o for o in c._operators()}
    waited: list[int] = []
    spawned: list[int] = []

    def wait(op: Any, timeout: float) -> None:
        waited.append(op.probe_port)
        if len(waited) == 1:
            raise ClusterError(f"{op.name} exited; log: listen tcp 127.0.0.1:"
                               f"{op.probe_port}: bind: address already in use")

    monkeypatch.setattr(c, "_wait_operator", wait)
    monkeypatch.setattr(c, "_spawn", lambda op: spawned.append(op.probe_port))
    c._wait_started(ops["mxjob-operator"], 1)
    assert len(waited) == 2 and spawned == [waited[1]]
    # Any other exit is the failure it is.
    waited.clear()
    monkeypatch.setattr(c, "_wait_operator", lambda op, timeout: (_ for _ in ()).throw(
        ClusterError("mxjob-operator exited; log: bad flag")))
    with pytest.raises(ClusterError, match="bad flag"):
        c._wait_started(ops["mxjob-operator"], 1)
