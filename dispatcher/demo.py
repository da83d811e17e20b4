"""`make demo`: the dispatcher on the local cluster, with one AppWrapper per wrapped kind.

Starts (or reuses) the local cluster, installs the CRD, runs `dispatcher run` in the
background, applies examples/demo/ and prints `kubectl get appwrappers` -- and, while some
wait, `dispatcher queue` with their estimated starts -- whenever the queue changes, until
every AppWrapper has settled (or --timeout). The cluster is left running; the dispatcher is
stopped.

    python -m dispatcher.demo [--policy fifo|priority|backfill] [--timeout 300]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SETTLED = {"Running", "Completed", "Failed"}
QUIET_SECONDS = 30


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dispatcher.demo")
    ap.add_argument("--policy", default="fifo")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--metrics-port", type=int, default=8080,
                    help="where the dispatcher serves /metrics (0: pick a free port)")
    ap.add_argument("--examples", default=str(REPO / "examples" / "demo"))
    args = ap.parse_args(argv)
    # A plain SIGTERM would skip the cleanup below and leave the dispatcher running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from localcluster import Cluster

    cluster = Cluster()
    cluster.up()
    kubectl = cluster.kubectl()
    namespace = "demo"
    kubectl("apply", "--server-side", "--force-conflicts", "-f",
            str(REPO / "crds" / "appwrappers.workload.codeflare.dev.yaml"))
    kubectl("wait", "--for=condition=Established", "--timeout=60s",
            "crd/appwrappers.workload.codeflare.dev")
    kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=true",
            timeout=180)
    kubectl("create", "namespace", namespace)

    log_path = cluster.logs / "dispatcher-demo.log"
    print(f"starting the dispatcher (policy {args.policy}); its log: {log_path}")
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", "run", "--kubeconfig",
             str(cluster.kubeconfig), "--policy", args.policy,
             "--metrics-port", str(args.metrics_port)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if args.metrics_port:
        print(f"metrics: http://127.0.0.1:{args.metrics_port}/metrics")
    try:
        time.sleep(3)
        k = kubectl.in_namespace(namespace)
        print(k("apply", "-f", args.examples), end="")
        if args.metrics_port:
            print(f"dashboard: {dashboard_url(kubectl, args.metrics_port, namespace)}")
        queue = [sys.executable, "-m", "dispatcher.cli", "queue", "--kubeconfig",
                 str(cluster.kubeconfig), "-n", namespace, "--policy", args.policy]
        return _watch(k, proc, args.timeout, cluster.kubeconfig,
                      lambda: subprocess.run(queue, capture_output=True, text=True,
                                             timeout=60).stdout)
    finally:
        proc.terminate()
        proc.wait(20)


VIEWER = "dashboard-viewer"


def dashboard_url(kubectl: Any, port: int, namespace: str) -> str:
    """The dashboard's address with a token of a service account that may list every
    namespace's AppWrappers, in the fragment (which the browser never sends; the page
    takes it and drops it from the address bar)."""
    kubectl.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": VIEWER, "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": VIEWER},
         "rules": [{"apiGroups": ["workload.codeflare.dev"], "resources": ["appwrappers"],
                    "verbs": ["list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": VIEWER},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": VIEWER},
         "subjects": [{"kind": "ServiceAccount", "name": VIEWER, "namespace": namespace}]}])
    token = kubectl("create", "token", VIEWER, "-n", namespace, "--duration=24h").strip()
    return f"http://127.0.0.1:{port}/dashboard/#token={token}"


def _watch(k: object, proc: subprocess.Popen[bytes], timeout: float, kubeconfig: Path,
           queue: Callable[[], str] | None = None) -> int:
    from localcluster import Kubectl

    assert isinstance(k, Kubectl)
    start = time.monotonic()
    last, changed = "", start
    while time.monotonic() - start < timeout:
        if proc.poll() is not None:
            print(f"the dispatcher exited with {proc.returncode}", file=sys.stderr)
            return 1
        statuses = {aw["metadata"]["name"]: aw.get("status", {})
                    for aw in k.items("appwrappers")}
        states = [st.get("queuejobstate", "") for st in statuses.values()]
        # Not the table itself: its AGE column changes every time.
        now = repr([(name, st.get("queuejobstate"), st.get("message"))
                    for name, st in statuses.items()])
        if now != last:
            print(f"\n--- t+{time.monotonic() - start:.0f}s: kubectl get appwrappers -o wide")
            print(k("get", "appwrappers", "-o", "wide"), end="")
            if queue is not None and any(s not in SETTLED for s in states):
                print("\n--- dispatcher queue (ETA: the estimated start)")
                print(queue(), end="")
            last, changed = now, time.monotonic()
        # Done when nothing waits any more and the table has been still for a while
        # (a RayCluster runs until deleted, so "all completed" may never come).
        if states and all(s in SETTLED for s in states) \
                and time.monotonic() - changed > QUIET_SECONDS:
            break
        time.sleep(2)
    print(f"\nGPU pods now:\n{k('get', 'pods', '-o', 'wide')}")
    print(f"The cluster keeps running: export KUBECONFIG={kubeconfig}; "
          "`python -m localcluster down` stops it.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
