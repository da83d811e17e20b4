"""End to end on the local control plane: N AppWrappers x M one-GPU pods onto fake nodes.

Two runs in one process, same cluster, same objects:
1. through the dispatcher: N AppWrappers, each wrapping a batch Job of M one-GPU pods;
2. directly: the same N Jobs created without the dispatcher (the API server's and the
   scheduler's own pace: the ceiling).
Pods succeed after --run-for, so the queue drains in waves (N x M GPUs do not fit at
once). Prints time to drain, jobs dispatched (or created) per second, and the partial
gangs seen by sampling pods every second: a job with some pods Running while others
wait unschedulable — what gang dispatch exists to prevent.

With --mixed SEED the gangs fragment the nodes (1, 2, 4 or 8 pods of 1, 2, 4 or 8 GPUs,
drawn with SEED), and the dispatcher's run also measures the decide-vs-bind gap: pods that
kube-scheduler bound on another node than the dispatcher planned (the nodes its Dispatched
condition names), and gangs with a pod left unschedulable after dispatch — a promise the
cluster did not keep.

Usage: python bench/e2e.py [--wrappers 500] [--pods 4] [--nodes 64] [--run-for 10s]
       [--mixed SEED] [--dispatcher-args '--kube-qps 100']
(starts the local cluster with a profile of --nodes 8-GPU nodes; leaves it running.)
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
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


def job(name: str, pods: int, run_for: str, gpus: int = 1) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {BENCH_LABEL: name}},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                     "template": {"metadata": {"labels": {BENCH_LABEL: name},
                                               "annotations": outcome("succeed", run_for)},
                                  "spec": {"restartPolicy": "Never",
                                           "containers": [container(gpus=gpus)]}}}}


def appwrapper(name: str, pods: int, run_for: str, gpus: int = 1) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name},
            "spec": {"resources": {"GenericItems": [{"generictemplate": job(
                name, pods, run_for, gpus)}]}}}


def shapes(count: int, pods: int, mixed: int | None) -> list[tuple[int, int]]:
    """(pods, GPUs per pod) of each job: all alike, or drawn to fragment the nodes."""
    if mixed is None:
        return [(pods, 1)] * count
    rng = random.Random(mixed)
    return [(rng.choice((1, 2, 4, 8)), rng.choice((1, 1, 2, 4, 8))) for _ in range(count)]


def sample(k: Kubectl, pods: dict[str, int], unschedulable_pods: dict[str, set[str]]
           ) -> tuple[int, set[str], set[str]]:
    """(partial gangs now, jobs with all pods done, jobs seen); pods seen unschedulable
    are added to `unschedulable_pods` by job."""
    by_job: dict[str, Counter[str]] = {}
    for p in k.items("pods", "-l", BENCH_LABEL):
        j = p["metadata"]["labels"][BENCH_LABEL]
        phase = p["status"].get("phase", "Pending")
        unschedulable = any(c.get("reason") == "Unschedulable"
                            for c in p["status"].get("conditions") or [])
        by_job.setdefault(j, Counter())["unschedulable" if unschedulable else phase] += 1
        if unschedulable:
            unschedulable_pods.setdefault(j, set()).add(p["metadata"]["name"])
    partial = sum(1 for c in by_job.values() if c["Running"] and c["unschedulable"])
    done = {j for j, c in by_job.items() if c["Succeeded"] >= pods[j]}
    return partial, done, set(by_job)


def off_plan(k: Kubectl) -> tuple[int, int]:
    """(pods bound on a node the dispatcher did not plan for their gang, pods checked):
    the planned nodes are those the Dispatched condition names (gangs on at most 5)."""
    planned: dict[str, set[str]] = {}
    for aw in k.items("appwrappers"):
        for c in (aw.get("status") or {}).get("conditions") or []:
            m = re.search(r"pods fit: on (.*)$", c.get("message", ""))
            if c.get("type") == "Dispatched" and m and " more" not in m.group(1):
                planned[aw["metadata"]["name"]] = set(m.group(1).split(", "))
    off = checked = 0
    for p in k.items("pods", "-l", BENCH_LABEL):
        nodes = planned.get(p["metadata"]["labels"][BENCH_LABEL])
        if nodes and p["spec"].get("nodeName"):
            checked += 1
            off += p["spec"]["nodeName"] not in nodes
    return off, checked


def post(objects: list[dict[str, Any]], create: Callable[[dict[str, Any]], Any]) -> None:
    """POST every object, 16 at a time (as many clients would; `kubectl apply` of a List
    goes one object after another, and it would be what is timed)."""
    def one(obj: dict[str, Any]) -> None:
        for attempt in range(5):
            try:
                create(obj)
                return
            except Exception:
                if attempt == 4:
                    raise
                time.sleep(1)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, objects))


def run(k: Kubectl, objects: list[dict[str, Any]], create: Callable[[dict[str, Any]], Any],
        names: list[str], pods: dict[str, int], what: str) -> dict[str, float]:
    """Post the objects (in a thread) while sampling the pods every second, until every
    job's pods have succeeded."""
    t0 = time.monotonic()
    posted: list[float] = []
    poster = threading.Thread(
        target=lambda: (post(objects, create), posted.append(time.monotonic() - t0)),
        daemon=True)
    poster.start()
    done: set[str] = set()
    partial_samples = partial_max = samples = 0
    first_seen: dict[str, float] = {}
    unschedulable: dict[str, set[str]] = {}
    while len(done) < len(names):
        partial, finished, seen = sample(k, pods, unschedulable)
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
    poster.join()
    applied = posted[0] if posted else drain
    starts = sorted(first_seen.values())
    off, checked = off_plan(k) if what == "dispatcher" else (0, 0)
    return {"drain_s": drain, "apply_s": applied, "jobs_per_s": len(names) / drain,
            "first_pods_s": starts[0], "last_pods_s": starts[-1],
            "partial_samples": partial_samples, "samples": samples,
            "partial_max": partial_max, "unschedulable_jobs": len(unschedulable),
            "unschedulable_pods": sum(len(v) for v in unschedulable.values()),
            "off_plan": off, "checked": checked}


