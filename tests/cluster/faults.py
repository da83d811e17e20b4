"""Harness for fault tests on the local cluster: a workload of AppWrappers, and a sampler
that checks the invariants on the cluster itself (never on the dispatcher's memory).

Invariants, sampled every second while the workload runs:
- no partial gang: no AppWrapper has a pod Running while another of its pods waits
  unschedulable;
- never more promised than the cluster has: the GPUs of bound, unfinished pods plus the
  GPUs promised to dispatched gangs for their pods not bound yet never exceed the GPUs
  the nodes offer (the cluster-side view of "bound + reserved ≤ allocatable");
- no duplicate object: never two Jobs for one AppWrapper at once;
and at the end:
- no lost wrapper: every AppWrapper exists and is Completed;
- nothing ran twice: every AppWrapper's Job ran exactly its pods, once (a Job torn down
  and created again after it had run would show more succeeded pods).
"""

from __future__ import annotations

import calendar
import json
import re
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from localcluster.testing import container, outcome

LABEL = "workload.codeflare.dev/appwrapper"
# Seconds a pod may wait at the placement gate before it counts as left out: the
# dispatcher lets it go in the cycle after it appears when the API answers, but the
# faults here delay that (the API away for 20 s, requests hung for 15 s and retried).
GATED_GRACE = 60.0
GPU = "nvidia.com/gpu"
PROMISING = ("Dispatched", "HeadOfLine")  # latest conditions of a gang not running yet


def appwrapper(name: str, pods: int, run_for: str, retries: int = 0) -> dict[str, Any]:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"parallelism": pods, "completions": pods, "backoffLimit": retries,
                    "template": {"metadata": {"annotations": outcome("succeed", run_for)},
                                 "spec": {"restartPolicy": "Never",
                                          "containers": [container(gpus=1)]}}}}
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name},
            "spec": {"resources": {"GenericItems": [{"generictemplate": job}]}}}


