"""Side by side with the peers users run today, on one local cluster, with the same workloads,
one system after another, in one run:

- *dispatcher*: `dispatcher run` with its default flags, AppWrappers (v1beta1);
- *kueue*: Kueue v0.17.0 with its default Configuration and the Job integration, one
  ClusterQueue holding the whole cluster, Jobs created suspended with its LocalQueue's label
  (what its webhook, not registered here, would make of them);
- *appwrapper*: codeflare's AppWrapper controller v1.2.1 with Kueue (its AppWrapper
  integration), v1beta2 AppWrappers created suspended with the label (its CRD replaces the
  dispatcher's while it runs);
- *direct*: the Jobs created with nothing queueing them (the API server's and the
  scheduler's own pace), where a row has it;
- *dispatcher-backfill* (fragmentation and trace): `dispatcher run --policy backfill`, which
  lets a gang that fits go ahead of one that cannot start yet (fifo keeps it behind);
- *kueue-wfpr*, *kueue-tas* (fragmentation only): Kueue with WaitForPodsReady as its docs
  set it up for all-or-nothing (timeout 5m, blockAdmission, requeued by eviction time), or
  with Topology Aware Scheduling (a Topology of one level, the node, on the ResourceFlavor).

Rows (each on a fresh namespace; pods are kwok's, Running at once and Succeeded after their
run time):
1. *cheap*: --cheap one-pod Jobs (no GPU, run 1 s): admitted per second (from the first
   POST until every Job is let run: created by the controller, or unsuspended by Kueue),
   CPU seconds per item of each controller and of the API server until all finished, and
   the requests the API server served per item by verb and resource.
2. *gangs*: --gangs Jobs of 4 one-GPU pods (run 10 s) on --nodes 8-GPU nodes: time to
   drain, jobs per second, time to the first pod Running, and partial gangs (some pods
   Running while others wait unschedulable) sampled every second.
3. *fragmentation*: 16 nodes of 8 GPUs, each with 4 taken by a pod outside any queue (runs
   60 s): 64 GPUs free, 4 on each node. Queue quota 64 GPUs. Submitted: 4 gangs of 2 pods x
   8 GPUs (fit no node until the others finish), then 8 of 2 pods x 4 GPUs (fit now), each
   runs 30 s. Gangs admitted that could not run, GPU-seconds of pods Pending unplaceable in
   admitted gangs (quota held idle), GPU-seconds of pods Running in partial gangs, drain
   time.
4. *trace*: the first --trace-jobs jobs of an ITP trace (../shared/traces/itp, --trace),
   arrivals and run times compressed to about --trace-seconds (each run 2 s at least and
   --trace-seconds at most), on --trace-nodes 8-GPU nodes:
   mean and p95 wait (submitted to every pod Running), GPU utilisation, and wasted
   GPU-seconds (pods Running in a gang not wholly Running).
5. *glue*: MCAD's GLUE AppWrapper (a RayCluster: a head and one 1-GPU worker, with
   custompodresources declaring 2 pods of 3 CPU and 1 GPU), through each system that can
   express it, with the kuberay operator: whether it runs whole and what each reserved.

Usage: python bench/peers.py [--rows cheap,gangs,fragmentation,trace,glue] [--systems
       dispatcher,kueue,...] [--nodes 64]
       [--cheap 1000] [--gangs 500] [--trace ../shared/traces/itp/cluster02.csv]
       [--trace-jobs 200] [--trace-seconds 180] [--trace-nodes 8]
Builds nothing: the peers come from `python -m localcluster build` (make cluster-build).
Starts the local cluster (DISPATCHER_CLUSTER names another) and leaves it running.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from e2e import (  # noqa: E402
    BENCH_LABEL,
    GPU,
    KUEUE_MODES,
    View,
    bench_cluster,
    cpu_seconds,
    job,
    pod_view,
    post,
    profile_file,
    requests_served,
    start_dispatcher,
)

from dispatcher.simulate.traces import read_trace  # noqa: E402
from localcluster import Cluster, Kubectl, wait_for  # noqa: E402
from localcluster.appwrapper import API as AW_V1BETA2  # noqa: E402
from localcluster.appwrapper import KUEUE_FRAMEWORK, AppWrapperController  # noqa: E402
from localcluster.kueue import API as KUEUE_API  # noqa: E402
from localcluster.kueue import QUEUE_LABEL, Kueue, queue  # noqa: E402
from localcluster.testing import container, outcome  # noqa: E402

SHARED = REPO.parent / "shared"
GLUE = (SHARED / "conformance" / "mcad-v1beta1" / "manifests" /
        "multi-cluster-app-dispatcher__doc__usage__examples__kuberay__config__aw-kuberay-glue.yaml")
TRACE = SHARED / "traces" / "itp" / "cluster02.csv"
RAY_FRAMEWORK = "ray.io/raycluster"
#: The local cluster's node name label: TAS's one level.
HOSTNAME = "kubernetes.io/hostname"
TAS_ANNOTATION = "kueue.x-k8s.io/podset-unconstrained-topology"


# --- the systems --------------------------------------------------------------------------

@dataclass
class Env:
    cluster: Cluster
    kubectl: Kubectl
    api: Any
    crd: str = "dispatcher"  # whose AppWrapper CRD is installed

    def use_crd(self, whose: str) -> None:
        if whose != self.crd:
            if whose == "appwrapper":
                AppWrapperController.install_crd(self.kubectl)
            else:
                AppWrapperController.restore_crd(self.kubectl)
            self.crd = whose


class Controller(Protocol):
    """A controller process a system runs: Kueue, codeflare's, the dispatcher."""

    @property
    def pid(self) -> int | None: ...

    def stop(self) -> None: ...


