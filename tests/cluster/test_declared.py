"""What is declared is what runs: tenants, with their own credentials and deploy/'s RBAC,
cannot split a gang or overrun their quota by declaring less than their pods ask.

1. alice's v1beta2 AppWrapper wraps a PyTorchJob of a Master and a Worker of 2 GPUs each
   and declares the Master's pod set only: refused at apply (as codeflare's webhook does),
   and bob's 1 x 2-GPU rival runs.
2. alice's team is at its hard quota of 8 GPUs; her v1beta1 AppWrapper declares 1 pod of 1
   cpu (custompodresources) for a Pod that asks 4 GPUs: refused at apply naming both
   counts; bob's team's 4-GPU job, within its guarantee, runs, and alice's team uses 8.
3. alice's v1beta1 AppWrapper declares 1 pod of 100m for a Job of 40 pods of 6 cpu
   (accepted with a warning, as MCAD does): they run on 240 of the 256 cpu. bob asks 120
   of his team's guaranteed 128: alice's wrapper, charged what its pods take, is
   reclaimed, and bob's runs.

Both versions are served with their webhooks by `dispatcher run` (test_v1beta2's fixture).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from localcluster import Kubectl, users, wait_for
from localcluster.testing import container

from .test_controller import appwrapper, job, pods_of, running_pods
from .test_sharing import subtree
from .test_tenancy import APPWRAPPERS, QUOTA_NODES, grant_use, refused
from .test_v1beta2 import as_v1, of_team, v1beta2, v1beta2_served, wait_condition

__all__ = ["v1beta2_served"]  # the module's fixture: both versions and their webhooks

GPU = "nvidia.com/gpu"
MASTER = "template.spec.pytorchReplicaSpecs.Master.template"


def pytorch_job(name: str, gpus: int) -> dict[str, Any]:
    def replica() -> dict[str, Any]:
        return {"replicas": 1, "restartPolicy": "Never", "template": {"spec": {
            "containers": [container(name="pytorch", gpus=gpus)]}}}

    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {"Master": replica(), "Worker": replica()}}}


def gpu_pod(name: str, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never", "containers": [container(gpus=gpus)]}}


def tenant(kubectl: Kubectl, as_user: Callable[[str], Kubectl], namespace: str, name: str,
           resources: list[str]) -> Kubectl:
    users.grant(kubectl, name, namespace, [APPWRAPPERS, *resources])
    k = as_user(name).in_namespace(namespace)
    wait_for(lambda: all(k.run("auth", "can-i", "create", r).stdout.strip() == "yes"
                         for r in (APPWRAPPERS, *resources)), 30, f"{name}'s grants")
    return k


def gpus_used(k: Kubectl, names: list[str]) -> int:
    return sum(int(c["resources"].get("limits", {}).get(GPU, 0))
               for name in names for p in pods_of(k, name)
               for c in p["spec"]["containers"])


def test_a_partial_v1beta2_gang_is_refused_and_the_rival_runs(
        v1beta2_served: object, kubectl: Kubectl, namespace: str,
        as_user: Callable[[str], Kubectl]) -> None:
    alice = tenant(kubectl, as_user, namespace, "alice", ["pytorchjobs.kubeflow.org"])
    bob = tenant(kubectl, as_user, namespace, "bob", ["jobs.batch"])
    partial = v1beta2("partial", pytorch_job("partial", 2))
    partial["spec"]["components"][0]["podSets"] = [{"path": MASTER, "replicas": 1}]
    error = refused(alice, partial)
    assert ("spec.components[0].podSets: declares 1 pod set, but PyTorchJob has 2 pod "
            "templates (template.spec.pytorchReplicaSpecs.Master.template, "
            "template.spec.pytorchReplicaSpecs.Worker.template)") in error
    assert kubectl.in_namespace(namespace).items("appwrappers") == []
    bob.apply(appwrapper("rival", job("rival", 1, 2)))
    wait_condition(bob, "rival", "Running")


@pytest.fixture
def teams(kubectl: Kubectl, namespace: str) -> Iterator[None]:
    """team-a: a hard leaf of 8 GPUs; team-b: 4 GPUs guaranteed; the rest for default."""
    k = kubectl.in_namespace(namespace)
    k.apply(subtree("gpus", [{"name": "all", "quotas": {"requests": {GPU: 32}}}]))
    k.apply(subtree("teams", [
        {"name": "team-a", "quotas": {"hardLimit": True, "requests": {GPU: 8}}},
        {"name": "team-b", "quotas": {"requests": {GPU: 4}}},
        {"name": "default", "quotas": {"requests": {GPU: 20}}}], parent="all"))
    yield
    k("delete", "quotasubtrees", "--all", "--wait=false")


def test_a_team_at_its_hard_quota_cannot_overrun_it_by_declaring_less(
        v1beta2_served: object, teams: None, kubectl: Kubectl, namespace: str,
        as_user: Callable[[str], Kubectl]) -> None:
    alice = tenant(kubectl, as_user, namespace, "alice", ["jobs.batch", "pods"])
    bob = tenant(kubectl, as_user, namespace, "bob", ["jobs.batch"])
    grant_use(kubectl, namespace, "alice", QUOTA_NODES, ["quota_gpu:team-a"])
    grant_use(kubectl, namespace, "bob", QUOTA_NODES, ["quota_gpu:team-b"])
    alice.apply(of_team(appwrapper("full", job("full", 1, 8)), "team-a"))
    wait_condition(alice, "full", "Running")

    sneaky = of_team(appwrapper("sneaky", gpu_pod("big", 4)), "team-a")
    sneaky["spec"]["resources"]["GenericItems"][0]["custompodresources"] = [
        {"replicas": 1, "requests": {"cpu": "1"}}]
    error = refused(alice, sneaky)
    assert ("spec.resources.GenericItems[0]: custompodresources: declares 0 nvidia.com/gpu "
            "in all, but Pod big will create 1 pod asking 4 nvidia.com/gpu in all") in error

    bob.apply(of_team(appwrapper("guaranteed", job("guaranteed", 1, 4)), "team-b"))
    wait_condition(bob, "guaranteed", "Running")
    assert gpus_used(alice, ["full", "sneaky"]) == 8


def cpu_job(name: str, pods: int, cpu: str) -> dict[str, Any]:
    wrapped = job(name, pods, 0)
    wrapped["spec"]["template"]["spec"]["containers"] = [container(cpu=cpu)]
    return wrapped


@pytest.fixture
def cpu_teams(kubectl: Kubectl, namespace: str) -> Iterator[None]:
    """The cluster's 256 cpu: 128 guaranteed to team-a, 128 to team-b."""
    k = kubectl.in_namespace(namespace)
    k.apply(subtree("cpus", [{"name": "all", "quotas": {"requests": {"cpu": "256"}}}]))
    k.apply(subtree("teams", [
        {"name": "team-a", "quotas": {"requests": {"cpu": "128"}}},
        {"name": "team-b", "quotas": {"requests": {"cpu": "128"}}},
        {"name": "default", "quotas": {"requests": {"cpu": "0"}}}], parent="all"))
    yield
    k("delete", "quotasubtrees", "--all", "--wait=false")


