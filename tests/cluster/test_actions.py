"""Actions and visibility on a real control plane: a tenant holds, releases, cancels and
asks why with `kubectl appwrapper`, within its own namespace only, under the example Role;
and `dispatcher queue`, the visibility endpoint and the controller agree on the order
under the priority policy."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcluster import Cluster, Kubectl, wait_for

from .dispatcher_process import REPO, DispatcherProcess, install_crd
from .test_operations import (
    appwrapper,
    free_port,
    job,
    last_condition,
    uniform_gpu_nodes,
    wait_alone,
)

ROLE = REPO / "deploy" / "examples" / "tenant-role.yaml"
VISIBILITY = "/apis/visibility.workload.codeflare.dev/v1beta1"


@pytest.fixture
def dispatcher(local_cluster: Cluster, kubectl: Kubectl) -> Iterator[DispatcherProcess]:
    install_crd(kubectl)
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs, "actions")
    yield d
    d.finish()


def plugin(tmp_path: Path) -> Path:
    """kubectl-appwrapper on a PATH of its own, as installing the package puts it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / "kubectl-appwrapper"
    path.write_text(f"#!{sys.executable}\nimport sys\nfrom dispatcher.cli import "
                    "kubectl_plugin\nsys.exit(kubectl_plugin())\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def as_tenant(kubectl: Kubectl, alice: Kubectl, bin_dir: Path, *args: str
              ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "KUBECONFIG": str(alice.kubeconfig), "PYTHONPATH": str(REPO)}
    return subprocess.run([kubectl.binary, "appwrapper", *args], capture_output=True,
                          text=True, env=env, cwd=bin_dir)


def annotations(k: Kubectl, name: str) -> dict[str, str]:
    return dict(k.json("appwrapper", name)["metadata"].get("annotations") or {})


def test_a_tenant_holds_releases_cancels_and_asks_why_in_its_namespace_only(
        dispatcher: DispatcherProcess, kubectl: Kubectl, k: Kubectl, namespace: str,
        as_user: Any, tmp_path: Path) -> None:
    wait_alone(kubectl, namespace)
    role = [dict(d, metadata={**d["metadata"], "namespace": namespace})
            for d in yaml.safe_load_all(ROLE.read_text())]
    kubectl.apply(role)
    alice = as_user("alice").in_namespace(namespace)
    bin_dir = plugin(tmp_path)
    dispatcher.start("fifo")
    nodes, per_node = uniform_gpu_nodes(kubectl)
    # The cluster is full of `hog`; `waits` queues behind it.
    alice.apply(appwrapper("hog", job("hog", nodes, per_node)))
    wait_for(lambda: last_condition(k, "hog").get("type") == "Running", 90, "hog running")
    alice.apply(appwrapper("waits", job("waits", 1, 1)))
    wait_for(lambda: k.json("appwrapper", "waits").get("status", {}).get("queuePosition")
             == 1, 60, "waits to be numbered first")

    held = as_tenant(kubectl, alice, bin_dir, "hold", "waits", "-n", namespace)
    assert held.returncode == 0, held.stderr
    assert annotations(k, "waits")["workload.codeflare.dev/held-by"] == "alice"
    wait_for(lambda: last_condition(k, "waits").get("reason") == "Held", 60, "Held")
    assert last_condition(k, "waits")["message"].startswith("held by alice:")
    why = as_tenant(kubectl, alice, bin_dir, "why", "waits", "-n", namespace)
    assert why.returncode == 0, why.stderr
    assert why.stdout.startswith(f"{namespace}/waits: Pending, Queueing/Held")
    assert "  held by    alice" in why.stdout
    # The hog goes: the room is free, and the held one stays queued, not dispatched.
    alice("delete", "appwrapper", "hog")
    wait_for(lambda: not k.items("pods"), 90, "hog's pods to go")
    dispatcher_cycles_later = last_condition(k, "waits")
    assert dispatcher_cycles_later["reason"] == "Held"
    assert not k.items("jobs")

    released = as_tenant(kubectl, alice, bin_dir, "release", "waits", "-n", namespace)
    assert released.returncode == 0, released.stderr
    wait_for(lambda: last_condition(k, "waits").get("type") == "Running", 90,
             "waits to run once released")
    why = as_tenant(kubectl, alice, bin_dir, "why", "waits", "-n", namespace)
    assert why.stdout.startswith(f"{namespace}/waits: Running, Running/PodsRunning")

    cancelled = as_tenant(kubectl, alice, bin_dir, "cancel", "waits", "-n", namespace)
    assert cancelled.returncode == 0, cancelled.stderr
    wait_for(lambda: last_condition(k, "waits").get("reason") == "Cancelled", 60,
             "waits cancelled")
    assert k.json("appwrapper", "waits")["status"]["state"] == "Failed"
    wait_for(lambda: not k.items("jobs"), 60, "what it created to be deleted")

    # Not in bob's namespace: RBAC refuses, and the command says what to do.
    k2 = kubectl.in_namespace("team-b")
    k2.apply(appwrapper("bobs", job("bobs", 1, 1)))
    try:
        for action in ("hold", "cancel", "why"):
            refused = as_tenant(kubectl, alice, bin_dir, action, "bobs", "-n", "team-b")
            assert refused.returncode == 1
            assert refused.stderr.startswith(f"kubectl appwrapper {action}: you may not ")
            assert "in namespace team-b" in refused.stderr and "Permissions" in refused.stderr
        assert "workload.codeflare.dev/held-by" not in annotations(k2, "bobs")
        assert "workload.codeflare.dev/cancelled-by" not in annotations(k2, "bobs")
    finally:
        k2("delete", "appwrapper", "bobs", "--ignore-not-found")