@dataclass
class DispatcherRun:
    """`dispatcher run` as bench/e2e.py starts it."""

    proc: subprocess.Popen[bytes]

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


@dataclass
class System:
    """One way of running the bench's Jobs: what starts before, what is posted for a Job,
    and which processes are its controllers."""

    name: str
    crd: str = "dispatcher"
    kueue: dict[str, Any] | None = None  # Kueue's settings when it runs Kueue
    appwrapper: bool = False  # codeflare's AppWrapper controller
    dispatcher: bool = False
    dispatcher_args: str = ""  # more flags for `dispatcher run`
    topology: bool = False  # Kueue's TAS on the ResourceFlavor
    procs: dict[str, Controller] = field(default_factory=dict)

    def start(self, env: Env, ns: str, quota: dict[str, str]) -> None:
        env.use_crd(self.crd)
        if self.appwrapper:
            controller = AppWrapperController(env.cluster)
            controller.start()
            self.procs["appwrapper"] = controller
        if self.kueue is not None:
            kueue = Kueue(env.cluster, self.kueue)
            kueue.start()
            self.procs["kueue"] = kueue
            queue(env.kubectl, ns, quota, name=ns, flavor=self._flavor(env))
        if self.dispatcher:
            self.procs["dispatcher"] = DispatcherRun(start_dispatcher(
                env.cluster, "dispatcher-peers", self.dispatcher_args))

    def _flavor(self, env: Env) -> dict[str, Any] | None:
        if not self.topology:
            return None
        env.kubectl.apply({"apiVersion": KUEUE_API, "kind": "Topology",
                           "metadata": {"name": "hosts"},
                           "spec": {"levels": [{"nodeLabel": HOSTNAME}]}})
        node = env.kubectl.items("nodes", "-l", "dispatcher.local/profile")[0]
        label = "dispatcher.local/profile"
        return {"nodeLabels": {label: node["metadata"]["labels"][label]},
                "topologyName": "hosts"}

    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items() if p.pid}

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()
        self.procs.clear()

    def wrap(self, w: Submitted, ns: str) -> dict[str, Any]:
        """What is posted for `w`'s Job or RayCluster."""
        obj = copy.deepcopy(w.obj)
        name = obj["metadata"]["name"]
        if self.dispatcher and w.users_appwrapper is not None:
            return w.users_appwrapper
        if self.dispatcher:
            return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                    "metadata": {"name": name},
                    "spec": {"resources": {"GenericItems": [{"generictemplate": obj}]}}}
        if self.appwrapper:
            return {"apiVersion": AW_V1BETA2, "kind": "AppWrapper",
                    "metadata": {"name": name, "labels": {QUEUE_LABEL: ns, BENCH_LABEL: name}},
                    "spec": {"suspend": True, "components": [{"template": obj}]}}
        if self.kueue is not None:
            if self.topology:
                for t in templates(obj):
                    t.setdefault("metadata", {}).setdefault("annotations", {})[
                        TAS_ANNOTATION] = "true"
            obj["metadata"].setdefault("labels", {})[QUEUE_LABEL] = ns
            obj["spec"]["suspend"] = True
            return obj
        return obj

    def creator(self, env: Env, ns: str) -> Callable[[dict[str, Any]], Any]:
        from kubernetes import client

        custom = client.CustomObjectsApi(env.api)
        if self.dispatcher:
            return partial(custom.create_namespaced_custom_object,
                           "workload.codeflare.dev", "v1beta1", ns, "appwrappers")
        if self.appwrapper:
            return partial(custom.create_namespaced_custom_object,
                           "workload.codeflare.dev", "v1beta2", ns, "appwrappers")

        def create(obj: dict[str, Any]) -> Any:
            if obj["kind"] == "Job":
                return client.BatchV1Api(env.api).create_namespaced_job(ns, obj)
            return custom.create_namespaced_custom_object("ray.io", "v1", ns, "rayclusters", obj)
        return create


def templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj["kind"] == "Job":
        return [obj["spec"]["template"]]
    spec = obj["spec"]
    return [spec["headGroupSpec"]["template"],
            *(g["template"] for g in spec.get("workerGroupSpecs") or [])]


def systems(names: Iterable[str], only: set[str] | None = None) -> list[System]:
    both = {"integrations": {"frameworks": ["batch/job", KUEUE_FRAMEWORK, RAY_FRAMEWORK]}}
    jobs_only = {"integrations": {"frameworks": ["batch/job", RAY_FRAMEWORK]}}
    known = {
        "direct": System("direct"),
        "dispatcher": System("dispatcher", dispatcher=True),
        # Its default policy (fifo) keeps every gang behind one that cannot start yet.
        "dispatcher-backfill": System("dispatcher-backfill", dispatcher=True,
                                      dispatcher_args="--policy backfill"),
        "kueue": System("kueue", kueue=jobs_only),
        "kueue-wfpr": System("kueue-wfpr", kueue={**jobs_only, **KUEUE_MODES["kueue-wfpr"]}),
        "kueue-tas": System("kueue-tas", kueue=jobs_only, topology=True),
        "appwrapper": System("appwrapper", crd="appwrapper", kueue=both, appwrapper=True),
    }
    return [known[n] for n in names if only is None or n in only]


# --- one run ---------------------------------------------------------------------------

@dataclass
class Submitted:
    name: str
    obj: dict[str, Any]  # the Job (or RayCluster)
    pods: int
    at: float = 0.0  # seconds after the start
    #: What the dispatcher is given, when not `obj` wrapped as it is (a user's AppWrapper).
    users_appwrapper: dict[str, Any] | None = None


def job_view(api: Any, ns: str) -> View:
    from kubernetes import client

    def let_run(j: dict[str, Any]) -> bool:
        return not j["spec"].get("suspend")

    return View(client.BatchV1Api(api).list_namespaced_job, ns,
                lambda j: j["metadata"]["name"], let_run)


def run(env: Env, system: System, work: list[Submitted], quota: dict[str, str],
        before: Callable[[], None] | None = None, limit: float = 1800,
        whole: bool = False) -> dict[str, Any]:
    """Post the work (each item at its time), sample pods every second until every Job's
    pods have succeeded (or, `whole`, all run at once); what a user and an operator would
    see."""
    ns = f"peers-{system.name}-{int(time.time())}"
    env.kubectl("create", "namespace", ns)
    wait_for(lambda: env.kubectl.run("get", "sa", "default", "-n", ns, check=False)
             .returncode == 0, 30, "default service account")
    system.start(env, ns, quota)
    try:
        return _measure(env, system, ns, work, before, limit, whole)
    finally:
        env.kubectl("delete", "namespace", ns, "--wait=true", timeout=900)
        system.stop()  # after its namespace: Kueue's and its controller's finalizers


