"""Fixtures for tests on the local Kubernetes control plane (localcluster, DESIGN.md §6).

The cluster is real: etcd, kube-apiserver (TLS, RBAC, admission), kube-controller-manager,
kube-scheduler, the KubeRay operator, the Kubeflow training operators (v1.9, and v1.8.1 for
MXJob) and the JobSet controller, with kwok playing the kubelet of fake GPU nodes. One control
plane serves the whole test run.

Fixtures
- ``local_cluster`` (session): a ready :class:`localcluster.Cluster`, started once per run
  (or reused when one is already running, healthy and built from the current binaries) and
  stopped at the end if this run started it; ``DISPATCHER_KEEP_CLUSTER=1`` keeps it for the
  next run (``python -m localcluster down`` stops it). If it cannot start, every test using
  it FAILS with the reason and the log directory; nothing is skipped.
- ``kubeconfig`` (session): path of the cluster's admin kubeconfig (also in
  ``local_cluster.kubeconfig``); hand it to a process under test.
- ``kubectl`` (session): :class:`localcluster.Kubectl`, cluster-wide. ``kubectl("get", ...)``
  returns stdout, ``.json(...)``/``.items(...)`` parse ``get -o json``, ``.apply(obj)``
  takes YAML text or dicts, ``.in_namespace(ns)`` rebinds.
- ``namespace`` (function): a fresh namespace per test (default service account ready);
  deleted afterwards, and the teardown waits until its pods are gone so the next test sees
  every GPU free.
- ``k`` (function): :class:`localcluster.Kubectl` bound to ``namespace``.
- ``node_profile`` (function): ``node_profile("fragmented")`` replaces the fake nodes with
  those of another profile (``localcluster/profiles/*.yaml``, or a path to a YAML file) and
  returns their names; the default profile is restored after the test. Profiles:
  ``default`` 4 x 8 GPUs; ``pool`` 2 x 8 GPUs (a whole pool a test can fill);
  ``fragmented`` 4 x 4 GPUs (16 free GPUs, but no node takes an 8-GPU pod); ``mixed``
  2x8 + 2x4 + 1x1 GPU nodes and 2 CPU-only nodes; ``tainted`` GPU nodes tainted
  ``nvidia.com/gpu=present:NoSchedule`` plus CPU-only nodes; ``labelled`` A100 nodes in
  zone-a and H100 nodes in zone-b.
- ``as_user`` (session): ``as_user("alice")`` is a :class:`localcluster.Kubectl` acting as
  a user of the local cluster (client certificate; localcluster/users.py): ``alice`` may
  create AppWrappers and Jobs in ``team-a``, ``bob`` AppWrappers only in ``team-b``,
  ``admin`` is cluster-admin. Bound to the user's own namespace, if any;
  ``.in_namespace(ns)`` rebinds. ``localcluster.users.grant(kubectl, "bob", ns,
  ["jobs.batch"])`` gives a user rights in another namespace (tests use fresh ones).
- ``deployed`` (module): deploy/ applied for real (after a server-side dry run), its
  webhook configurations pointed at a `dispatcher webhook` process on loopback that runs
  with deploy/'s ``dispatcher-webhook`` service account; ``.controller_kubeconfig`` acts
  as deploy/'s ``dispatcher`` service account. Everything but the CRD is removed after.
- ``kube_api_client`` (session): a ``kubernetes.client.ApiClient`` for the cluster.

What pods do (localcluster.testing, localcluster/stages/pods.yaml): a pod bound to a fake
node becomes Running and Ready. The annotation or label ``dispatcher.local/outcome``
(``testing.outcome(kind, run_for=, start_after=, exit_code=)`` builds it, for a pod or a
pod template) makes it instead ``succeed`` or ``fail`` after ``run_for``, ``crashloop``,
stay ``pending`` on its node, or sit in ``image-pull-backoff``. ``testing.set_outcome(k,
"fail", selector="app=x")`` changes the outcome of existing pods (release pending ones,
make running ones finish). A pod no node can hold stays Pending with the scheduler's
``PodScheduled=False/Unschedulable`` condition and a ``FailedScheduling`` event.
``testing.wait_pods``, ``wait_phase``, ``condition``, ``events`` and ``fake_gpu_nodes`` wait
for and read those states.
"""

from __future__ import annotations

import os
import re
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import Cluster, Kubectl, users, wait_for
from localcluster import config as lc_config

