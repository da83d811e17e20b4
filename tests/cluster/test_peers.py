"""Kueue (v0.17.0, built from its published module) beside the dispatcher on the local
cluster: one gang each way, and the case the comparison is about. Kueue admits by quota; a
gang whose pods fit no node is admitted all the same and its pods wait Pending, holding the
quota, where the dispatcher keeps the whole gang queued and says why. bench/peers.py measures
the same at size; this keeps its peer honest in every run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from localcluster import Cluster, Kubectl, wait_for
from localcluster.kueue import QUEUE_LABEL, Kueue, queue
from localcluster.testing import condition

from .dispatcher_process import DispatcherProcess, install_crd, wait_quiet
from .test_controller import appwrapper, job, latest, wait_condition

QUEUE = "peers"


@pytest.fixture(scope="module")
def kueue(local_cluster: Cluster) -> Iterator[Kueue]:
    k = Kueue(local_cluster)
    k.start()
    yield k
    k.stop()


@pytest.fixture
def dispatcher(local_cluster: Cluster, kubectl: Kubectl) -> Iterator[DispatcherProcess]:
    install_crd(kubectl)
    wait_quiet(kubectl)
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs / "peers")
    d.start("fifo")
    yield d
    d.stop()


def queued_job(name: str, pods: int, gpus: int, run: str = "run") -> dict[str, Any]:
    """A Job for Kueue: created suspended with its LocalQueue's label (what Kueue's Job
    webhook would make of it)."""
    j = job(name, pods, gpus, run)
    j["metadata"]["labels"] = {QUEUE_LABEL: QUEUE}
    j["spec"]["suspend"] = True
    return j


def workload_admitted(k: Kubectl, job_name: str) -> dict[str, Any] | None:
    for w in k.items("workloads.kueue.x-k8s.io"):
        owners = w["metadata"].get("ownerReferences") or []
        if any(o.get("name") == job_name for o in owners):
            admitted = condition(w, "Admitted")
            return w if admitted and admitted.get("status") == "True" else None
    return None


def pods_of_job(k: Kubectl, name: str) -> list[dict[str, Any]]:
    return k.items("pods", "-l", f"batch.kubernetes.io/job-name={name}")


def test_one_gang_runs_whole_through_kueue_and_through_the_dispatcher(
        kueue: Kueue, dispatcher: DispatcherProcess, kubectl: Kubectl, k: Kubectl,
        namespace: str) -> None:
    queue(kubectl, namespace, {"cpu": "256", "memory": "2Ti", "nvidia.com/gpu": "32"},
          name=QUEUE)
    k.apply(queued_job("via-kueue", 2, 8, run="succeed"))
    wait_for(lambda: workload_admitted(k, "via-kueue"), 120, "Kueue to admit via-kueue")

    def complete(name: str) -> bool:
        return (condition(k.json("job", name), "Complete") or {}).get("status") == "True"

    wait_for(lambda: complete("via-kueue"), 120, "Job via-kueue to complete")
    assert len(pods_of_job(k, "via-kueue")) == 2

    k.apply(appwrapper("via-dispatcher", job("via-dispatcher", 2, 8, "succeed")))
    wait_condition(k, "via-dispatcher", "Completed", timeout=120)
    assert complete("via-dispatcher")


def test_on_scattered_gpus_kueue_admits_a_gang_no_node_can_hold_the_dispatcher_keeps_it(
        kueue: Kueue, dispatcher: DispatcherProcess, node_profile: Callable[[str], list[str]],
        kubectl: Kubectl, k: Kubectl, namespace: str) -> None:
    node_profile("fragmented")  # 4 nodes of 4 GPUs: 16 free, none takes an 8-GPU pod
    queue(kubectl, namespace, {"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": "16"},
          name=QUEUE)
    k.apply(queued_job("via-kueue", 2, 8))
    admitted = wait_for(lambda: workload_admitted(k, "via-kueue"), 120,
                        "Kueue to admit via-kueue by quota")
    assert admitted["status"]["admission"]["clusterQueue"] == QUEUE

    def unschedulable() -> bool:
        got = pods_of_job(k, "via-kueue")
        return len(got) == 2 and all(
            (condition(p, "PodScheduled") or {}).get("reason") == "Unschedulable" for p in got)

    wait_for(unschedulable, 120, "via-kueue's 2 pods to be Pending, no node fitting them")

    # It holds the whole quota: a pod that would fit a node waits behind it.
    k.apply(queued_job("small-kueue", 1, 4))
    wait_for(lambda: any(
        (condition(w, "QuotaReserved") or {}).get("status") == "False"
        for w in k.items("workloads.kueue.x-k8s.io")
        if any(o.get("name") == "small-kueue" for o in w["metadata"].get("ownerReferences") or [])),
        120, "Kueue to keep small-kueue waiting for quota")
    assert workload_admitted(k, "small-kueue") is None

    k.apply(appwrapper("via-dispatcher", job("via-dispatcher", 2, 8)))
    aw = wait_condition(k, "via-dispatcher", "Backoff", timeout=120)
    assert latest(aw)["message"] == (
        "NeverFits: would not fit even on an empty cluster: 16 nvidia.com/gpu free in total, "
        "but at most 4 nvidia.com/gpu on any node; a pod needs 8 nvidia.com/gpu")
    assert not pods_of_job(k, "via-dispatcher")
    assert k.run("get", "job", "via-dispatcher", check=False).returncode != 0  # not made
    # What fits a node runs beside it.
    k.apply(appwrapper("small-dispatcher", job("small-dispatcher", 1, 4)))
    wait_condition(k, "small-dispatcher", "Running", timeout=120)
