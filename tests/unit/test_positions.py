"""Queue positions in status: where each waiting AppWrapper stands in the dispatcher's own
queue, per scope (the cluster, its quota leaf), written only when they change and, when a
wrapper merely moves up, at the pace of a message."""

from __future__ import annotations

from dispatcher.controller.record.status import MESSAGE_INTERVAL_SECONDS
from dispatcher.queue import Policy

from .fake_kube import FakeKube
from .test_runtime import Clock, appwrapper, aw_status, job, node, run, started
from .test_runtime_sharing import TREE, team
from .test_runtime_sharing import started as started_with_quota

PRIORITY = Policy("priority", order="priority")


def positions(kube: FakeKube, *names: str) -> dict[str, int | None]:
    return {n: aw_status(kube, n).get("queuePosition") for n in names}


def test_waiting_wrappers_show_their_place_in_the_controllers_order_and_the_policy() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("low", job("low", 1, 8), created=1, priority=1))
        kube.put(appwrapper("high", job("high", 1, 8), created=2, priority=5))
        kube.put(appwrapper("mid", job("mid", 1, 8), created=3, priority=3))
        d = await started(kube, clock, PRIORITY)
        await d.cycle()
        # high is dispatched: it has no position any more; the others follow priority,
        # not arrival.
        assert positions(kube, "high", "mid", "low") == {"high": None, "mid": 1, "low": 2}
        assert aw_status(kube, "mid")["queuePolicy"] == "priority"
        assert "queuePolicy" not in aw_status(kube, "high")
        assert [(e.name, e.position) for e in d.positions.snapshot.entries] == [
            ("mid", 1), ("low", 2)]

    run(scenario)


def test_positions_that_hold_are_not_written_again_and_a_move_alone_waits_like_a_message(
        ) -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))  # 8 GPUs: none of them fits, each waits for its own reason
        kube.put(appwrapper("head", job("head", 1, 16), created=1, priority=5))
        kube.put(appwrapper("behind", job("behind", 1, 16), created=2, priority=1))
        d = await started(kube, clock, PRIORITY)
        await d.cycle()
        assert positions(kube, "head", "behind") == {"head": 1, "behind": 2}
        writes = {n: kube.status_writes(n) for n in ("head", "behind")}
        for _ in range(3):
            clock.now += 5
            await d.cycle()
        # Nothing moved: nothing written.
        assert {n: kube.status_writes(n) for n in writes} == writes
        # An urgent one arrives: it is 1 at once (its first position); the others move
        # down with nothing else to say, so they wait for the message interval.
        d.on_appwrapper("ADDED", kube.put(
            appwrapper("urgent", job("urgent", 1, 16), created=3, priority=7)))
        clock.now += 1
        await d.cycle()
        assert positions(kube, "urgent", "head", "behind") == {
            "urgent": 1, "head": 1, "behind": 2}
        assert d.tracked[("team", "behind")].status.queuePosition == 3
        clock.now += MESSAGE_INTERVAL_SECONDS / 2
        await d.cycle()
        assert positions(kube, "head", "behind") == {"head": 1, "behind": 2}
        clock.now += MESSAGE_INTERVAL_SECONDS / 2
        await d.cycle()
        assert positions(kube, "urgent", "head", "behind") == {
            "urgent": 1, "head": 2, "behind": 3}
        assert {n: kube.status_writes(n) for n in writes} == {
            n: w + 1 for n, w in writes.items()}

    run(scenario)


def test_reaching_the_front_is_written_within_seconds() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("first", job("first", 1, 8), created=1))
        kube.put(appwrapper("second", job("second", 1, 8), created=2))
        kube.put(appwrapper("third", job("third", 1, 8), created=3))
        d = await started(kube, clock)
        await d.cycle()
        assert positions(kube, "second", "third") == {"second": 1, "third": 2}
        # `second` goes (deleted): `third` moves to the front, written as a detail.
        path = "/apis/workload.codeflare.dev/v1beta1/namespaces/team/appwrappers/second"
        gone = kube.objects.pop(path)
        d.on_appwrapper("DELETED", gone)
        clock.now += 1
        await d.cycle()
        clock.now += 10
        await d.cycle()
        assert positions(kube, "third") == {"third": 1}

    run(scenario)


def test_quota_positions_count_the_waiting_wrappers_of_the_same_leaf() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1", gpus=8))  # none fits: all wait
        kube.put(team(appwrapper("g1", job("g1", 1, 16), created=1), "gold"))
        kube.put(team(appwrapper("b1", job("b1", 1, 16), created=2), "bronze"))
        kube.put(team(appwrapper("g2", job("g2", 1, 16), created=3), "gold"))
        d = await started_with_quota(kube, clock, TREE, Policy("fifo", order="arrival"))
        await d.cycle()
        quota = {n: [(q["tree"], q["node"], q["position"])
                     for q in aw_status(kube, n)["quotaPositions"]] for n in ("g1", "b1", "g2")}
        assert positions(kube, "g1", "b1", "g2") == {"g1": 1, "b1": 2, "g2": 3}
        assert quota == {"g1": [("quota_gpu", "gold", 1)], "b1": [("quota_gpu", "bronze", 1)],
                         "g2": [("quota_gpu", "gold", 2)]}
        snapshot = d.positions.snapshot
        assert [e.name for e in snapshot.under("quota_gpu", "root")] == ["g1", "b1", "g2"]
        assert [e.name for e in snapshot.under("quota_gpu", "gold")] == ["g1", "g2"]

    run(scenario)