def test_a_job_declared_as_one_small_pod_is_reclaimed_for_a_team_within_its_cpu(
        v1beta2_served: object, cpu_teams: None, kubectl: Kubectl, namespace: str,
        as_user: Callable[[str], Kubectl]) -> None:
    alice = tenant(kubectl, as_user, namespace, "alice", ["jobs.batch"])
    bob = tenant(kubectl, as_user, namespace, "bob", ["jobs.batch"])
    grant_use(kubectl, namespace, "alice", QUOTA_NODES, ["quota_gpu:team-a"])
    grant_use(kubectl, namespace, "bob", QUOTA_NODES, ["quota_gpu:team-b"])
    short = of_team(appwrapper("short", cpu_job("short", 40, "6")), "team-a")
    short["spec"]["resources"]["GenericItems"][0]["custompodresources"] = [
        {"replicas": 1, "requests": {"cpu": "100m"}}]
    applied = alice.run("apply", "-f", "-", input=yaml.safe_dump(short))
    assert "declares 1 pod, but Job 'short' will create 40 pods" in applied.stderr
    wait_condition(alice, "short", "Running")
    running_pods(kubectl.in_namespace(namespace), "short", 40, timeout=120)  # as an admin sees

    bob.apply(of_team(appwrapper("guaranteed", cpu_job("guaranteed", 20, "6")), "team-b"))
    wait_condition(bob, "guaranteed", "Running", timeout=180)
    taken = [c for c in as_v1(alice, "short")["status"]["conditions"]
             if c["type"] == "PreemptCandidate"]
    assert taken and "to reclaim the quota it borrows" in taken[-1]["message"]
