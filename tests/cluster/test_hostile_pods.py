"""A tenant who may create pods in its own namespace cannot shrink anyone's free room.

Alice (her own client certificate) has a small AppWrapper running and may create pods in
her namespace. She adds pods labelled for her wrapper, required onto each node, asking
1,000 GPUs each: they never bind. Another team's 8-GPU gang must still run, before and
after the dispatcher restarts (it rebuilds what it holds from what it lists).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localcluster import Cluster, Kubectl, users, wait_for
from localcluster.testing import container

from .dispatcher_process import DispatcherProcess, install_crd, wait_quiet
from .test_tenancy import APPWRAPPERS, LABEL, appwrapper, job


def _squatter(name: str, owner: str, node: str) -> dict[str, Any]:
    c = container(gpus=1000)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {LABEL: owner}},
            "spec": {"containers": [c], "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In",
                                      "values": [node]}]}]}}}}}


def _latest(k: Kubectl, name: str) -> str:
    conditions = (k.json("appwrapper", name).get("status") or {}).get("conditions") or []
    return str(conditions[-1]["type"]) if conditions else ""


def test_pods_a_tenant_labels_for_its_wrapper_take_no_room_from_another_team(
        local_cluster: Cluster, kubectl: Kubectl, namespace: str,
        as_user: Callable[[str], Kubectl], node_profile: Callable[[str], list[str]]) -> None:
    install_crd(kubectl)
    wait_quiet(kubectl)
    nodes = node_profile("pool")  # 2 x 8 GPUs
    users.grant(kubectl, "alice", namespace, [APPWRAPPERS, "jobs.batch", "pods"])
    alice = as_user("alice").in_namespace(namespace)
    other = f"{namespace}-b"
    kubectl("create", "namespace", other)
    theirs = kubectl.in_namespace(other)
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs, "dispatcher-squat")
    try:
        d.start("fifo")
        alice.apply(appwrapper("mine", job("mine")))
        wait_for(lambda: _latest(alice, "mine") == "Running", 90, "alice's wrapper to run")
        for i, node in enumerate(nodes):
            alice.apply(_squatter(f"squat-{i}", "mine", node))
        d.kill()  # the rebuild after a restart is what read such pods
        d.start("fifo")
        eight = job("eight")
        eight["spec"]["template"]["spec"]["containers"] = [container(gpus=8)]
        theirs.apply(appwrapper("eight", eight))
        wait_for(lambda: _latest(theirs, "eight") == "Running", 90,
                 f"the other team's 8-GPU gang to run (log: {d.log_path})")
        assert all(not p["spec"].get("nodeName")
                   for p in alice.items("pods", "-l", f"{LABEL}=mine")
                   if p["metadata"]["name"].startswith("squat-"))
        d.finish()
    finally:
        d.stop()
        kubectl("delete", "namespace", other, "--wait=false", "--ignore-not-found")
        theirs("delete", "pods", "--all", "--wait=false", "--ignore-not-found")
