"""Elastic gangs on a real control plane: an elastic PyTorchJob is admitted at its minimum,
grows when another wrapper completes, shrinks when a high-priority one arrives, and never
goes below its minimum -- the training operator creating and deleting the pods.

Default profile, 4 nodes x 8 GPUs; every pod takes a whole node.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from localcluster import Cluster, Kubectl, wait_for
from localcluster.testing import container, events, set_outcome

from .dispatcher_process import DispatcherProcess, install_crd, wait_quiet
from .test_controller import (
    LABEL,
    appwrapper,
    aw_of,
    job,
    latest,
    raycluster,
    running_pods,
    stays,
)


@pytest.fixture(scope="module")
def dispatcher(local_cluster: Cluster, kubectl: Kubectl) -> Iterator[DispatcherProcess]:
    install_crd(kubectl)
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs)
    d.start("priority")
    wait_quiet(kubectl)
    yield d
    d.stop()


def elastic_pytorchjob(name: str, low: int, high: int) -> dict[str, Any]:
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"elasticPolicy": {"minReplicas": low, "maxReplicas": high},
                     "pytorchReplicaSpecs": {"Worker": {
                         "replicas": high, "restartPolicy": "OnFailure",
                         "template": {"spec": {"containers": [
                             container(name="pytorch", gpus=8)]}}}}}}


def workers(k: Kubectl, name: str) -> int:
    replicas: int = k.json("pytorchjob", name)["spec"]["pytorchReplicaSpecs"]["Worker"][
        "replicas"]
    return replicas


def wait_workers(k: Kubectl, aw: str, job_name: str, count: int, timeout: float = 90) -> None:
    """The object asks for `count` workers and exactly that many pods of it are Running."""
    wait_for(lambda: workers(k, job_name) == count, timeout,
             f"PyTorchJob {job_name} to be patched to {count} workers")
    running_pods(k, aw, count, timeout)


def grows_then_shrinks(k: Kubectl) -> None:
    """An elastic PyTorchJob of 2 to 4 workers is admitted at 2 beside a blocker, grows to
    4 when the blocker completes and gives one worker (the highest index) to a wrapper of
    higher priority: the object's replicas and its Running pods follow each step."""
    k.apply(appwrapper("blocker", job("blocker", 2, 8)))
    running_pods(k, "blocker", 2)

    # Admitted at its minimum: 2 workers on the 2 free nodes, though it asks for up to 4.
    k.apply(appwrapper("elastic", elastic_pytorchjob("train", 2, 4)))
    wait_workers(k, "elastic", "train", 2)
    aw = aw_of(k, "elastic")
    assert aw["status"]["elasticPods"] == [2]
    dispatched = next(c for c in aw["status"]["conditions"] if c["type"] == "Dispatched")
    assert "admitted at its minimum, 2 workers" in dispatched["message"]

    # The blocker completes: its 2 nodes are the elastic gang's to grow into.
    set_outcome(k, "succeed", selector=f"{LABEL}=blocker")
    wait_workers(k, "elastic", "train", 4)
    aw = aw_of(k, "elastic")
    assert aw["status"]["elasticPods"] == [4]
    assert latest(aw)["reason"] == "ScaledOut"
    # (in one step or two, as the blocker's pods finish)
    assert latest(aw)["message"].startswith("scaled out to 4 workers (from ")
    assert any(e.get("reason") == "ScaledOut" for e in events(k, "elastic"))
    assert aw["status"]["state"] == "Running"

    # A high-priority wrapper needs one node: one worker goes (the highest index), not
    # the whole gang.
    k.apply(appwrapper("urgent", job("urgent", 1, 8), priority=10))
    running_pods(k, "urgent", 1, timeout=90)
    wait_workers(k, "elastic", "train", 3)
    names = sorted(p["metadata"]["name"] for p in k.items("pods", "-l", f"{LABEL}=elastic"))
    assert names == ["train-worker-0", "train-worker-1", "train-worker-2"]
    aw = aw_of(k, "elastic")
    assert aw["status"]["elasticPods"] == [3]
    assert latest(aw)["reason"] == "ScaledIn"
    assert "scaled in to 3 workers (from 4 workers) to make room for" in latest(aw)["message"]


def test_elastic_pytorchjob_grows_when_room_frees_and_shrinks_for_priority(
        dispatcher: DispatcherProcess, k: Kubectl) -> None:
    grows_then_shrinks(k)

    # Another needs 2 nodes: shrinking to the minimum frees only one. The gang keeps its
    # 3 workers (never below 2, never shrunk for nothing) and stays Running; that one waits.
    k.apply(appwrapper("urgent-pair", job("urgent-pair", 2, 8), priority=10))
    wait_for(lambda: latest(aw_of(k, "urgent-pair")).get("type") == "Backoff", 60,
             "urgent-pair to wait")
    stays(lambda: workers(k, "train") == 3 and aw_of(k, "elastic")["status"]["state"]
          == "Running", 10, "the elastic gang keeps 3 workers and runs")


def elastic_raycluster(name: str, low: int, high: int) -> dict[str, Any]:
    """A RayCluster whose 8-GPU worker group may run with `low` to `high` replicas."""
    rc = raycluster(name, high, 8)
    rc["spec"]["workerGroupSpecs"][0]["minReplicas"] = low
    return rc


def ray_workers(k: Kubectl, aw: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in k.items("pods", "-l", f"{LABEL}={aw}")
                  if "worker" in p["metadata"]["name"]
                  and not p["metadata"].get("deletionTimestamp"))


def test_elastic_raycluster_is_told_which_workers_to_remove(
        dispatcher: DispatcherProcess, k: Kubectl) -> None:
    k.apply(appwrapper("blocker", job("blocker", 3, 8)))
    running_pods(k, "blocker", 3)
    k.apply(appwrapper("ray", elastic_raycluster("ray", 1, 3)))
    running_pods(k, "ray", 2)  # the head and 1 worker: its minimum, on the free node
    assert aw_of(k, "ray")["status"]["elasticPods"] == [1]
    assert k.json("raycluster", "ray")["spec"]["workerGroupSpecs"][0]["replicas"] == 1

    set_outcome(k, "succeed", selector=f"{LABEL}=blocker")
    running_pods(k, "ray", 4, timeout=90)  # grown to 3 workers
    wait_for(lambda: aw_of(k, "ray")["status"]["elasticPods"] == [3], 30, "3 workers recorded")

    before = ray_workers(k, "ray")
    # Ray's 3 workers take 3 nodes (the head, without GPUs, shares one): `urgent` needs 2.
    k.apply(appwrapper("urgent", job("urgent", 2, 8), priority=10))
    running_pods(k, "urgent", 2, timeout=90)
    group = k.json("raycluster", "ray")["spec"]["workerGroupSpecs"][0]
    assert group["replicas"] == 2
    # The worker the core planned to take (the last by name: Ray's have no index) is the
    # one KubeRay removed, not a random one: it was named in workersToDelete.
    wait_for(lambda: len(ray_workers(k, "ray")) == 2, 60, "2 Ray workers")
    assert ray_workers(k, "ray") == before[:-1]
    assert latest(aw_of(k, "ray"))["reason"] == "ScaledIn"
