"""End to end on the local control plane: N AppWrappers x M one-GPU pods onto fake nodes.

Two runs in one process, same cluster, same objects:
1. through the dispatcher: N AppWrappers, each wrapping a batch Job of M one-GPU pods;
2. directly: the same N Jobs created without the dispatcher (the API server's and the
   scheduler's own pace: the ceiling).
Pods succeed after --run-for, so the queue drains in waves (N x M GPUs do not fit at
once). Prints time to drain, jobs dispatched (or created) per second, and the partial
gangs seen by sampling pods every second: a job with some pods Running while others
wait unschedulable — what gang dispatch exists to prevent.

Usage: python bench/e2e.py [--wrappers 500] [--pods 4] [--nodes 64] [--run-for 10s]
(starts the local cluster with a profile of --nodes 8-GPU nodes; leaves it running.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localcluster import Cluster, Kubectl, wait_for  # noqa: E402
from localcluster.testing import container, outcome  # noqa: E402

LABEL = "workload.codeflare.dev/appwrapper"
BENCH_LABEL = "bench.dispatcher/job"


def profile_file(nodes: int) -> Path:
    doc = {"description": f"{nodes} nodes x 8 GPUs (bench)", "nodes": [
        {"name": "gpu", "count": nodes,
         "capacity": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8", "pods": "110"}}]}
    path = Path(tempfile.gettempdir()) / f"bench{nodes}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def job(name: str, pods: int, run_for: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {BENCH_LABEL: name}},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                     "template": {"metadata": {"labels": {BENCH_LABEL: name},
                                               "annotations": outcome("succeed", run_for)},
                                  "spec": {"restartPolicy": "Never",
                                           "containers": [container(gpus=1)]}}}}


def appwrapper(name: str, pods: int, run_for: str) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name},
            "spec": {"resources": {"GenericItems": [{"generictemplate": job(name, pods,
                                                                             run_for)}]}}}


def sample(k: Kubectl, pods: int) -> tuple[int, set[str], set[str]]:
    """(partial gangs now, jobs with all pods done, jobs seen)."""
    by_job: dict[str, Counter[str]] = {}
    for p in k.items("pods", "-l", BENCH_LABEL):
        j = p["metadata"]["labels"][BENCH_LABEL]
        phase = p["status"].get("phase", "Pending")
        unschedulable = any(c.get("reason") == "Unschedulable"
                            for c in p["status"].get("conditions") or [])
        by_job.setdefault(j, Counter())["unschedulable" if unschedulable else phase] += 1
    partial = sum(1 for c in by_job.values() if c["Running"] and c["unschedulable"])
    done = {j for j, c in by_job.items() if c["Succeeded"] >= pods}
    return partial, done, set(by_job)


def run(k: Kubectl, objects: list[dict[str, Any]], names: list[str], pods: int,
        what: str) -> dict[str, float]:
    t0 = time.monotonic()
    k("apply", "-f", "-", input=yaml.safe_dump({"apiVersion": "v1", "kind": "List",
                                                "items": objects}), timeout=600)
    applied = time.monotonic() - t0
    done: set[str] = set()
    partial_samples = partial_max = samples = 0
    first_seen: dict[str, float] = {}
    while len(done) < len(names):
        partial, finished, seen = sample(k, pods)
        now = time.monotonic() - t0
        for j in seen:
            first_seen.setdefault(j, now)
        samples += 1
        partial_samples += partial > 0
        partial_max = max(partial_max, partial)
        done |= finished
        if now > 1800:
            raise TimeoutError(f"{what}: {len(done)} of {len(names)} done after 30 min")
        time.sleep(1.0)
    drain = time.monotonic() - t0
    starts = sorted(first_seen.values())
    return {"drain_s": drain, "apply_s": applied, "jobs_per_s": len(names) / drain,
            "first_pods_s": starts[0], "last_pods_s": starts[-1],
            "partial_samples": partial_samples, "samples": samples,
            "partial_max": partial_max}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wrappers", type=int, default=500)
    ap.add_argument("--pods", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--run-for", default="10s")
    ap.add_argument("--dispatcher-args", default="",
                    help="more arguments for `dispatcher run`, e.g. '--kube-qps 100'")
    args = ap.parse_args()

    cluster = Cluster()
    cluster.up(profile=str(profile_file(args.nodes)), operators=False)
    kubectl = cluster.kubectl()
    kubectl("apply", "--server-side", "--force-conflicts", "-f",
            str(REPO / "crds" / "appwrappers.workload.codeflare.dev.yaml"))
    names = [f"job-{i:04d}" for i in range(args.wrappers)]
    results: dict[str, dict[str, float]] = {}

    for mode in ("direct", "dispatcher"):
        ns = f"bench-{mode}"
        kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=true", timeout=600)
        kubectl("create", "namespace", ns)
        k = kubectl.in_namespace(ns)
        wait_for(lambda k=k: k.run("get", "sa", "default", check=False).returncode == 0,
                 30, "default service account")
        proc = None
        if mode == "dispatcher":
            log = (cluster.logs / "dispatcher-bench.log").open("ab")
            proc = subprocess.Popen(
                [sys.executable, "-m", "dispatcher.cli", "run", "--kubeconfig",
                 str(cluster.kubeconfig), "--metrics-port", "0",
                 *args.dispatcher_args.split()],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
            time.sleep(3)
            objects = [appwrapper(n, args.pods, args.run_for) for n in names]
        else:
            objects = [job(n, args.pods, args.run_for) for n in names]
        try:
            results[mode] = run(k, objects, names, args.pods, mode)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
        kubectl("delete", "namespace", ns, "--wait=false")

    gpus = args.nodes * 8
    print(f"{args.wrappers} jobs x {args.pods} one-GPU pods (run {args.run_for}) on "
          f"{args.nodes} nodes x 8 GPUs = {gpus} GPUs "
          f"({args.wrappers * args.pods / gpus:.1f} cluster-fulls of work)")
    header = ("mode", "drain s", "jobs/s", "apply s", "partial-gang samples", "max partial")
    print("  ".join(f"{h:>20}" for h in header))
    for mode, r in results.items():
        print("  ".join(f"{v:>20}" for v in (
            mode, f"{r['drain_s']:.1f}", f"{r['jobs_per_s']:.2f}", f"{r['apply_s']:.1f}",
            f"{int(r['partial_samples'])}/{int(r['samples'])}", int(r["partial_max"]))))
    ratio = results["dispatcher"]["jobs_per_s"] / results["direct"]["jobs_per_s"]
    print(f"dispatcher / direct throughput = {ratio:.2f} (aim: >= 0.5)")


if __name__ == "__main__":
    main()
