"""Teams sharing the GPUs on the local control plane: preemption of whole gangs (the MCAD
blog's second requirement) and quota trees with borrowing and reclaim, through the
dispatcher process with the priority-preemption policy; default profile, 4 nodes x 8 GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from localcluster import Cluster, Kubectl, wait_for
from localcluster.testing import container, outcome

from .dispatcher_process import QUOTA_CRD, DispatcherProcess, install_crd, wait_quiet
from .test_controller import (
    LABEL,
    appwrapper,
    aw_of,
    job,
    latest,
    pods_of,
    raycluster,
    running_pods,
    wait_condition,
)


@pytest.fixture(scope="module")
def preempting(local_cluster: Cluster, kubectl: Kubectl) -> Iterator[DispatcherProcess]:
    install_crd(kubectl)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(QUOTA_CRD))
    kubectl("wait", "--for=condition=Established", "--timeout=60s",
            "crd/quotasubtrees.quota.codeflare.dev")
    wait_quiet(kubectl)
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs, "dispatcher-sharing")
    d.start("priority-preemption")
    yield d
    d.finish()


def pytorchjob(name: str, gpus: int, run_for: str) -> dict[str, Any]:
    def replica() -> dict[str, Any]:
        return {"replicas": 1, "restartPolicy": "Never", "template": {
            "metadata": {"annotations": outcome("succeed", run_for)},
            "spec": {"containers": [container(name="pytorch", gpus=gpus)]}}}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {"Master": replica(), "Worker": replica()}}}


def conditions(k: Kubectl, name: str) -> list[dict[str, Any]]:
    return list(aw_of(k, name).get("status", {}).get("conditions") or [])


def test_a_high_priority_pytorchjob_preempts_a_low_priority_raycluster_whole(
        preempting: DispatcherProcess, k: Kubectl) -> None:
    k.apply(appwrapper("ray", raycluster("ray", workers=4, gpus=8), priority=1))
    running_pods(k, "ray", 5, timeout=120)  # head + 4 workers: every GPU of the cluster
    wait_condition(k, "ray", "Running")
    k.apply(appwrapper("train", pytorchjob("train", 8, "25s"), priority=10))
    # The RayCluster goes whole: torn down, requeued with Preempted, naming the preemptor.
    wait_for(lambda: any(c["type"] == "PreemptCandidate" and c.get("reason") == "Preempted"
                         for c in conditions(k, "ray")), 60, "the RayCluster to be preempted")
    preempted = next(c for c in conditions(k, "ray") if c.get("reason") == "Preempted")
    assert f"preempted by {k.namespace}/train" in preempted["message"]
    wait_for(lambda: not k.items("rayclusters"), 60, "the RayCluster to be deleted")
    wait_condition(k, "train", "Running", timeout=120)
    assert len(pods_of(k, "train")) == 2
    assert latest(aw_of(k, "ray"))["type"] in ("Queueing", "Backoff")
    assert not pods_of(k, "ray")  # never a part of the gang left behind
    # The PyTorchJob succeeds; the RayCluster comes back and runs again, whole.
    wait_condition(k, "train", "Completed", timeout=180)
    running_pods(k, "ray", 5, timeout=180)
    wait_condition(k, "ray", "Running")
    assert aw_of(k, "ray")["status"].get("numberOfRequeueings", 0) == 0


def subtree(name: str, children: list[dict[str, Any]], parent: str | None = None
            ) -> dict[str, Any]:
    spec: dict[str, Any] = {"children": children}
    if parent:
        spec["parent"] = parent
    return {"apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
            "metadata": {"name": name, "labels": {"tree": "quota_gpu"}}, "spec": spec}


def test_a_team_borrows_idle_quota_and_gives_it_back_when_the_owner_needs_it(
        preempting: DispatcherProcess, k: Kubectl) -> None:
    k.apply(subtree("gpus", [{"name": "all", "quotas": {"requests": {"nvidia.com/gpu": 32}}}]))
    k.apply(subtree("teams", [
        {"name": "gold", "quotas": {"requests": {"nvidia.com/gpu": 16}}},
        {"name": "bronze", "quotas": {"requests": {"nvidia.com/gpu": 16}}}], parent="all"))
    try:
        borrower = appwrapper("bronze-big", job("bronze-big", 4, 8), priority=50)
        borrower["metadata"]["labels"] = {"quota_gpu": "bronze"}
        k.apply(borrower)  # 32 GPUs: 16 of its own, 16 borrowed from gold's idle share
        wait_condition(k, "bronze-big", "Running", timeout=120)
        owner = appwrapper("gold-job", job("gold-job", 2, 8), priority=1)
        owner["metadata"]["labels"] = {"quota_gpu": "gold"}
        k.apply(owner)
        # Within its quota, gold reclaims what bronze borrows, whatever their priorities.
        wait_for(lambda: any(c.get("reason") == "Preempted" for c in conditions(
            k, "bronze-big")), 60, "the borrower to be preempted")
        reclaimed = next(c for c in conditions(k, "bronze-big")
                         if c.get("reason") == "Preempted")
        assert "to reclaim the quota it borrows" in reclaimed["message"]
        wait_condition(k, "gold-job", "Running", timeout=120)
        assert len(k.items("pods", "-l", f"{LABEL}=gold-job")) == 2
        # bronze alone needs more than its quota now: it waits, saying so.
        wait_for(lambda: "QuotaExceeded" in aw_of(k, "bronze-big")["status"].get(
            "message", "") or latest(aw_of(k, "bronze-big"))["type"] == "Backoff", 60,
            "the borrower to wait for quota")
    finally:
        k("delete", "quotasubtrees", "--all", "--wait=false")
