"""The dispatcher as users run it: its image, built here with no engine, installed by its Helm
chart as pods on a real node (kubelet, containerd, runc; localcluster/node.py), and gangs of
real containers.

The cluster is one of its own (``dispatcher-real``): a real node beside the default profile's
fake GPU nodes. The chart's pods run on the real node (its taint tolerated, its label
selected); the webhook is reached by the API server through its Service; the controller
elects a leader among its two replicas. A tenant's AppWrappers are dispatched onto the fake
GPU nodes, and real gangs (an indexed Job whose pods call each other by name, a PyTorchJob
whose worker reports to its master, a container killed for memory) onto the real node.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.controller.access.creator import CREATOR
from localcluster import Cluster, Kubectl, image_build, node, users, wait_for
from localcluster.image import describe
from localcluster.real_demo import (
    ON_REAL_NODE,
    gang,
    helm,
    install_chart,
    python_container,
    wait_for_webhook,
)
from localcluster.release import install_yaml, package_version
from tests.shared_files import in_ci

from .test_operations import appwrapper, job, last_condition
from .webhook_process import apply_deploy, delete_deploy

CLUSTER = "dispatcher-real"
NAMESPACE = "dispatcher-system"
VERSION = package_version()


@dataclass
class Real:
    cluster: Cluster
    kubectl: Kubectl
    image: str
    #: Seconds from `helm install` to the first AppWrapper dispatched.
    install_to_dispatch: float = 0.0


@pytest.fixture(scope="module")
def real() -> Iterator[Real]:
    problems = node.missing() + image_build.missing()
    if problems:
        if in_ci():
            pytest.fail(f"the real node's tests must run in CI: {'; '.join(problems)}",
                        pytrace=False)
        pytest.skip("; ".join(problems))
    cluster = Cluster(CLUSTER)
    try:
        cluster.up(real_node=True, timeout=300)
        cluster.real_node().import_image(image_build.build_image().path)
        yield Real(cluster, cluster.kubectl(), describe().reference)
    finally:
        if os.environ.get("DISPATCHER_KEEP_CLUSTER") != "1":
            cluster.down()


@pytest.fixture(scope="module")
def installed(real: Real, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Real]:
    """The chart installed as users install it, its pods on the real node."""
    values = tmp_path_factory.mktemp("chart") / "values.yaml"
    started = time.monotonic()
    try:
        install_chart(real.cluster, real.image, values)
    except (RuntimeError, TimeoutError) as e:
        raise AssertionError(f"{e}\n{_pods_report(real.kubectl)}") from None
    tenant = _tenant(real)
    tenant.create(appwrapper("first", job("first", pods=2, gpus=1)))
    wait_for(lambda: _state(tenant, "first") == "Running", 180,
             "the tenant's first AppWrapper to run")
    real.install_to_dispatch = time.monotonic() - started
    print(f"helm install to the first AppWrapper running: {real.install_to_dispatch:.1f} s")
    yield real
    tenant("delete", "appwrappers", "--all", "--wait=true", "--timeout=120s")
    helm(real.cluster, "uninstall", "dispatcher", "-n", NAMESPACE)
    real.kubectl("delete", "namespace", NAMESPACE)
    # kube-controller-manager may apply the aggregated role again as it goes (without the
    # chart's labels): another install would refuse to adopt it.
    real.kubectl("delete", "clusterrole", "dispatcher-wrapped-kinds", "--ignore-not-found")


# --- install.yaml (first: the chart's install below is the module's) --------------------

def test_install_yaml_applied_as_is_runs_the_dispatcher_and_a_real_gang(
        real: Real, namespace_on: Any) -> None:
    """The release's one file, unchanged but for its image: its pods select no node and
    tolerate nothing, so here the real node is the only schedulable one."""
    manifest = install_yaml(VERSION, real.image.rpartition(":")[0])
    with node.alone(real.kubectl):
        apply_deploy(real.kubectl, manifest)
        try:
            system = real.kubectl.in_namespace(NAMESPACE)
            for name in ("dispatcher", "dispatcher-webhook"):
                system("rollout", "status", f"deployment/{name}", "--timeout=180s",
                       timeout=200)
            wait_for_webhook(real.kubectl)
            assert {p["spec"]["nodeName"] for p in system.items("pods")} == {node.NAME}
            k = namespace_on(real)
            k.create(gang(real.image, name="release"))
            wait_for(lambda: _state(k, "release") in ("Completed", "Failed"), 300,
                     "the gang to finish")
            assert _state(k, "release") == "Completed", _report(k, "release")
        finally:
            delete_deploy(real.kubectl)
            wait_for(lambda: real.kubectl.run("get", "namespace", NAMESPACE,
                                              check=False).returncode, 180,
                     f"namespace {NAMESPACE} to be gone")


# --- the chart's pods -------------------------------------------------------------------

def test_the_chart_runs_the_dispatcher_as_pods_on_the_real_node(installed: Real) -> None:
    pods = installed.kubectl.in_namespace(NAMESPACE).items("pods")
    by_component = {}
    for p in pods:
        component = p["metadata"]["labels"].get("app.kubernetes.io/component")
        by_component.setdefault(component, []).append(p)
        assert p["spec"]["nodeName"] == node.NAME, p["metadata"]["name"]
        assert p["status"]["phase"] == "Running"
        assert all(c["ready"] for c in p["status"]["containerStatuses"])
        # A real container: the kubelet reports its runtime's id and the image it ran.
        status = p["status"]["containerStatuses"][0]
        assert status["containerID"].startswith("containerd://")
        assert status["image"].endswith(installed.image.rpartition("/")[2])
    assert {c: len(ps) for c, ps in by_component.items()} == {"controller": 2, "webhook": 2}


def test_a_tenants_appwrapper_goes_through_the_webhook_service_and_is_dispatched(
        installed: Real) -> None:
    tenant = _tenant(installed)
    aw = tenant.json("appwrapper", "first")
    # The webhook pods recorded who created it (reached through their Service).
    assert aw["metadata"]["annotations"][CREATOR] == "alice"
    team = installed.kubectl.in_namespace("team-a")
    uid = team.json("job", "first")["metadata"]["uid"]
    pods = team.items("pods", "-l", f"batch.kubernetes.io/controller-uid={uid}")
    assert len(pods) == 2
    # Pinned by the dispatcher onto the fake GPU nodes (kwok's), not the real node.
    assert all(p["spec"].get("nodeName", "").startswith("default-") for p in pods), pods
    # A tenant may not wrap what it may not create itself: refused at admission.
    refused = tenant.run("create", "-f", "-", check=False, input=json.dumps(appwrapper(
        "sneaky", {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": "sneaky"}, "rules": []})))
    assert refused.returncode != 0
    assert "denied the request" in refused.stderr, refused.stderr


def test_a_tenants_job_cannot_reach_the_machine_under_the_real_node(
        installed: Real) -> None:
    """alice may create Jobs; one whose pod is privileged and mounts the host's root on the
    real node would own the machine (and the cluster's CA key): her namespace enforces the
    baseline Pod Security Standard, so the pod is never created."""
    tenant = _tenant(installed)
    escape = {"name": "escape", "image": installed.image, "imagePullPolicy": "Never",
              "command": ["cat", "/host/etc/shadow"],
              "securityContext": {"privileged": True, "runAsUser": 0},
              "volumeMounts": [{"name": "host", "mountPath": "/host"}]}
    tenant.create({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "escape"},
                   "spec": {"backoffLimit": 0, "template": {"spec": {
                       "restartPolicy": "Never", **ON_REAL_NODE, "containers": [escape],
                       "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}}})
    team = installed.kubectl.in_namespace("team-a")
    refused = wait_for(lambda: [e for e in team.items(
        "events", "--field-selector", "involvedObject.name=escape,reason=FailedCreate")
        if "violates PodSecurity" in e.get("message", "")], 60,
        "the Job controller to be refused the pod")
    assert "privileged" in refused[0]["message"] and "hostPath" in refused[0]["message"]
    assert team.items("pods", "-l", "job-name=escape") == []
    team("delete", "job", "escape")


def test_the_nodes_programs_act_as_a_node_would_not_as_the_admin(real: Real) -> None:
    """The kubelet, kube-proxy and CoreDNS each have a client certificate of their own: the
    kubelet is a node to the Node authorizer (a tenant's Secret is not its to read unless a
    pod on it mounts it), kube-proxy is Kubernetes' system:kube-proxy, CoreDNS may only list
    and watch what it answers for."""
    real_node = real.cluster.real_node()
    paths = real_node.paths
    for program in ("kubelet", "kube-proxy"):
        pid = real_node.pid_file(program).read_text()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert str(paths.kubeconfig(program)).encode() in argv, (program, argv)
    assert f"kubeconfig {paths.kubeconfig('coredns')}\n" in paths.corefile.read_text()
    acting = {i.program: Kubectl(real.kubectl.binary, paths.kubeconfig(i.program))
              for i in node.IDENTITIES}
    for identity in node.IDENTITIES:
        me = json.loads(acting[identity.program]("auth", "whoami", "-o", "json"))[
            "status"]["userInfo"]
        assert me["username"] == identity.user
        assert set(identity.groups) <= set(me.get("groups") or ())
    for program in acting:
        refused = acting[program].run("get", "secrets", "-n", "team-a", check=False)
        assert refused.returncode != 0 and "Forbidden" in refused.stderr, (program, refused)
    assert acting["kubelet"].json("node", node.NAME)["metadata"]["name"] == node.NAME
    assert acting["coredns"].items("services", "-A")
    refused = acting["coredns"].run("delete", "service", "kubernetes", "--dry-run=server",
                                    check=False)
    assert refused.returncode != 0 and "Forbidden" in refused.stderr, refused


def test_metrics_are_scraped_through_the_service(installed: Real) -> None:
    text = installed.kubectl(
        "get", "--raw",
        f"/api/v1/namespaces/{NAMESPACE}/services/dispatcher-metrics:metrics/proxy/metrics")
    assert "dispatcher_appwrappers" in text


def test_leader_pod_deleted_mid_run_nothing_lost_nor_run_twice(installed: Real) -> None:
    system = installed.kubectl.in_namespace(NAMESPACE)
    tenant = _tenant(installed)
    team = installed.kubectl.in_namespace("team-a")
    leader = _leader(system)
    before = [f"before-{i}" for i in range(3)]
    for name in before:
        tenant.create(appwrapper(name, job(name, pods=2, gpus=1)))
    for name in before:
        wait_for(lambda n=name: _state(tenant, n) == "Running", 180, f"{name} to run")
    running = {n: team.json("job", n)["metadata"]["uid"] for n in before}
    system("delete", "pod", leader, "--wait=false")
    after = [f"after-{i}" for i in range(3)]
    for name in after:
        tenant.create(appwrapper(name, job(name, pods=2, gpus=1)))
    new_leader = wait_for(lambda: (p := _leader(system)) != leader and p, 120,
                          f"another pod than {leader} to lead")
    assert new_leader in {p["metadata"]["name"] for p in system.items("pods")}
    for name in after:
        wait_for(lambda n=name: _state(tenant, n) == "Running", 180, f"{name} to run")
    # The new leader took the running gangs over as they were: the same Jobs.
    assert {n: team.json("job", n)["metadata"]["uid"] for n in before} == running
    for name in before + after:
        uid = team.json("job", name)["metadata"]["uid"]
        # The status records the Job's uid (a detail, written within seconds of Running).
        wait_for(lambda n=name, u=uid: u in json.dumps(_wrapped_items(tenant, n)), 60,
                 f"{name}'s status to record its Job's uid {uid}")
        # Two pods ever created for each Job: none was run twice.
        assert _pods_created(team, name) == 2, name


# --- real gangs on the real node --------------------------------------------------------

def test_a_real_two_pod_gang_runs_to_completion(real: Real, installed: Real,
                                                namespace_on: Any) -> None:
    k = namespace_on(real)
    k.create(gang(real.image))
    wait_for(lambda: _state(k, "gang") in ("Completed", "Failed"), 300,
             "the real gang to finish")
    assert _state(k, "gang") == "Completed", _report(k, "gang")
    pods = k.items("pods", "-l", "job-name=gang")
    assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} == {node.NAME}
    assert all(_terminated(p)["exitCode"] == 0 for p in pods)
    logs = k("logs", "-l", "job-name=gang", "--tail", "5")
    assert logs.count(" met ") == 2, logs


MASTER_WORKER = textwrap.dedent("""\
    # The training operator's environment: the master waits for every worker to report.
    import os, socket, sys, time
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    port = int(os.environ["MASTER_PORT"])
    if rank == 0:
        server = socket.create_server(("", port))
        server.settimeout(150)
        got = [server.accept()[0].recv(16) for _ in range(world - 1)]
        print("master heard from", sorted(g.decode() for g in got), flush=True)
        sys.exit(0)
    deadline = time.monotonic() + 150
    while True:
        try:
            with socket.create_connection((os.environ["MASTER_ADDR"], port), timeout=2) as s:
                s.sendall(str(rank).encode())
            print("worker", rank, "reported", flush=True)
            sys.exit(0)
        except OSError:
            if time.monotonic() > deadline:
                sys.exit("the master never answered")
            time.sleep(0.5)
    """)


def test_a_real_pytorchjob_runs_to_completion(real: Real, installed: Real,
                                              namespace_on: Any) -> None:
    k = namespace_on(real)
    replica = {"replicas": 1, "restartPolicy": "Never", "template": {"spec": {
        **ON_REAL_NODE, "containers": [{**python_container(real.image, MASTER_WORKER, {}),
                                        "name": "pytorch"}]}}}
    pytorchjob = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                  "metadata": {"name": "torch"},
                  "spec": {"pytorchReplicaSpecs": {"Master": replica, "Worker": replica}}}
    k.create(appwrapper("torch", pytorchjob))
    wait_for(lambda: _state(k, "torch") in ("Completed", "Failed"), 300,
             "the real PyTorchJob to finish")
    assert _state(k, "torch") == "Completed", _report(k, "torch")
    pods = k.items("pods", "-l", "training.kubeflow.org/job-name=torch")
    assert sorted(p["metadata"]["labels"]["training.kubeflow.org/replica-type"]
                  for p in pods) == ["master", "worker"]
    assert all(_terminated(p)["exitCode"] == 0 for p in pods)
    # The worker's init container (the operator's own, waiting for the master's name in
    # DNS) really ran, from the node's busybox image.
    (worker,) = [p for p in pods
                 if p["metadata"]["labels"]["training.kubeflow.org/replica-type"] == "worker"]
    init = worker["status"]["initContainerStatuses"][0]
    assert init["state"]["terminated"]["exitCode"] == 0


RETRY_ONCE = textwrap.dedent("""\
    # The first attempt leaves a mark on the node and exits 130 (retryable under the
    # Kubeflow operators' ExitCode policy: 128 and above); the second finds it and succeeds.
    import os, sys
    mark = "/attempts/first"
    if os.path.exists(mark):
        print("second attempt: done", flush=True)
        sys.exit(0)
    open(mark, "w").close()
    sys.exit(130)
    """)


def test_a_retryable_exit_code_is_retried_by_the_operator_not_failed(
        real: Real, installed: Real, namespace_on: Any) -> None:
    k = namespace_on(real)
    attempts = f"/tmp/dispatcher-real-node-attempts-{uuid.uuid4().hex[:8]}"
    container = {**python_container(real.image, RETRY_ONCE, {}), "name": "pytorch",
                 "securityContext": {"runAsUser": 0},
                 "volumeMounts": [{"name": "attempts", "mountPath": "/attempts"}]}
    replica = {"replicas": 1, "restartPolicy": "ExitCode", "template": {"spec": {
        **ON_REAL_NODE, "containers": [container],
        "volumes": [{"name": "attempts",
                     "hostPath": {"path": attempts, "type": "DirectoryOrCreate"}}]}}}
    retried = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
               "metadata": {"name": "retried"},
               "spec": {"pytorchReplicaSpecs": {"Master": replica}}}
    try:
        k.create(appwrapper("retried", retried))
        wait_for(lambda: _state(k, "retried") in ("Completed", "Failed"), 300,
                 "the retried gang to end")
        assert _state(k, "retried") == "Completed", _report(k, "retried")
        # The first attempt ran (its mark is on the node) and exited 130; the wrapper was
        # never failed for it.
        assert Path(attempts, "first").exists()
        types = [c["type"] for c in k.json("appwrapper", "retried")["status"]["conditions"]]
        assert "Failed" not in types, types
        assert "second attempt: done" in k("logs", "retried-master-0")
    finally:
        shutil.rmtree(attempts, ignore_errors=True)


OOM = "data = b'x' * (512 << 20)  # past the 64 MiB limit: the kernel kills the container"


def test_a_container_killed_for_memory_fails_the_gang(real: Real, installed: Real,
                                                      namespace_on: Any) -> None:
    k = namespace_on(real)
    container = python_container(real.image, OOM, {})
    container["resources"]["limits"] = {"memory": "64Mi"}
    greedy = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "greedy"},
              "spec": {"backoffLimit": 0, "template": {"spec": {
                  "restartPolicy": "Never", **ON_REAL_NODE, "containers": [container]}}}}
    k.create(appwrapper("greedy", greedy))
    wait_for(lambda: _state(k, "greedy") in ("Completed", "Failed"), 300,
             "the greedy gang to end")
    assert _state(k, "greedy") == "Failed", _report(k, "greedy")
    assert last_condition(k, "greedy")["reason"] == "WrappedObjectFailed"
    (pod,) = k.items("pods", "-l", "job-name=greedy")
    assert _terminated(pod)["reason"] == "OOMKilled"


# --- helpers ----------------------------------------------------------------------------

@pytest.fixture
def namespace_on(request: pytest.FixtureRequest) -> Any:
    made: list[tuple[Kubectl, str]] = []

    def make(real: Real) -> Kubectl:
        name = f"real-{request.node.name[7:30].replace('_', '-').strip('-')}-{uuid.uuid4().hex[:6]}"
        real.kubectl.apply({"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": name}})
        wait_for(lambda: real.kubectl.run("get", "sa", "default", "-n", name,
                                          check=False).returncode == 0, 60,
                 f"namespace {name}'s default service account")
        made.append((real.kubectl, name))
        return real.kubectl.in_namespace(name)

    yield make
    for kubectl, name in made:
        kubectl("delete", "namespace", name, "--wait=false")


def _tenant(real: Real) -> Kubectl:
    users.ensure(real.cluster.dir, real.kubectl)
    return Kubectl(real.kubectl.binary, users.kubeconfig(real.cluster.dir, "alice"), "team-a")


def _state(k: Kubectl, name: str) -> str:
    return str((k.json("appwrapper", name).get("status") or {}).get("state") or "")


def _wrapped_items(k: Kubectl, name: str) -> list[dict[str, Any]]:
    return list((k.json("appwrapper", name).get("status") or {}).get("wrappedItems") or [])


def _leader(system: Kubectl) -> str:
    identity = system.json("lease", "dispatcher")["spec"].get("holderIdentity") or ""
    return str(identity.rpartition("_")[0])


def _pods_created(k: Kubectl, job_name: str) -> int:
    """Pods the Job controller created for `job_name`, by its events (deleted ones too)."""
    events = k.items("events", "--field-selector",
                     f"involvedObject.kind=Job,involvedObject.name={job_name},"
                     "reason=SuccessfulCreate")
    return sum(int(e.get("count") or 1) for e in events)


def _terminated(pod: dict[str, Any]) -> dict[str, Any]:
    status = pod["status"]["containerStatuses"][0]
    state = status["state"].get("terminated") or status.get("lastState", {}).get("terminated")
    assert state, status
    return dict(state)


def _report(k: Kubectl, name: str) -> str:
    aw = k.json("appwrapper", name)
    return yaml.safe_dump({"status": aw.get("status"),
                           "pods": [p["status"] for p in k.items("pods")]})


def _pods_report(kubectl: Kubectl) -> str:
    return kubectl("get", "pods", "-A", "-o", "wide") + kubectl(
        "get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp")

