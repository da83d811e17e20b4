"""Admission at the API server's pace, for items that cost nothing to run (issue 14).

Two runs in one process, same local cluster, same client (16 threads posting):
1. directly: N ConfigMaps created by POST — the API server's own create rate, the ceiling;
2. through the dispatcher: N AppWrappers, each wrapping one ConfigMap, posted the same
   way; the time runs from the first POST until every wrapped ConfigMap exists.
Prints both rates and their ratio (target: >= 0.5), and the status PATCHes the API server
served per AppWrapper in the second run.

Usage: python bench/cheap.py [--wrappers 1000] [--dispatcher-args '--kube-qps 100']
(starts the local cluster; leaves it running.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from e2e import bench_cluster, post, start_dispatcher  # noqa: E402
from scale import apiserver_patches  # noqa: E402

from localcluster import wait_for  # noqa: E402

LABEL = "bench.dispatcher/cheap"


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {LABEL: "1"}}, "data": {"k": "v"}}


def appwrapper(name: str) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name},
            "spec": {"resources": {"GenericItems": [{"generictemplate": configmap(name)}]}}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wrappers", type=int, default=1000)
    ap.add_argument("--dispatcher-args", default="",
                    help="more arguments for `dispatcher run`, e.g. '--kube-qps 100'")
    args = ap.parse_args()
    from kubernetes import client

    cluster, kubectl, api = bench_cluster()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    names = [f"cm-{i:05d}" for i in range(args.wrappers)]
    rates: dict[str, float] = {}

    def count(ns: str) -> int:
        return len(core.list_namespaced_config_map(ns, label_selector=LABEL).items)

    for mode in ("direct", "dispatcher"):
        ns = f"bench-cheap-{mode}"
        kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=true", timeout=600)
        kubectl("create", "namespace", ns)
        proc = None
        if mode == "dispatcher":
            proc = start_dispatcher(cluster, "dispatcher-cheap", args.dispatcher_args)
            patches = apiserver_patches(kubectl)
        try:
            t0 = time.monotonic()
            if mode == "direct":
                post([configmap(n) for n in names],
                     lambda o, ns=ns: core.create_namespaced_config_map(ns, o))
            else:
                post([appwrapper(n) for n in names],
                     lambda o, ns=ns: custom.create_namespaced_custom_object(
                         "workload.codeflare.dev", "v1beta1", ns, "appwrappers", o))
            wait_for(lambda ns=ns: count(ns) == len(names), 900,
                     f"{len(names)} ConfigMaps in {ns}", interval=0.2)
            seconds = time.monotonic() - t0
            rates[mode] = len(names) / seconds
            print(f"{mode}: {len(names)} ConfigMaps in {seconds:.1f} s = "
                  f"{rates[mode]:.0f}/s", flush=True)
            if mode == "dispatcher":
                time.sleep(5)  # the Dispatched writes of the last ones
                per = (apiserver_patches(kubectl) - patches) / len(names)
                print(f"status PATCHes per AppWrapper: {per:.2f}")
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
        kubectl("delete", "namespace", ns, "--wait=false")
    print(f"dispatcher / direct create rate = {rates['dispatcher'] / rates['direct']:.2f} "
          "(target: >= 0.5)")


if __name__ == "__main__":
    main()
