"""Quota trees and preemption in the controller, on an in-memory API: the core decides
(tests/unit/test_preemption*.py, test_quota*.py); here the controller carries it out —
victims torn down whole and requeued with Preempted, room held for the preemptor until
their pods are gone, quota waits said in status, QuotaSubtrees followed as they change."""

from __future__ import annotations

import copy
import json
from typing import Any

from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.policy_files import load_policy

from .fake_kube import FakeKube
from .test_placement import arrive, gated_pod, pinned_to, seen
from .test_runtime import (
    Clock,
    appwrapper,
    aw_status,
    created_job,
    job,
    node,
    pod,
    run,
    types,
)

PREEMPTION = load_policy("priority-preemption")


def subtree(name: str, children: list[dict[str, Any]], parent: str | None = None,
            tree: str = "quota_gpu") -> dict[str, Any]:
    spec: dict[str, Any] = {"children": children}
    if parent:
        spec["parent"] = parent
    return {"apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
            "metadata": {"name": name, "namespace": "kube-system", "labels": {"tree": tree}},
            "spec": spec}


def quota(name: str, gpus: int, hard: bool = False) -> dict[str, Any]:
    return {"name": name, "quotas": {"hardLimit": hard, "requests": {"nvidia.com/gpu": gpus}}}


TREE = [subtree("root", [quota("root", 16)]),
        subtree("teams", [quota("gold", 8), quota("bronze", 8)], parent="root")]


def team(obj: dict[str, Any], leaf: str) -> dict[str, Any]:
    obj["metadata"]["labels"] = {"quota_gpu": leaf}
    return obj


async def started(kube: FakeKube, clock: Clock, trees: list[dict[str, Any]] = TREE,
                  policy: Any = PREEMPTION, require_creator: bool = False,
                  **options: Any) -> Dispatcher:
    d = Dispatcher(kube, policy, clock=clock,  # type: ignore[arg-type]
                   require_creator=require_creator, **options)
    for obj in kube.of_kind("Node"):
        d.on_node("ADDED", obj)
    for obj in kube.of_kind("AppWrapper"):
        d.on_appwrapper("ADDED", obj)
    for obj in kube.of_kind("Pod"):
        d.on_pod("ADDED", obj)
    d.relisted("QuotaSubtree", trees)
    return d


def running(kube: FakeKube, d: Dispatcher, name: str, pods: int, gpus: int,
            nodes: list[str]) -> None:
    j = created_job(kube, name)
    for i in range(pods):
        p = pod(name, f"{name}-{i}", nodes[i % len(nodes)], "Running", gpus, j)
        kube.put(p)
        d.on_pod("ADDED", p)


async def low_then_high(kube: FakeKube, clock: Clock) -> Dispatcher:
    """`low` (priority 1) runs 2 pods on the 2 nodes; then `high` (priority 9) comes,
    needing one of them: one cycle decides."""
    kube.put(node("n1"))
    kube.put(node("n2"))
    kube.put(appwrapper("low", job("low", 2, 8), created=1, priority=1))
    d = await started(kube, clock, trees=[])
    await d.cycle()
    running(kube, d, "low", 2, 8, ["n1", "n2"])
    await d.cycle()
    assert types(kube, "low")[-1] == "Running"
    clock.now += 10
    d.on_appwrapper("ADDED", kube.put(appwrapper("high", job("high", 1, 8), created=2,
                                                 priority=9)))
    await d.cycle()
    return d