def create_workload(api: Any, namespace: str, count: int, pods: int, run_for: str,
                    prefix: str = "w", retries: int = 0) -> list[str]:
    """POST `count` AppWrappers, 16 at a time (kubectl apply of a thousand objects takes
    minutes: it diffs and annotates each one)."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    names = [f"{prefix}{i:04d}" for i in range(count)]

    def create(name: str) -> None:
        for attempt in range(5):
            try:
                custom.create_namespaced_custom_object(
                    "workload.codeflare.dev", "v1beta1", namespace, "appwrappers",
                    appwrapper(name, pods, run_for, retries))
                return
            except client.ApiException as e:
                if e.status == 409:
                    return
                if attempt == 4:
                    raise
                time.sleep(1)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, names))
    return names


def _get(api: Any, path: str) -> dict[str, Any]:
    """A consistent (current) list. Not resourceVersion=0: each resource's watch cache
    may lag on its own (a busy or just restarted API server), and a pods list older than
    the AppWrappers list counts a gang's GPUs twice — once as the finished pods of the
    gang before it, once as its own promise."""
    params = api.param_serialize("GET", path, query_params=[],
                                 header_params={"Accept": "application/json"},
                                 auth_settings=["BearerToken"])
    response = api.call_api(*params, _request_timeout=20)
    response.read()
    data: dict[str, Any] = json.loads(response.data)
    if response.status >= 400:
        # An API server starting again answers 500 or 503 for a while, with a Status.
        raise RuntimeError(f"GET {path}: {response.status} {data.get('message', data)}")
    return data


def _gpus(pod: dict[str, Any]) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        total += int((res.get("requests") or res.get("limits") or {}).get(GPU, 0)
                     or (res.get("limits") or {}).get(GPU, 0))
    return total


@dataclass
class Report:
    samples: int = 0
    skipped: int = 0  # the API server did not answer (it may be the fault)
    partial: list[str] = field(default_factory=list)
    overpromised: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    max_promised: int = 0
    succeeded: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))

    def violations(self) -> list[str]:
        return [*self.partial[:5], *self.overpromised[:5], *self.duplicates[:5]]


class Sampler:
    """Samples namespace `namespace` every `interval` seconds in a thread."""

    def __init__(self, api: Any, namespace: str, pods_per_gang: int,
                 interval: float = 1.0) -> None:
        self.api = api
        self.ns = namespace
        self.pods_per_gang = pods_per_gang
        self.interval = interval
        self.report = Report()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample()
            except Exception:  # the API server may be down: that is the test
                self.report.skipped += 1
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    def sample(self) -> None:
        # AppWrappers before pods: a gang dispatched after the first listing is not
        # counted as promised, and one whose pods bound after it counts them as bound —
        # never both, so a sample never counts one GPU twice.
        aws = _get(self.api, "/apis/workload.codeflare.dev/v1beta1/namespaces/"
                   f"{self.ns}/appwrappers")["items"]
        nodes = _get(self.api, "/api/v1/nodes")["items"]
        all_pods = _get(self.api, "/api/v1/pods")["items"]
        pods = [p for p in all_pods if p["metadata"].get("namespace") == self.ns]
        jobs = _get(self.api, f"/apis/batch/v1/namespaces/{self.ns}/jobs")["items"]
        r = self.report
        r.samples += 1
        capacity = sum(int((n.get("status") or {}).get("allocatable", {}).get(GPU, 0))
                       for n in nodes
                       if not (n.get("spec") or {}).get("unschedulable"))
        # A pod bound to a node that is gone (until the pod garbage collector deletes
        # it) holds nothing the remaining nodes offer.
        names = {n["metadata"]["name"] for n in nodes}
        bound_gpus = sum(_gpus(p) for p in all_pods
                         if (p.get("spec") or {}).get("nodeName") in names
                         and (p.get("status") or {}).get("phase") not in ("Succeeded",
                                                                         "Failed"))
        by_aw: dict[str, Counter[str]] = defaultdict(Counter)
        for p in pods:
            aw = ((p.get("metadata") or {}).get("labels") or {}).get(LABEL)
            if not aw:
                continue
            phase = (p.get("status") or {}).get("phase", "Pending")
            conditions = (p.get("status") or {}).get("conditions") or []
            if any(c.get("reason") == "Unschedulable" for c in conditions):
                phase = "Unschedulable"
            elif any(c.get("reason") == "SchedulingGated" for c in conditions) \
                    and _age(p) > GATED_GRACE:
                # Held at the dispatcher's gate longer than it takes to be let go: as
                # good as unschedulable (a gang running with a pod held back is partial).
                phase = "Unschedulable"
            elif (p.get("spec") or {}).get("nodeName") and phase == "Pending":
                phase = "BoundPending"
            if (p.get("metadata") or {}).get("deletionTimestamp"):
                phase = "Terminating"
            by_aw[aw][phase] += 1
            if phase == "Succeeded":
                r.succeeded[aw].add(p["metadata"]["name"])
        stamp = time.strftime("%H:%M:%S")
        for aw, c in by_aw.items():
            if c["Running"] and c["Unschedulable"]:
                r.partial.append(f"{stamp} {aw}: {dict(c)}")
        promised = 0
        for aw in aws:
            status = aw.get("status") or {}
            latest = (status.get("conditions") or [{}])[-1].get("type")
            if latest in PROMISING:
                c = by_aw.get(aw["metadata"]["name"], Counter())
                have = c["Running"] + c["BoundPending"] + c["Succeeded"] + c["Failed"]
                promised += max(0, self.pods_per_gang - have)
        r.max_promised = max(r.max_promised, promised + bound_gpus)
        if promised + bound_gpus > capacity:
            r.overpromised.append(f"{stamp}: {bound_gpus} GPUs bound + {promised} promised "
                                  f"> {capacity} allocatable")
        per_aw = Counter(((j.get("metadata") or {}).get("labels") or {}).get(LABEL)
                         for j in jobs if not (j.get("metadata") or {}).get("deletionTimestamp"))
        for aw, n in per_aw.items():
            if aw and n > 1:
                r.duplicates.append(f"{stamp} {aw}: {n} Jobs at once")


def final_check(api: Any, namespace: str, names: list[str], report: Report,
                pods_per_gang: int) -> list[str]:
    """What is wrong at the end: lost or unfinished wrappers, work that ran twice."""
    problems: list[str] = []
    aws = {a["metadata"]["name"]: a for a in _get(
        api, f"/apis/workload.codeflare.dev/v1beta1/namespaces/{namespace}/appwrappers")
        ["items"]}
    missing = [n for n in names if n not in aws]
    if missing:
        problems.append(f"{len(missing)} AppWrappers lost: {missing[:5]}")
    states = Counter((aws[n].get("status") or {}).get("state", "") for n in names if n in aws)
    if states.get("Completed", 0) != len(names) - len(missing):
        problems.append(f"not all Completed: {dict(states)}")
    twice = {aw: len(p) for aw, p in report.succeeded.items() if len(p) > pods_per_gang}
    if twice:
        problems.append(f"{len(twice)} AppWrappers ran more pods than their gang: "
                        f"{dict(list(twice.items())[:5])}")
    jobs = Counter(((j.get("metadata") or {}).get("labels") or {}).get(LABEL)
                   for j in _get(api, f"/apis/batch/v1/namespaces/{namespace}/jobs")["items"])
    extra = {aw: n for aw, n in jobs.items() if n > 1}
    if extra:
        problems.append(f"AppWrappers with more than one Job: {dict(list(extra.items())[:5])}")
    return problems


def completed(api: Any, namespace: str) -> int:
    """How many AppWrappers completed; -1 while the API server does not answer (the
    outage test stops it)."""
    try:
        aws = _get(api, "/apis/workload.codeflare.dev/v1beta1/namespaces/"
                   f"{namespace}/appwrappers")
    except Exception:
        return -1
    return sum(1 for a in aws["items"] if (a.get("status") or {}).get("state") == "Completed")


def states(api: Any, namespace: str) -> Counter[str]:
    """How many AppWrappers are in each state ("" for none yet); empty while the API
    server does not answer."""
    try:
        aws = _get(api, "/apis/workload.codeflare.dev/v1beta1/namespaces/"
                   f"{namespace}/appwrappers")
    except Exception:
        return Counter()
    return Counter((a.get("status") or {}).get("state", "") for a in aws["items"])


def in_flight(api: Any, namespace: str) -> Counter[str] | None:
    """The AppWrappers' states once work is in flight — some completed (the dispatcher
    has seen gangs through, its pod watch delivering), some running, some still queued —
    the moment a fault must land on; None before."""
    now = states(api, namespace)
    queued = now[""] + now["Pending"]
    return now if now["Completed"] and now["Running"] and queued else None


def histories(api: Any, namespace: str, problems: list[str]) -> list[str]:
    """The condition history of every AppWrapper a problem names: what to read when a
    fault test fails (the namespace is deleted after the test)."""
    named = sorted(set(re.findall(r"\b(w\d{4})\b", " ".join(problems))))[:10]
    lines = []
    for name in named:
        try:
            aw = _get(api, f"/apis/workload.codeflare.dev/v1beta1/namespaces/{namespace}/"
                      f"appwrappers/{name}")
        except Exception as e:  # the history is a help, never the failure
            lines.append(f"{name}: {e}")
            continue
        for c in (aw.get("status") or {}).get("conditions") or []:
            lines.append(f"{name}: {c.get('lastTransitionMicroTime', '')[11:23]} "
                         f"{c['type']} {c.get('reason', '')}: {c.get('message', '')[:160]}")
    return lines


def _age(pod: dict[str, Any]) -> float:
    stamp = (pod.get("metadata") or {}).get("creationTimestamp")
    if not stamp:
        return 0.0
    return time.time() - calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
