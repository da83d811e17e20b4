"""``make demo-real``: the dispatcher as users run it, on the local cluster's real node.

Starts (or reuses) the local cluster with its real node, builds the image (or takes it from
the cache) and imports it into the node, installs charts/dispatcher with it (its pods on the
real node), then submits a gang of two real containers that call each other by name and
prints the AppWrapper and its pods until the gang has completed. The cluster and the
release are left running (``helm uninstall dispatcher -n dispatcher-system``,
``python -m localcluster down``).

    python -m localcluster.real_demo [--timeout 300]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import yaml

from . import build, node
from .cluster import Cluster
from .image import REPO, describe
from .image_build import build_image
from .kube import Kubectl, wait_for

CHART = REPO / "charts" / "dispatcher"
NAMESPACE = "dispatcher-system"
DEMO_NAMESPACE = "demo-real"
#: What puts a pod on the real node: its label selected, its taint tolerated.
ON_REAL_NODE: dict[str, Any] = {
    "nodeSelector": {node.LABEL: "true"},
    "tolerations": [{"key": node.LABEL, "operator": "Exists", "effect": "NoSchedule"}],
}

#: Every pod listens, calls every other by name, and exits once all have called it: it
#: succeeds only if the whole gang ran at the same time.
PEERS = textwrap.dedent("""\
    import os, socket, sys, threading, time
    peers = os.environ["PEERS"].split(",")
    me = os.environ["HOSTNAME"]
    others = [p for p in peers if not p.startswith(me + ".")]
    server = socket.create_server(("", 7000))
    called = []
    def accept():
        while len(called) < len(others):
            conn, _ = server.accept()
            called.append(conn.recv(64))
    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    deadline = time.monotonic() + 150
    for peer in others:
        while True:
            try:
                with socket.create_connection((peer, 7000), timeout=2) as s:
                    s.sendall(me.encode())
                break
            except OSError:
                if time.monotonic() > deadline:
                    sys.exit(f"{peer} never answered")
                time.sleep(0.5)
    listener.join(150)
    print(me, "met", sorted(c.decode() for c in called), flush=True)
    sys.exit(0 if len(called) == len(others) else 2)
    """)


def chart_values(image: str) -> dict[str, Any]:
    """The chart's values for an image imported into the node: never pulled, pods there."""
    repository, _, tag = image.rpartition(":")
    return {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "controller": ON_REAL_NODE, "webhook": ON_REAL_NODE}


def install_chart(cluster: Cluster, image: str, values_file: Path) -> None:
    """charts/dispatcher installed (or upgraded) as its README says: the namespace first,
    enforcing the restricted Pod Security Standard."""
    cluster.kubectl().apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    values_file.write_text(yaml.safe_dump(chart_values(image)))
    done = helm(cluster, "upgrade", "--install", "dispatcher", CHART, "-n", NAMESPACE,
                "-f", values_file, "--wait", "--timeout", "5m")
    if done.returncode != 0:
        raise RuntimeError(f"helm install failed: {done.stderr.strip()}")
    wait_for_webhook(cluster.kubectl())


def wait_for_webhook(kubectl: Kubectl, timeout: float = 120) -> None:
    """Wait until the API server reaches the webhook through its Service. A pod Ready is
    not yet a Service that routes to it: kube-proxy writes its rules a moment later, and
    until then every AppWrapper is refused (the webhook fails closed). The probe is a valid
    AppWrapper created as a dry run: only the webhooks' answer lets it through."""
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "probe"}}
    probe = json.dumps({"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                        "metadata": {"name": "webhook-probe", "namespace": NAMESPACE},
                        "spec": {"resources": {"GenericItems": [
                            {"generictemplate": config_map}]}}})
    wait_for(lambda: kubectl.run("create", "--dry-run=server", "-f", "-", input=probe),
             timeout, "the API server to reach the dispatcher's webhook")


def helm(cluster: Cluster, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(build.binary("helm")), *map(str, args), "--kubeconfig",
                           str(cluster.kubeconfig)], capture_output=True, text=True,
                          check=False)


def python_container(image: str, program: str, env: dict[str, str]) -> dict[str, Any]:
    """A container of the dispatcher's image (it has Python) running `program`."""
    return {"name": "main", "image": image, "imagePullPolicy": "Never",
            "command": ["python3", "-c", program],
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                          "limits": {"memory": "256Mi"}}}


def gang(image: str, name: str = "gang", pods: int = 2) -> dict[str, Any]:
    """An AppWrapper of an indexed Job whose pods find each other through a headless
    Service (wrapped too), on the real node."""
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
               "spec": {"clusterIP": "None", "selector": {"job-name": name},
                        "publishNotReadyAddresses": True, "ports": [{"port": 7000}]}}
    peers = ",".join(f"{name}-{i}.{name}" for i in range(pods))
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"completions": pods, "parallelism": pods, "completionMode": "Indexed",
                    "backoffLimit": 0,
                    "template": {"spec": {
                        "subdomain": name, "restartPolicy": "Never", **ON_REAL_NODE,
                        "containers": [python_container(image, PEERS, {"PEERS": peers})]}}}}
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name},
            "spec": {"resources": {"GenericItems": [{"generictemplate": service},
                                                    {"generictemplate": job}]}}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localcluster.real_demo")
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args(argv)
    cluster = Cluster()
    cluster.up(real_node=True)
    built = build_image()
    print(f"image {describe().reference}: {built.size / 1e6:.0f} MB, "
          f"{'from the cache' if built.reused else f'built in {built.seconds:.0f} s'}")
    cluster.real_node().import_image(built.path)
    start = time.monotonic()
    install_chart(cluster, describe().reference, cluster.dir / "demo-values.yaml")
    print(f"helm install: the dispatcher's pods ready in {time.monotonic() - start:.0f} s")
    print(cluster.kubectl()("get", "pods", "-n", NAMESPACE, "-o", "wide"))
    k = cluster.kubectl(DEMO_NAMESPACE)
    cluster.kubectl().apply({"apiVersion": "v1", "kind": "Namespace",
                             "metadata": {"name": DEMO_NAMESPACE}})
    k("delete", "appwrapper", "gang", "--ignore-not-found", "--wait=true")
    k.create(gang(describe().reference))
    state = wait_for(lambda: _settled(k), args.timeout, "the real gang to finish")
    print(k("get", "appwrappers,pods", "-o", "wide"))
    print(k("logs", "-l", "job-name=gang"))
    print(f"AppWrapper gang: {state}")
    return 0 if state == "Completed" else 1


def _settled(k: Kubectl) -> str | None:
    state = (k.json("appwrapper", "gang").get("status") or {}).get("state")
    return str(state) if state in ("Completed", "Failed") else None


if __name__ == "__main__":
    sys.exit(main())