def _measure(env: Env, system: System, ns: str, work: list[Submitted],
             before: Callable[[], None] | None, limit: float, whole: bool) -> dict[str, Any]:
    create = system.creator(env, ns)
    pods, jobs = pod_view(env.api, ns), job_view(env.api, ns)
    need = {w.name: w.pods for w in work}
    cpu0, served0 = cpu_seconds(named=system.pids()), requests_served(env.kubectl)
    if before is not None:
        before()
    t0 = time.monotonic()
    poster = threading.Thread(target=_post_in_time, daemon=True,
                              args=(work, lambda w: create(system.wrap(w, ns)), t0))
    poster.start()
    s = Samples()
    finished = s.whole if whole else s.done
    while len(finished) < len(work) and time.monotonic() - t0 < limit:
        s.take(pods.snapshot(), need, time.monotonic() - t0)
        time.sleep(1.0)
    if len(finished) < len(work):
        print(f"  {system.name}: {len(s.done)} of {len(work)} done after {limit:.0f} s; "
              "stopped there")
    end = time.monotonic() - t0
    pods.stop.set()
    jobs.stop.set()
    cpu = cpu_seconds(named=system.pids())
    cpu.subtract(cpu0)
    served = requests_served(env.kubectl)
    served.subtract(served0)
    poster.join()
    admitted = sorted(t - t0 for t in jobs.first.values())
    submitted = {w.name: w.at for w in work}
    waits = sorted(s.whole[n] - submitted[n] for n in s.whole)
    return {
        "drain_s": end, "admitted_s": admitted[-1] if admitted else float("nan"),
        "first_running_s": min(s.first_running.values(), default=float("nan")),
        "wait_mean": statistics.fmean(waits) if waits else float("nan"),
        "wait_p95": waits[int(len(waits) * 0.95)] if waits else float("nan"),
        "partial_samples": s.partial_samples, "samples": s.count,
        "partial_max": s.partial_max, "stuck_gangs": len(s.stuck),
        "running_gpu_s": s.gpu_s["running"], "partial_gpu_s": s.gpu_s["partial"],
        "stuck_gpu_s": s.gpu_s["stuck"],
        "cpu": dict(cpu), "served": dict(served), "items": len(work), "done": len(finished),
    }


def _post_in_time(work: list[Submitted], create: Callable[[Submitted], Any],
                  t0: float) -> None:
    """Everything due at once is posted 16 at a time; later items at their times."""
    by_time: dict[float, list[Submitted]] = {}
    for w in work:
        by_time.setdefault(w.at, []).append(w)
    for at in sorted(by_time):
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        post(by_time[at], create)


@dataclass
class Samples:
    """What sampling pods every second found."""

    count: int = 0
    partial_samples: int = 0
    partial_max: int = 0
    done: set[str] = field(default_factory=set)
    first_running: dict[str, float] = field(default_factory=dict)
    whole: dict[str, float] = field(default_factory=dict)  # every pod Running (or done)
    stuck: set[str] = field(default_factory=set)  # a pod seen unschedulable
    gpu_s: Counter[str] = field(default_factory=Counter)
    last: float = 0.0

    def take(self, kept: list[Any], need: dict[str, int], now: float) -> None:
        dt, self.last = now - self.last, now
        by_job: dict[str, Counter[str]] = {}
        gpus: dict[str, Counter[str]] = {}
        for j, phase, requested, unschedulable, _ in kept:
            state = "unschedulable" if unschedulable else phase
            by_job.setdefault(j, Counter())[state] += 1
            gpus.setdefault(j, Counter())[state] += requested
        partial = 0
        for j, c in by_job.items():
            if c["Running"]:
                self.first_running.setdefault(j, now)
            if c["Running"] + c["Succeeded"] >= need[j]:
                self.whole.setdefault(j, now)
            if c["unschedulable"]:
                self.stuck.add(j)
                self.gpu_s["stuck"] += gpus[j]["unschedulable"] * dt
            if c["Running"] and c["Running"] + c["Succeeded"] < need[j]:
                self.gpu_s["partial"] += gpus[j]["Running"] * dt
            if c["Running"] and c["unschedulable"]:
                partial += 1
            self.gpu_s["running"] += gpus[j]["Running"] * dt
            if c["Succeeded"] >= need[j]:
                self.done.add(j)
        self.count += 1
        self.partial_samples += partial > 0
        self.partial_max = max(self.partial_max, partial)


# --- the rows --------------------------------------------------------------------------

def whole_cluster(nodes: int) -> dict[str, str]:
    """A ClusterQueue's quota: the profile's nodes (profile_file), all of them."""
    return {"cpu": str(nodes * 96), "memory": f"{nodes}Ti", GPU: str(nodes * 8)}


