"""Prometheus metrics of the dispatcher: values against what happened, bounded labels,
cheap snapshots, and the /metrics and /healthz endpoints."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dispatcher.controller.kube.client import Resource
from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.controller.metrics.prometheus import PrometheusObserver
from dispatcher.controller.metrics.server import MetricsServer
from dispatcher.queue import Policy

from .fake_kube import FakeKube

FIFO = Policy("fifo", order="arrival")
T0 = 1_800_000_000.0
CREATED = "2027-01-15T08:00:00Z"
ALLOWED_LABELS = {"state", "condition", "reason", "resource", "schedulable", "policy", "fit",
                  "tree", "node", "estimate", "kind", "how", "reported",
                  "verb", "code", "priority", "endpoint", "result",
                  "version", "python_version", "le", "level", "outcome"}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def node(name: str, gpus: int = 8, unschedulable: bool = False) -> dict[str, Any]:
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "spec": {"unschedulable": unschedulable},
            "status": {"allocatable": alloc, "capacity": alloc}}


def job(name: str, pods: int, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": pods, "completions": pods, "template": {"spec": {
                "containers": [{"name": "c", "resources": {
                    "requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": gpus}}}]}}}}


def appwrapper(name: str, *items: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": "team", "creationTimestamp": CREATED},
            "spec": {"resources": {"GenericItems": [{"generictemplate": i} for i in items]},
                     **spec}}


def run(scenario: Callable[[FakeKube, Clock], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario(FakeKube(), Clock()))


async def started(kube: FakeKube, clock: Clock, observer: PrometheusObserver) -> Dispatcher:
    d = Dispatcher(kube, FIFO, clock=clock, observer=observer)  # type: ignore[arg-type]
    for kind in ("Node", "AppWrapper", "Pod"):
        for obj in await kube.list(Resource("", kind, "", True)):
            getattr(d, f"on_{'appwrapper' if kind == 'AppWrapper' else kind.lower()}")(
                "ADDED", obj)
    return d


def scrape(observer: PrometheusObserver) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = generate_latest(observer.registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_values_follow_what_the_dispatcher_did() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(node("n2", unschedulable=True))
        kube.put(appwrapper("first", job("first", 1, 8)))
        kube.put(appwrapper("second", job("second", 1, 8)))
        kube.put(appwrapper("odd", {"apiVersion": "example.com/v1", "kind": "Widget",
                                    "metadata": {"name": "w"}}))
        obs = PrometheusObserver()
        d = await started(kube, clock, obs)
        clock.now = T0 + 90
        await d.cycle()
        m = scrape(obs)
        assert value(m, "dispatcher_dispatches_total") == 1
        assert value(m, "dispatcher_pending_appwrappers") == 1
        assert value(m, "dispatcher_appwrappers", state="Running", condition="Dispatched") == 1
        assert value(m, "dispatcher_appwrappers", state="Pending", condition="Backoff") == 1
        assert value(m, "dispatcher_appwrappers", state="Failed", condition="Failed") == 1
        assert value(m, "dispatcher_failures_total", reason="InvalidSpec") == 1
        assert value(m, "dispatcher_failures_total", reason="ItemCreationFailure") == 0
        assert value(m, "dispatcher_requeues_total", reason="MinPodsNotRunning") == 0
        # Waited from its creation time to the dispatcher's clock at dispatch.
        assert value(m, "dispatcher_admission_wait_time_seconds_count") == 1
        assert value(m, "dispatcher_admission_wait_time_seconds_sum") == 90
        assert value(m, "dispatcher_admission_wait_time_seconds_bucket", le="60.0") == 0
        assert value(m, "dispatcher_admission_wait_time_seconds_bucket", le="120.0") == 1
        assert value(m, "dispatcher_admission_cycle_duration_seconds_count") == 1
        # Capacity of the schedulable node only; its GPUs are held for "first".
        assert value(m, "dispatcher_cluster_nodes", schedulable="true") == 1
        assert value(m, "dispatcher_cluster_nodes", schedulable="false") == 1
        assert value(m, "dispatcher_cluster_capacity", resource="nvidia.com/gpu") == 8
        assert value(m, "dispatcher_cluster_capacity", resource="cpu") == 64
        assert value(m, "dispatcher_cluster_capacity", resource="memory") == 512 * 2**30
        assert value(m, "dispatcher_cluster_free_capacity", resource="nvidia.com/gpu") == 0
        assert value(m, "dispatcher_cluster_free_capacity", resource="cpu") == 63
        assert value(m, "dispatcher_cluster_largest_free_capacity", resource="cpu") == 63
        assert value(m, "dispatcher_policy_info", policy="fifo", fit="per-node") == 1
        assert [v for (n, _), v in m.items() if n == "dispatcher_build_info"] == [1]
        # One PATCH each: the failed wrapper, the dispatched one, the one that waits.
        assert value(m, "dispatcher_status_writes_total", kind="news") == 3
        assert value(m, "dispatcher_status_writes_total", kind="details") == 0
        assert value(m, "dispatcher_events_dropped_total") == 0
        assert value(m, "dispatcher_pods_pinned_total", how="created") == 0

        kube.objects = {p: o for p, o in kube.objects.items() if not p.endswith("/first")}
        d.on_appwrapper("DELETED", appwrapper("first") | {
            "metadata": {"name": "first", "namespace": "team", "uid": d.tracked[
                ("team", "first")].uid}})
        await d.cycle()
        m = scrape(obs)
        assert value(m, "dispatcher_dispatches_total") == 2
        assert value(m, "dispatcher_pending_appwrappers") == 0
        assert value(m, "dispatcher_admission_wait_time_seconds_count") == 2
        assert value(m, "dispatcher_appwrappers", state="Running", condition="Dispatched") == 1
        # A combination seen before stays, at 0, so its series does not vanish.
        assert value(m, "dispatcher_appwrappers", state="Pending", condition="Backoff") == 0

    run(scenario)


def test_a_gang_that_does_not_start_counts_a_requeue() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("slow", job("slow", 2, 4),
                            schedulingSpec={"requeuing": {"timeInSeconds": 60}}))
        obs = PrometheusObserver()
        d = await started(kube, clock, obs)
        await d.cycle()
        clock.now += 61  # no pod ever appeared
        await d.cycle()  # torn down and requeued
        await d.cycle()  # and dispatched again at once
        m = scrape(obs)
        assert value(m, "dispatcher_requeues_total", reason="PodsNotCreated") == 1
        assert value(m, "dispatcher_dispatches_total") == 2
        assert value(m, "dispatcher_admission_wait_time_seconds_count") == 2

    run(scenario)


def test_completions_are_counted() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 4)))
        obs = PrometheusObserver()
        d = await started(kube, clock, obs)
        await d.cycle()
        j = kube.get("batch/v1", "Job", "team", "a")
        assert j is not None
        done = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "a-0", "namespace": "team",
                             "labels": {"workload.codeflare.dev/appwrapper": "a"},
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                                  "name": "a", "controller": True,
                                                  "uid": j["metadata"]["uid"]}]},
                "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
                "status": {"phase": "Succeeded"}}
        j["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        d.on_pod("ADDED", done)
        await d.cycle()
        m = scrape(obs)
        assert value(m, "dispatcher_completions_total") == 1
        assert value(m, "dispatcher_appwrappers", state="Completed", condition="Completed") == 1

    run(scenario)


def test_labels_are_bounded_and_names_follow_prometheus_conventions() -> None:
    obs = PrometheusObserver()
    obs.requeued("SomethingNew")
    obs.failed("")
    obs.failed("team-a/my-appwrapper")
    obs.requests.api_request("BREW", 418, 0.1)
    obs.requests.api_request("GET", 0, 0.1)
    obs.requests.webhook_review("/anything", "maybe", 0.1)
    text = generate_latest(obs.registry).decode()
    families = list(text_string_to_metric_families(text))
    for family in families:
        assert family.name.startswith("dispatcher_"), family.name
        for s in family.samples:
            assert set(s.labels) <= ALLOWED_LABELS, (s.name, s.labels)
            if family.type == "counter":
                assert s.name.endswith(("_total", "_created")), s.name
    m = scrape(obs)
    assert value(m, "dispatcher_requeues_total", reason="Other") == 1
    assert value(m, "dispatcher_failures_total", reason="Other") == 2
    assert value(m, "dispatcher_api_requests_total", verb="Other", code="418") == 1
    assert value(m, "dispatcher_api_requests_total", verb="GET", code="none") == 1
    assert value(m, "dispatcher_webhook_request_duration_seconds_count", endpoint="Other",
                 result="Other") == 1
    assert "my-appwrapper" not in text


def test_only_resources_some_node_advertises_become_series() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        made_up = {f"example.com/r{i}": "0" for i in range(100)}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
               "spec": {"containers": [{"name": "c", "resources": {
                   "requests": {"cpu": "1", **made_up}, "limits": made_up}}]}}
        kube.put(appwrapper("greedy", pod))
        obs = PrometheusObserver()
        d = await started(kube, clock, obs)
        await d.cycle()
        m = scrape(obs)
        assert value(m, "dispatcher_dispatches_total") == 1
        resources = {dict(lbl)["resource"] for (n, lbl) in m
                     if n.startswith("dispatcher_cluster_") and "resource" in dict(lbl)}
        assert resources == {"cpu", "memory", "pods", "nvidia.com/gpu"}

    run(scenario)


def test_snapshot_is_throttled_in_the_loop_and_exact_at_scrape() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 4)))
        obs = PrometheusObserver(min_interval=3600)
        d = await started(kube, clock, obs)
        await d.cycle()
        assert obs.snapshots_computed == 1
        for _ in range(5):
            await d.cycle()
        assert obs.snapshots_computed == 1  # no recomputation in the loop
        scrape(obs)
        assert obs.snapshots_computed == 2  # a cycle ran since: read once for the scrape
        scrape(obs)
        assert obs.snapshots_computed == 2  # nothing ran since: nothing to read

    run(scenario)


def test_the_queue_length_is_current_after_every_cycle() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=0))
        obs = PrometheusObserver(min_interval=3600)
        d = await started(kube, clock, obs)
        await d.cycle()
        kube.put(appwrapper("a", job("a", 1, 4)))
        d.on_appwrapper("ADDED", kube.of_kind("AppWrapper")[0])
        await d.cycle()
        assert obs.snapshot_data.pending == 1

    run(scenario)


def test_server_serves_metrics_and_health() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        obs = PrometheusObserver()
        made: list[Dispatcher] = []  # the loop, once the operator has made it
        server = MetricsServer(obs, port=0, host="127.0.0.1", max_cycle_age=60,
                               dispatcher=lambda: made[0] if made else None)
        await server.start()
        try:
            ((host, port),) = server.addresses()
            base = f"http://{host}:{port}"
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{base}/healthz") as r:
                    assert r.status == 503
                    assert "starting" in await r.text()
                d = await started(kube, clock, obs)
                made.append(d)
                d.ready = True
                await d.cycle()
                async with http.get(f"{base}/healthz") as r:
                    assert r.status == 200
                async with http.get(f"{base}/metrics") as r:
                    assert r.status == 200
                    assert r.headers["Content-Type"].startswith("text/plain")
                    body = await r.text()
                    assert "dispatcher_cluster_capacity{resource=\"nvidia.com/gpu\"} 8.0" in body
                async with http.get(f"{base}/metrics", headers={
                        "Accept": "application/openmetrics-text; version=1.0.0"}) as r:
                    assert r.headers["Content-Type"].startswith("application/openmetrics-text")
                    assert (await r.text()).rstrip().endswith("# EOF")
                d.last_cycle_at = time.monotonic() - 3600  # the loop is stuck
                async with http.get(f"{base}/healthz") as r:
                    assert r.status == 503
                    assert "has not finished a cycle" in await r.text()
        finally:
            await server.stop()

    run(scenario)


def test_gangs_that_ask_for_a_domain_are_counted_per_level_and_outcome() -> None:
    from dispatcher.fit.topology import Topology

    block, rack = "cloud.provider.com/topology-block", "cloud.provider.com/topology-rack"

    def racked(name: str, r: str) -> dict[str, Any]:
        n = node(name)
        n["metadata"]["labels"] = {block: "b1", rack: r}
        return n

    def asking(name: str, kind: str, created: str) -> dict[str, Any]:
        aw = appwrapper(name, job(name, 2, 8))
        aw["metadata"] |= {"creationTimestamp": created,
                           "annotations": {f"kueue.x-k8s.io/podset-{kind}-topology": rack}}
        return aw

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        # Rack r1 holds two nodes, r2 and r3 one each: `pair` (required) takes r1, and
        # `pref` (preferred) finds no rack left with two free nodes: spread over r2, r3.
        for name, r in (("a1", "r1"), ("a2", "r1"), ("b1", "r2"), ("c1", "r3")):
            kube.put(racked(name, r))
        kube.put(asking("pair", "required", "2027-01-15T08:00:00Z"))
        kube.put(asking("pref", "preferred", "2027-01-15T08:01:00Z"))
        kube.put(appwrapper("plain", job("plain", 0, 8)))
        obs = PrometheusObserver(topology_levels=(block, rack))
        d = Dispatcher(kube, FIFO, clock=clock, observer=obs,  # type: ignore[arg-type]
                       topology=Topology((block, rack)))
        for kind in ("Node", "AppWrapper"):
            for obj in await kube.list(Resource("", kind, "", True)):
                getattr(d, f"on_{kind.lower()}")("ADDED", obj)
        await d.cycle()
        m = scrape(obs)
        placed = "dispatcher_topology_placements_total"
        assert value(m, "dispatcher_dispatches_total") == 3  # `plain` asks for no domain
        assert value(m, placed, level=rack, outcome="one_domain") == 1
        assert value(m, placed, level=rack, outcome="spread") == 1
        assert value(m, placed, level=block, outcome="one_domain") == 0

    run(scenario)


def test_the_docs_list_every_metric() -> None:
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    families = {f.name: f.type for f in text_string_to_metric_families(
        generate_latest(PrometheusObserver().registry).decode())
        if not f.name.endswith("_created")}
    exposed = {f"{n}_total" if t == "counter" else n for n, t in families.items()}
    docs = (repo / "docs" / "operations.md").read_text()
    table = dict(re.findall(r"^\| `(dispatcher_\w+)` \| (\w+) \|", docs, re.M))
    assert set(table) == exposed
    for name, kind in table.items():
        assert families[name.removesuffix("_total")] == kind, name


def quota_tree(children: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """A root of 16 GPUs and, under it, `children`: (name, quotas)."""
    def subtree(name: str, nodes: list[dict[str, Any]], parent: str | None) -> dict[str, Any]:
        spec: dict[str, Any] = {"children": nodes} | ({"parent": parent} if parent else {})
        return {"apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
                "metadata": {"name": name, "namespace": "kube-system",
                             "labels": {"tree": "quota_gpu"}}, "spec": spec}

    return [subtree("root", [{"name": "root", "quotas": {"requests": {
                "nvidia.com/gpu": 16}}}], None),
            subtree("teams", [{"name": n, "quotas": q} for n, q in children], "root")]


def of_team(aw: dict[str, Any], leaf: str) -> dict[str, Any]:
    aw["metadata"]["labels"] = {"quota_gpu": leaf}
    return aw


def test_quota_nodes_show_use_and_the_wrappers_waiting_under_them() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(of_team(appwrapper("a", job("a", 1, 8)), "gold"))
        kube.put(of_team(appwrapper("b", job("b", 1, 8)), "gold"))
        kube.put(of_team(appwrapper("c", job("c", 1, 4)), "bronze"))
        obs = PrometheusObserver()
        d = await started(kube, clock, obs)
        # A resource no node advertises (anyone writing a QuotaSubtree may name one)
        # gets no series.
        d.relisted("QuotaSubtree", quota_tree([
            ("gold", {"requests": {"nvidia.com/gpu": 8}}),
            ("bronze", {"requests": {"nvidia.com/gpu": 8, "example.com/made-up": 3}})]))
        await d.cycle()
        m = scrape(obs)
        gpu = "nvidia.com/gpu"
        assert value(m, "dispatcher_quota_nominal", tree="quota_gpu", node="gold",
                     resource=gpu) == 8
        assert value(m, "dispatcher_quota_used", tree="quota_gpu", node="gold",
                     resource=gpu) == 8
        assert value(m, "dispatcher_quota_used", tree="quota_gpu", node="root",
                     resource=gpu) == 8
        assert not [k for k in m if dict(k[1]).get("resource") == "example.com/made-up"]
        # b waits under gold, c under bronze; the root counts both.
        for leaf, waiting in (("gold", 1), ("bronze", 1), ("root", 2)):
            assert value(m, "dispatcher_quota_pending_appwrappers", tree="quota_gpu",
                         node=leaf) == waiting, leaf
        assert value(m, "dispatcher_quota_nodes", reported="true") == 3
        assert value(m, "dispatcher_quota_nodes", reported="false") == 0
        assert value(m, "dispatcher_preemption_holds") == 0

    run(scenario)


def test_quota_node_series_are_capped_upper_levels_first(caplog: Any) -> None:
    from dispatcher.controller.metrics.snapshot import MAX_QUOTA_NODES

    teams = [(f"team-{i:03}", {"hardLimit": True, "requests": {"nvidia.com/gpu": 1}})
             for i in range(MAX_QUOTA_NODES + 50)]

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(of_team(appwrapper("late", job("late", 1, 1)), teams[-1][0]))
        kube.put(of_team(appwrapper("early", job("early", 1, 2)), teams[0][0]))
        obs = PrometheusObserver()
        d = await started(kube, clock, obs)
        d.relisted("QuotaSubtree", quota_tree(teams))
        await d.cycle()
        m = scrape(obs)
        nodes = {dict(k[1])["node"] for k in m if k[0] == "dispatcher_quota_nominal"}
        assert len(nodes) == MAX_QUOTA_NODES
        assert "root" in nodes and teams[0][0] in nodes and teams[-1][0] not in nodes
        assert value(m, "dispatcher_quota_nodes", reported="true") == MAX_QUOTA_NODES
        assert value(m, "dispatcher_quota_nodes", reported="false") == 51
        # "early" waits over its hard quota of 1 GPU: counted at its team and at the root.
        assert value(m, "dispatcher_quota_pending_appwrappers", tree="quota_gpu",
                     node=teams[0][0]) == 1
        assert value(m, "dispatcher_quota_pending_appwrappers", tree="quota_gpu",
                     node="root") == 1
        assert "series for the first 200 only" in caplog.text

    run(scenario)


def test_a_v1beta2_gang_whose_pods_never_come_counts_a_reset_not_a_requeue() -> None:
    from .test_runtime_v1beta2 import FT, codeflare

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(codeflare("slow", job("slow", 2, 4), annotations={
            FT + "admissionGracePeriodDuration": "10s",
            FT + "failureGracePeriodDuration": "0s"}))
        obs = PrometheusObserver()
        d = await started(kube, clock, obs)
        await d.cycle()
        clock.now += 11  # no pod ever appeared
        await d.cycle()
        m = scrape(obs)
        assert value(m, "dispatcher_resets_total", reason="InsufficientPodsPending") == 1
        assert value(m, "dispatcher_requeues_total", reason="PodsNotCreated") == 0

    run(scenario)