from .dispatcher_process import install_crd
from .fleet import FleetClusters
from .webhook_process import (
    CONTROLLER_SA,
    SYSTEM_NAMESPACE,
    WEBHOOK_SA,
    Installed,
    WebhookProcess,
    apply_deploy,
    delete_deploy,
    service_account_kubeconfig,
    unregister_webhooks,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Everything under tests/cluster needs the control plane: `-m "not cluster"` skips it.
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def local_cluster() -> Iterator[Cluster]:
    cluster = Cluster()
    was_running = cluster.is_running()
    error: Exception | None = None
    for attempt in (1, 2):
        try:
            cluster.up(profile=lc_config.DEFAULT_PROFILE)
            error = None
            break
        except Exception as exc:  # any failure to start is reported as a test failure
            error = exc
        if was_running or attempt == 2:
            break
        # Seen once on a busy machine: kwok never marked the fake nodes Ready. Started again
        # from scratch once, rather than failing every test of the session.
        print(f"the local cluster did not start ({error}); starting it again from scratch",
              file=sys.stderr)
        cluster.down(quiet=True)
    if error is not None:
        pytest.fail(
            f"the local Kubernetes cluster could not start: {error}\n"
            f"Logs: {cluster.logs}/ and build logs in {lc_config.build_log_dir()}/ "
            f"(run `make cluster-build` then `python -m localcluster up` to reproduce).",
            pytrace=False,
        )
    # A run killed mid-way may have left webhook configurations calling a dead process:
    # with failurePolicy Fail they would refuse every AppWrapper.
    unregister_webhooks(cluster.kubectl())
    yield cluster
    if not was_running and not os.environ.get("DISPATCHER_KEEP_CLUSTER"):
        cluster.down()


@pytest.fixture(scope="session")
def fleet_clusters() -> Iterator[FleetClusters]:
    """The multi-cluster tests' manager and workers (tests/cluster/fleet.py): shared by
    their modules, each of which brings them up; stopped at the end of the run if it
    started them."""
    fleet = FleetClusters.named()
    yield fleet
    if not os.environ.get("DISPATCHER_KEEP_CLUSTER"):
        fleet.down()


@pytest.fixture(scope="session")
def kubeconfig(local_cluster: Cluster) -> Path:
    return local_cluster.kubeconfig


@pytest.fixture(scope="session")
def kubectl(local_cluster: Cluster) -> Kubectl:
    return local_cluster.kubectl()


def _namespace_name(nodeid: str) -> str:
    base = re.sub(r"[^a-z0-9]+", "-", nodeid.split("::")[-1].lower()).strip("-")[:40]
    return f"t-{base.rstrip('-')}-{uuid.uuid4().hex[:5]}"


@pytest.fixture
def namespace(kubectl: Kubectl, request: pytest.FixtureRequest) -> Iterator[str]:
    name = _namespace_name(request.node.nodeid)
    kubectl("create", "namespace", name)
    wait_for(lambda: kubectl.run("get", "serviceaccount", "default", "-n", name,
                                 check=False).returncode == 0,
             30, f"service account default in namespace {name}")
    yield name
    # Its AppWrappers first, by name: the namespace controller deletes only the kinds its
    # discovery lists at that moment, and while a test changes the CRD's versions (v1beta2
    # served, then not) it can miss AppWrappers altogether, deleting the namespace and
    # leaving them running in no namespace (seen: a wrapper that held GPUs for the rest of
    # the session, and every later wait for a quiet cluster timed out).
    kubectl.run("delete", "appwrappers", "--all", "-n", name, "--wait=false",
                "--ignore-not-found", check=False)
    kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")
    # The namespace controller gets round to the pods only after it has walked every API
    # type (seconds). A terminating namespace admits no new objects, so no controller can
    # recreate the pods: delete them now and wait (kwok removes them at once), so the next
    # test finds every GPU free. The namespace object itself may linger; that is harmless.
    ns = kubectl.in_namespace(name)
    ns("delete", "pods", "--all", "--wait=false", "--ignore-not-found")
    wait_for(lambda: not ns.items("pods"), 60, f"the pods of namespace {name} to be deleted")


@pytest.fixture
def k(kubectl: Kubectl, namespace: str) -> Kubectl:
    return kubectl.in_namespace(namespace)


@pytest.fixture
def node_profile(local_cluster: Cluster) -> Iterator[Callable[[str], list[str]]]:
    applied: list[str] = []

    def use(name: str, timeout: float = 60) -> list[str]:
        applied.append(name)
        # Through the cluster, which records the profile: a run interrupted here leaves a
        # cluster whose next `up` knows to put the default nodes back.
        return local_cluster.use_profile(name, timeout=timeout)

    yield use
    if applied:
        local_cluster.use_profile(lc_config.DEFAULT_PROFILE)


@pytest.fixture(scope="session")
def kube_api_client(kubeconfig: Path) -> Any:
    from kubernetes import config as k8s_config

    return k8s_config.new_client_from_config(config_file=str(kubeconfig))


@pytest.fixture(scope="session")
def as_user(local_cluster: Cluster, kubectl: Kubectl) -> Callable[[str], Kubectl]:
    def acting_as(name: str) -> Kubectl:
        user = next((u for u in users.USERS if u.name == name), None)
        return Kubectl(kubectl.binary, users.kubeconfig(local_cluster.dir, name),
                       user.namespace if user is not None else None)

    return acting_as


@pytest.fixture(scope="module")
def deployed(local_cluster: Cluster, kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[Installed]:
    install_crd(kubectl)
    apply_deploy(kubectl)
    wait_for(lambda: kubectl.json("clusterrole", "dispatcher-wrapped-kinds").get("rules"),
             60, "the aggregated ClusterRole dispatcher-wrapped-kinds to be filled in")
    tmp = tmp_path_factory.mktemp("deployed")
    configs = {sa: service_account_kubeconfig(kubectl, local_cluster.kubeconfig, sa,
                                              tmp / f"{sa}.kubeconfig")
               for sa in (WEBHOOK_SA, CONTROLLER_SA)}
    webhook = WebhookProcess(configs[WEBHOOK_SA], local_cluster.logs / "deployed",
                             SYSTEM_NAMESPACE)
    try:
        webhook.serve(kubectl)
        yield Installed("deployed", webhook, configs[CONTROLLER_SA])
    finally:
        webhook.stop()
        delete_deploy(kubectl)
