"""The local cluster does what the dispatcher's tests and demo rely on.

Workloads of every wrapped family get their pods scheduled onto fake GPU nodes and
Running; a pod that no node can hold stays Pending with the scheduler's reason; pods can
be made to succeed, fail, crash or never start.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from localcluster import Cluster, Kubectl, wait_for
from localcluster.cluster import JOB_SYNCS, READY_FILE
from localcluster.testing import (
    GPU,
    condition,
    container,
    events,
    fake_gpu_nodes,
    outcome,
    phase,
    pod,
    pods,
    set_outcome,
    wait_phase,
    wait_pods,
)

from .test_controller import stays

pytestmark = pytest.mark.cluster

OPERATORS = ("kuberay-operator", "training-operator", "mxjob-operator", "jobset-controller",
             "lws-controller")


def _gpu_template(labels: dict[str, str], gpus: int, name: str = "main",
                  annotations: dict[str, str] | None = None,
                  restart: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container(name=name, gpus=gpus)]}
    if restart:
        spec["restartPolicy"] = restart
    return {"metadata": {"labels": labels, "annotations": annotations or {}}, "spec": spec}


def _assert_on_gpu_nodes(kubectl: Kubectl, got: list[dict[str, Any]]) -> None:
    gpu_nodes = fake_gpu_nodes(kubectl)
    for p in got:
        node = p["spec"].get("nodeName")
        assert node in gpu_nodes, f"{p['metadata']['name']} on {node}, not a fake GPU node"
        assert phase(p) == "Running", p["status"]
        assert (condition(p, "Ready") or {}).get("status") == "True", p["status"]


def test_default_profile_has_ready_gpu_nodes(kubectl: Kubectl) -> None:
    nodes = fake_gpu_nodes(kubectl)
    assert len(nodes) == 4
    assert set(nodes.values()) == {8}


def test_control_plane_components(local_cluster: Cluster, kubectl: Kubectl) -> None:
    assert kubectl("get", "--raw=/readyz").strip() == "ok"
    # RBAC is on: an unprivileged service account may not list nodes.
    out = kubectl("auth", "can-i", "list", "nodes",
                  "--as=system:serviceaccount:default:default", check=False)
    assert out.strip() == "no"
    st = local_cluster.status()
    assert st["apiserver_ready"], st
    assert st["processes"] == {p: True for p in (
        "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
        "kwok-controller", *OPERATORS)}, st


def test_upstream_crds_installed(kubectl: Kubectl) -> None:
    kinds = set(kubectl("api-resources", "-o", "name").split())
    for crd in ("rayclusters.ray.io", "rayjobs.ray.io", "rayservices.ray.io",
                "tfjobs.kubeflow.org", "pytorchjobs.kubeflow.org", "xgboostjobs.kubeflow.org",
                "jaxjobs.kubeflow.org", "paddlejobs.kubeflow.org", "mpijobs.kubeflow.org",
                "mxjobs.kubeflow.org", "jobsets.jobset.x-k8s.io",
                "leaderworkersets.leaderworkerset.x-k8s.io"):
        assert crd in kinds, f"CRD {crd} not served"


def test_deployment_pods_run_on_gpu_nodes(k: Kubectl, kubectl: Kubectl) -> None:
    labels = {"app": "deploy"}
    k.apply({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "deploy"},
        "spec": {"replicas": 3, "selector": {"matchLabels": labels},
                 "template": _gpu_template(labels, gpus=2)},
    })
    got = wait_pods(k, "app=deploy", 3)
    _assert_on_gpu_nodes(kubectl, got)
    wait_for(lambda: k.json("deployment", "deploy")["status"].get("availableReplicas") == 3,
             60, "deployment available")


def test_batch_job_pods_run_then_complete(k: Kubectl, kubectl: Kubectl) -> None:
    labels = {"app": "job"}
    k.apply({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job"},
        "spec": {"parallelism": 2, "completions": 2, "backoffLimit": 0,
                 "template": _gpu_template(labels, gpus=4, restart="Never")},
    })
    _assert_on_gpu_nodes(kubectl, wait_pods(k, "app=job", 2))
    # A second Job whose pods finish: the Job controller sees them succeed.
    k.apply({
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job-done"},
        "spec": {"parallelism": 2, "completions": 2, "backoffLimit": 0,
                 "template": _gpu_template({"app": "job-done"}, gpus=1, restart="Never",
                                           annotations=outcome("succeed", run_for="2s"))},
    })
    wait_for(lambda: (condition(k.json("job", "job-done"), "Complete") or {}).get("status")
             == "True", 90, "job-done Complete")


def test_raycluster_pods_run_on_gpu_nodes(k: Kubectl, kubectl: Kubectl) -> None:
    image = "rayproject/ray:2.46.0"
    k.apply({
        "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "rc"},
        "spec": {
            "rayVersion": "2.46.0",
            "headGroupSpec": {
                "rayStartParams": {},
                "template": {"spec": {"containers": [
                    {**container(name="ray-head", gpus=1, cpu="1", memory="2Gi"),
                     "image": image}]}},
            },
            "workerGroupSpecs": [{
                "groupName": "gpu", "replicas": 2, "minReplicas": 2, "maxReplicas": 2,
                "rayStartParams": {},
                "template": {"spec": {"containers": [
                    {**container(name="ray-worker", gpus=4, cpu="4", memory="8Gi"),
                     "image": image}]}},
            }],
        },
    })
    got = wait_pods(k, "ray.io/cluster=rc", 3, timeout=90)
    _assert_on_gpu_nodes(kubectl, got)
    types = sorted(p["metadata"]["labels"].get("ray.io/node-type", "") for p in got)
    assert types == ["head", "worker", "worker"]


def test_pytorchjob_pods_run_on_gpu_nodes(k: Kubectl, kubectl: Kubectl) -> None:
    def replica(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": "OnFailure",
                "template": _gpu_template({}, gpus=2, name="pytorch")}

    k.apply({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pt"},
        "spec": {"pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(2)}},
    })
    got = wait_pods(k, "training.kubeflow.org/job-name=pt", 3, timeout=90)
    _assert_on_gpu_nodes(kubectl, got)
    wait_for(lambda: (condition(k.json("pytorchjob", "pt"), "Running") or {}).get("status")
             == "True", 60, "PyTorchJob Running condition")


def test_leaderworkerset_groups_run_on_gpu_nodes(k: Kubectl, kubectl: Kubectl) -> None:
    """The LeaderWorkerSet controller and its webhooks: 2 groups of a leader and a worker,
    each pod labelled with its group and its place in it."""
    k.apply({
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": "lws"},
        "spec": {"replicas": 2, "leaderWorkerTemplate": {
            "size": 2, "workerTemplate": _gpu_template({}, gpus=1)}}})
    got = wait_pods(k, "leaderworkerset.sigs.k8s.io/name=lws", 4)
    _assert_on_gpu_nodes(kubectl, got)
    places = sorted((p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/group-index"],
                     p["metadata"]["labels"]["leaderworkerset.sigs.k8s.io/worker-index"])
                    for p in got)
    assert places == [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]


def test_a_pod_whose_node_never_confirms_its_deletion_stays_until_forced(k: Kubectl) -> None:
    k.apply(pod("hangs", gpus=1, annotations={"dispatcher.local/on-delete": "hang"}))
    wait_phase(k, "hangs", "Running")
    k("delete", "pod", "hangs", "--wait=false")
    stays(lambda: "deletionTimestamp" in k.json("pod", "hangs")["metadata"], 3,
          "a pod with on-delete: hang to stay Terminating")
    k("delete", "pod", "hangs", "--force", "--grace-period=0", "--wait=true", timeout=60)
    assert pods(k) == []


def test_pod_needing_more_gpus_than_any_node_stays_pending(k: Kubectl) -> None:
    k.apply(pod("too-big", gpus=9))

    def unschedulable() -> dict[str, Any] | None:
        c = condition(k.json("pod", "too-big"), "PodScheduled")
        return c if c and c.get("reason") == "Unschedulable" else None

    cond = wait_for(unschedulable, 60, "PodScheduled=False/Unschedulable")
    assert cond["status"] == "False"
    assert f"Insufficient {GPU}" in cond["message"], cond
    evs = wait_for(lambda: events(k, "too-big", "FailedScheduling"), 60,
                   "a FailedScheduling event")
    assert any(f"Insufficient {GPU}" in e.get("message", "") for e in evs), evs
    assert phase(k.json("pod", "too-big")) == "Pending"
    assert not k.json("pod", "too-big")["spec"].get("nodeName")


def test_pod_outcomes(k: Kubectl) -> None:
    for kind in ("run", "succeed", "fail", "crashloop", "pending", "image-pull-backoff"):
        k.apply(pod(f"p-{kind}", gpus=1, annotations=outcome(kind, run_for="1s",
                                                            exit_code=3)))
    # The same keys work as labels (for pods whose annotations a test does not write).
    k.apply(pod("by-label", gpus=1, labels=outcome("fail", run_for="1s")))
    wait_phase(k, "p-run", "Running")
    wait_phase(k, "p-succeed", "Succeeded")
    failed = wait_phase(k, "p-fail", "Failed")
    term = failed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 3 and term["reason"] == "Error"
    by_label = wait_phase(k, "by-label", "Failed")
    assert by_label["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1

    def waiting(name: str, reason: str) -> bool:
        st = k.json("pod", name)["status"].get("containerStatuses") or [{}]
        return st[0].get("state", {}).get("waiting", {}).get("reason") == reason

    wait_for(lambda: waiting("p-crashloop", "CrashLoopBackOff"), 30, "CrashLoopBackOff")
    wait_for(lambda: waiting("p-image-pull-backoff", "ImagePullBackOff"), 30,
             "ImagePullBackOff")
    for name in ("p-pending", "p-image-pull-backoff"):
        p = k.json("pod", name)
        assert phase(p) == "Pending" and p["spec"].get("nodeName"), p["status"]
    # A test decides when a held pod starts, and when a running one finishes.
    set_outcome(k, "run", names=["p-pending"])
    wait_phase(k, "p-pending", "Running")
    set_outcome(k, "succeed", names=["p-pending", "p-run"], run_for="500ms")
    wait_phase(k, "p-pending", "Succeeded")
    wait_phase(k, "p-run", "Succeeded")
    # Deleting pods works without a kubelet.
    k("delete", "pod", "--all", "--wait=true", timeout=60)
    assert pods(k) == []


def test_pods_that_only_sleep_finish_after_their_sleep(k: Kubectl) -> None:
    """As on a real node (MCAD's kuttl suites rely on it): `sleep N` succeeds after N s."""
    def sleeper(name: str, command: list[str], args: list[str] | None = None
                ) -> dict[str, Any]:
        p = pod(name)
        p["spec"]["containers"][0].update(command=command, **({"args": args} if args else {}))
        return p

    k.apply([sleeper("sh-sleep", ["sh", "-c", "sleep 2\n"]),
             sleeper("bash-sleep", ["/bin/bash", "-c", "--"], ["sleep 1;"]),
             sleeper("exit-0", ["sh", "-c", "sleep 1; exit 0"]),
             sleeper("forever", ["sh", "-c", "sleep infinity"]),
             sleeper("loop", ["/bin/sh", "-c", "while true; do sleep 1; done"])])
    done = wait_phase(k, "sh-sleep", "Succeeded")
    term = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and term["reason"] == "Completed"
    running = k.json("pod", "sh-sleep")["status"]["startTime"]
    wait_phase(k, "bash-sleep", "Succeeded")
    wait_phase(k, "exit-0", "Succeeded")
    # Not before its sleep is over: Running at startTime, finished 2 s later or more.
    started = datetime.fromisoformat(running.replace("Z", "+00:00"))
    finished = datetime.fromisoformat(term["finishedAt"].replace("Z", "+00:00"))
    assert (finished - started).total_seconds() >= 2
    for name in ("forever", "loop"):  # a sleep then `exit M`: the next test
        assert phase(k.json("pod", name)) == "Running"


def test_pods_that_sleep_then_exit_fail_with_that_code(k: Kubectl) -> None:
    """codeflare's failing samples: `sh -c "sleep 15; exit 1"` fails after its sleep."""
    def container_of(name: str, command: list[str]) -> dict[str, Any]:
        return {"name": name, "image": "busybox:1.36", "command": command}

    failing = pod("sleep-exit")
    failing["spec"]["containers"] = [container_of("fails", ["sh", "-c", "sleep 2; exit 3"]),
                                     container_of("sleeps", ["sh", "-c", "sleep 1"])]
    done = pod("sleep-exit-0")
    done["spec"]["containers"] = [container_of("main", ["sh", "-c", "sleep 1; exit 0"])]
    k.apply([failing, done])
    failed = wait_phase(k, "sleep-exit", "Failed")
    codes = {c["name"]: c["state"]["terminated"]["exitCode"]
             for c in failed["status"]["containerStatuses"]}
    assert codes == {"fails": 3, "sleeps": 0}
    started = datetime.fromisoformat(failed["status"]["startTime"].replace("Z", "+00:00"))
    finished = datetime.fromisoformat(failed["status"]["containerStatuses"][0]["state"][
        "terminated"]["finishedAt"].replace("Z", "+00:00"))
    assert (finished - started).total_seconds() >= 2
    wait_phase(k, "sleep-exit-0", "Succeeded")  # exiting 0 is no failure


def test_node_profiles(k: Kubectl, kubectl: Kubectl, node_profile: Any) -> None:
    names = node_profile("mixed")
    assert sum(1 for n in names if "gpu8" in n) == 2
    gpus = fake_gpu_nodes(kubectl)
    assert sorted(gpus.values()) == [1, 4, 4, 8, 8]
    k.apply(pod("eight", gpus=8))
    p = wait_phase(k, "eight", "Running")
    assert "gpu8" in p["spec"]["nodeName"]

    node_profile("fragmented")
    # Replacing the nodes removed their pods, as the pod garbage collector would.
    wait_for(lambda: not pods(k), 30, "the pods of the replaced nodes to be removed")
    assert sorted(fake_gpu_nodes(kubectl).values()) == [4, 4, 4, 4]
    k.apply(pod("eight-fragmented", gpus=8))
    cond = wait_for(lambda: condition(k.json("pod", "eight-fragmented"), "PodScheduled"), 60,
                    "PodScheduled condition")
    assert cond["status"] == "False" and f"Insufficient {GPU}" in cond["message"], cond

    node_profile("tainted")
    k.apply(pod("no-toleration", gpus=1))
    k.apply(pod("tolerates", gpus=1, tolerations=[
        {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]))
    assert "gpu" in wait_phase(k, "tolerates", "Running")["spec"]["nodeName"]
    cond = wait_for(lambda: condition(k.json("pod", "no-toleration"), "PodScheduled"), 60,
                    "PodScheduled condition")
    assert cond["status"] == "False" and "untolerated taint" in cond["message"], cond

    node_profile("labelled")
    k.apply(pod("inference", gpus=8, nodeSelector={"pool": "inference"}))
    assert "h100" in wait_phase(k, "inference", "Running")["spec"]["nodeName"]

    node_profile("pool")
    assert sorted(fake_gpu_nodes(kubectl).values()) == [8, 8]


def test_a_kwok_controller_that_gave_up_while_the_api_server_started_is_started_again(
        local_cluster: Cluster, kubectl: Kubectl, node_profile: Any) -> None:
    """kwokctl starts kwok-controller beside kube-apiserver, and kwok exits for good when it
    cannot list nodes within five tries (~15 s): on a loaded machine kube-apiserver took
    longer, and no fake node was ever Ready. `up` starts again whatever exited then."""
    os.kill(local_cluster.component_pids()["kwok-controller"], signal.SIGKILL)
    wait_for(lambda: not local_cluster.processes()["kwok-controller"], 30,
             "kwok-controller to exit")

    local_cluster.start_exited()

    assert all(local_cluster.processes().values()), local_cluster.processes()
    # New fake nodes are marked Ready again (use_profile waits for it). The kwok-controller
    # started again first lists every node and pod: on a loaded machine (a CI run with
    # other work beside it) that took over the 60 s a profile change is given.
    assert len(node_profile("pool", timeout=240)) == 2


def test_reusing_a_cluster_started_without_operators_starts_them(
        local_cluster: Cluster, k: Kubectl) -> None:
    # Make the running cluster look as `up(operators=False)` (the e2e bench) leaves it.
    operators = local_cluster.operator_pids()
    assert set(operators) == set(OPERATORS)
    for pid in operators.values():
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not any(local_cluster.processes().get(n) for n in operators), 60,
             "the operators to stop")
    shutil.rmtree(local_cluster.pids)
    info = local_cluster.ready_info()
    assert info is not None
    (local_cluster.dir / READY_FILE).write_text(json.dumps({**info, "operators": []}))

    local_cluster.up(profile=info["profile"])

    assert local_cluster.processes() == {p: True for p in (
        "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
        "kwok-controller", *OPERATORS)}
    assert sorted((local_cluster.ready_info() or {}).get("operators") or []) == sorted(operators)
    # And they work: a PyTorchJob gets its pods.
    master = {"replicas": 1, "restartPolicy": "OnFailure",
              "template": _gpu_template({}, gpus=1, name="pytorch")}
    k.apply({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
             "metadata": {"name": "after-reuse"},
             "spec": {"pytorchReplicaSpecs": {"Master": master}}})
    wait_pods(k, "training.kubeflow.org/job-name=after-reuse", 1, timeout=90)


def test_controllers_run_without_leader_election_and_with_25_job_workers(
        local_cluster: Cluster) -> None:
    """One of each, so nothing to elect (a lease renewal that timed out on a loaded machine
    made kube-controller-manager exit); the Job controller's workers as localcluster/
    README.md says. A cluster whose ready file records other flags is not reused."""
    pids = local_cluster.component_pids()
    argv = {name: Path(f"/proc/{pids[name]}/cmdline").read_bytes().decode().split("\0")
            for name in ("kube-controller-manager", "kube-scheduler")}
    assert "--leader-elect=false" in argv["kube-controller-manager"]
    assert "--leader-elect=false" in argv["kube-scheduler"]
    assert f"--concurrent-job-syncs={JOB_SYNCS}" in argv["kube-controller-manager"]

    assert local_cluster.is_running()
    ready = local_cluster.dir / READY_FILE
    saved = ready.read_text()
    try:
        ready.write_text(json.dumps({**json.loads(saved), "components": []}))
        assert not local_cluster.is_running()
    finally:
        ready.write_text(saved)
    assert local_cluster.is_running()
