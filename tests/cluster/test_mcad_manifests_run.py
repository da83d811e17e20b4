"""MCAD's own AppWrappers run here, end to end, with the real operators: every pod of
every manifest of the MCAD corpus that the dispatcher dispatches gets bound and starts.

The corpus (../shared/conformance/mcad-v1beta1) is other projects' files, read where it
lies. `dispatcher plan` already checks each manifest's decision offline
(tests/unit/test_mcad_conformance.py); this runs them: a decision that is right on paper
is worth nothing if the pods it pinned never start (MCAD's GLUE example declares pods
of another shape than its RayCluster makes, and once stopped at its own gang's hold).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.api.labels import APPWRAPPER_LABEL
from dispatcher.api.models import parse_appwrapper
from dispatcher.kinds.checks import pods_made
from localcluster import Cluster, Kubectl, wait_for
from localcluster import config as lc_config

from ..shared_files import MCAD_V1BETA1, require
from .dispatcher_process import DispatcherProcess, install_crd, wait_quiet
from .webhook_process import (
    free_port,
    register_pod_webhook,
    unregister_pod_webhook,
)

CORPUS = MCAD_V1BETA1
GLUE = "multi-cluster-app-dispatcher__doc__usage__examples__kuberay__config__aw-kuberay-glue.yaml"
PODS_NS = "dispatcher-glue-pod-webhook"  # the pod webhook's Secret

_ROUTE = ("wraps an OpenShift Route (route.openshift.io/v1), a kind a plain Kubernetes "
          "cluster does not serve")
_SELECTOR = ("its Deployment's template labels do not match its selector: the API server "
             "refuses such a Deployment with or without any dispatcher (MCAD's kuttl suite "
             "runs it patched, see tests/conformance)")
# Dispatching manifests that cannot run on this cluster: why, and the reason the
# dispatcher fails them with instead (checked: it says so, and nothing is left running).
EXCLUDED = {
    "codeflare-sdk__demo-notebooks__guided-demos__notebook-ex-outputs__jobtest.yaml":
        (_ROUTE, "ItemCreationFailure"),
    "codeflare-sdk__demo-notebooks__guided-demos__notebook-ex-outputs__raytest.yaml":
        (_ROUTE, "ItemCreationFailure"),
    "codeflare-sdk__src__codeflare_sdk__templates__base-template.yaml": (
        "a codeflare-sdk template the SDK fills in; as it stands its "
        "rayStartParams.num-gpus is a number, which KubeRay's CRD refuses (it wants a "
        "string)", "ItemCreationFailure"),
    "multi-cluster-app-dispatcher__test__e2e-kuttl-deployment-01__steps__01-install.yaml":
        (_SELECTOR, "ItemCreationFailure"),
    "multi-cluster-app-dispatcher__test__e2e-kuttl-deployment-02__steps__02-install.yaml":
        (_SELECTOR, "ItemCreationFailure"),
    "multi-cluster-app-dispatcher__test__e2e-kuttl-deployment-03__steps__02-install.yaml":
        (_SELECTOR, "ItemCreationFailure"),
}


def _rows() -> list[dict[str, str]]:
    table = CORPUS / "expected.tsv"
    if not table.is_file():
        return []
    with table.open(newline="") as f:
        return [r for r in csv.DictReader(f, delimiter="\t") if r["decision"] == "dispatch"]


ROWS = _rows()


def _need_corpus() -> None:
    require(CORPUS, "MCAD's AppWrapper manifests", "MCAD_V1BETA1")


def _profile_of_snapshot(tmp: Path) -> Path:
    """The corpus's cluster.yaml (four 8-GPU nodes, two CPU nodes) as a node profile."""
    snapshot = yaml.safe_load((CORPUS / "cluster.yaml").read_text())
    groups = [{"name": n["metadata"]["name"], "count": 1, "names": [n["metadata"]["name"]],
               "capacity": {**n["status"]["allocatable"], "ephemeral-storage": "1Ti"},
               "labels": n["metadata"].get("labels") or {}}
              for n in snapshot["items"]]
    path = tmp / "mcad-snapshot.yaml"
    path.write_text(yaml.safe_dump({"description": "MCAD corpus snapshot", "nodes": groups}))
    return path


@pytest.fixture(scope="module")
def snapshot_cluster(local_cluster: Cluster, kubectl: Kubectl,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[DispatcherProcess]:
    _need_corpus()
    install_crd(kubectl)
    wait_quiet(kubectl)
    local_cluster.use_profile(str(_profile_of_snapshot(tmp_path_factory.mktemp("mcad"))))
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs, "dispatcher-mcad-run")
    d.start("fifo")
    try:
        yield d
        d.finish()
    finally:
        d.stop()
        local_cluster.use_profile(lc_config.DEFAULT_PROFILE)


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _ensure_namespace(kubectl: Kubectl, name: str) -> None:
    if kubectl.run("get", "namespace", name, check=False).returncode != 0:
        kubectl("create", "namespace", name)
        wait_for(lambda: kubectl.run("get", "serviceaccount", "default", "-n", name,
                                     check=False).returncode == 0,
                 30, f"service account default in namespace {name}")


def _started(k: Kubectl, name: str) -> list[dict[str, Any]]:
    return [p for p in k.items("pods", "-l", f"{APPWRAPPER_LABEL}={name}")
            if p["spec"].get("nodeName")
            and (p.get("status") or {}).get("phase") in ("Running", "Succeeded")]


def _real_pods(path: Path) -> int:
    """How many pods the wrapped objects will create."""
    (aw,) = [d for d in _documents(path) if d.get("kind") == "AppWrapper"]
    return pods_made(parse_appwrapper(aw))[0]