def test_a_high_priority_wrapper_preempts_a_low_one_whole_and_waits_for_its_pods() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d = await low_then_high(kube, clock)
        low = aw_status(kube, "low")
        preempted = [c for c in low["conditions"] if c["type"] == "PreemptCandidate"][-1]
        assert preempted["reason"] == "Preempted"
        assert "preempted by team/high as it has a lower priority" in preempted["message"]
        assert low["state"] == "Pending" and low.get("numberOfRequeueings", 0) == 0
        assert kube.get("batch/v1", "Job", "team", "low") is None  # the whole gang
        high = aw_status(kube, "high")
        assert high["message"].startswith("Preempting: dispatch after preempting team/low")
        assert kube.get("batch/v1", "Job", "team", "high") is None  # its pods still there
        # One pod of low is gone: enough room on that node for high, held for it alone.
        d.on_pod("DELETED", pod("low", "low-0", "n1", "Running", 8))
        await d.cycle()
        assert types(kube, "high")[-1] == "Dispatched"
        assert types(kube, "low")[-1] in ("Queueing", "Backoff")

    run(scenario)


def test_a_wrapper_over_its_quota_waits_saying_which_quota() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        for n in ("n1", "n2", "n3"):
            kube.put(node(n))
        kube.put(team(appwrapper("a", job("a", 1, 8), created=1), "gold"))
        hard = [subtree("root", [quota("root", 16)]),
                subtree("teams", [quota("gold", 8, hard=True), quota("bronze", 8)],
                        parent="root")]
        kube.put(team(appwrapper("b", job("b", 1, 8), created=2), "gold"))
        d = await started(kube, clock, trees=hard, policy=load_policy("fifo"))
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"
        b = aw_status(kube, "b")
        assert types(kube, "b")[-1] == "Backoff"
        assert b["message"].startswith("QuotaExceeded: ")
        assert "gold" in b["message"] and "hardLimit" in b["message"]
        # The administrator lifts the hard limit: b borrows from the root.
        d.on_quota("MODIFIED", TREE[1])
        await d.cycle()
        assert types(kube, "b")[-1] == "Dispatched"

    run(scenario)


def test_a_wrapper_within_its_quota_reclaims_from_a_borrower() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(node("n2"))
        kube.put(team(appwrapper("borrower", job("borrower", 2, 8), created=1, priority=9),
                      "bronze"))
        d = await started(kube, clock)
        await d.cycle()
        running(kube, d, "borrower", 2, 8, ["n1", "n2"])
        await d.cycle()
        clock.now += 10
        kube.put(team(appwrapper("owner", job("owner", 1, 8), created=2, priority=1), "gold"))
        d.on_appwrapper("ADDED", kube.get("workload.codeflare.dev/v1beta1", "AppWrapper",
                                          "team", "owner"))
        await d.cycle()
        borrower = [c for c in aw_status(kube, "borrower")["conditions"]
                    if c["type"] == "PreemptCandidate"][-1]
        assert "to reclaim the quota it borrows" in borrower["message"]
        assert kube.get("batch/v1", "Job", "team", "borrower") is None

    run(scenario)


def test_deleting_the_preemptor_gives_the_held_room_back() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("low", job("low", 1, 8), created=1, priority=1))
        d = await started(kube, clock, trees=[])
        await d.cycle()
        running(kube, d, "low", 1, 8, ["n1"])
        await d.cycle()
        high = kube.put(appwrapper("high", job("high", 1, 8), created=2, priority=9))
        d.on_appwrapper("ADDED", high)
        await d.cycle()
        assert d.memory.sharing.holds
        d.on_appwrapper("DELETED", high)
        assert not d.memory.sharing.holds

    run(scenario)


