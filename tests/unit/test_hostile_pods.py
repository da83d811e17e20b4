"""What a tenant who may create pods in its own namespace can make the dispatcher do to
another team's room: nothing. Pods are anyone's to label, annotate, give a node rule or
an owner reference; only the room the tenant's own gang was admitted with is ever theirs."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dispatcher.cluster.state import PlannedPod
from dispatcher.controller.items.shaping import PLACEMENT_GATE
from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.controller.pods import placement
from dispatcher.controller.pods.placement import PIN_TOKEN_ANNOTATION
from dispatcher.controller.pods.pod_pinning import TOKEN_SECONDS
from dispatcher.controller.record.ownership import Ownership
from dispatcher.preemption import Hold

from .fake_kube import FakeKube
from .test_placement import arrive, gated_pod, one_pod_job, pinned_to, pinning, seen, two_pod_job
from .test_pod_pinning import applied, creating, dispatched
from .test_runtime import (
    Clock,
    appwrapper,
    created_job,
    job,
    node,
    pod,
    run,
    started,
    types,
)

GPU = "nvidia.com/gpu"


def let_onto(pod_obj: dict[str, Any], node_name: str) -> dict[str, Any]:
    """A pod the tenant made by hand: not bound, required onto `node_name`, as a pod
    the dispatcher let go would be."""
    obj = copy.deepcopy(pod_obj)
    obj["spec"].pop("nodeName", None)
    obj["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In",
                              "values": [node_name]}]}]}}}
    obj["status"] = {"phase": "Pending"}
    return obj


async def running_small_gang(kube: FakeKube, clock: Clock) -> Dispatcher:
    """Two 8-GPU nodes; alice's 'mine' (one 1-GPU pod) running on n1."""
    kube.put(node("n1"))
    kube.put(node("n2"))
    kube.put(appwrapper("mine", job("mine", 1, 1), created=0))
    d = await started(kube, clock)
    await d.cycle()
    mine0 = pod("mine", "mine-0", "n1", "Running", 1, created_job(kube, "mine"))
    d.on_pod("ADDED", copy.deepcopy(kube.put(mine0)))
    await d.cycle()
    assert types(kube, "mine")[-1] == "Running"
    return d


async def first_pod_running(kube: FakeKube, d: Dispatcher, a: dict[str, Any]
                            ) -> dict[str, Any]:
    """a's first pod made, let go, bound where it was pinned and running."""
    arrive(kube, d, gated_pod(a, "a-0"))
    await d.cycle()
    a0 = seen(kube, d, "a-0")
    (where,) = pinned_to(a0)
    a0["spec"]["nodeName"] = where
    a0["status"]["phase"] = "Running"
    d.on_pod("MODIFIED", copy.deepcopy(kube.put(a0)))
    await d.cycle()
    return a0


def test_pods_with_only_the_appwrapper_label_hold_no_room() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d = await running_small_gang(kube, clock)
        for i, where in enumerate(("n1", "n2")):
            fake = let_onto(pod("mine", f"fake-{i}", where, "Pending", 1000), where)
            d.on_pod("ADDED", copy.deepcopy(kube.put(fake)))
        await d.cycle()
        assert d.state.free("n1")[GPU] == 7 and d.state.free("n2")[GPU] == 8
        # After a restart too (the rebuild reads what was let onto a node).
        d = await started(kube, clock)
        await d.cycle()
        assert d.state.free("n1")[GPU] == 7 and d.state.free("n2")[GPU] == 8
        kube.put(appwrapper("theirs", job("theirs", 1, 8), created=5))
        d.on_appwrapper("ADDED", kube.get("workload.codeflare.dev/v1beta1", "AppWrapper",
                                          "team", "theirs") or {})
        await d.cycle()
        assert types(kube, "theirs")[-1] == "Dispatched"

    run(scenario)


def test_pods_with_a_forged_owner_hold_no_more_than_their_gang_was_admitted_with() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d = await running_small_gang(kube, clock)
        mine = created_job(kube, "mine")
        for i, where in enumerate(("n1", "n2")):
            fake = let_onto(pod("mine", f"fake-{i}", where, "Pending", 1000, mine), where)
            d.on_pod("ADDED", copy.deepcopy(kube.put(fake)))
        await d.cycle()
        d = await started(kube, clock)
        await d.cycle()
        assert d.state.free("n1")[GPU] == 7 and d.state.free("n2")[GPU] == 8

    run(scenario)


