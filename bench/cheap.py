"""Admission at the API server's pace, for items that cost nothing to run.

Runs in one process, same local cluster (--nodes fake nodes), same client (16 threads
posting), each mode one after the other, for --rounds rounds:
- floor: N AppWrappers posted, and for each, from the same threads and with no decision
  at all, the least any AppWrapper controller can cause: one status write (Dispatched,
  written before the item is created), then the wrapped ConfigMap. What kubectl alone
  does; no controller does better;
- dispatcher: N AppWrappers, each wrapping one ConfigMap, posted the same way and
  dispatched by `dispatcher run` with its default flags (--dispatcher-args adds some);
- direct (only when asked for in --modes): N ConfigMaps created by POST, the API
  server's own create rate;
- watched (only when asked for in --modes): the floor, while a watch on the namespace's
  AppWrappers reads every event — what any controller that learns of AppWrappers by
  watching them also costs the API server (serving the events), which the floor leaves out.
The time runs from the first POST until every wrapped ConfigMap exists. Prints, per round,
the rates and the dispatcher's ratio to the floor; their medians over the rounds; the CPU
seconds of each component; and the requests the API server served per wrapper, by verb
and resource (the fake nodes' heartbeats left out).

Usage: python bench/cheap.py [--wrappers 1000] [--nodes 64] [--rounds 3]
       [--modes floor,dispatcher] [--dispatcher-args '--kube-qps 100']
(starts the local cluster; leaves it running.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from e2e import bench_cluster, conditions, cpu_seconds, post, profile_file, start_dispatcher  # noqa: E402
from scale import apiserver_requests  # noqa: E402

LABEL = "bench.dispatcher/cheap"
# Requests of the fake nodes' heartbeats (kwok) and of leader election: not the wrappers'.
BACKGROUND = frozenset({"leases", "nodes", "nodes/status"})


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": {LABEL: "1"}}, "data": {"k": "v"}}


def appwrapper(name: str) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name},
            "spec": {"resources": {"GenericItems": [{"generictemplate": configmap(name)}]}}}


def by_hand(custom: Any, core: Any, ns: str) -> Callable[[dict[str, Any]], None]:
    """The floor: one AppWrapper through its MCAD chain with nothing decided, in one
    status write before its item."""
    group = ("workload.codeflare.dev", "v1beta1", ns, "appwrappers")
    dispatched = ("Init", "Queueing", "HeadOfLine", "Dispatched")

    def one(aw: dict[str, Any]) -> None:
        name = aw["metadata"]["name"]
        custom.create_namespaced_custom_object(*group, aw)
        custom.patch_namespaced_custom_object_status(*group, name, {"status": {
            "state": "Running", "conditions": conditions(*dispatched)}})
        core.create_namespaced_config_map(ns, configmap(name))
    return one


class Watcher:
    """Reads every AppWrapper event of one namespace, as a controller's watch would."""

    def __init__(self, custom: Any, ns: str) -> None:
        self.custom, self.ns = custom, ns
        self.events = 0
        self.done = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        from kubernetes import watch

        group = ("workload.codeflare.dev", "v1beta1", self.ns, "appwrappers")
        version = self.custom.list_namespaced_custom_object(*group)["metadata"][
            "resourceVersion"]
        while not self.done.is_set():
            for ev in watch.Watch().stream(self.custom.list_namespaced_custom_object, *group,
                                           resource_version=version, timeout_seconds=5):
                version = ev["object"]["metadata"]["resourceVersion"]
                self.events += 1


class Arrivals:
    """Watches the bench's ConfigMaps in one namespace appear; `last` is when the last of
    `expected` did. (Listing them over and over would cost the API server more than
    creating them.)"""

    def __init__(self, core: Any, ns: str, expected: int) -> None:
        self.core, self.ns, self.expected = core, ns, expected
        self.done = threading.Event()
        self.last = 0.0
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        from kubernetes import watch

        listed = self.core.list_namespaced_config_map(self.ns, label_selector=LABEL)
        seen = {cm.metadata.name for cm in listed.items}
        version = listed.metadata.resource_version
        while not self.done.is_set():
            w = watch.Watch()
            for ev in w.stream(self.core.list_namespaced_config_map, self.ns,
                               label_selector=LABEL, resource_version=version,
                               timeout_seconds=5):
                version = ev["object"].metadata.resource_version
                if ev["type"] == "ADDED":
                    seen.add(ev["object"].metadata.name)
                    if len(seen) == self.expected:
                        self.last = time.monotonic()
                        self.done.set()
                        w.stop()


