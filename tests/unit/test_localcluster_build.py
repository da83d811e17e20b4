"""`localcluster build` builds two wrapper modules at a time, the longest first."""

from __future__ import annotations

import dataclasses
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


def test_clusters_side_by_side_listen_on_their_own_blocks_of_ports(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from localcluster import cluster, ports, url_webhooks
    from localcluster.cluster import Cluster

    monkeypatch.setenv("DISPATCHER_STATE", str(tmp_path))
    monkeypatch.setattr(url_webhooks.WebhookedOperator, "arguments",
                        lambda self, d, kc, probe, webhook: [str(probe), str(webhook)])
    bins = {k: Path(k) for k in ("etcd", "kube-apiserver", "kube-controller-manager",
                                 "kube-scheduler", "kwok", "kubectl")}

    def listened(name: str) -> set[int]:
        c = Cluster(name)
        opts = cluster._kwokctl_config(bins, ports.block_of(name), tmp_path)["options"]
        out = {v for k, v in opts.items() if k.endswith("Port") and k != "securePort"}
        out |= set(dataclasses.astuple(c.real_node_ports()))
        for op in c._operators():
            out.add(op.probe_port)
            out |= {int(a) for a in op.args if a.isdigit() and a != "0"}
        return out

    manager, w1, w2 = (listened(n) for n in ("h-manager", "h-w1", "h-w2"))
    assert len(manager) == len(ports.ROLES)  # every listener has a port of its own
    assert not (manager & w1) and not (manager & w2) and not (w1 & w2)
    # Recorded: the same cluster keeps its ports (an API server restarted binds the same).
    assert listened("h-w1") == w1


def test_a_block_held_by_another_cluster_or_busy_is_passed_over(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import socket

    from localcluster import config, ports

    monkeypatch.setenv("DISPATCHER_STATE", str(tmp_path))
    # "other" already holds the block "mine" would prefer.
    slot = ports.preferred_slot("mine")
    preferred = ports.FIRST_PORT + slot * ports.BLOCK_SIZE
    other = config.cluster_dir("other")
    other.mkdir(parents=True)
    (other / ports.RECORD).write_text(f'{{"first": {preferred}}}')
    # and the block after it has a port some process listens on.
    busy = socket.socket()
    busy.bind(("127.0.0.1", preferred + ports.BLOCK_SIZE + 3))
    try:
        block = ports.block_of("mine")
    finally:
        busy.close()
    assert block.first == ports.FIRST_PORT + ((slot + 2) % ports.SLOTS) * ports.BLOCK_SIZE


def test_an_empty_cluster_name_is_the_default_cluster_not_every_cluster(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from localcluster import config
    monkeypatch.setenv("DISPATCHER_CLUSTER", "")
    assert config.cluster_name() == config.DEFAULT_CLUSTER_NAME
    monkeypatch.setenv("DISPATCHER_CLUSTER", "mine")
    assert config.cluster_name() == "mine"
