"""End to end on the local control plane: N AppWrappers x M one-GPU pods onto fake nodes.

Two runs in one process, same cluster, same objects, one after the other (the first one's
objects removed before the second starts):
1. directly: N batch Jobs of M one-GPU pods created without the dispatcher (the API
   server's and the scheduler's own pace: the ceiling);
2. through the dispatcher: N AppWrappers, each wrapping one of those Jobs.
With `--modes` one more run, *floor*, measures what the API server alone must do for an
AppWrapper, on top of the direct run: the bench posts the AppWrappers and, from the same
threads and with nothing decided or held back, sends what any controller that keeps MCAD's
conditions must send — Queueing for a job that cannot start in the first cluster-full,
Dispatched before the Job, the Job, then Running and Completed as the pods go (the
dispatcher also lifts gates, reads the Job and posts Events: none of that is in the floor).
Pods succeed after --run-for, so the queue drains in waves (N x M GPUs do not fit at
once). Prints time to drain, jobs dispatched (or created) per second, and the partial
gangs seen by sampling pods every second: a job with some pods Running while others
wait unschedulable — what gang dispatch exists to prevent.

Mode *webhook* runs the dispatcher with its pod webhook (deploy/components/pod-webhook,
registered with a loopback URL): each pod of a gang is created already let onto its node,
instead of at its gate lifted by a PATCH (the default dispatcher run).

Modes *kueue* and *kueue-wfpr* run the same Jobs through Kueue v0.17.0 (built by
`python -m localcluster build kueue`; localcluster/kueue.py starts it): created suspended
with the label of a LocalQueue whose ClusterQueue holds the whole cluster's resources; Kueue
admits by quota and kube-scheduler places the pods. *kueue-wfpr* adds WaitForPodsReady as
Kueue's docs set it up for all-or-nothing (timeout 5 min, blockAdmission, requeued by
eviction time).

With --mixed SEED the gangs fragment the nodes (1, 2, 4 or 8 pods of 1, 2, 4 or 8 GPUs,
drawn with SEED), and the dispatcher's run also measures the decide-vs-bind gap: pods that
kube-scheduler bound on another node than the dispatcher planned (the nodes its Dispatched
condition names), and gangs with a pod left unschedulable after dispatch — a promise the
cluster did not keep.

Usage: python bench/e2e.py [--wrappers 500] [--pods 4] [--nodes 64] [--run-for 10s]
       [--mixed SEED] [--dispatcher-args '--kube-qps 100']
       [--modes direct,floor,dispatcher,unpinned,webhook,kueue,kueue-wfpr]
(starts the local cluster with a profile of --nodes 8-GPU nodes; leaves it running.)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from localcluster import Cluster, Kubectl, wait_for  # noqa: E402
from localcluster.kueue import QUEUE_LABEL, Kueue, queue  # noqa: E402
from localcluster.testing import container, outcome  # noqa: E402

LABEL = "workload.codeflare.dev/appwrapper"
BENCH_LABEL = "bench.dispatcher/job"
# Runs through the dispatcher, and what each adds to `dispatcher run`.
WEBHOOK_PORT = 18443  # `dispatcher run`'s pod webhook (mode "webhook"), on loopback
DISPATCHER_MODES = {
    "dispatcher": "", "unpinned": "--no-pin-pods",
    # Pods pinned as they are created (deploy/components/pod-webhook), not by a PATCH.
    "webhook": f"--webhook-port {WEBHOOK_PORT} --webhook-host 127.0.0.1 --webhook-cert-host "
               "127.0.0.1 --namespace default --webhook-secret dispatcher-bench-pods-cert "
               "--webhook-configuration=",
}
POD_WEBHOOK = REPO / "deploy" / "components" / "pod-webhook" / "webhook.yaml"
# Runs through Kueue (v0.17.0, localcluster/kueue.py), and what each adds to its
# Configuration: its defaults; or WaitForPodsReady as its docs configure it for gangs (a job
# whose pods are not all Ready within the timeout is evicted and requeued, and no other is
# admitted meanwhile).
KUEUE_MODES: dict[str, dict[str, Any]] = {
    "kueue": {},
    "kueue-wfpr": {"waitForPodsReady": {
        "timeout": "5m", "blockAdmission": True,
        "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 10}}},
}
GPU = "nvidia.com/gpu"
METRICS_PORT = 18089  # the dispatcher's /metrics, on loopback
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller", "kwok",
              "kueue")


def cpu_seconds(dispatcher_pid: int | None = None,
                named: dict[str, int] | None = None) -> Counter[str]:
    """CPU seconds used so far by each control-plane component (by process name), the
    dispatcher, the processes `named` (name -> pid), and this bench with the kubectl it ran."""
    by_pid = {**(named or {}), **({"dispatcher": dispatcher_pid} if dispatcher_pid else {})}
    names = {pid: name for name, pid in by_pid.items()}
    tick = os.sysconf("SC_CLK_TCK")
    used: Counter[str] = Counter()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text[text.rindex(")") + 2:].split()
        seconds = (int(fields[11]) + int(fields[12])) / tick
        pid = int(stat.parent.name)
        if pid in names:
            used[names[pid]] += seconds
        elif pid == os.getpid():
            used["bench"] += seconds
        else:
            for c in COMPONENTS:
                if comm.startswith(c):
                    used[c] += seconds
    t = os.times()
    used["bench"] += t.children_user + t.children_system
    return used


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


def queued(job: dict[str, Any], local_queue: str) -> dict[str, Any]:
    """The Job for Kueue: suspended, with its LocalQueue's label (what Kueue's Job webhook,
    not registered here, would make of it)."""
    job["metadata"]["labels"][QUEUE_LABEL] = local_queue
    job["spec"]["suspend"] = True
    return job


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


Kept = tuple[str, str, int, bool, str]  # what pod_view keeps of a pod (_kept)


class View:
    """The bench's objects of one kind in a namespace, as a watch keeps them (in a thread):
    what a sampler reads every second. Listing 2,000 pods with kubectl every second cost the
    bench more CPU than the dispatcher, and the API server a list each time, on a machine
    both runs share. `keep` is what it keeps of each object; `when`, if given, records the
    first time (monotonic) an object's name met it."""

    def __init__(self, lister: Callable[..., Any], namespace: str,
                 keep: Callable[[dict[str, Any]], Any],
                 when: Callable[[dict[str, Any]], bool] | None = None) -> None:
        self.lister = lister
        self.namespace = namespace
        self.keep = keep
        self.when = when
        self.items: dict[str, Any] = {}
        self.first: dict[str, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                listing = json.loads(self.lister(
                    self.namespace, label_selector=BENCH_LABEL, _preload_content=False).data)
                with self.lock:
                    self.items = {}
                    for obj in listing["items"]:
                        self._put(obj)
                stream = self.lister(
                    self.namespace, label_selector=BENCH_LABEL, watch=True,
                    resource_version=listing["metadata"]["resourceVersion"],
                    timeout_seconds=600, _preload_content=False)
                for line in stream:
                    if self.stop.is_set():
                        break
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        break  # too old: list again
                    with self.lock:
                        if event["type"] == "DELETED":
                            self.items.pop(event["object"]["metadata"]["name"], None)
                        else:
                            self._put(event["object"])
            except Exception:
                if not self.stop.is_set():
                    time.sleep(1.0)

    def _put(self, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        self.items[name] = self.keep(obj)
        if self.when is not None and name not in self.first and self.when(obj):
            self.first[name] = time.monotonic()

    def snapshot(self) -> list[Any]:
        with self.lock:
            return list(self.items.values())


def pod_view(api: Any, namespace: str) -> View:
    from kubernetes import client

    return View(client.CoreV1Api(api).list_namespaced_pod, namespace, _kept)


def _kept(p: dict[str, Any]) -> Kept:
    """(job, phase, GPUs, unschedulable, name) of a pod."""
    requested = p["spec"]["containers"][0].get("resources", {}).get("limits", {})
    return (p["metadata"]["labels"][BENCH_LABEL], p["status"].get("phase", "Pending"),
            int(requested.get(GPU, 0)),
            any(c.get("reason") == "Unschedulable" for c in p["status"].get("conditions") or []),
            p["metadata"]["name"])


def sample(view: View, pods: dict[str, int], unschedulable_pods: dict[str, set[str]],
           gpus: Counter[str]) -> tuple[int, set[str], set[str]]:
    """(partial gangs now, jobs with all pods done, jobs seen); pods seen unschedulable
    are added to `unschedulable_pods` by job, and the GPUs of pods Running and Pending
    (bound or not) to `gpus`."""
    by_job: dict[str, Counter[str]] = {}
    for j, phase, requested, unschedulable, name in view.snapshot():
        if phase in ("Running", "Pending"):
            gpus[phase] += requested
        by_job.setdefault(j, Counter())["unschedulable" if unschedulable else phase] += 1
        if unschedulable:
            unschedulable_pods.setdefault(j, set()).add(name)
    partial = sum(1 for c in by_job.values() if c["Running"] and c["unschedulable"])
    done = {j for j, c in by_job.items() if c["Succeeded"] >= pods[j]}
    return partial, done, set(by_job)


def off_plan(k: Kubectl) -> tuple[int, int]:
    """(pods bound on a node the dispatcher did not plan for their gang, pods checked):
    the planned nodes are those the Dispatched condition names (gangs on at most 5)."""
    planned: dict[str, set[str]] = {}
    for aw in k.items("appwrappers"):
        for c in (aw.get("status") or {}).get("conditions") or []:
            m = re.search(r"(?:pods fit|pod fits): on (.*)$", c.get("message", ""))
            if c.get("type") == "Dispatched" and m and " more" not in m.group(1):
                planned[aw["metadata"]["name"]] = set(m.group(1).split(", "))
    off = checked = 0
    for p in k.items("pods", "-l", BENCH_LABEL):
        nodes = planned.get(p["metadata"]["labels"][BENCH_LABEL])
        if nodes and p["spec"].get("nodeName"):
            checked += 1
            off += p["spec"]["nodeName"] not in nodes
    return off, checked


def _at(stamp: str | None) -> float | None:
    if not stamp:
        return None
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def stages(k: Kubectl) -> dict[str, list[float]]:
    """Where a gang's time goes, through the dispatcher: seconds from each step to the
    next, one value per job (the API's timestamps: AppWrapper conditions to the
    microsecond, the rest to the second), and GPU-seconds held (Dispatched to Completed)
    against run (pods' start to finish)."""
    out: dict[str, list[float]] = {}
    by_job: dict[str, list[dict[str, Any]]] = {}
    for p in k.items("pods", "-l", BENCH_LABEL):
        by_job.setdefault(p["metadata"]["labels"][BENCH_LABEL], []).append(p)
    jobs = {j["metadata"]["name"]: j for j in k.items("jobs", "-l", BENCH_LABEL)}
    for aw in k.items("appwrappers"):
        name = aw["metadata"]["name"]
        cond = {c["type"]: _at(c.get("lastTransitionMicroTime"))
                for c in (aw.get("status") or {}).get("conditions") or []}
        pods, job_ = by_job.get(name, []), jobs.get(name)
        if not pods or job_ is None or cond.get("Dispatched") is None:
            continue
        created = [_at(p["metadata"]["creationTimestamp"]) or 0.0 for p in pods]
        scheduled = [_at(c.get("lastTransitionTime")) or 0.0 for p in pods
                     for c in p["status"].get("conditions") or [] if c["type"] == "PodScheduled"]
        # The pod's startTime, not its container's: kwok writes a finished container's
        # startedAt as the time it finished.
        ran = [(_at(p["status"].get("startTime")) or 0.0, _at(t.get("finishedAt")) or 0.0)
               for p in pods for cs in p["status"].get("containerStatuses") or []
               if (t := (cs.get("state") or {}).get("terminated"))]
        gpus = sum(int(p["spec"]["containers"][0]["resources"]["limits"].get(GPU, 0))
                   for p in pods) / len(pods)
        steps = {
            "created -> Dispatched": cond["Dispatched"] - (cond.get("Init") or cond["Dispatched"]),
            "Dispatched -> Job created": (_at(job_["metadata"]["creationTimestamp"]) or 0.0)
            - cond["Dispatched"],
            "Job created -> last pod created": max(created)
            - (_at(job_["metadata"]["creationTimestamp"]) or 0.0),
            "last pod created -> last scheduled": max(scheduled or [0.0]) - max(created),
            "last scheduled -> last started": max(s for s, _ in ran) - max(scheduled or [0.0])
            if ran else 0.0,
            "last finished -> Completed": (cond.get("Completed") or 0.0)
            - max(f for _, f in ran) if ran else 0.0,
        }
        for step, v in steps.items():
            out.setdefault(step, []).append(v)
        if cond.get("Completed") is not None:
            out.setdefault("held GPU-s", []).append(
                (cond["Completed"] - cond["Dispatched"]) * gpus * len(pods))
        out.setdefault("run GPU-s", []).append(sum(f - s for s, f in ran) * gpus)
    return out


def requests_served(k: Kubectl) -> Counter[str]:
    """Requests the API server has served so far, by verb and resource (its own
    counter), watches and the leases' heartbeats left out."""
    served: Counter[str] = Counter()
    for line in k("get", "--raw", "/metrics", timeout=60).splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if labels.get("verb") in ("WATCH", "CONNECT") or labels.get("resource") == "leases":
            continue
        sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
        served[f"{labels.get('verb')} {labels.get('resource')}{sub}"] += int(
            float(line.rsplit(" ", 1)[1]))
    return served


def job_queue(pid: int | None) -> Counter[str]:
    """kube-controller-manager's (`pid`) Job controller so far (its own workqueue
    metrics): syncs, and seconds they waited in its queue before a worker took them, and
    worked."""
    out: Counter[str] = Counter()
    if pid is None:
        return out
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        port = next(a.split("=", 1)[1] for a in argv if a.startswith("--secure-port="))
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        text = urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=30,
                                      context=ctx).read().decode()
    except (OSError, StopIteration):
        return out  # not this cluster's layout: nothing to say
    for what, key in (("queue_duration", "waited"), ("work_duration", "worked")):
        for stat, value in re.findall(
                rf'^workqueue_{what}_seconds_(sum|count){{name="job"}} (\S+)$', text, re.M):
            if stat == "sum":
                out[key] = float(value)
            elif what == "queue_duration":
                out["syncs"] = float(value)
    return out


def dispatcher_counter(name: str, label: str) -> Counter[str]:
    """One of the dispatcher's counters so far, by its one label (its /metrics)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics",
                                  timeout=30).read().decode()
    return Counter({value: int(float(n)) for value, n in re.findall(
        rf'^dispatcher_{name}_total\{{{label}="(\w+)"\}} (\S+)$', text, re.M)})


def conditions(*types: str) -> list[dict[str, Any]]:
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return [{"type": t, "status": "True", "reason": "Bench", "message": "",
             "lastTransitionMicroTime": stamp, "lastUpdateMicroTime": stamp} for t in types]


class Floor:
    """The floor run's controller, with nothing to decide: each AppWrapper posted, then its
    conditions written as a dispatcher must (one merge PATCH each) and its Job created at
    once; Running and Completed written when `follow` sees all of a job's pods there."""

    def __init__(self, api: Any, ns: str, shapes_: dict[str, tuple[int, int]],
                 gpus: int, run_for: str) -> None:
        from kubernetes import client

        self.custom, self.batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
        self.group = ("workload.codeflare.dev", "v1beta1", ns, "appwrappers")
        self.ns, self.shapes, self.run_for = ns, shapes_, run_for
        # Jobs past the first cluster-full of GPUs wait, so they must say Queueing first.
        self.waits: set[str] = set()
        held = 0
        for name, (pods, per_pod) in shapes_.items():
            held += pods * per_pod
            if held > gpus:
                self.waits.add(name)
        # The conditions written (or being written) per job: only `create` and `follow`
        # change it, so a late PATCH cannot take a job's chain back.
        self.chain: dict[str, tuple[str, ...]] = {}
        self.pool = ThreadPoolExecutor(16)
        self.writes: list[Future[None]] = []

    def _status(self, name: str, state: str, *types: str) -> None:
        self.custom.patch_namespaced_custom_object_status(*self.group, name, {"status": {
            "state": state, "conditions": conditions(*types)}})

    def finish(self) -> int:
        """Wait for the Running and Completed writes still under way; how many failed."""
        self.pool.shutdown(wait=True)
        return sum(1 for f in self.writes if f.exception() is not None)

    def create(self, aw: dict[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        name = aw["metadata"]["name"]
        try:
            self.custom.create_namespaced_custom_object(*self.group, aw)
        except ApiException as e:  # posted by an earlier attempt
            if e.status != 409:
                raise
        first = ("Init", "Queueing")
        if name in self.waits:
            self._status(name, "Pending", *first)
        dispatched = (*first, "HeadOfLine", "Dispatched")
        self._status(name, "Running", *dispatched)
        self.chain[name] = dispatched
        pods, per_pod = self.shapes[name]
        try:
            self.batch.create_namespaced_job(self.ns, job(name, pods, self.run_for, per_pod))
        except ApiException as e:
            if e.status != 409:
                raise

    def follow(self, snapshot: list[Kept]) -> None:
        phases: dict[str, Counter[str]] = {}
        for j, phase, *_ in snapshot:
            phases.setdefault(j, Counter())[phase] += 1
        for j, c in phases.items():
            chain = self.chain.get(j, ())
            pods = self.shapes[j][0]
            if chain and "Running" not in chain and c["Running"] + c["Succeeded"] >= pods:
                self.chain[j] = (*chain, "Running")
                self.writes.append(
                    self.pool.submit(self._status, j, "Running", *chain, "Running"))
            elif "Running" in chain and "Completed" not in chain and c["Succeeded"] >= pods:
                self.chain[j] = (*chain, "Completed")
                self.writes.append(
                    self.pool.submit(self._status, j, "Completed", *chain, "Completed"))


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


def run(k: Kubectl, api: Any, objects: list[dict[str, Any]],
        create: Callable[[dict[str, Any]], Any], names: list[str], pods: dict[str, int],
        what: str, dispatcher_pid: int | None = None,
        follow: Callable[[list[Kept]], None] | None = None,
        controller_pid: int | None = None) -> dict[str, float]:
    """Post the objects (in a thread) while sampling the pods every second, until every
    job's pods have succeeded."""
    view = pod_view(api, k.namespace or "default")
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
    gpus: Counter[str] = Counter()
    cpu0 = cpu_seconds(dispatcher_pid)
    served0 = requests_served(k)
    jobs0 = job_queue(controller_pid)
    while len(done) < len(names):
        partial, finished, seen = sample(view, pods, unschedulable, gpus)
        if follow is not None:
            follow(view.snapshot())
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
    view.stop.set()
    cpu = cpu_seconds(dispatcher_pid)
    cpu.subtract(cpu0)
    served = requests_served(k)
    served.subtract(served0)
    jobs = job_queue(controller_pid)
    jobs.subtract(jobs0)
    if jobs["syncs"]:
        print(f"  Job controller ({what}): {jobs['syncs']:.0f} syncs, waited in its queue "
              f"{jobs['waited'] / jobs['syncs']:.2f} s on average, worked "
              f"{jobs['worked'] / jobs['syncs']:.3f} s")
    print(f"  API requests served per job ({what}): " + ", ".join(
        f"{key} {n / len(names):.2f}" for key, n in served.most_common() if n >= len(names) / 10))
    if dispatcher_pid is not None:
        print("  status PATCHes per job, by what made them: " + ", ".join(
            f"{kind} {n / len(names):.2f}" for kind, n in
            dispatcher_counter("status_writes", "kind").items()))
        print("  pods pinned per job, by how: " + ", ".join(
            f"{how} {n / len(names):.2f}" for how, n in
            dispatcher_counter("pods_pinned", "how").items()))
    poster.join()
    applied = posted[0] if posted else drain
    starts = sorted(first_seen.values())
    through = what in DISPATCHER_MODES
    off, checked = off_plan(k) if through else (0, 0)
    if through:
        steps = stages(k)
        for step, values in steps.items():
            if step.endswith("GPU-s"):
                print(f"  {step}: {sum(values):,.0f}")
            else:
                values.sort()
                print(f"  {step}: median {values[len(values) // 2]:.2f} s, "
                      f"p90 {values[int(len(values) * 0.9)]:.2f} s")
    return {"drain_s": drain, "apply_s": applied, "jobs_per_s": len(names) / drain,
            "first_pods_s": starts[0], "last_pods_s": starts[-1],
            "partial_samples": partial_samples, "samples": samples,
            "partial_max": partial_max, "unschedulable_jobs": len(unschedulable),
            "unschedulable_pods": sum(len(v) for v in unschedulable.values()),
            "off_plan": off, "checked": checked,
            "running_gpus": gpus["Running"] / samples, "pending_gpus": gpus["Pending"] / samples,
            **{f"cpu {c}": v for c, v in cpu.items()}}


def register_pod_webhook(kubectl: Kubectl) -> None:
    """deploy/components/pod-webhook's configuration, calling the dispatcher on loopback
    (the local cluster has no Service network)."""
    (doc,) = [d for d in yaml.safe_load_all(POD_WEBHOOK.read_text())
              if d and d["kind"] == "MutatingWebhookConfiguration"]
    for hook in doc["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"https://127.0.0.1:{WEBHOOK_PORT}{path}"}
    kubectl("delete", "mutatingwebhookconfiguration", "dispatcher-pods", "--ignore-not-found")
    kubectl.create(doc)


def start_dispatcher(cluster: Cluster, name: str, extra: str) -> subprocess.Popen[bytes]:
    """`dispatcher run` on the local cluster (log: `name`.log), returned once it has
    listed the cluster and decides: its start-up is not what a bench times."""
    path = cluster.logs / f"{name}.log"
    with path.open("ab") as f:
        f.write(b"\n===== start =====\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispatcher.cli", "run", "--kubeconfig",
         str(cluster.kubeconfig), "--metrics-host", "127.0.0.1",
         "--metrics-port", str(METRICS_PORT), *extra.split()],
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
    ap.add_argument("--modes", default="direct,dispatcher",
                    help="which runs, e.g. 'dispatcher' alone (no ratio then), or "
                    "'direct,floor,dispatcher,unpinned,webhook' (unpinned: --no-pin-pods; "
                    "webhook: pods pinned as they are created, by the pod webhook)")
    args = ap.parse_args()
    from kubernetes import client

    cluster, kubectl, api = bench_cluster(str(profile_file(args.nodes)))
    if set(args.modes.split(",")) & set(KUEUE_MODES):
        # Its CRDs first: the API server's work on them (a 1.4 MB schema) is not a job's.
        Kueue.install_crds(kubectl)
    custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
    names = [f"job-{i:04d}" for i in range(args.wrappers)]
    drawn = dict(zip(names, shapes(args.wrappers, args.pods, args.mixed), strict=True))
    pods = {n: shape[0] for n, shape in drawn.items()}
    results: dict[str, dict[str, float]] = {}

    for mode in args.modes.split(","):
        # A new namespace each run: one deleted and made again costs the API server a
        # live GET of it at every create for a while (0.67 GETs a job were seen).
        ns = f"bench-{mode}-{int(time.time())}"
        kubectl("create", "namespace", ns)
        k = kubectl.in_namespace(ns)
        wait_for(lambda k=k: k.run("get", "sa", "default", check=False).returncode == 0,
                 30, "default service account")
        proc = floor = peer = None
        create: Callable[[dict[str, Any]], Any]
        if mode == "floor":
            floor = Floor(api, ns, drawn, args.nodes * 8, args.run_for)
            objects = [appwrapper(n, drawn[n][0], args.run_for, drawn[n][1]) for n in names]
            create = floor.create
        elif mode in DISPATCHER_MODES:
            if mode == "webhook":
                register_pod_webhook(kubectl)
            proc = start_dispatcher(cluster, "dispatcher-bench",
                                    f"{args.dispatcher_args} {DISPATCHER_MODES[mode]}")
            if mode == "webhook":
                wait_for(lambda: kubectl.json("mutatingwebhookconfiguration",
                                              "dispatcher-pods")["webhooks"][0][
                    "clientConfig"].get("caBundle"), 60, "the pod webhook's CA patched in")
            objects = [appwrapper(n, drawn[n][0], args.run_for, drawn[n][1]) for n in names]
            create = partial(custom.create_namespaced_custom_object,
                             "workload.codeflare.dev", "v1beta1", ns, "appwrappers")
        elif mode in KUEUE_MODES:
            peer = Kueue(cluster, KUEUE_MODES[mode])
            peer.start()
            # Its ClusterQueue holds the whole cluster: admitted by quota, placed by the
            # scheduler (as its docs set it up for one team).
            queue(kubectl, ns, {"cpu": str(args.nodes * 96), "memory": f"{args.nodes}Ti",
                                GPU: str(args.nodes * 8)}, name=ns)
            objects = [queued(job(n, drawn[n][0], args.run_for, drawn[n][1]), ns)
                       for n in names]
            create = partial(batch.create_namespaced_job, ns)
        else:
            objects = [job(n, drawn[n][0], args.run_for, drawn[n][1]) for n in names]
            create = partial(batch.create_namespaced_job, ns)
        try:
            results[mode] = run(k, api, objects, create, names, pods, mode,
                                None if proc is None else proc.pid,
                                None if floor is None else floor.follow,
                                cluster.component_pids().get("kube-controller-manager"))
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
            kubectl("delete", "mutatingwebhookconfiguration", "dispatcher-pods",
                    "--ignore-not-found")
            if floor is not None and (failed := floor.finish()):
                print(f"  floor: {failed} status writes failed")
        # Each run starts on a cluster with nothing else to do: removing the last run's
        # 2,000 pods would load the API server, etcd and the watchers of the next.
        try:
            kubectl("delete", "namespace", ns, "--wait=true", timeout=600)
        finally:
            if peer is not None:  # after its namespace: its Workloads' finalizers are its own
                peer.stop()

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
    print("mean GPUs of pods Running / Pending while draining: " + ", ".join(
        f"{mode} {r['running_gpus']:.0f} / {r['pending_gpus']:.0f}"
        for mode, r in results.items()))
    for mode, r in results.items():
        cpu = {key[4:]: v for key, v in r.items() if key.startswith("cpu ")}
        print(f"CPU seconds while draining, {mode}: {sum(cpu.values()):.0f} of "
              f"{(os.cpu_count() or 1) * r['drain_s']:.0f} core-seconds (" + ", ".join(
                  f"{c} {v:.0f}" for c, v in sorted(cpu.items(), key=lambda kv: -kv[1])) + ")")
    if "floor" in results and "direct" in results:
        print(f"floor / direct throughput = "
              f"{results['floor']['jobs_per_s'] / results['direct']['jobs_per_s']:.2f} "
              f"(what the API server's work for AppWrappers alone leaves)")
    for mode in (m for m in results if m in DISPATCHER_MODES):
        r = results[mode]
        if "direct" in results:
            ratio = r["jobs_per_s"] / results["direct"]["jobs_per_s"]
            print(f"{mode} / direct throughput = {ratio:.2f} (aim: >= 0.9)")
        if "floor" in results:
            print(f"{mode} / floor throughput = "
                  f"{r['jobs_per_s'] / results['floor']['jobs_per_s']:.2f}")
        print(f"decide-vs-bind, {mode}: {int(r['off_plan'])} of "
              f"{int(r['checked'])} pods bound off the planned nodes; "
              f"{int(r['unschedulable_jobs'])} gangs ({int(r['unschedulable_pods'])} pods) "
              f"seen with a pod unschedulable after dispatch")

if __name__ == "__main__":
    main()