def cheap(env: Env, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    env.cluster.use_profile(str(profile_file(args.nodes)))
    work = [Submitted(f"c-{i:04d}", job(f"c-{i:04d}", 1, "1s", gpus=0), 1)
            for i in range(args.cheap)]
    return {s.name: run(env, s, work, whole_cluster(args.nodes))
            for s in systems(("direct", "dispatcher", "kueue", "appwrapper"), args.only)}


def gangs(env: Env, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    env.cluster.use_profile(str(profile_file(args.nodes)))
    work = [Submitted(f"g-{i:04d}", job(f"g-{i:04d}", 4, "10s"), 4) for i in range(args.gangs)]
    return {s.name: run(env, s, work, whole_cluster(args.nodes))
            for s in systems(("direct", "dispatcher", "kueue", "appwrapper"), args.only)}


FRAGMENT_NODES = 16


def fragmentation(env: Env, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    env.cluster.use_profile(str(profile_file(FRAGMENT_NODES)))
    nodes = [n["metadata"]["name"] for n in env.kubectl.items(
        "nodes", "-l", "dispatcher.local/profile")]
    work = [*(Submitted(f"big-{i}", job(f"big-{i}", 2, "30s", gpus=8), 2) for i in range(4)),
            *(Submitted(f"small-{i}", job(f"small-{i}", 2, "30s", gpus=4), 2)
              for i in range(8))]
    quota = {"cpu": str(FRAGMENT_NODES * 96), "memory": f"{FRAGMENT_NODES}Ti", GPU: "64"}
    return {s.name: run(env, s, work, quota, before=partial(fillers, env.kubectl, nodes),
                        limit=300)
            for s in systems(("dispatcher", "dispatcher-backfill", "kueue", "kueue-wfpr",
                              "kueue-tas", "appwrapper"), args.only)}


def fillers(kubectl: Kubectl, nodes: list[str]) -> None:
    """A pod of 4 GPUs on each node, outside any queue, running 60 s."""
    k = kubectl.in_namespace("peers-fillers")
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": "peers-fillers"}})
    k("delete", "pods", "--all", "--wait=true", timeout=300)
    k.apply([{"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": f"filler-{n}", "annotations": outcome("succeed", "60s")},
              "spec": {"nodeName": n, "restartPolicy": "Never",
                       "containers": [container(gpus=4)]}} for n in nodes])
    wait_for(lambda: all(p["status"].get("phase") == "Running" for p in k.items("pods")),
             120, "the fillers to run")


def trace(env: Env, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    env.cluster.use_profile(str(profile_file(args.trace_nodes)))
    jobs = read_trace(Path(args.trace), limit=args.trace_jobs).jobs
    start, span = jobs[0].submit, (jobs[-1].submit - jobs[0].submit) or 1.0
    squeeze = span / args.trace_seconds
    work = []
    for i, j in enumerate(jobs):
        pods, gpus = j.pods, j.gpus // j.pods
        run_for = f"{min(args.trace_seconds, max(2.0, j.duration / squeeze)):.1f}s"
        work.append(Submitted(f"t-{i:04d}", job(f"t-{i:04d}", pods, run_for, gpus=gpus), pods,
                              at=round((j.submit - start) / squeeze, 1)))
    print(f"trace: {len(jobs)} jobs of {args.trace}, {span / 3600:.0f} h compressed "
          f"{squeeze:.0f}x (run times too, from 2 s to at most {args.trace_seconds:.0f} s) "
          f"onto {args.trace_nodes} nodes x 8 GPUs")
    return {s.name: run(env, s, work, whole_cluster(args.trace_nodes))
            for s in systems(("direct", "dispatcher", "dispatcher-backfill", "kueue",
                              "appwrapper"), args.only)}


def glue(env: Env, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    if not GLUE.is_file():
        print(f"glue: skipped, {GLUE} is not here")
        return {}
    env.cluster.use_profile(str(profile_file(4)))
    env.cluster.start_operator("kuberay-operator")
    aw = yaml.safe_load(GLUE.read_text())
    item = aw["spec"]["resources"]["GenericItems"][0]
    ray = item["generictemplate"]
    ray["apiVersion"] = "ray.io/v1"  # kuberay 1.5 serves v1 only
    ray["metadata"] = {"name": "glue", "labels": {BENCH_LABEL: "glue"}}
    for t in templates(ray):
        t.setdefault("metadata", {}).setdefault("labels", {})[BENCH_LABEL] = "glue"
        t["metadata"]["annotations"] = outcome("run")  # kuberay restarts a pod that ends
    aw["metadata"] = {"name": "glue"}
    work = [Submitted("glue", ray, 2, users_appwrapper=aw)]
    return {s.name: run(env, s, work, whole_cluster(4), limit=300, whole=True)
            for s in systems(("dispatcher", "kueue", "appwrapper"), args.only)}


ROWS: dict[str, Callable[[Env, argparse.Namespace], dict[str, dict[str, Any]]]] = {
    "cheap": cheap, "gangs": gangs, "fragmentation": fragmentation, "trace": trace,
    "glue": glue}


# --- the table ---------------------------------------------------------------------------

CONTROLLERS = ("dispatcher", "kueue", "appwrapper")


def report(row: str, results: dict[str, dict[str, Any]]) -> None:
    print(f"\n## {row}")
    columns = {
        "cheap": ("admitted/s", "CPU ms/item: controllers", "kube-apiserver", "requests/item"),
        "gangs": ("drain s", "jobs/s", "first Running s", "partial samples", "max partial",
                  "CPU s: controllers"),
        "fragmentation": ("drain s", "gangs admitted unrunnable", "GPU-s stuck Pending",
                          "GPU-s in partial gangs", "mean wait s"),
        "trace": ("mean wait s", "p95 wait s", "GPU util %", "wasted GPU-s", "drain s"),
        "glue": ("ran whole", "wait s", "GPU-s stuck Pending"),
    }[row]
    print("| system | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, r in results.items():
        print(f"| {name} | " + " | ".join(cells(row, r)) + " |")
    if row == "cheap":
        for name, r in results.items():
            top = Counter(r["served"]).most_common(8)
            print(f"{name} requests/item: " + ", ".join(
                f"{key} {n / r['items']:.2f}" for key, n in top if n >= r["items"] / 20))


def cells(row: str, r: dict[str, Any]) -> list[str]:
    n = r["items"]
    drain = (f"{r['drain_s']:.0f}" if r["done"] == n
             else f">{r['drain_s']:.0f} ({r['done']} of {n} done)")
    controllers = sum(v for k, v in r["cpu"].items() if k in CONTROLLERS)
    if row == "cheap":
        return [f"{n / r['admitted_s']:.1f}", f"{controllers * 1000 / n:.1f}",
                f"{r['cpu'].get('kube-apiserver', 0) * 1000 / n:.1f}",
                f"{sum(r['served'].values()) / n:.1f}"]
    if row == "gangs":
        return [drain, f"{n / r['drain_s']:.2f}", f"{r['first_running_s']:.0f}",
                f"{r['partial_samples']}/{r['samples']}", str(r["partial_max"]),
                f"{controllers:.0f}"]
    if row == "fragmentation":
        return [drain, str(r["stuck_gangs"]), f"{r['stuck_gpu_s']:.0f}",
                f"{r['partial_gpu_s']:.0f}", f"{r['wait_mean']:.0f}"]
    if row == "trace":
        capacity = r["capacity"] * r["drain_s"]
        return [f"{r['wait_mean']:.1f}", f"{r['wait_p95']:.1f}",
                f"{100 * r['running_gpu_s'] / capacity:.0f}", f"{r['partial_gpu_s']:.0f}", drain]
    return ["yes" if r["done"] == n else "no", f"{r['wait_mean']:.1f}",
            f"{r['stuck_gpu_s']:.0f}"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--systems", default=None,
                    help="only these systems (comma-separated), e.g. 'dispatcher,kueue'")
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--cheap", type=int, default=1000)
    ap.add_argument("--gangs", type=int, default=500)
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--trace-jobs", type=int, default=200)
    ap.add_argument("--trace-seconds", type=float, default=180)
    ap.add_argument("--trace-nodes", type=int, default=8)
    args = ap.parse_args()
    rows = args.rows.split(",")
    args.only = None if args.systems is None else set(args.systems.split(","))
    if unknown := set(rows) - set(ROWS):
        sys.exit(f"unknown rows {sorted(unknown)}; choose from {', '.join(ROWS)}")
    cluster, kubectl, api = bench_cluster(str(profile_file(args.nodes)))
    Kueue.install_crds(kubectl)  # before any run: a 1.4 MB schema is not a job's work
    env = Env(cluster, kubectl, api)
    results = {}
    try:
        for row in rows:
            results[row] = ROWS[row](env, args)
            if row == "trace":
                for r in results[row].values():
                    r["capacity"] = args.trace_nodes * 8
            report(row, results[row])
    finally:
        env.use_crd("dispatcher")
    print("\n# all rows")
    for row, r in results.items():
        report(row, r)


if __name__ == "__main__":
    main()