def _latest(k: Kubectl, name: str) -> str:
    conditions = (k.json("appwrapper", name).get("status") or {}).get("conditions") or []
    return str(conditions[-1]["type"]) if conditions else ""


@pytest.mark.parametrize("row", ROWS, ids=[r["file"].removesuffix(".yaml") for r in ROWS])
def test_every_pod_of_each_dispatched_mcad_manifest_starts(
        snapshot_cluster: DispatcherProcess, kubectl: Kubectl, row: dict[str, str]) -> None:
    path = CORPUS / "manifests" / row["file"]
    _ensure_namespace(kubectl, row["namespace"])
    k = kubectl.in_namespace(row["namespace"])
    k("apply", "-f", str(path))
    try:
        if row["file"] in EXCLUDED:
            _, reason = EXCLUDED[row["file"]]
            wait_for(lambda: _latest(k, row["name"]) == "Failed", 60,
                     f"{row['name']} to fail ({EXCLUDED[row['file']][0]})")
            conditions = k.json("appwrapper", row["name"])["status"]["conditions"]
            assert conditions[-1]["reason"] == reason, conditions[-1]
            assert not _started(k, row["name"])
            return
        pods = _real_pods(path)
        seen: set[str] = set()

        def all_started() -> bool:
            seen.update(p["metadata"]["name"] for p in _started(k, row["name"]))
            return len(seen) >= pods

        wait_for(all_started, 180,
                 f"the {pods} pods of {row['namespace']}/{row['name']} to start "
                 f"(latest condition: {_latest(k, row['name'])}; "
                 f"log: {snapshot_cluster.log_path})")
    finally:
        k("delete", "-f", str(path), "--wait=false", "--ignore-not-found")
        wait_quiet(kubectl)


# --- the GLUE example, as the blog runs it ---------------------------------------------

def _glue(namespace: str, suffix: str = "") -> dict[str, Any]:
    """MCAD's GLUE AppWrapper as published; only its namespace and, for the second of
    the pair, its names changed."""
    (aw,) = _documents(CORPUS / "manifests" / GLUE)
    aw["metadata"]["namespace"] = namespace
    aw["metadata"]["name"] += suffix
    item = aw["spec"]["resources"]["GenericItems"][0]["generictemplate"]
    item["metadata"]["name"] += suffix
    return aw


# A GPU node whose CPUs the two declared pods (2 x 3 cpu) fill, and a CPU node: the
# worker (4 cpu, 1 GPU) fits only in its gang's hold taken as an amount.
GLUE_NODES = {"description": "one 2-GPU node of 6 cpu, one CPU node", "nodes": [
    {"name": "v100", "count": 1,
     "capacity": {"cpu": "6", "memory": "61Gi", "nvidia.com/gpu": "2",
                  "ephemeral-storage": "1Ti", "pods": "110"}},
    {"name": "cpu", "count": 1,
     "capacity": {"cpu": "8", "memory": "32Gi", "ephemeral-storage": "1Ti", "pods": "110"}},
]}


@pytest.mark.parametrize("path", ["gate", "pod-webhook"])
def test_the_glue_example_runs_as_published(
        local_cluster: Cluster, kubectl: Kubectl, k: Kubectl, namespace: str,
        node_profile: Any, tmp_path: Path, path: str) -> None:
    """The pair of GLUE AppWrappers as the blog applies them: the first runs (every pod
    bound), the second waits, and runs once the first is deleted."""
    _need_corpus()
    install_crd(kubectl)
    wait_quiet(kubectl)
    profile = tmp_path / "glue.yaml"
    profile.write_text(yaml.safe_dump(GLUE_NODES))
    node_profile(str(profile))
    args: list[str] = []
    if path == "pod-webhook":
        kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PODS_NS}})
        port = free_port()
        register_pod_webhook(kubectl, port)
        args = ["--webhook-port", str(port), "--webhook-host", "127.0.0.1",
                "--webhook-cert-host", "127.0.0.1", "--namespace", PODS_NS,
                "--webhook-configuration", ""]
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs / "glue", path)
    try:
        d.start("fifo", extra_args=args)
        k.apply(_glue(namespace))
        wait_for(lambda: len(_started(k, "raycluster-glue")) == 2, 120,
                 f"the head and the worker of raycluster-glue to run (log: {d.log_path})")
        wait_for(lambda: _latest(k, "raycluster-glue") == "Running", 60, "Running")
        if path == "pod-webhook":
            worker = [p for p in _started(k, "raycluster-glue")
                      if "worker" in p["metadata"]["name"]]
            assert worker and all(
                "dispatcher.codeflare.dev/pin-token" in p["metadata"].get("annotations", {})
                for p in worker), "the worker was not pinned as it was created"
        k.apply(_glue(namespace, "-2"))
        wait_for(lambda: _latest(k, "raycluster-glue-2") in ("Queueing", "Backoff"), 60,
                 "the second to wait")
        assert not k.items("pods", "-l", f"{APPWRAPPER_LABEL}=raycluster-glue-2")
        k("delete", "appwrapper", "raycluster-glue", "--wait=false")
        wait_for(lambda: len(_started(k, "raycluster-glue-2")) == 2, 120,
                 f"the second's head and worker to run (log: {d.log_path})")
        wait_for(lambda: _latest(k, "raycluster-glue-2") == "Running", 60, "Running")
        d.finish()
    finally:
        d.stop()
        if path == "pod-webhook":
            unregister_pod_webhook(kubectl)
            kubectl("delete", "namespace", PODS_NS, "--wait=false", "--ignore-not-found")