def test_a_pod_beyond_its_gangs_admitted_count_gets_no_free_room() -> None:
    """The owner of a running Job raises its parallelism: the extra pod was admitted by
    nobody, and waits at its gate."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(node("n2"))
        kube.put(appwrapper("a", one_pod_job("a")))
        d = await pinning(kube, clock)
        await d.cycle()
        a = created_job(kube, "a")
        await first_pod_running(kube, d, a)
        assert types(kube, "a")[-1] == "Running"
        arrive(kube, d, gated_pod(a, "a-1"))  # parallelism 2 now
        await d.cycle()
        await d.cycle()
        assert seen(kube, d, "a-1")["spec"]["schedulingGates"] == [{"name": PLACEMENT_GATE}]

    run(scenario)


def test_room_kept_for_a_preemptor_goes_to_no_other_gangs_pod() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(node("n2"))
        kube.put(appwrapper("a", one_pod_job("a", completions=2), created=0))
        d = await pinning(kube, clock)
        await d.cycle()
        a = created_job(kube, "a")
        a0 = await first_pod_running(kube, d, a)
        # n1's room is kept for a preemptor whose victims just left it.
        d.memory.sharing.holds[("team", "big")] = Hold((PlannedPod("n1", {GPU: 8}),))
        a0["status"]["phase"] = "Succeeded"
        d.on_pod("MODIFIED", copy.deepcopy(kube.put(a0)))
        arrive(kube, d, gated_pod(a, "a-1"))  # the Job's next pod
        await d.cycle()
        assert pinned_to(seen(kube, d, "a-1")) == ["n2"]

    run(scenario)


def test_a_pin_whose_pods_watch_event_is_late_is_not_given_to_another_pod() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, hook, job_obj = await dispatched(kube, clock, two_pod_job("a"))
        first = gated_pod(job_obj, "a-0")
        patch = await hook.review(creating(first, "r0"))
        assert patch is not None
        made = applied(first, patch)
        assert made["metadata"]["annotations"][PIN_TOKEN_ANNOTATION] == "r0"
        kube.put(made)  # created, but its watch event has not come
        await d.pod_placer.lapse_tokens(hook.clock() + TOKEN_SECONDS + 1)
        second = gated_pod(job_obj, "a-1")
        patch = await hook.review(creating(second, "r1"))
        assert patch is not None
        assert pinned_to(applied(second, patch)) != pinned_to(made)

    run(scenario)


FORGED_OWNERS = {
    # A big ConfigMap of the tenant's, its uid copied: no kind that makes pods.
    "a ConfigMap": ("v1", "ConfigMap", "big", "configmaps/big", 0),
    # A Job of the tenant's own, under no AppWrapper, its uid copied: one GET answers
    # every pod naming it.
    "a Job under no AppWrapper": ("batch/v1", "Job", "own", "jobs/own", 1),
    # A Job named by the tenant with a uid made up per pod: each chain ends at once.
    "a made-up Job per pod": ("batch/v1", "Job", "forged", "jobs/forged", 100),
}


@pytest.mark.parametrize("forged", FORGED_OWNERS, ids=list(FORGED_OWNERS))
def test_pods_with_forged_owners_are_looked_up_once_until_they_change(
        forged: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant's 100 gated pods labelled for its running gang, each naming an owner of
    the tenant's choice: a minute of the loop, another tenant's dispatch in it, reads
    that owner at most once per pod (not at all for a kind that makes no pods), and once
    more only after a pod changed."""
    api_version, kind, name, path, most = FORGED_OWNERS[forged]

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        monkeypatch.setattr(placement.time, "monotonic", clock)
        d = await running_small_gang(kube, clock)
        if kind == "ConfigMap":
            owner = kube.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
                "name": "big", "namespace": "team"}, "data": {"x": "y" * 1024}})
        else:
            owner = kube.put(one_pod_job(name) | {"metadata": {"name": name,
                                                                "namespace": "team"}})
        pods = []
        for i in range(100):
            fake = pod("mine", f"fake-{i}", "", "Pending", 1)
            uid = f"made-up-{i}" if most == 100 else owner["metadata"]["uid"]
            fake["metadata"]["ownerReferences"] = [{"apiVersion": api_version, "kind": kind,
                                                    "name": name, "uid": uid,
                                                    "controller": True}]
            fake["spec"].pop("nodeName")
            fake["spec"]["schedulingGates"] = [{"name": PLACEMENT_GATE}]
            pods.append(kube.put(fake))
            d.on_pod("ADDED", copy.deepcopy(pods[-1]))

        def lookups() -> int:
            return sum(1 for p in kube.reads if p.endswith(f"/namespaces/team/{path}"))

        for second in range(60):
            if second == 20:  # items learned: what was disproven is forgotten
                other = kube.put(appwrapper("other", job("other", 1, 8), created=9))
                d.on_appwrapper("ADDED", copy.deepcopy(other))
            await d.cycle()
            clock.now += 1
        assert types(kube, "other")[-1] == "Dispatched"
        assert lookups() <= most and (lookups() > 0) == bool(most)
        before = lookups()
        changed = copy.deepcopy(pods[0])
        changed["metadata"]["annotations"] = {"note": "edited"}
        d.on_pod("MODIFIED", copy.deepcopy(kube.put(changed)))
        for _ in range(30):
            await d.cycle()
            clock.now += 1
        assert lookups() - before == (1 if most else 0)
        assert d.state.free("n1")[GPU] == 7  # and they hold nothing, as before

    run(scenario)


def test_an_owner_of_a_kind_that_makes_no_pods_proves_nothing_without_a_lookup() -> None:
    ownership = Ownership()
    forged = {"metadata": {"name": "x", "namespace": "team", "uid": "x", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "big", "uid": "cm",
         "controller": True}]}}
    assert ownership.disproves(forged, ("team", "mine"))
    assert ownership.owner_of(forged, ("team", "mine")) is None
    assert ownership.unresolved == 0
