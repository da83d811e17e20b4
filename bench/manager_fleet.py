"""The manager at size on local clusters: a manager cluster and 4 worker clusters of 250
fake 8-GPU nodes each, 5,000 AppWrappers flowing through.

Five local control planes side by side (`<cluster>-manager`, `-w1` ... `-w4`), each worker
running `dispatcher run`, the manager cluster `dispatcher run --manager`. Every AppWrapper
wraps one pod of 8 GPUs (a whole node) that runs for `--runs-for` seconds and succeeds; all
are posted to the manager at the start, so the workers fill up and each copy that finishes
frees room for the next. Reported, from outside the manager:
- its CPU (its process's, read every second): in all, per AppWrapper through, per pass;
- its pass: how long one takes (its `dispatcher_manager_pass_duration_seconds`) and the
  period between passes under load;
- the requests it sends to each worker (its `dispatcher_worker_api_requests_total`) per
  second while the wrappers flow, beside the changes there (copies made and finished), and
  once everything has finished (nothing changing; every finished copy still in its
  worker's watch);
- the time from a copy finishing in a worker to the next copy made there, while wrappers
  still wait in the manager (each worker's AppWrappers watched by this bench).

`--source DIR` runs the manager of another checkout (e.g. `git worktree add /tmp/old REV`)
against the same clusters; a manager without the two metrics has those rows empty.

Usage: python bench/manager_fleet.py [--workers 4] [--nodes 250] [--wrappers 5000]
                                     [--runs-for 90] [--quiet 30] [--source DIR]
(starts the clusters without operators and leaves them running; DISPATCHER_CLUSTER names
them.)
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from e2e import post, profile_file  # noqa: E402

from localcluster import Cluster, wait_for  # noqa: E402
from localcluster import config as lc_config  # noqa: E402
from localcluster.testing import container, outcome, register_workers  # noqa: E402
from tests.cluster.dispatcher_process import DispatcherProcess, free_port, install_crd  # noqa: E402

WORKER_CRD = REPO / "crds" / "workerclusters.workload.codeflare.dev.yaml"
GROUP, VERSION, PLURAL = "workload.codeflare.dev", "v1beta1", "appwrappers"
#: A namespace of its own for each run (the clusters may have served runs before).
NAMESPACE = f"fleet-{int(time.time())}"


def appwrapper(name: str, runs_for: int) -> dict[str, Any]:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "annotations": outcome("succeed", f"{runs_for}s")},
           "spec": {"restartPolicy": "Never", "containers": [container(gpus=8)]}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"resources": {"GenericItems": [{"generictemplate": pod}]}}}


class Watched:
    """One cluster's AppWrappers in NAMESPACE, as a watch tells them: when each was first
    seen (made after the watch began) and when each first said Completed."""

    def __init__(self, cluster: Cluster) -> None:
        from kubernetes import client
        from kubernetes import config as kconfig

        self.api = client.CustomObjectsApi(kconfig.new_client_from_config(
            config_file=str(cluster.kubeconfig)))
        self.made: dict[str, float] = {}
        self.completed: dict[str, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._follow, daemon=True)
        self.thread.start()

    def _see(self, obj: dict[str, Any], at: float) -> None:
        name = obj["metadata"]["name"]
        self.made.setdefault(name, at)
        if (obj.get("status") or {}).get("state") == "Completed":
            self.completed.setdefault(name, at)

    def _follow(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        while not self.stop.is_set():
            listing = self.api.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL)
            for obj in listing["items"]:
                self._see(obj, time.monotonic())
            version = listing["metadata"]["resourceVersion"]
            try:
                for event in watch.Watch().stream(
                        self.api.list_namespaced_custom_object, GROUP, VERSION, NAMESPACE,
                        PLURAL, resource_version=version, timeout_seconds=60):
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._see(event["object"], time.monotonic())
                    if self.stop.is_set():
                        return
            except ApiException as e:
                if e.status != 410:
                    raise


def manager_cpu(pid: int) -> float:
    """CPU seconds the process has used so far."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape(port: int) -> dict[str, float]:
    """The manager's /metrics: requests per worker ("requests w1"), passes and their time."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    got: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("dispatcher_worker_api_requests_total{"):
            cluster = re.search(r'cluster="([^"]*)"', line)
            assert cluster is not None
            got[f"requests {cluster.group(1)}"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("dispatcher_manager_pass_duration_seconds_count "):
            got["passes"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("dispatcher_manager_pass_duration_seconds_sum "):
            got["pass seconds"] = float(line.rsplit(" ", 1)[1])
    return got


class Manager(DispatcherProcess):
    """`dispatcher run --manager` from `source` (this checkout by default)."""

    def __init__(self, cluster: Cluster, source: Path, port: int) -> None:
        super().__init__(cluster.kubeconfig, cluster.logs, "fleet-manager")
        self.source, self.port = source, port

    def launch(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", "run", "--kubeconfig",
             str(self.kubeconfig), "--manager", "--metrics-port", str(self.port),
             "--metrics-host", "127.0.0.1"],
            stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT, cwd=self.source,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(self.source)})
        self.starts += 1
        wait_for(self.ready, 120, f"{self.READY!r} in {self.log_path}")


def freed_to_sent(worker: Watched, until: float) -> list[float]:
    """Seconds from each copy finishing in the worker (before `until`: wrappers still
    waited in the manager) to the next copy made there, each copy made answering one."""
    made = sorted(t for t in worker.made.values())
    gaps, i = [], 0
    for done in sorted(t for t in worker.completed.values() if t < until):
        while i < len(made) and made[i] < done:
            i += 1
        if i == len(made):
            break
        gaps.append(made[i] - done)
        i += 1
    return gaps


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def flow(args: argparse.Namespace, manager_cluster: Cluster,
         workers: dict[str, Cluster]) -> None:
    port = free_port()
    boss = Manager(manager_cluster, args.source, port)
    watched = {name: Watched(c) for name, c in {"manager": manager_cluster, **workers}.items()}
    samples: list[tuple[float, float, dict[str, float]]] = []
    try:
        boss.launch()
        assert boss.proc is not None
        pid = boss.proc.pid

        def sample() -> None:
            try:
                figures = scrape(port)
            except OSError:
                figures = {}
            samples.append((time.monotonic(), manager_cpu(pid), figures))

        wrappers = [appwrapper(f"aw-{i:05d}", args.runs_for) for i in range(args.wrappers)]
        api = watched["manager"].api
        poster = threading.Thread(target=post, daemon=True, args=(wrappers, lambda obj: (
            api.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, obj))))
        sample()
        started = time.monotonic()
        poster.start()
        while len(watched["manager"].completed) < args.wrappers:
            time.sleep(1)
            sample()
            boss.ready()  # fails at once if it died
            if time.monotonic() - started > args.timeout:
                raise TimeoutError(f"{len(watched['manager'].completed)} of {args.wrappers} "
                                   f"Completed after {args.timeout}s")
        finished = time.monotonic()
        flowing = len(samples)
        end = finished + args.quiet
        while time.monotonic() < end:
            time.sleep(1)
            sample()
    finally:
        boss.stop()
        for w in watched.values():
            w.stop.set()
    report(args, samples, flowing, started, finished, watched)


def report(args: argparse.Namespace, samples: list[tuple[float, float, dict[str, float]]],
           flowing: int, started: float, finished: float, watched: dict[str, Watched]) -> None:
    first, flow_end, last = samples[0], samples[flowing - 1], samples[-1]
    seconds = finished - started
    cpu = flow_end[1] - first[1]
    per_second = [(b[1] - a[1]) / (b[0] - a[0]) * 1000
                  for a, b in itertools.pairwise(samples[:flowing])]
    durations = [(b[2]["pass seconds"] - a[2].get("pass seconds", 0)) /
                 (b[2]["passes"] - a[2].get("passes", 0)) * 1000
                 for a, b in itertools.pairwise(samples[:flowing])
                 if b[2].get("passes", 0) > a[2].get("passes", 0)]
    passes = flow_end[2].get("passes", 0) - first[2].get("passes", 0)
    print(f"\n{args.wrappers} AppWrappers (one 8-GPU pod, {args.runs_for} s) through a manager "
          f"and {len(watched) - 1} workers of {args.nodes} nodes: {seconds:.0f} s, "
          f"{args.wrappers / seconds:.1f}/s")
    print(f"manager CPU: {cpu:.1f} s in all, {cpu / args.wrappers * 1000:.1f} ms per "
          f"AppWrapper; per second median {statistics.median(per_second):.0f} ms, "
          f"p95 {pct(per_second, 0.95):.0f} ms")
    if passes:
        print(f"passes: {passes:.0f}, one every {seconds / passes:.2f} s; CPU per pass "
              f"{cpu / passes * 1000:.0f} ms; a pass takes median "
              f"{statistics.median(durations):.0f} ms, p95 {pct(durations, 0.95):.0f} ms")
    last_made = max(t for n, w in watched.items() if n != "manager" for t in w.made.values())
    quiet = last[0] - flow_end[0]
    if quiet:
        calm_passes = last[2].get("passes", 0) - flow_end[2].get("passes", 0)
        print(f"once all finished (nothing changing, every copy and node still watched): "
              f"manager CPU {(last[1] - flow_end[1]) / quiet * 1000:.0f} ms a second"
              + (f", {(last[1] - flow_end[1]) / calm_passes * 1000:.0f} ms a pass"
                 if calm_passes else ""))
    for name, w in watched.items():
        if name == "manager":
            continue
        key = f"requests {name}"
        sent = flow_end[2].get(key, 0) - first[2].get(key, 0)
        calm = last[2].get(key, 0) - flow_end[2].get(key, 0)
        changes = len(w.made) + len(w.completed)
        gaps = freed_to_sent(w, last_made)
        print(f"{name}: {len(w.made)} copies; requests {sent / seconds:.1f}/s while "
              f"{changes / seconds:.1f} changes/s, {calm / quiet if quiet else 0:.1f}/s once "
              f"all finished; copy finished to the next made there: median "
              f"{pct(gaps, 0.5):.1f} s, p95 {pct(gaps, 0.95):.1f} s ({len(gaps)})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=250)
    ap.add_argument("--wrappers", type=int, default=5000)
    ap.add_argument("--runs-for", type=int, default=90)
    ap.add_argument("--quiet", type=float, default=30)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--source", type=Path, default=REPO)
    args = ap.parse_args()
    base = lc_config.cluster_name()
    manager = Cluster(f"{base}-manager")
    workers = {f"w{i}": Cluster(f"{base}-w{i}") for i in range(1, args.workers + 1)}
    manager.up(profile="pool", operators=False)
    for c in workers.values():
        c.up(profile=str(profile_file(args.nodes)), operators=False)
    for c in (manager, *workers.values()):
        install_crd(c.kubectl())
        c.kubectl()("create", "namespace", NAMESPACE)
    left = [f"{aw['metadata']['namespace']}/{aw['metadata']['name']}"
            for aw in manager.kubectl().items("aw", "-A")
            if (aw.get("status") or {}).get("state") not in ("Completed", "Failed")]
    if left:
        sys.exit(f"the manager cluster holds {len(left)} unfinished AppWrappers of an earlier "
                 f"run (e.g. {left[0]}), which the manager would send too: take the clusters "
                 "down first (python -m localcluster down, DISPATCHER_CLUSTER=<name>-manager "
                 "and each -wN)")
    register_workers(manager.kubectl(), {w: c.kubeconfig for w, c in workers.items()},
                     WORKER_CRD)
    dispatchers = [DispatcherProcess(c.kubeconfig, c.logs, f"fleet-dispatcher-{w}")
                   for w, c in workers.items()]
    try:
        for d in dispatchers:
            d.start("fifo")
        flow(args, manager, workers)
    finally:
        for d in dispatchers:
            d.stop()


if __name__ == "__main__":
    main()