def test_a_victim_whose_priority_grew_never_preempts_its_preemptor_even_after_a_restart(
) -> None:
    """The ping-pong guard: "low" (priority 1, growing by 1 a second while it waits) is
    preempted by "high" (priority 100). Minutes later low's priority is past high's; it
    may still never take its room back from high — not from this dispatcher, nor from the
    one that leads after a failover and knows only what the API says."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("low", job("low", 1, 8), created=1, priority=1,
                            priorityslope=1.0))
        d = await started(kube, clock, trees=[])
        await d.cycle()
        running(kube, d, "low", 1, 8, ["n1"])
        await d.cycle()
        clock.now += 10
        kube.put(appwrapper("high", job("high", 1, 8), created=2, priority=100))
        d.on_appwrapper("ADDED", kube.get("workload.codeflare.dev/v1beta1", "AppWrapper",
                                          "team", "high"))
        await d.cycle()
        assert [c for c in aw_status(kube, "low")["conditions"]
                if c["type"] == "PreemptCandidate"][-1]["reason"] == "Preempted"
        kube.objects.pop("/api/v1/namespaces/team/pods/low-0", None)
        d.on_pod("DELETED", pod("low", "low-0", "n1", "Running", 8))
        await d.cycle()
        running(kube, d, "high", 1, 8, ["n1"])
        await d.cycle()
        assert types(kube, "high")[-1] == "Running"
        assert aw_status(kube, "high")["preempted"] == ["team/low"]
        clock.now += 600  # low's priority is now past 600
        await d.cycle()
        assert types(kube, "high")[-1] == "Running"
        await d.stop()
        d = await started(kube, clock, trees=[])  # the next leader, from the API
        await d.cycle()
        await d.cycle()
        assert types(kube, "high")[-1] == "Running"
        assert kube.get("batch/v1", "Job", "team", "high") is not None
        assert aw_status(kube, "low")["state"] == "Pending"

    run(scenario)


def test_a_preemptor_whose_victims_never_go_gives_up_its_hold_after_the_deadline() -> None:
    """The preempted gang's pods stay (a finalizer nobody removes): the preemptor holds
    the room for the policy's maxHoldSeconds, then gives it up and says so, instead of
    waiting (and holding the line) for ever."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d = await low_then_high(kube, clock)
        assert kube.get("batch/v1", "Job", "team", "low") is None  # preempted whole
        since = clock.now
        while clock.now - since < PREEMPTION.max_hold_seconds - 30:
            clock.now += 30
            await d.cycle()
            assert aw_status(kube, "high")["message"].startswith("AwaitingPreemption: ")
        clock.now = since + PREEMPTION.max_hold_seconds
        await d.cycle()
        message = aw_status(kube, "high")["message"]
        assert message.startswith("InsufficientResources: gave up the room held for it: "
                                  "what it waited for was not gone after 5m; "), message
        assert not d.memory.sharing.holds
        assert kube.get("batch/v1", "Job", "team", "high") is None

    run(scenario)