def viewer_token(kubectl: Kubectl, namespace: str) -> str:
    """A service account allowed to list AppWrappers in every namespace (the visibility
    endpoint's whole queue), and its token."""
    name = f"{namespace}-queue-viewer"
    kubectl.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "viewer", "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name},
         "rules": [{"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"],
                    "verbs": ["list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": "viewer",
                       "namespace": namespace}]}])
    return kubectl("create", "token", "viewer", "-n", namespace).strip()


def endpoint(port: int, token: str, path: str) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{VISIBILITY}{path}",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


def test_queue_and_the_endpoint_agree_with_the_controllers_order_under_priority(
        dispatcher: DispatcherProcess, local_cluster: Cluster, kubectl: Kubectl, k: Kubectl,
        namespace: str) -> None:
    wait_alone(kubectl, namespace)
    token = viewer_token(kubectl, namespace)
    port = free_port()
    try:
        dispatcher.start("priority", extra_args=["--metrics-port", str(port),
                                                 "--metrics-host", "127.0.0.1"])
        # More GPUs than any node has: none dispatches, none holds the line; the order is
        # priority's, ties by arrival.
        for name, priority in (("p1", 1), ("p9", 9), ("p5a", 5), ("p5b", 5)):
            obj = appwrapper(name, job(name, 1, 64))
            obj["spec"]["priority"] = priority
            k.apply(obj)
        want = ["p9", "p5a", "p5b", "p1"]

        def queue() -> list[str]:
            out = subprocess.run(
                [sys.executable, "-m", "dispatcher.cli", "queue", "--kubeconfig",
                 str(local_cluster.kubeconfig), "-n", namespace, "-o", "json"],
                capture_output=True, text=True, check=True, cwd=REPO).stdout
            data = json.loads(out)
            assert data["policy"] == "priority"
            return [e["name"] for e in data["pending"] if e["position"] is not None]

        def served() -> list[str]:
            body = endpoint(port, token, f"/namespaces/{namespace}/pendingappwrappers")
            assert body["policy"] == "priority"
            return [i["metadata"]["name"] for i in body["items"]]

        wait_for(lambda: served() == want, 60, f"the endpoint to serve {want}")
        wait_for(lambda: queue() == want, 60, f"dispatcher queue to show {want}")
        # One more, second by priority: the endpoint has it at once; the statuses, and so
        # `queue`, once their writes have caught up (a move alone waits up to a minute).
        urgent = appwrapper("p7", job("p7", 1, 64))
        urgent["spec"]["priority"] = 7
        k.apply(urgent)
        want = ["p9", "p7", "p5a", "p5b", "p1"]
        wait_for(lambda: served() == want, 60, f"the endpoint to serve {want}")
        wait_for(lambda: queue() == want, 120, f"dispatcher queue to show {want}")
        positions = {a["metadata"]["name"]: a["status"]["queuePosition"]
                     for a in k.items("appwrappers")}
        whole = endpoint(port, token, "/pendingappwrappers")
        assert {i["metadata"]["name"]: i["positionInCluster"]
                for i in whole["items"] if i["metadata"]["namespace"] == namespace} \
            == positions
        # Who may not list AppWrappers everywhere is refused the whole queue.
        with pytest.raises(urllib.error.HTTPError) as refused:
            endpoint(port, "not-a-token", "/pendingappwrappers")
        assert refused.value.code == 401
    finally:
        name = f"{namespace}-queue-viewer"
        kubectl("delete", "clusterrole,clusterrolebinding", name, "--ignore-not-found")
