"""The manager's pass at size, in one process: its CPU per pass and per AppWrapper, what it
asks of each worker, how soon freed room is used, before and after a change, side by side.

A manager (`Manager`, the code of `dispatcher run --manager`) over W stand-in worker API
servers (the unit tests' FakeKube: objects in memory, watches served from a listing's
version) of N nodes each (8 GPUs). A stand-in worker dispatcher runs what it is sent: each
copy gets a pod bound to a free node and goes Running, and 2 Events; it completes after
`--runs-for` passes (pod Succeeded, 2 more Events), freeing its node. A flows through: all
AppWrappers (1 pod, 8 GPUs each) are queued in the manager at the start; every pass sends
as many as there is room.

Measured per pass (a pass is the manager's 1 s period in production):
- the manager's CPU: `time.process_time()` over the pass, less the time spent inside the
  stand-in API servers (their listings' deep copies are the server's cost), plus the
  handling of the watch events that reached it before the pass (after: informers). The
  client's parsing of responses is not counted (it favours the listing code);
- API requests to each worker (lists, gets, writes) and watch events delivered to the
  manager from it;
- time from room freed in a worker (a copy completes) to the next AppWrapper sent there,
  in passes;
- the wall time of a pass.

The "before" run executes the same harness against another tree's `dispatcher` (`git
archive` of a revision), in a subprocess, so both columns come from one invocation.

Usage: python bench/manager_pass.py [--workers 4] [--nodes 250] [--wrappers 5000]
                                    [--runs-for 20] [--events 2] [--before main]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _setup_path(tree: Path) -> None:
    sys.path.insert(0, str(tree))


class Meter:
    """Time spent inside stand-in API servers (theirs, not the manager's)."""

    inside = 0.0


def _worker_class() -> type:
    from tests.unit.fake_kube import FakeKube

    class Worker(FakeKube):  # type: ignore[misc, valid-type]
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name
            self.server = f"https://{name}.example"
            self.asked = 0  # API requests (lists, gets, writes)
            self.delivered = 0  # watch events sent to the manager

        async def list(self, *a: Any, **kw: Any) -> Any:
            self.asked += 1
            t = time.process_time()
            try:
                return await super().list(*a, **kw)
            finally:
                Meter.inside += time.process_time() - t

        async def request(self, *a: Any, **kw: Any) -> Any:
            self.asked += 1
            t = time.process_time()
            try:
                return await super().request(*a, **kw)
            finally:
                Meter.inside += time.process_time() - t

        def publish(self) -> None:
            if not hasattr(FakeKube, "publish"):
                return
            before = sum(w.queue.qsize() for w in self.watches)
            super().publish()
            self.delivered += sum(w.queue.qsize() for w in self.watches) - before

    return Worker


def _manager_class() -> type:
    from tests.unit.fake_kube import FakeKube

    class ManagerKube(FakeKube):  # type: ignore[misc, valid-type]
        async def list(self, *a: Any, **kw: Any) -> Any:
            t = time.process_time()
            try:
                return await super().list(*a, **kw)
            finally:
                Meter.inside += time.process_time() - t

        async def request(self, *a: Any, **kw: Any) -> Any:
            t = time.process_time()
            try:
                return await super().request(*a, **kw)
            finally:
                Meter.inside += time.process_time() - t

    return ManagerKube


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One measured flow on the `dispatcher` importable now; its figures."""
    from dispatcher.controller.manager.passes import Manager, ManagerSettings
    from dispatcher.controller.manager.workers import WorkerLink, digest
    from tests.unit.test_runtime import appwrapper, job, node

    logging_quiet()
    Worker, ManagerKube = _worker_class(), _manager_class()
    manager = ManagerKube()
    workers = {f"w{i + 1}": Worker(f"w{i + 1}") for i in range(args.workers)}
    for name, w in workers.items():
        for n in range(args.nodes):
            w.put(node(f"{name}-n{n}", 8))
        manager.put({"apiVersion": "v1", "kind": "Secret",
                     "metadata": {"name": name, "namespace": "fleet"},
                     "data": {"kubeconfig": base64.b64encode(name.encode()).decode()}})
        manager.put({"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "WorkerCluster",
                     "metadata": {"name": name},
                     "spec": {"kubeconfigSecret": {"name": name, "namespace": "fleet"}}})
    for i in range(args.wrappers):
        manager.put(appwrapper(f"aw-{i:05d}", job(f"aw-{i:05d}", 1, 8), created=i % 60))

    async def connect(worker: Mapping[str, Any], kubeconfig: bytes, _: Path) -> Any:
        name = worker["metadata"]["name"]
        return WorkerLink(name, {}, workers[name], digest(kubeconfig))

    now = [1000.0]
    process = Manager(manager, ManagerSettings(grace=60.0), Path("/nonexistent"),
                      clock=lambda: now[0], wall=lambda: now[0], link=connect)
    sim = Simulation(workers, args)
    loop = asyncio.new_event_loop()
    passes: list[dict[str, float]] = []
    started = time.monotonic()
    while sim.completed < args.wrappers and len(passes) < args.max_passes:
        sim.step(len(passes))
        passes.append(loop.run_until_complete(_measured_pass(process, workers, manager)))
        sim.note_sent(manager, len(passes) - 1)
        now[0] += 1.0
    elapsed = time.monotonic() - started
    if hasattr(process, "close"):
        loop.run_until_complete(process.close())
    else:
        for link in _links(process).values():
            loop.run_until_complete(link.close())
    loop.close()
    return summarise(passes, sim, args, elapsed)


def logging_quiet() -> None:
    import logging

    logging.getLogger("dispatcher").setLevel(logging.ERROR)


def _links(process: Any) -> Mapping[str, Any]:
    """The manager's links to its workers (kept by its WorkerClusters since they have a
    module of their own; by the manager itself in trees from before)."""
    return getattr(process, "clusters", process).links


async def _measured_pass(process: Any, workers: Mapping[str, Any], manager: Any
                         ) -> dict[str, float]:
    asked = {n: w.asked for n, w in workers.items()}
    delivered = {n: w.delivered for n, w in workers.items()}
    for link in _links(process).values():
        if hasattr(link, "retry_now"):
            link.retry_now()
    for w in workers.values():
        w.publish()
    if hasattr(manager, "publish"):  # the manager's own cluster, where it watches
        manager.publish()
    Meter.inside = 0.0
    cpu, wall = time.process_time(), time.monotonic()
    for _ in range(20):  # the informers take the events (none where nothing watches)
        await asyncio.sleep(0)
    await process.cycle()
    out = {"cpu": time.process_time() - cpu - Meter.inside,
           "wall": time.monotonic() - wall}
    for n, w in workers.items():
        out[f"asked:{n}"] = w.asked - asked[n]
        out[f"events:{n}"] = w.delivered - delivered[n]
    return out


class Simulation:
    """The workers' own dispatchers, as the manager sees them: copies run on a node, emit
    Events, complete after a while and free their node."""

    def __init__(self, workers: Mapping[str, Any], args: argparse.Namespace) -> None:
        self.workers = workers
        self.args = args
        self.running: dict[tuple[str, str], int] = {}  # (worker, copy) -> pass started
        self.free: dict[str, list[str]] = {n: [f"{n}-n{i}" for i in range(args.nodes)]
                                           for n in workers}
        self.freed_at: dict[str, list[int]] = {n: [] for n in workers}
        self.waits: list[int] = []
        self.completed = 0
        self.seen: set[tuple[str, str]] = set()
        self._events = 0

    def step(self, at: int) -> None:
        for name, w in self.workers.items():
            for c in [o for o in w.of_kind("AppWrapper") if "status" not in o]:
                self._start(name, w, c, at)
            for (wn, copy), since in list(self.running.items()):
                if wn == name and at - since >= self.args.runs_for:
                    self._complete(name, w, copy, at)

    def _start(self, name: str, w: Any, c: dict[str, Any], at: int) -> None:
        if not self.free[name]:
            c["status"] = {"state": "Pending"}
            return
        n = self.free[name].pop()
        aw = c["metadata"]["name"]
        made = w.put({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": f"{aw}-0", "namespace": "team",
                                   "labels": {"workload.codeflare.dev/appwrapper": aw}},
                      "spec": {"nodeName": n, "containers": [{"name": "c", "resources": {
                          "limits": {"nvidia.com/gpu": 8}}}]},
                      "status": {"phase": "Running"}})
        # As a worker's dispatcher records what it made: the pod is proven the gang's.
        c["status"] = {"state": "Running", "running": 1, "wrappedItems": [
            {"apiVersion": "v1", "kind": "Pod", "name": f"{aw}-0",
             "uid": made["metadata"]["uid"]}]}
        self.running[(name, aw)] = at
        self._emit(w, c, "Running")

    def _complete(self, name: str, w: Any, aw: str, at: int) -> None:
        c = w.get("workload.codeflare.dev/v1beta1", "AppWrapper", "team", aw)
        pod = w.get("v1", "Pod", "team", f"{aw}-0")
        del self.running[(name, aw)]
        if c is None or pod is None:
            return
        c["status"] = {"state": "Completed", "running": 0, "succeeded": 1}
        pod["status"] = {"phase": "Succeeded"}
        self.free[name].append(pod["spec"]["nodeName"])
        self.freed_at[name].append(at)
        self.completed += 1
        self._emit(w, c, "Completed")

    def _emit(self, w: Any, c: dict[str, Any], what: str) -> None:
        for _ in range(self.args.events):
            self._events += 1
            w.put({"apiVersion": "v1", "kind": "Event",
                   "metadata": {"name": f"e{self._events}", "namespace": "team",
                                "uid": f"ev-{self._events}"},
                   "involvedObject": {"kind": "AppWrapper", "name": c["metadata"]["name"],
                                      "namespace": "team", "uid": c["metadata"]["uid"]},
                   "reason": what, "message": f"{what} {self._events}", "type": "Normal",
                   "lastTimestamp": "2027-01-15T08:00:00Z"})

    def note_sent(self, manager: Any, at: int) -> None:
        """For each AppWrapper newly sent: the oldest room freed in its worker and not
        used yet, and how many passes it waited."""
        for aw in manager.of_kind("AppWrapper"):
            # The manager's record (status); an earlier manager's label (--before main).
            target = (aw.get("status") or {}).get("workerCluster") or (
                aw["metadata"].get("labels") or {}).get("workload.codeflare.dev/cluster")
            key = (str(target), aw["metadata"]["name"])
            if target is None or key in self.seen:
                continue
            self.seen.add(key)
            if self.freed_at.get(target):
                self.waits.append(at - self.freed_at[target].pop(0))


def summarise(passes: list[dict[str, float]], sim: Simulation, args: argparse.Namespace,
              elapsed: float) -> dict[str, Any]:
    loaded = passes[1:] or passes  # the first pass lists everything, for both
    names = sorted(sim.workers)
    asked = [statistics.mean(p[f"asked:{n}"] for p in loaded) for n in names]
    events = [statistics.mean(p[f"events:{n}"] for p in loaded) for n in names]
    cpu = [p["cpu"] for p in loaded]
    return {
        "passes": len(passes), "completed": sim.completed, "seconds": elapsed,
        "first pass cpu ms": passes[0]["cpu"] * 1000,
        "cpu ms/pass median": statistics.median(cpu) * 1000,
        "cpu ms/pass p95": sorted(cpu)[int(0.95 * (len(cpu) - 1))] * 1000,
        "cpu ms/wrapper": sum(p["cpu"] for p in passes) * 1000 / max(sim.completed, 1),
        "requests/worker/pass": statistics.mean(asked),
        "watch events/worker/pass": statistics.mean(events),
        "freed to sent, passes (median)": statistics.median(sim.waits) if sim.waits else 0,
        "pass wall ms median": statistics.median(p["wall"] for p in loaded) * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=250, help="per worker")
    ap.add_argument("--wrappers", type=int, default=5000)
    ap.add_argument("--runs-for", type=int, default=20, help="passes a copy runs")
    ap.add_argument("--events", type=int, default=2, help="Events per copy per change")
    ap.add_argument("--max-passes", type=int, default=400)
    ap.add_argument("--before", default="main", help="the revision to compare with")
    ap.add_argument("--tree", help=argparse.SUPPRESS)  # a run in a subprocess
    args = ap.parse_args()
    if args.tree:
        _setup_path(Path(args.tree))
        print(json.dumps(run(args)))
        return
    flags = [f"--workers={args.workers}", f"--nodes={args.nodes}",
             f"--wrappers={args.wrappers}", f"--runs-for={args.runs_for}",
             f"--events={args.events}", f"--max-passes={args.max_passes}"]
    with tempfile.TemporaryDirectory(prefix="manager-before-") as before:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", args.before],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
        figures = {label: json.loads(subprocess.run(
            [sys.executable, __file__, f"--tree={tree}", *flags], check=True,
            capture_output=True, text=True).stdout.splitlines()[-1])
            for label, tree in ((f"before ({args.before})", before), ("after", str(REPO)))}
    print(f"{args.workers} workers x {args.nodes} nodes, {args.wrappers} AppWrappers "
          f"(1 pod, 8 GPUs), each runs {args.runs_for} passes, {args.events} Events a change")
    labels = list(figures)
    print(f"{'':<34}" + "".join(f"{label:>16}" for label in labels))
    for key in figures[labels[0]]:
        print(f"{key:<34}" + "".join(f"{figures[label][key]:>16.1f}" for label in labels))


if __name__ == "__main__":
    main()