def requests_text(served: Counter[str], wrappers: int) -> str:
    """Requests per wrapper, by verb and resource, busiest first."""
    shown = [(what, n / wrappers) for what, n in served.most_common()
             if what.split()[1] not in BACKGROUND and n >= wrappers / 100]
    total = sum(n for _, n in shown)
    return f"{total:.2f} (" + ", ".join(f"{what} {n:.2f}" for what, n in shown) + ")"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wrappers", type=int, default=1000)
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", default="floor,dispatcher")
    ap.add_argument("--dispatcher-args", default="",
                    help="more arguments for `dispatcher run`, e.g. '--kube-qps 100'")
    args = ap.parse_args()
    from kubernetes import client

    cluster, kubectl, api = bench_cluster(str(profile_file(args.nodes)))
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    names = [f"cm-{i:05d}" for i in range(args.wrappers)]
    modes = args.modes.split(",")
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    served: dict[str, Counter[str]] = {mode: Counter() for mode in modes}

    def one_run(mode: str, round_: int) -> None:
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
            arrivals = Arrivals(core, ns, len(names))
            watcher = Watcher(custom, ns) if mode == "watched" else None
            time.sleep(0.5)  # the watch is open
            t0 = time.monotonic()
            if mode == "direct":
                post([configmap(n) for n in names],
                     lambda o, ns=ns: core.create_namespaced_config_map(ns, o))
            elif mode in ("floor", "watched"):
                post([appwrapper(n) for n in names], by_hand(custom, core, ns))
            else:
                post([appwrapper(n) for n in names],
                     lambda o, ns=ns: custom.create_namespaced_custom_object(
                         "workload.codeflare.dev", "v1beta1", ns, "appwrappers", o))
            if not arrivals.done.wait(900):
                raise TimeoutError(f"{len(names)} ConfigMaps in {ns}: not after 900 s")
            seconds = arrivals.last - t0
            if watcher is not None:
                watcher.done.set()
            rates[mode].append(len(names) / seconds)
            cpu = cpu_seconds(proc.pid if proc else None) - cpu0
            cores = (os.cpu_count() or 1) * seconds
            if mode == "dispatcher":
                time.sleep(5)  # the last ones' writes after their items
            now = apiserver_requests(kubectl) - served0
            served[mode] += now
            print(f"round {round_} {mode}: {len(names)} ConfigMaps in {seconds:.1f} s = "
                  f"{rates[mode][-1]:.1f}/s; CPU seconds {sum(cpu.values()):.1f} of "
                  f"{cores:.0f} core-seconds (" + ", ".join(
                      f"{k} {v:.1f}" for k, v in cpu.most_common()) + ")", flush=True)
            print(f"  requests per wrapper: {requests_text(now, len(names))}", flush=True)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)
        # Gone before the next run: a dispatcher started next would take the floor's
        # wrappers (Running, by their status) for its own and make their items again.
        kubectl("delete", "namespace", ns, "--wait=true", timeout=600)

    for round_ in range(1, args.rounds + 1):
        for mode in modes:
            one_run(mode, round_)
    print(f"\n{args.wrappers} ConfigMap wrappers, {args.nodes} nodes, {args.rounds} rounds "
          "(wrappers/s; requests per wrapper served by the API server, all rounds)")
    for mode in modes:
        print(f"{mode:>10}: median {statistics.median(rates[mode]):6.1f}/s  (" + ", ".join(
            f"{r:.1f}" for r in rates[mode]) + ")  requests "
            + requests_text(served[mode], args.wrappers * args.rounds))
    for floor in ("floor", "watched"):
        if floor in rates and "dispatcher" in rates:
            ratios = [d / f for d, f in zip(rates["dispatcher"], rates[floor], strict=True)]
            print(f"dispatcher / {floor}: median {statistics.median(ratios):.2f} ("
                  + ", ".join(f"{r:.2f}" for r in ratios) + "; target: >= 0.9)")


if __name__ == "__main__":
    main()
