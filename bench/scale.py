"""The dispatcher at scale on the local control plane: 10,000 AppWrappers queued on a
cluster of 1,000 fake nodes (issues 14 and 16).

Every GPU is held by a pod the dispatcher does not own, so the queue cannot move; then:

1. start-up: a dispatcher is started and the time until it has listed everything and
   rebuilt its memory ("dispatcher ready") is measured, with its peak RSS;
2. quiet: for --quiet seconds nothing changes; the admission cycles' duration (from its
   /metrics) and the AppWrapper status PATCHes the API server served in that time (from
   the API server's own /metrics) are reported — they should be ~0;
3. recovery: the dispatcher is killed with SIGKILL, one node's GPUs are freed, a new
   dispatcher is started; the time from its start to the first new dispatch (the head
   of the queue, which now fits) is the recovery time.

Then a small drain (--drain AppWrappers of 2 one-GPU pods that succeed at once, on freed
nodes) measures status PATCHes per dispatched AppWrapper.

Usage: python bench/scale.py [--wrappers 10000] [--nodes 1000] [--quiet 60] [--drain 200]
       [--python PY --source DIR]   # run another checkout's dispatcher (e.g. an old one)
(starts the local cluster with a profile of --nodes 8-GPU nodes; leaves it running.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dispatcher.controller.record.status import MINOR_WRITES_PER_SECOND  # noqa: E402
from localcluster import Cluster, Kubectl, wait_for  # noqa: E402
from localcluster.testing import container, outcome  # noqa: E402

GPU = "nvidia.com/gpu"
NS = "bench-scale"


def profile(nodes: int) -> Path:
    doc = {"description": f"{nodes} nodes x 8 GPUs (scale bench)", "nodes": [
        {"name": "gpu", "count": nodes,
         "capacity": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8", "pods": "110"}}]}
    path = Path(tempfile.gettempdir()) / f"scale{nodes}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def appwrapper(name: str, pods: int, gpus: int, run: str = "run") -> dict[str, Any]:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                    "template": {"metadata": {"annotations": outcome(run, "1s")},
                                 "spec": {"restartPolicy": "Never",
                                          "containers": [container(gpus=gpus)]}}}}
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"resources": {"GenericItems": [{"generictemplate": job}]}}}


def post_all(api: Any, objects: list[dict[str, Any]]) -> float:
    from kubernetes import client

    custom = client.CustomObjectsApi(api)

    def create(obj: dict[str, Any]) -> None:
        for attempt in range(5):
            try:
                custom.create_namespaced_custom_object(
                    "workload.codeflare.dev", "v1beta1", NS, "appwrappers", obj)
                return
            except client.ApiException as e:
                if e.status == 409:
                    return
                if attempt == 4:
                    raise
                time.sleep(1)

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, objects))
    return time.monotonic() - t0


def apiserver_requests(kubectl: Kubectl) -> Counter[str]:
    """Requests the API server has served so far (its own counter), by "VERB resource"
    ("VERB resource/subresource"), watches left out."""
    text = kubectl("get", "--raw", "/metrics", timeout=60)
    served: Counter[str] = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line[:line.rindex("}")]))
        if labels.get("verb") in (None, "WATCH") or not labels.get("resource"):
            continue
        what = labels["resource"] + (f"/{labels['subresource']}"
                                     if labels.get("subresource") else "")
        served[f"{labels['verb']} {what}"] += int(float(line.rsplit(" ", 1)[1]))
    return served


def apiserver_patches(kubectl: Kubectl) -> int:
    """AppWrapper status PATCHes the API server has served (its own counter)."""
    return apiserver_requests(kubectl)["PATCH appwrappers/status"]


def settle(kubectl: Kubectl, window: float = 10.0, timeout: float = 1800.0,
           rate: float = 1.0) -> float:
    """Wait until fewer than `rate` status PATCHes a second are served over `window`
    seconds; when (monotonic) the last busy window ended."""
    end = time.monotonic() + timeout
    last = apiserver_patches(kubectl)
    while time.monotonic() < end:
        time.sleep(window)
        now = apiserver_patches(kubectl)
        if now - last < rate * window:
            return time.monotonic() - window
        last = now
    raise TimeoutError(f"status writes still going after {timeout:.0f} s")


def rss_mb(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    m = re.search(r"VmHWM:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else 0.0


def cycle_stats(port: int) -> tuple[float, float]:
    """(count, sum) of the admission cycle duration histogram."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    count = total = 0.0
    for line in text.splitlines():
        if line.startswith("dispatcher_admission_cycle_duration_seconds_count"):
            count = float(line.split()[-1])
        elif line.startswith("dispatcher_admission_cycle_duration_seconds_sum"):
            total = float(line.split()[-1])
    return count, total


