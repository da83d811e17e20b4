"""A tenant who may create pods in its own namespace cannot shrink anyone's free room.

Alice (her own client certificate) has a small AppWrapper running and may create pods in
her namespace. She adds pods labelled for her wrapper, required onto each node, asking
1,000 GPUs each: they never bind. Another team's 8-GPU gang must still run, before and
after the dispatcher restarts (it rebuilds what it holds from what it lists).

Bob may only create pods in his namespace. He binds one to a node himself
(`spec.nodeName`), asking `example.com/foo: 8E` in each of two containers: more than 64
bits hold on that node. Another team's gang, which needs that node's GPUs, must still run.
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


def _beyond_64_bits(node: str) -> dict[str, Any]:
    """A pod bound by hand asking 16E of an extended resource: the API server takes it
    (nothing checks a pod bound by name against its node)."""
    c = container()
    asked = {"example.com/foo": "8E"}
    c["resources"] = {"requests": {**c["resources"]["requests"], **asked}, "limits": asked}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "beyond"},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "containers": [c, {**c, "name": "second"}]}}


def test_a_pod_bound_by_hand_beyond_64_bits_stops_nobodys_gang(
        local_cluster: Cluster, kubectl: Kubectl, namespace: str,
        as_user: Callable[[str], Kubectl], node_profile: Callable[[str], list[str]]) -> None:
    install_crd(kubectl)
    wait_quiet(kubectl)
    nodes = node_profile("pool")  # 2 x 8 GPUs
    users.grant(kubectl, "bob", namespace, ["pods"], verbs=["create"])
    bob = as_user("bob").in_namespace(namespace)
    assert bob.run("get", "pods", check=False).returncode != 0  # create, nothing else
    bob.create(_beyond_64_bits(nodes[0]))
    other = f"{namespace}-b"
    kubectl("create", "namespace", other)
    theirs = kubectl.in_namespace(other)
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs, "dispatcher-overflow")
    try:
        d.start("fifo")  # its first listing holds bob's pod
        both = job("both", pods=2)
        both["spec"]["template"]["spec"]["containers"] = [container(gpus=8)]
        theirs.apply(appwrapper("both", both))
        wait_for(lambda: _latest(theirs, "both") == "Running", 90,
                 f"the other team's gang of 2 x 8 GPUs to run (log: {d.log_path})")
        placed = {p["spec"].get("nodeName") for p in theirs.items("pods", "-l", f"{LABEL}=both")}
        assert placed == set(nodes)  # bob's node too: only its example.com/foo is full
        d.finish()
    finally:
        d.stop()
        kubectl("delete", "namespace", other, "--wait=false", "--ignore-not-found")
        theirs("delete", "pods", "--all", "--wait=false", "--ignore-not-found")