def test_a_preemption_across_namespaces_names_nobody_the_reader_cannot_read() -> None:
    """Each side's status is read in its own namespace: the other wrapper is said to be
    in another namespace, not named."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("low", job("low", 1, 8), created=1, priority=1))
        d = await started(kube, clock, trees=[])
        await d.cycle()
        running(kube, d, "low", 1, 8, ["n1"])
        await d.cycle()
        clock.now += 10
        high = appwrapper("high", job("high", 1, 8), created=2, priority=9)
        high["metadata"]["namespace"] = "secret-team"
        d.on_appwrapper("ADDED", kube.put(high))
        await d.cycle()
        low = aw_status(kube, "low")
        preempted = [c for c in low["conditions"] if c["type"] == "PreemptCandidate"][-1]
        assert preempted["message"].startswith(
            "preempted by a higher-priority AppWrapper in another namespace as it has a "
            "lower priority")
        assert "secret-team" not in json.dumps(low)
        shown = kube.get("workload.codeflare.dev/v1beta1", "AppWrapper", "secret-team", "high")
        assert shown is not None
        assert shown["status"]["message"].startswith(
            "Preempting: dispatch after preempting an AppWrapper in another namespace")
        assert "team/low" not in shown["status"]["message"]

    run(scenario)


def cpu_quota(name: str, cpus: int) -> dict[str, Any]:
    return {"name": name, "quotas": {"requests": {"cpu": str(cpus)}}}


# Two teams guaranteed 32 cpu each of a root of 64.
CPU_TREE = [subtree("root", [cpu_quota("root", 64)], tree="quota_cpu"),
            subtree("teams", [cpu_quota("team-a", 32), cpu_quota("team-b", 32)],
                    parent="root", tree="quota_cpu")]


def cpu_node(name: str) -> dict[str, Any]:
    alloc = {"cpu": "32", "memory": "128Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": alloc, "capacity": alloc}}


def cpu_job(name: str, pods: int, cpu: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": pods, "completions": pods, "template": {"spec": {
                "containers": [{"name": "c", "image": "x",
                                "resources": {"requests": {"cpu": cpu}}}]}}}}


def on_cpu_team(obj: dict[str, Any], leaf: str) -> dict[str, Any]:
    obj["metadata"].setdefault("labels", {})["quota_cpu"] = leaf
    return obj


def bind_where_let(kube: FakeKube, d: Dispatcher, names: list[str]) -> list[str]:
    """Each pod binds on the node it was let onto, and runs (kube-scheduler and the
    kubelet). The nodes, in order."""
    nodes = []
    for name in names:
        obj = seen(kube, d, name)
        (where,) = pinned_to(obj)
        obj["spec"]["nodeName"] = where
        obj["status"]["phase"] = "Running"
        d.on_pod("MODIFIED", copy.deepcopy(kube.put(obj)))
        nodes.append(where)
    return nodes


async def team_b_asks_30_of_its_32_cpu(kube: FakeKube, d: Dispatcher, clock: Clock,
                                       a: str) -> None:
    """team-b's Job of 10 pods of 3 cpu comes while team-a's `a` runs on 60 of the 64 cpu:
    `a` is reclaimed, whole, and b is dispatched once a's pods are gone."""
    clock.now += 10
    b = on_cpu_team(appwrapper("b", cpu_job("b", 10, "3"), created=30), "team-b")
    d.on_appwrapper("ADDED", kube.put(b))
    await d.cycle()
    preempted = [c for c in aw_status(kube, a).get("conditions", [])
                 if c["type"] == "PreemptCandidate"]
    assert preempted, aw_status(kube, "b").get("message")
    assert "to reclaim the quota it borrows" in preempted[-1]["message"]
    for obj in kube.of_kind("Pod"):
        if obj["metadata"]["name"].startswith(f"{a}-"):
            kube.objects.pop(f"/api/v1/namespaces/team/pods/{obj['metadata']['name']}", None)
            d.on_pod("DELETED", obj)
    await d.cycle()
    assert types(kube, "b")[-1] == "Dispatched"


def test_a_job_declared_as_one_small_pod_is_reclaimed_for_a_team_within_its_cpu() -> None:
    """team-a wraps a Job of 20 pods of 3 cpu, declaring 1 pod of 100m (accepted, with a
    warning, as MCAD does): its pods take 60 of the 64 cpu. team-b asks 30 of its
    guaranteed 32: team-a is charged the 60 it really uses, borrows, and is reclaimed."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(cpu_node("n1"))
        kube.put(cpu_node("n2"))
        a = on_cpu_team(appwrapper("a", cpu_job("a", 20, "3"), created=1, priority=9),
                        "team-a")
        a["spec"]["resources"]["GenericItems"][0]["custompodresources"] = [
            {"replicas": 1, "requests": {"cpu": "100m"}}]
        kube.put(a)
        d = await started(kube, clock, trees=CPU_TREE)
        d.items.pin = True
        await d.cycle()
        job = created_job(kube, "a")
        for i in range(20):
            arrive(kube, d, gated_pod(job, f"a-{i}"))
        await d.cycle()
        assert sorted(bind_where_let(kube, d, [f"a-{i}" for i in range(20)])) == \
            ["n1"] * 10 + ["n2"] * 10
        await d.cycle()
        assert types(kube, "a")[-1] == "Running"
        await team_b_asks_30_of_its_32_cpu(kube, d, clock, "a")

    run(scenario)