class Dispatcher:
    def __init__(self, cluster: Cluster, python: str, source: Path, port: int) -> None:
        self.cluster, self.python, self.source, self.port = cluster, python, source, port
        self.log = cluster.logs / "dispatcher-scale.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> None:
        with self.log.open("ab") as f:
            f.write(b"\n===== start =====\n")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [self.python, "-m", "dispatcher.cli", "run", "--kubeconfig",
             str(self.cluster.kubeconfig), "--metrics-port", str(self.port)],
            stdout=self.log.open("ab"), stderr=subprocess.STDOUT, cwd=self.source,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(self.source)})

    def ready(self) -> bool:
        text = self.log.read_text(errors="replace").split("===== start =====")[-1]
        return "dispatcher ready" in text

    def created_since_start(self) -> bool:
        """This run has created a wrapper's objects (its log says so)."""
        text = self.log.read_text(errors="replace").split("===== start =====")[-1]
        return ": created " in text

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def dispatched(k: Kubectl, names: list[str]) -> list[str]:
    out = []
    for aw in k.items("appwrappers"):
        conditions = (aw.get("status") or {}).get("conditions") or []
        if aw["metadata"]["name"] in names and any(c["type"] == "Dispatched"
                                                   for c in conditions):
            out.append(aw["metadata"]["name"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wrappers", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--quiet", type=float, default=60.0)
    ap.add_argument("--drain", type=int, default=200)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--source", type=Path, default=REPO)
    ap.add_argument("--port", type=int, default=18089)
    args = ap.parse_args()

    cluster = Cluster()
    cluster.up(profile=str(profile(args.nodes)), operators=False)
    kubectl = cluster.kubectl()
    kubectl("apply", "--server-side", "--force-conflicts", "-f",
            str(REPO / "crds" / "appwrappers.workload.codeflare.dev.yaml"))
    kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=900)
    kubectl("create", "namespace", NS)
    k = kubectl.in_namespace(NS)
    wait_for(lambda: k.run("get", "sa", "default", check=False).returncode == 0, 30, "sa")
    from kubernetes import config as kconfig

    api = kconfig.new_client_from_config(config_file=str(cluster.kubeconfig))
    nodes = sorted(n["metadata"]["name"] for n in kubectl.items("nodes"))
    # Every GPU held by a pod the dispatcher does not own (one per node, bound directly).
    hogs = [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"hog-{i}", "namespace": NS, "labels": {"hog": "1"},
                          "annotations": outcome("run")},
             "spec": {"nodeName": n, "containers": [container(gpus=8)]}}
            for i, n in enumerate(nodes)]
    for start in range(0, len(hogs), 250):
        k("apply", "-f", "-", input=yaml.safe_dump(
            {"apiVersion": "v1", "kind": "List", "items": hogs[start:start + 250]}),
          timeout=600)
    names = [f"q{i:05d}" for i in range(args.wrappers)]
    posted = post_all(api, [appwrapper(n, 1, 8) for n in names])
    print(f"{args.wrappers} AppWrappers created in {posted:.0f} s on {len(nodes)} nodes, "
          "every GPU held by another pod")

    d = Dispatcher(cluster, args.python, args.source, args.port)
    results: dict[str, Any] = {}
    try:
        d.start()
        wait_for(d.ready, 600, "the dispatcher to list and rebuild")
        assert d.proc is not None
        results["startup_s"] = time.monotonic() - d.started
        # Let it write the first decisions (Queueing/Backoff for each), then be quiet.
        wait_for(lambda: cycle_stats(args.port)[0] >= 3, 600, "three admission cycles")
        # Every wrapper's first status (Init, Queueing, its reason to wait: one PATCH
        # each) goes out at the client's pace; quiet starts once that backlog is written.
        # What follows is each wrapper's first start estimate, a minor write: those go
        # out at the shared minor rate (5 a second) until every wrapper has one, and are
        # what the quiet window counts (10,000 take about half an hour).
        first = apiserver_patches(kubectl)
        results["first_writes_s"] = settle(
            kubectl, rate=MINOR_WRITES_PER_SECOND + 1) - d.started
        results["first_writes"] = apiserver_patches(kubectl) - first
        before = apiserver_patches(kubectl)
        c0, s0 = cycle_stats(args.port)
        time.sleep(args.quiet)
        c1, s1 = cycle_stats(args.port)
        results["quiet_patches"] = apiserver_patches(kubectl) - before
        results["cycle_ms"] = 1000 * (s1 - s0) / max(1.0, c1 - c0)
        results["cycles"] = c1 - c0
        results["rss_mb"] = rss_mb(d.proc.pid)
        print(json.dumps(results), flush=True)  # in case a later phase does not finish
        # Recovery: kill -9, free one node, start again: time to the first new dispatch.
        d.kill()
        k("delete", "pod", "hog-0", "--grace-period=0", "--force", "--wait=true")
        d.start()
        # Whichever wrapper the policy puts first (many share a creation second): the
        # first new dispatch after the restart is the recovery.
        wait_for(lambda: d.created_since_start(), 600, "a first new dispatch")
        results["recovery_s"] = time.monotonic() - d.started
        wait_for(d.ready, 60, "ready")
        results["rss_after_mb"] = rss_mb(d.proc.pid)
        # Writes per dispatched wrapper: free more nodes, drain a small workload.
        k("delete", "appwrappers", "--all", "--wait=false", timeout=900)
        wait_for(lambda: not k.items("appwrappers"), 900, "the queue to be deleted")
        k("delete", "pods", "-l", "hog=1", "--grace-period=0", "--force", "--wait=true",
          timeout=600)
        drain = [f"d{i:04d}" for i in range(args.drain)]
        before = apiserver_patches(kubectl)
        t0 = time.monotonic()
        post_all(api, [appwrapper(n, 2, 1, "succeed") for n in drain])

        def completed() -> int:
            return sum(1 for aw in k.items("appwrappers")
                       if (aw.get("status") or {}).get("state") == "Completed")

        wait_for(lambda: completed() == args.drain, 1200, "the drain to complete")
        results["drain_s"] = time.monotonic() - t0
        results["patches_per_wrapper"] = (apiserver_patches(kubectl) - before) / args.drain
    finally:
        d.stop()
        kubectl("delete", "namespace", NS, "--wait=false")
    print(json.dumps(results, indent=1))
    print(f"start-up (list + rebuild) {results['startup_s']:.1f} s (target < 30 s); "
          f"peak RSS {results['rss_mb']:.0f} MB (target < 500 MB); admission cycle "
          f"{results['cycle_ms']:.0f} ms mean over {results['cycles']:.0f} cycles (target "
          f"< 1 s); first statuses ({results['first_writes']} PATCHes) written "
          f"{results['first_writes_s']:.0f} s after the start; then status PATCHes in "
          f"{args.quiet:.0f} quiet s: {results['quiet_patches']} (bound: "
          f"{MINOR_WRITES_PER_SECOND * args.quiet:.0f}, start estimates); "
          f"recovery after kill -9 to the first new dispatch {results['recovery_s']:.1f} s; "
          f"status PATCHes per dispatched AppWrapper {results['patches_per_wrapper']:.2f} "
          f"({args.drain} drained in {results['drain_s']:.0f} s)")


if __name__ == "__main__":
    main()
