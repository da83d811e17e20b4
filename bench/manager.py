"""A manager over two workers against one worker alone: how fast 1,000 small AppWrappers
go from submitted to Running.

Three local control planes side by side (`<cluster>-manager`, `-w1`, `-w2`, as the
multi-cluster tests make them), each worker running `dispatcher run`. Two runs in one
process, one after the other, the same N AppWrappers each (one ConfigMap each: nothing to
schedule, so what is timed is dispatch, not pods):
1. one worker alone: the AppWrappers posted to w1, its dispatcher runs them;
2. the manager: the AppWrappers posted to the manager cluster (`dispatcher run --manager`
   with w1 and w2 as WorkerClusters), which sends each to a worker, where its dispatcher
   runs the copy, and mirrors Running back.
Timed from the first POST until every AppWrapper where it was posted says Running (read
every half second). Prints both rates and their ratio.

Usage: python bench/manager.py [--wrappers 1000]
(starts the three clusters without operators; leaves them running.)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from e2e import post  # noqa: E402

from localcluster import Cluster, Kubectl, wait_for  # noqa: E402
from localcluster import config as lc_config  # noqa: E402
from localcluster.testing import register_workers  # noqa: E402
from tests.cluster.dispatcher_process import DispatcherProcess, install_crd  # noqa: E402

WORKER_CRD = REPO / "crds" / "workerclusters.workload.codeflare.dev.yaml"


def appwrapper(name: str) -> dict[str, Any]:
    item = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
            "data": {"k": "v"}}
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name},
            "spec": {"resources": {"GenericItems": [{"generictemplate": item}]}}}


def running(k: Kubectl) -> int:
    return sum(1 for aw in k.items("aw") if (aw.get("status") or {}).get("state") == "Running")


def timed(cluster: Cluster, namespace: str, count: int) -> float:
    """Post `count` AppWrappers into `cluster`'s `namespace`; seconds until all Running."""
    from kubernetes import client
    from kubernetes import config as kconfig

    api = client.CustomObjectsApi(kconfig.new_client_from_config(
        config_file=str(cluster.kubeconfig)))
    create: Callable[[dict[str, Any]], Any] = lambda obj: api.create_namespaced_custom_object(  # noqa: E731
        "workload.codeflare.dev", "v1beta1", namespace, "appwrappers", obj)
    k = cluster.kubectl(namespace)
    started = time.monotonic()
    post([appwrapper(f"aw-{i:04d}") for i in range(count)], create)
    posted = time.monotonic() - started
    wait_for(lambda: running(k) == count, 1800, f"{count} AppWrappers Running in "
             f"{cluster.name}/{namespace}", interval=0.5)
    seconds = time.monotonic() - started
    print(f"  {cluster.name}: posted in {posted:.1f}s, all Running after {seconds:.1f}s",
          flush=True)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wrappers", type=int, default=1000)
    args = ap.parse_args()
    base = lc_config.cluster_name()
    manager = Cluster(f"{base}-manager")
    workers = {w: Cluster(f"{base}-{w}") for w in ("w1", "w2")}
    for c in (manager, *workers.values()):
        c.up(profile="pool", operators=False)
        install_crd(c.kubectl())
    register_workers(manager.kubectl(), {w: c.kubeconfig for w, c in workers.items()},
                     WORKER_CRD)
    procs = {w: DispatcherProcess(c.kubeconfig, c.logs, f"bench-dispatcher-{w}")
             for w, c in workers.items()}
    boss = DispatcherProcess(manager.kubeconfig, manager.logs, "bench-manager")
    namespace = f"bench-{int(time.time())}"
    try:
        for p in procs.values():
            p.start("fifo")
        for c in (manager, *workers.values()):
            c.kubectl()("create", "namespace", namespace)
        print(f"{args.wrappers} AppWrappers of one ConfigMap each", flush=True)
        print("one worker alone:", flush=True)
        alone = timed(workers["w1"], namespace, args.wrappers)
        workers["w1"].kubectl(namespace)("delete", "aw", "--all", "--wait=false")
        wait_for(lambda: not workers["w1"].kubectl(namespace).items("aw"), 600,
                 "w1's AppWrappers to be gone")
        boss.start("fifo", extra_args=["--manager"])
        print("the manager over two workers:", flush=True)
        fleet = timed(manager, namespace, args.wrappers)
        spread = {w: len(c.kubectl(namespace).items("aw")) for w, c in workers.items()}
    finally:
        boss.stop()
        for p in procs.values():
            p.stop()
    print()
    print(f"{'':<28}{'seconds':>9}{'AppWrappers/s':>15}")
    print(f"{'one worker alone':<28}{alone:>9.1f}{args.wrappers / alone:>15.1f}")
    print(f"{'manager over two workers':<28}{fleet:>9.1f}{args.wrappers / fleet:>15.1f}")
    print(f"ratio (manager / alone): {alone / fleet:.2f}; copies per worker: "
          + ", ".join(f"{w} {n}" for w, n in spread.items()))


if __name__ == "__main__":
    main()
