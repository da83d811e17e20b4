"""Quota nodes and priorities only as granted, in the controller: an AppWrapper whose
recorded creator was not granted its quota label or priority (applied while the webhook
was not installed, or the grant revoked since) is never charged to that node nor given
that priority: it preempts nobody, holds nothing, and waits saying which grant is
missing, until the grant is given. A grant revoked just before the dispatch stops it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from dispatcher.controller.access.creator import UserInfo
from dispatcher.controller.access.grant_screen import RECHECK_SECONDS
from dispatcher.controller.loop.runtime import Dispatcher

from .fake_authz import FakeApi
from .fake_kube import FakeKube
from .test_runtime import Clock, appwrapper, aw_status, job, node, types
from .test_runtime_sharing import quota, running, subtree, team
from .test_runtime_sharing import started as sharing_started

GOLD = "use quota.codeflare.dev quotasubtrees quota_gpu:gold"
TOP = "use workload.codeflare.dev appwrappers/priority 1000000000"
# gold is a hard leaf of 8 GPUs: whoever is charged to it takes the gold team's quota.
HARD = [subtree("root", [quota("root", 16)]),
        subtree("teams", [quota("gold", 8, hard=True), quota("bronze", 8)], parent="root")]


class AuthzKube(FakeKube):
    """The in-memory API server, answering SubjectAccessReviews by `rights` (FakeApi's)."""

    def __init__(self, clock: Callable[[], float], rights: dict[str, set[str]]) -> None:
        super().__init__(clock)
        self.authz = FakeApi(rights)

    async def request(self, method: str, path: str, body: Any = None, *args: Any,
                      **kwargs: Any) -> Any:
        if method == "POST" and path.endswith("/subjectaccessreviews"):
            return await self.authz.request(method, path, body)
        return await super().request(method, path, body, *args, **kwargs)

    def grant_reviews(self) -> list[str]:
        return [f"{r['spec']['user']} {r['spec']['resourceAttributes']['name']}"
                for r in self.authz.reviews
                if r["spec"]["resourceAttributes"]["verb"] == "use"]


def by(user: str, obj: dict[str, Any]) -> dict[str, Any]:
    """As the webhook records it: created by `user`."""
    obj["metadata"]["annotations"] = UserInfo(user, groups=("system:authenticated",)
                                              ).annotations()
    return obj


def run(scenario: Callable[[AuthzKube, Clock], Coroutine[Any, Any, None]],
        rights: dict[str, set[str]]) -> None:
    clock = Clock()
    asyncio.run(scenario(AuthzKube(clock, rights), clock))


async def started(kube: FakeKube, clock: Clock, require_creator: bool = True) -> Dispatcher:
    return await sharing_started(kube, clock, HARD, require_creator=require_creator)


async def gold_running(kube: AuthzKube, d: Dispatcher) -> None:
    """carol's gold gang runs on n1, the cluster's only node."""
    kube.put(node("n1"))
    d.on_node("ADDED", kube.of_kind("Node")[0])
    await d.cycle()
    await d.cycle()
    running(kube, d, "gold", 1, 8, ["n1"])
    await d.cycle()
    assert types(kube, "gold")[-1] == "Running"


def arrive(kube: FakeKube, d: Dispatcher, obj: dict[str, Any]) -> None:
    d.on_appwrapper("ADDED", kube.put(obj))


def grab(user: str = "mallory") -> dict[str, Any]:
    """The issue's attack: gold's hard leaf, priority 10^9."""
    return by(user, team(appwrapper("grab", job("grab", 1, 8), created=5,
                                    priority=1000000000), "gold"))


NOT_GRANTED = (
    "NotGranted: metadata.labels.quota_gpu: mallory may not use quota node gold of tree "
    "quota_gpu in namespace team: no RBAC grant of verb use on quotasubtrees (apiGroup "
    "quota.codeflare.dev), resourceName 'quota_gpu:gold'; spec.priority: mallory may not "
    "use priority 1000000000 in namespace team: no RBAC grant of verb use on "
    "appwrappers/priority (apiGroup workload.codeflare.dev), resourceName '1000000000'")


def test_an_ungranted_quota_node_and_priority_preempt_nobody_and_wait_naming_the_grants(
        ) -> None:
    async def scenario(kube: AuthzKube, clock: Clock) -> None:
        kube.put(by("carol", team(appwrapper("gold", job("gold", 1, 8), created=1), "gold")))
        d = await started(kube, clock)
        await gold_running(kube, d)
        arrive(kube, d, grab())
        for _ in range(3):
            await d.cycle()
        assert "PreemptCandidate" not in types(kube, "gold")
        assert kube.get("batch/v1", "Job", "team", "gold") is not None
        assert kube.get("batch/v1", "Job", "team", "grab") is None
        assert types(kube, "grab")[-1] == "Backoff"
        assert aw_status(kube, "grab")["message"] == NOT_GRANTED
        assert not d.memory.sharing.holds
        # Asked once per claim, not every cycle; carol's again at its dispatch.
        assert sorted(kube.grant_reviews()) == [
            "carol quota_gpu:gold", "carol quota_gpu:gold", "mallory 1000000000",
            "mallory quota_gpu:gold"]
        # The administrator grants it: seen at the next look, and then it is charged to
        # gold with its priority, as it would have been all along.
        kube.authz.rights["mallory"] |= {GOLD, TOP}
        clock.now += RECHECK_SECONDS
        await d.cycle()
        await d.cycle()
        preempted = [c for c in aw_status(kube, "gold")["conditions"]
                     if c["type"] == "PreemptCandidate"]
        assert preempted and "preempted by team/grab as it has a lower priority" in \
            preempted[-1]["message"]

    run(scenario, {"carol": {"jobs.batch", GOLD}, "mallory": {"jobs.batch"}})


def test_a_grant_revoked_just_before_the_dispatch_stops_it() -> None:
    async def scenario(kube: AuthzKube, clock: Clock) -> None:
        kube.put(node("n1"))
        d = await started(kube, clock)
        arrive(kube, d, grab())
        await d.cycle()  # asks; not considered until the answer is in
        assert kube.get("batch/v1", "Job", "team", "grab") is None
        kube.authz.rights["mallory"] -= {GOLD}  # after the screen's answer, before dispatch
        await d.cycle()
        await d.cycle()
        assert kube.get("batch/v1", "Job", "team", "grab") is None
        assert "Dispatched" not in types(kube, "grab")
        assert aw_status(kube, "grab")["message"].startswith(
            "NotGranted: metadata.labels.quota_gpu: mallory may not use quota node gold")
        assert d.state.holdings(("team", "grab")) == []  # its reservation given back

    run(scenario, {"mallory": {"jobs.batch", GOLD, TOP}})


def test_without_a_recorded_creator_nothing_is_granted_when_creators_are_required() -> None:
    async def scenario(kube: AuthzKube, clock: Clock) -> None:
        kube.put(by("admin", team(appwrapper("gold", job("gold", 1, 8), created=1),
                                  "gold")))
        d = await started(kube, clock)
        await gold_running(kube, d)
        unrecorded = grab()
        del unrecorded["metadata"]["annotations"]
        arrive(kube, d, unrecorded)
        await d.cycle()
        await d.cycle()
        assert "PreemptCandidate" not in types(kube, "gold")
        assert aw_status(kube, "grab")["message"].startswith(
            "NotGranted: no creator is recorded on this AppWrapper")

    run(scenario, {"admin": {"*"}})


@pytest.mark.parametrize(("creator", "require"), [("admin", True), (None, False)])
def test_an_admin_and_an_install_without_the_webhook_are_taken_as_written(
        creator: str | None, require: bool) -> None:
    """MCAD's suites: a cluster-admin (or, without the webhook and --require-creator,
    anyone) gets the quota node and priority it names."""
    async def scenario(kube: AuthzKube, clock: Clock) -> None:
        kube.put(by("admin", team(appwrapper("gold", job("gold", 1, 8), created=1), "gold")))
        d = await started(kube, clock, require_creator=require)
        await gold_running(kube, d)
        obj = grab("admin")
        if creator is None:
            del obj["metadata"]["annotations"]
        arrive(kube, d, obj)
        await d.cycle()
        await d.cycle()
        assert "PreemptCandidate" in types(kube, "gold")

    run(scenario, {"admin": {"*"}})
