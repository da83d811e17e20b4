"""Admission at the API server's pace, for items that cost nothing to run (issue 14).

Runs in one process, same local cluster, same client (16 threads posting), one after the
other:
1. direct: N ConfigMaps created by POST — the API server's own create rate, the ceiling;
2. floor: N AppWrappers posted, and for each, from the same threads and with no decision
   at all, what any controller that keeps MCAD's conditions must send: the Dispatched
   status written before the item is created, the ConfigMap, then the Running status.
   What the API server alone needs for an AppWrapper: no controller does better here;
3. dispatcher: N AppWrappers, each wrapping one ConfigMap, posted the same way and
   dispatched by `dispatcher run`.
For the last two the time runs from the first POST until every wrapped ConfigMap exists.
Prints the rates, their ratios to direct (target: >= 0.5) and to the floor, the CPU
seconds of each component and the requests the API server served per object.

Usage: python bench/cheap.py [--wrappers 1000] [--modes direct,floor,dispatcher]
       [--dispatcher-args '--kube-qps 100']
(starts the local cluster; leaves it running.)
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from e2e import bench_cluster, conditions, cpu_seconds, post, start_dispatcher  # noqa: E402
from scale import apiserver_requests  # noqa: E402

LABEL = "bench.dispatcher/cheap"


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {LABEL: "1"}}, "data": {"k": "v"}}


def appwrapper(name: str) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name},
            "spec": {"resources": {"GenericItems": [{"generictemplate": configmap(name)}]}}}


def by_hand(custom: Any, core: Any, ns: str) -> Callable[[dict[str, Any]], None]:
    """The floor: one AppWrapper through its MCAD chain with nothing decided."""
    group = ("workload.codeflare.dev", "v1beta1", ns, "appwrappers")
    dispatched = ("Init", "Queueing", "HeadOfLine", "Dispatched")

    def one(aw: dict[str, Any]) -> None:
        name = aw["metadata"]["name"]
        custom.create_namespaced_custom_object(*group, aw)
        custom.patch_namespaced_custom_object_status(*group, name, {"status": {
            "state": "Running", "conditions": conditions(*dispatched)}})
        core.create_namespaced_config_map(ns, configmap(name))
        custom.patch_namespaced_custom_object_status(*group, name, {"status": {
            "state": "Running", "conditions": conditions(*dispatched, "Running")}})
    return one


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wrappers", type=int, default=1000)
    ap.add_argument("--modes", default="direct,floor,dispatcher")
    ap.add_argument("--dispatcher-args", default="",
                    help="more arguments for `dispatcher run`, e.g. '--kube-qps 100'")
    args = ap.parse_args()
    from kubernetes import client, watch

    cluster, kubectl, api = bench_cluster()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    names = [f"cm-{i:05d}" for i in range(args.wrappers)]
    rates: dict[str, float] = {}

    def arrivals(ns: str, done: threading.Event, last: list[float]) -> None:
        """Until `done`: watch the bench's ConfigMaps in `ns` appear; once all have, the
        time the last one did goes into `last`. (Listing them over and over would cost the
        API server more than creating them.)"""
        listed = core.list_namespaced_config_map(ns, label_selector=LABEL)
        seen = {cm.metadata.name for cm in listed.items}
        version = listed.metadata.resource_version
        while not done.is_set():
            w = watch.Watch()
            for ev in w.stream(core.list_namespaced_config_map, ns, label_selector=LABEL,
                               resource_version=version, timeout_seconds=5):
                version = ev["object"].metadata.resource_version
                if ev["type"] == "ADDED":
                    seen.add(ev["object"].metadata.name)
                    if len(seen) == len(names):
                        last.append(time.monotonic())
                        done.set()
                        w.stop()

    for mode in args.modes.split(","):
        # A new namespace each run: one deleted and made again is looked up live by the
        # API server for a while at every create in it (NamespaceLifecycle).
        ns = f"bench-cheap-{mode}-{int(time.time())}"
        kubectl("create", "namespace", ns)
        proc = None
        if mode == "dispatcher":
            proc = start_dispatcher(cluster, "dispatcher-cheap", args.dispatcher_args)
        try:
            cpu0 = cpu_seconds(proc.pid if proc else None)
            served0 = apiserver_requests(kubectl)
            done, last = threading.Event(), []
            watcher = threading.Thread(target=arrivals, args=(ns, done, last), daemon=True)
            watcher.start()
            time.sleep(0.5)  # the watch is open
            t0 = time.monotonic()
            if mode == "direct":
                post([configmap(n) for n in names],
                     lambda o, ns=ns: core.create_namespaced_config_map(ns, o))
            elif mode == "floor":
                post([appwrapper(n) for n in names], by_hand(custom, core, ns))
            else:
                post([appwrapper(n) for n in names],
                     lambda o, ns=ns: custom.create_namespaced_custom_object(
                         "workload.codeflare.dev", "v1beta1", ns, "appwrappers", o))
            if not done.wait(900):
                raise TimeoutError(f"{len(names)} ConfigMaps in {ns}: not after 900 s")
            seconds = last[0] - t0
            rates[mode] = len(names) / seconds
            print(f"{mode}: {len(names)} ConfigMaps in {seconds:.1f} s = "
                  f"{rates[mode]:.0f}/s", flush=True)
            cpu = cpu_seconds(proc.pid if proc else None) - cpu0
            cores = (os.cpu_count() or 1) * seconds
            print(f"  CPU seconds: {sum(cpu.values()):.1f} of {cores:.0f} core-seconds ("
                  + ", ".join(f"{k} {v:.1f}" for k, v in cpu.most_common()) + ")")
            if mode == "dispatcher":
                time.sleep(5)  # the last ones' writes after their items
            served = apiserver_requests(kubectl) - served0
            print(f"  requests served per {'ConfigMap' if mode == 'direct' else 'AppWrapper'}: "
                  f"{sum(served.values()) / len(names):.2f} (" + ", ".join(
                      f"{k} {v / len(names):.2f}" for k, v in served.most_common()
                      if v >= len(names) / 100) + ")", flush=True)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
        # Gone before the next run: a dispatcher started next would take the floor's
        # wrappers (Running, by their status) for its own and make their items again.
        kubectl("delete", "namespace", ns, "--wait=true", timeout=600)
    for mode in ("floor", "dispatcher"):
        if mode in rates and "direct" in rates:
            print(f"{mode} / direct create rate = {rates[mode] / rates['direct']:.2f} "
                  "(target: >= 0.5)")
    if "floor" in rates and "dispatcher" in rates:
        print(f"dispatcher / floor = {rates['dispatcher'] / rates['floor']:.2f}")


if __name__ == "__main__":
    main()