def start_dispatcher(cluster: Cluster, name: str, extra: str) -> subprocess.Popen[bytes]:
    """`dispatcher run` on the local cluster (log: `name`.log), returned once it has
    listed the cluster and decides: its start-up is not what a bench times."""
    path = cluster.logs / f"{name}.log"
    with path.open("ab") as f:
        f.write(b"\n===== start =====\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli", "run", "--kubeconfig",
         str(cluster.kubeconfig), "--metrics-port", "0", *extra.split()],
        stdout=path.open("ab"), stderr=subprocess.STDOUT, cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wait_for(lambda: "dispatcher ready" in path.read_text(errors="replace")
             .split("===== start =====")[-1], 120, "the dispatcher to start")
    return proc


def bench_cluster(profile: str | None = None) -> tuple[Cluster, Kubectl, Any]:
    """The local cluster up without operators, the AppWrapper CRD installed, and an API
    client for it."""
    from kubernetes import config as kconfig

    cluster = Cluster()
    if profile is None:
        cluster.up(operators=False)
    else:
        cluster.up(profile=profile, operators=False)
    kubectl = cluster.kubectl()
    kubectl("apply", "--server-side", "--force-conflicts", "-f",
            str(REPO / "crds" / "appwrappers.workload.codeflare.dev.yaml"))
    return cluster, kubectl, kconfig.new_client_from_config(
        config_file=str(cluster.kubeconfig))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wrappers", type=int, default=500)
    ap.add_argument("--pods", type=int, default=4)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--run-for", default="10s")
    ap.add_argument("--mixed", type=int, default=None, metavar="SEED",
                    help="gangs of mixed sizes that fragment the nodes, drawn with SEED")
    ap.add_argument("--dispatcher-args", default="",
                    help="more arguments for `dispatcher run`, e.g. '--kube-qps 100'")
    args = ap.parse_args()
    from kubernetes import client

    cluster, kubectl, api = bench_cluster(str(profile_file(args.nodes)))
    custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
    names = [f"job-{i:04d}" for i in range(args.wrappers)]
    drawn = dict(zip(names, shapes(args.wrappers, args.pods, args.mixed), strict=True))
    pods = {n: shape[0] for n, shape in drawn.items()}
    results: dict[str, dict[str, float]] = {}

    for mode in ("direct", "dispatcher"):
        ns = f"bench-{mode}"
        kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=true", timeout=600)
        kubectl("create", "namespace", ns)
        k = kubectl.in_namespace(ns)
        wait_for(lambda k=k: k.run("get", "sa", "default", check=False).returncode == 0,
                 30, "default service account")
        proc = None
        create: Callable[[dict[str, Any]], Any]
        if mode == "dispatcher":
            proc = start_dispatcher(cluster, "dispatcher-bench", args.dispatcher_args)
            objects = [appwrapper(n, drawn[n][0], args.run_for, drawn[n][1]) for n in names]
            create = partial(custom.create_namespaced_custom_object,
                             "workload.codeflare.dev", "v1beta1", ns, "appwrappers")
        else:
            objects = [job(n, drawn[n][0], args.run_for, drawn[n][1]) for n in names]
            create = partial(batch.create_namespaced_job, ns)
        try:
            results[mode] = run(k, objects, create, names, pods, mode)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
        kubectl("delete", "namespace", ns, "--wait=false")

    gpus = args.nodes * 8
    work = sum(p * g for p, g in drawn.values())
    what = (f"mixed gangs (seed {args.mixed})" if args.mixed is not None
            else f"x {args.pods} one-GPU pods")
    print(f"{args.wrappers} jobs {what} (run {args.run_for}) on {args.nodes} nodes x 8 GPUs "
          f"= {gpus} GPUs ({work / gpus:.1f} cluster-fulls of work)")
    header = ("mode", "drain s", "jobs/s", "posted in s", "partial-gang samples", "max partial")
    print("  ".join(f"{h:>20}" for h in header))
    for mode, r in results.items():
        print("  ".join(f"{v:>20}" for v in (
            mode, f"{r['drain_s']:.1f}", f"{r['jobs_per_s']:.2f}", f"{r['apply_s']:.1f}",
            f"{int(r['partial_samples'])}/{int(r['samples'])}", int(r["partial_max"]))))
    ratio = results["dispatcher"]["jobs_per_s"] / results["direct"]["jobs_per_s"]
    print(f"dispatcher / direct throughput = {ratio:.2f} (aim: >= 0.9)")
    r = results["dispatcher"]
    print(f"decide-vs-bind, through the dispatcher: {int(r['off_plan'])} of "
          f"{int(r['checked'])} pods bound off the planned nodes; "
          f"{int(r['unschedulable_jobs'])} gangs ({int(r['unschedulable_pods'])} pods) "
          f"seen with a pod unschedulable after dispatch")


if __name__ == "__main__":
    main()
