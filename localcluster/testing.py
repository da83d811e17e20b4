"""Helpers for tests that run against the local cluster (see tests/cluster/conftest.py).

Pod outcomes on the fake nodes are chosen per pod with an annotation or a label
(localcluster/stages/pods.yaml): ``outcome(...)`` builds the keys, to put in a pod's (or a pod
template's) ``metadata.annotations`` or ``metadata.labels``, e.g.
``metadata.annotations = outcome("fail", run_for="2s")``; ``set_outcome(...)`` changes the
outcome of pods that already exist (e.g. release ``pending`` pods, or make running ones fail).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from .kube import Kubectl, wait_for

OUTCOME = "dispatcher.local/outcome"
RUN_FOR = "dispatcher.local/run-for"
START_AFTER = "dispatcher.local/start-after"
EXIT_CODE = "dispatcher.local/exit-code"
OUTCOMES = ("run", "succeed", "fail", "crashloop", "pending", "image-pull-backoff")
GPU = "nvidia.com/gpu"


def outcome(kind: str = "run", run_for: str | None = None, start_after: str | None = None,
            exit_code: int | None = None) -> dict[str, str]:
    """Pod annotations (or labels: the values are valid label values too) that make kwok
    drive a pod to ``kind``; ``run_for``/``start_after`` are Go durations such as ``"2s"``."""
    if kind not in OUTCOMES:
        raise ValueError(f"unknown outcome {kind!r}; one of {OUTCOMES}")
    ann = {OUTCOME: kind}
    if run_for is not None:
        ann[RUN_FOR] = run_for
    if start_after is not None:
        ann[START_AFTER] = start_after
    if exit_code is not None:
        ann[EXIT_CODE] = str(exit_code)
    return ann


def set_outcome(kubectl: Kubectl, kind: str, selector: str | None = None,
                names: Sequence[str] = (), run_for: str | None = None,
                exit_code: int | None = None) -> None:
    """Change the outcome of existing pods: those named ``names``, else those matching the
    label ``selector``.

    kwok reacts to the update: ``pending`` pods annotated ``run``/``succeed``/``fail`` start,
    running pods annotated ``succeed``/``fail`` finish after ``run_for`` (default 1s).
    """
    if not selector and not names:
        raise ValueError("set_outcome needs a label selector or pod names")
    ann = outcome(kind, run_for=run_for, exit_code=exit_code)
    target = list(names) if names else ["-l", str(selector)]
    kubectl("annotate", "pods", *target, "--overwrite", *(f"{k}={v}" for k, v in ann.items()))


def container(name: str = "main", image: str = "busybox:1.36", gpus: int = 0,
              cpu: str = "100m", memory: str = "128Mi") -> dict[str, Any]:
    """A container spec with requests (and a GPU limit, which is what GPU pods set)."""
    req: dict[str, str] = {"cpu": cpu, "memory": memory}
    c: dict[str, Any] = {"name": name, "image": image, "resources": {"requests": req}}
    if gpus:
        req[GPU] = str(gpus)
        c["resources"]["limits"] = {GPU: str(gpus)}
    return c


def pod(name: str, gpus: int = 0, annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
        "spec": {"containers": [container(gpus=gpus)], "restartPolicy": "Never", **spec},
    }


def pods(kubectl: Kubectl, selector: str | None = None) -> list[dict[str, Any]]:
    args = ["pods"] + (["-l", selector] if selector else [])
    return kubectl.items(*args)


def phase(p: dict[str, Any]) -> str:
    return str(p.get("status", {}).get("phase", ""))


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for c in obj.get("status", {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return None


def wait_pods(kubectl: Kubectl, selector: str | None, count: int,
              predicate: Callable[[dict[str, Any]], bool] = lambda p: phase(p) == "Running",
              timeout: float = 60, what: str = "Running") -> list[dict[str, Any]]:
    """Wait until exactly ``count`` pods match ``selector`` and all satisfy ``predicate``."""
    def check() -> list[dict[str, Any]] | None:
        got = pods(kubectl, selector)
        if len(got) == count and all(predicate(p) for p in got):
            return got
        return None

    try:
        return wait_for(check, timeout, f"{count} pods ({selector or 'all'}) {what}")
    except TimeoutError as exc:
        summary = [(p["metadata"]["name"], phase(p), p["spec"].get("nodeName"))
                   for p in pods(kubectl, selector)]
        raise TimeoutError(f"{exc}; pods now: {summary}") from None


def wait_phase(kubectl: Kubectl, name: str, want: str, timeout: float = 180) -> dict[str, Any]:
    # A pod on nodes just made (a profile applied) may wait a minute for kwok on a loaded
    # machine (seen: 60 s were not enough beside five other control planes).
    def check() -> dict[str, Any] | None:
        p: dict[str, Any] = kubectl.json("pod", name)
        return p if phase(p) == want else None

    try:
        return wait_for(check, timeout, f"pod {name} phase {want}")
    except TimeoutError as exc:
        p = kubectl.json("pod", name)
        raise TimeoutError(f"{exc}; now {phase(p)} on {p['spec'].get('nodeName')}, "
                           f"conditions {p.get('status', {}).get('conditions')}") from None


def events(kubectl: Kubectl, involved: str | None = None,
           reason: str | None = None) -> list[dict[str, Any]]:
    selectors = []
    if involved:
        selectors.append(f"involvedObject.name={involved}")
    if reason:
        selectors.append(f"reason={reason}")
    args = ["events"] + (["--field-selector", ",".join(selectors)] if selectors else [])
    return kubectl.items(*args)


def fake_gpu_nodes(kubectl: Kubectl) -> dict[str, int]:
    """Name -> allocatable nvidia.com/gpu of the Ready fake nodes that have GPUs."""
    out = {}
    for n in kubectl.items("nodes", "-l", "type=kwok"):
        gpus = int(n.get("status", {}).get("allocatable", {}).get(GPU, "0"))
        ready = (condition(n, "Ready") or {}).get("status") == "True"
        if gpus and ready:
            out[n["metadata"]["name"]] = gpus
    return out


FILE_FIELDS = {"certificate-authority": "certificate-authority-data",
               "client-certificate": "client-certificate-data",
               "client-key": "client-key-data"}


def self_contained(kubeconfig: Path) -> bytes:
    """`kubeconfig` with the files it names put inside it (the `-data` fields), as a
    WorkerCluster's Secret must hold it: the manager reads no file of its own for it."""
    doc = yaml.safe_load(kubeconfig.read_text())
    for entry in [*(doc.get("clusters") or []), *(doc.get("users") or [])]:
        body = entry.get("cluster") or entry.get("user") or {}
        for field, data in FILE_FIELDS.items():
            if field in body:
                path = Path(body.pop(field)).expanduser()
                if not path.is_absolute():
                    path = kubeconfig.parent / path
                body[data] = base64.b64encode(path.read_bytes()).decode()
    return yaml.safe_dump(doc).encode()


def register_workers(manager: Kubectl, workers: dict[str, Path], crd: Path,
                     namespace: str = "fleet") -> None:
    """Make `manager`'s cluster a manager of `workers` (name -> kubeconfig): the
    WorkerCluster CRD, a kubeconfig Secret per worker in `namespace`, and a WorkerCluster
    per worker, labelled site=<name>."""
    manager("apply", "--server-side", "-f", str(crd))
    manager("wait", "--for=condition=Established", "--timeout=60s",
            "crd/workerclusters.workload.codeflare.dev")
    manager.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for w, kubeconfig in workers.items():
        manager.in_namespace(namespace).apply({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"{w}-kubeconfig"},
            "data": {"kubeconfig": base64.b64encode(self_contained(kubeconfig)).decode()}})
        manager.apply({"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "WorkerCluster",
                       "metadata": {"name": w, "labels": {"site": w}},
                       "spec": {"kubeconfigSecret": {"name": f"{w}-kubeconfig",
                                                     "namespace": namespace}}})
