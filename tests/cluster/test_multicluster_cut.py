"""A network cut between the manager and one worker: nothing runs twice.

A manager and two workers (`<cluster>-manager`, `-w1`, `-w2`), the manager reaching each
worker's API server through its own proxy (localcluster.faultproxy, no faults injected).
Stopping one proxy cuts the path from the manager to that worker only: the worker's API
server and its own dispatcher keep running. The worker's dispatcher stops its copy once it
has not seen the manager's heartbeat renewed for half the manager's grace; the manager
sends the wrapper to the other worker only after the whole grace. Pods are sampled in both
clusters all along (kubectl, not the dispatchers' memory).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import Cluster, Kubectl, wait_for
from localcluster.testing import register_workers

from .dispatcher_process import DispatcherProcess
from .fleet import WORKERS, FleetClusters
from .test_multicluster import (
    AW_LABEL,
    WORKER_CRD,
    gpus_gang,
    sent_to,
    start_dispatchers,
)

REPO = Path(__file__).resolve().parents[2]
GRACE = 45  # --worker-grace (the least): the workers stop its copies after 22.5 s


class ManagerPath:
    """The manager's path to one worker: a proxy that can be stopped (cut) and started
    again on the same port (healed)."""

    def __init__(self, worker: Cluster, out: Path) -> None:
        self.worker = worker
        self.out = out
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None

    def open(self) -> None:
        log = (self.worker.logs / "manager-path.log").open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "localcluster.faultproxy", "--kubeconfig",
             str(self.worker.kubeconfig), "--out", str(self.out), "--rate", "0",
             "--watch-cut-seconds", "0", "--port", str(self.port)],
            stdout=subprocess.PIPE, stderr=log, cwd=REPO, text=True)
        assert self.proc.stdout is not None
        self.port = json.loads(self.proc.stdout.readline())["listening"]

    def cut(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


class Fleet:
    def __init__(self, manager: Cluster, workers: dict[str, Cluster],
                 paths: dict[str, ManagerPath], process: DispatcherProcess) -> None:
        self.manager, self.workers, self.paths, self.process = manager, workers, paths, process

    def running_in(self, namespace: str, name: str) -> set[str]:
        """The workers where a pod of the wrapper is Running (being deleted or not)."""
        out = set()
        for w, c in self.workers.items():
            pods = c.kubectl(namespace).items("pods", "-l", f"{AW_LABEL}={name}")
            if any(p["status"].get("phase") == "Running" for p in pods):
                out.add(w)
        return out

    def copies(self, namespace: str, name: str) -> set[str]:
        return {w for w, c in self.workers.items()
                if c.kubectl(namespace).run("get", "aw", name, check=False).returncode == 0}


@pytest.fixture(scope="module")
def fleet(fleet_clusters: FleetClusters, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Fleet]:
    fleet_clusters.up()  # quick when a module before brought them up
    manager, workers = fleet_clusters.manager, fleet_clusters.workers
    d = tmp_path_factory.mktemp("paths")
    paths = {w: ManagerPath(c, d / f"{w}.yaml") for w, c in workers.items()}
    for p in paths.values():
        p.open()
    register_workers(manager.kubectl(), {w: p.out for w, p in paths.items()}, WORKER_CRD)
    process, worker_processes = start_dispatchers(manager, workers, GRACE)
    yield Fleet(manager, workers, paths, process)
    process.stop()
    for wp in worker_processes.values():
        wp.stop()
    for p in paths.values():
        p.cut()


class Sampler:
    """Samples, in a thread, where the wrapper's pods run; remembers any sample in which
    they ran in two clusters at once."""

    def __init__(self, fleet: Fleet, namespace: str, name: str) -> None:
        self.fleet, self.namespace, self.name = fleet, namespace, name
        self.samples: list[set[str]] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.is_set():
            self.samples.append(self.fleet.running_in(self.namespace, self.name))

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stopped.set()
        self.thread.join(30)

    def twice(self) -> list[set[str]]:
        return [s for s in self.samples if len(s) > 1]


def test_a_worker_cut_off_from_the_manager_stops_its_copy_before_it_runs_elsewhere(
        fleet: Fleet) -> None:
    ns = f"cut-{uuid.uuid4().hex[:6]}"
    fleet.manager.kubectl()("create", "namespace", ns)
    mk = fleet.manager.kubectl(ns)
    try:
        mk.apply(gpus_gang("g", 2, 4))
        first = wait_for(lambda: sent_to(mk, "g"), 60, "g to be sent")
        other = next(w for w in WORKERS if w != first)
        wait_for(lambda: fleet.running_in(ns, "g") == {first}, 90, f"g Running in {first}")
        with Sampler(fleet, ns, "g") as sampler:
            reasons, left = cut_off_then_healed(fleet, mk, ns, first, other)
        assert len(sampler.samples) > 20, sampler.samples  # it sampled all along
        assert sampler.twice() == [], f"g ran in two clusters at once: {sampler.twice()}"
        # The copy cut off said why it stopped, and stayed stopped while the cut lasted.
        assert "ManagerLost" in reasons and not left, (reasons, left)
    finally:
        mk("delete", "aw", "--all", "--wait=false")
        for w, c in fleet.workers.items():  # the manager deletes the copies: GPUs free again
            k = c.kubectl(ns)
            wait_for(lambda k=k: not k.items("aw") and not k.items("pods"), 90,
                     f"the copies and pods in {w}/{ns} to be gone")


def cut_off_then_healed(fleet: Fleet, mk: Kubectl, ns: str, first: str, other: str
                        ) -> tuple[list[str], list[str]]:
    """Cut, wait until g runs in `other`, heal, check nothing comes back in `first`. The
    reasons of the conditions of the copy cut off, and its pods left 5 s later."""
    wk = fleet.workers[first].kubectl(ns)
    fleet.paths[first].cut()  # the manager's path to it only
    try:
        wait_for(lambda: sent_to(mk, "g") == other, GRACE + 60, f"g sent to {other}")
        wait_for(lambda: other in fleet.running_in(ns, "g"), 90, f"g Running in {other}")
        reasons = [c.get("reason") for c in
                   wk.json("aw", "g").get("status", {}).get("conditions", [])]
        time.sleep(5)
        left = [p["metadata"]["name"] for p in wk.items("pods", "-l", f"{AW_LABEL}=g")]
    finally:
        fleet.paths[first].open()  # healed, on the same port
    # Healed: the stopped copy is deleted by the manager, nothing comes back.
    wait_for(lambda: fleet.copies(ns, "g") == {other}, 60, f"the copy in {first} deleted")
    wait_for(lambda: fleet.running_in(ns, "g") == {other}, 60, f"g Running in {other} only")
    for _ in range(10):
        assert fleet.copies(ns, "g") == {other}
        assert fleet.running_in(ns, "g") == {other}
        assert sent_to(mk, "g") == other
        time.sleep(1)
    return reasons, left
