"""`dispatcher run --manager` against stand-in API servers: one manager, two workers.

- The fence: the manager's wrapper names its worker before the copy is made; a manager
  restarted at any point adopts the copy it finds and never makes a second.
- A worker silent past the grace: its wrappers go back to the queue and on to the other
  worker; its stale copy is deleted in the first pass it answers again.
- A copy the worker requeues or fails goes back to the manager's queue (its copy deleted),
  or fails in the manager once the wrapper's requeue limit is reached.
- The copy's status and Events come back to the manager's wrapper, once each.
- The choice honours each worker's quota (its QuotaSubtrees, with what its own dispatcher
  counts: the wrappers admitted there, and those sent there not admitted yet) and the
  topology levels of the manager's configuration.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.api.labels import CLUSTER_LABEL, MANAGER_UID_LABEL
from dispatcher.controller.kube.client import ApiError, Resource
from dispatcher.controller.manager.passes import Manager, ManagerSettings
from dispatcher.controller.manager.workers import WorkerLink, digest
from dispatcher.fit.topology import Topology
from dispatcher.fleet.copies import EVENTS_PER_PASS
from dispatcher.fleet.fence import LEASE_NAME, LEASE_NAMESPACE

from .fake_kube import FakeKube
from .quota_world import subtree
from .test_runtime import appwrapper, job, node

GRACE = 60.0
AW_PATH = "/apis/workload.codeflare.dev/v1beta1/namespaces/team/appwrappers"


class Worker(FakeKube):
    """A worker's API server that can stop answering, and can tell when a copy is made."""

    def __init__(self, name: str, gpus: int = 8, quota_error: int = 0) -> None:
        super().__init__()
        self.name = name
        self.server = f"https://{name}.example"
        self._down = False
        self.quota_error = quota_error  # what listing QuotaSubtrees answers (0: the list)
        self.on_copy: list[Any] = []
        self.listed: list[str] = []  # each listing asked of it, by resource
        self.copy_posts = 0  # copies asked for, answered or refused
        self.put(node(f"{name}-n0", gpus))

    @property
    def down(self) -> bool:
        return self._down

    @down.setter
    def down(self, down: bool) -> None:
        """Its API server stopped: its watches end, nothing answers until it is back."""
        self._down = down
        if down:
            self.cut(ApiError(0, "ClientConnectionError", f"{self.name}: connection reset"))

    async def list(self, resource: Resource, label_selector: str | None = None,
                   namespace: str | None = None, field_selector: str | None = None
                   ) -> list[dict[str, Any]]:
        if self.down:
            raise ApiError(503, "ServiceUnavailable", f"{self.name} does not answer")
        self.listed.append(resource.plural)
        if self.quota_error and resource.kind == "QuotaSubtree":
            raise ApiError(self.quota_error, "NotFound or Forbidden", "no QuotaSubtrees")
        return await super().list(resource, label_selector, namespace, field_selector)

    def watch(self, *args: Any, **kw: Any) -> Any:
        if self.down:
            raise ApiError(0, "ClientConnectorError", f"{self.name}: connection refused")
        return super().watch(*args, **kw)

    async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        if self.down:
            raise ApiError(503, "ServiceUnavailable", f"{self.name} does not answer")
        if method == "POST" and path == AW_PATH:
            self.copy_posts += 1
            for hook in self.on_copy:
                hook(body)
        return await super().request(method, path, body, **kw)

    def copy(self, name: str) -> dict[str, Any] | None:
        return self.get("workload.codeflare.dev/v1beta1", "AppWrapper", "team", name)

    def copies_made(self) -> int:
        return sum(1 for m, p in self.writes if m == "POST" and p == AW_PATH)


FLEETS: list[Fleet] = []


async def idle(fleet: Fleet) -> None:
    """Let the informers take what was sent them, and open again the watches of workers
    that answer: no clock, no wait."""
    def settled() -> bool:
        return all(not w.queue.qsize() for worker in (*fleet.workers.values(), fleet.manager)
                   for w in worker.watches) and \
            all(fleet.workers[name].down or (link.look is not None and link.look.blind_reason()
                is None) for name, link in fleet.process.clusters.links.items())

    for _ in range(200):
        await asyncio.sleep(0)
        if settled():
            break
    for _ in range(3):  # the last event taken is handled
        await asyncio.sleep(0)


@pytest.fixture(autouse=True)
def _stop_fleets() -> Iterator[None]:
    yield
    while FLEETS:
        FLEETS.pop().close()


class Fleet:
    def __init__(self, *workers: Worker, settings: ManagerSettings | None = None) -> None:
        self.settings = settings or ManagerSettings(grace=GRACE)
        self.now = 1000.0
        self.manager = FakeKube(lambda: self.now)
        self.workers = {w.name: w for w in workers}
        for w in workers:
            self.manager.put({"apiVersion": "v1", "kind": "Secret",
                              "metadata": {"name": w.name, "namespace": "fleet"},
                              "data": {"kubeconfig": base64.b64encode(
                                  w.name.encode()).decode()}})
            self.manager.put({"apiVersion": "workload.codeflare.dev/v1beta1",
                              "kind": "WorkerCluster", "metadata": {"name": w.name},
                              "spec": {"kubeconfigSecret": {"name": w.name,
                                                            "namespace": "fleet"}}})
        self.loop = asyncio.new_event_loop()
        self.process = self.start()
        FLEETS.append(self)

    def close(self) -> None:
        """The manager stopped: its watches end with it."""
        self.loop.run_until_complete(self.process.close())
        self.loop.close()

    def start(self) -> Manager:
        """A manager process (again): nothing kept but what the API servers hold."""
        old = getattr(self, "process", None)
        if old is not None:  # the old process's watches end with it
            self.loop.run_until_complete(old.close())
        async def connect(worker: Mapping[str, Any], kubeconfig: bytes, _: Path
                          ) -> WorkerLink:
            name = worker["metadata"]["name"]
            return WorkerLink(name, {}, self.workers[name],  # type: ignore[arg-type]
                              digest(kubeconfig))

        return Manager(self.manager, self.settings,  # type: ignore[arg-type]
                       Path("/nonexistent"), clock=lambda: self.now, wall=lambda: self.now,
                       link=connect)

    def cycle(self, passes: int = 1) -> None:
        """Passes of the manager, each after the workers' watches have delivered what
        changed there (objects the test changed in place included)."""
        for _ in range(passes):
            self.loop.run_until_complete(self._pass())

    async def _pass(self) -> None:
        await self.settle()
        await self.process.cycle()

    async def settle(self) -> None:
        for link in self.process.clusters.links.values():
            link.retry_now()  # watches cut short are opened again (where they answer)
        await idle(self)
        for w in (*self.workers.values(), self.manager):
            w.publish()
        await idle(self)

    def submit(self, name: str, pods: int = 1, gpus: int = 8, labels: Mapping[str, str] = {},
               **spec: Any) -> None:
        aw = appwrapper(name, job(name, pods, gpus), **spec)
        aw["metadata"]["labels"] = dict(labels)
        self.manager.put(aw)

    def wrapper(self, name: str) -> dict[str, Any]:
        aw = self.manager.get("workload.codeflare.dev/v1beta1", "AppWrapper", "team", name)
        assert aw is not None
        return aw

    def target(self, name: str) -> str | None:
        """The worker the manager recorded it sent the wrapper to (in its status)."""
        return (self.wrapper(name).get("status") or {}).get("workerCluster")

    def holding(self, name: str) -> set[str]:
        return {w.name for w in self.workers.values() if w.copy(name) is not None}


def test_the_target_is_recorded_before_the_copy_is_made() -> None:
    fleet = Fleet(Worker("w1"))
    seen: list[str | None] = []
    fleet.workers["w1"].on_copy.append(lambda body: seen.append(fleet.target("a")))
    fleet.submit("a")
    fleet.cycle()
    assert seen == ["w1"]
    copy = fleet.workers["w1"].copy("a")
    assert copy is not None
    assert copy["metadata"]["labels"][MANAGER_UID_LABEL] == fleet.wrapper("a")["metadata"]["uid"]


def test_a_manager_restarted_between_the_two_steps_makes_the_copy_once() -> None:
    fleet = Fleet(Worker("w1"))
    w1 = fleet.workers["w1"]
    # The copy's POST fails: the manager died after recording the target.
    w1.fail_next[("POST", AW_PATH)] = [ApiError(500, "InternalError", "boom")]
    fleet.submit("a")
    fleet.cycle()
    assert fleet.target("a") == "w1" and w1.copy("a") is None
    fleet.process = fleet.start()
    fleet.cycle(3)
    assert fleet.holding("a") == {"w1"} and w1.copies_made() == 1


def test_a_copy_made_whose_answer_was_lost_is_adopted_not_made_again() -> None:
    fleet = Fleet(Worker("w1"), Worker("w2"))
    w1 = fleet.workers["w1"]
    w1.lost_answer[("POST", AW_PATH)] = [ApiError(504, "Timeout", "no answer")]
    fleet.submit("a")
    fleet.cycle()
    made = w1.copy("a")
    assert made is not None
    for _ in range(2):
        fleet.process = fleet.start()  # and restarted, twice
        fleet.cycle(2)
    assert fleet.holding("a") == {"w1"} and w1.copies_made() == 1
    assert w1.copy("a") == made


def test_a_worker_silent_past_the_grace_loses_its_wrappers_and_its_copy_on_return() -> None:
    fleet = Fleet(Worker("w1"), Worker("w2"))
    fleet.submit("a")
    fleet.cycle()
    first = fleet.target("a")
    assert first is not None
    other = next(w for w in fleet.workers if w != first)
    gone = fleet.workers[first]
    gone.down = True
    fleet.cycle()
    fleet.now += GRACE / 2
    fleet.cycle()
    assert fleet.target("a") == first  # within the grace: left where it is
    fleet.now += GRACE
    fleet.cycle()
    status = fleet.wrapper("a")["status"]
    assert fleet.target("a") is None
    assert status["state"] == "Pending" and status["numberOfRequeueings"] == 1
    assert f"worker cluster {first} did not answer for over 60s" in status["message"]
    fleet.cycle()
    assert fleet.target("a") == other and fleet.holding("a") == {first, other}
    gone.down = False
    fleet.cycle()  # one pass after it answers: its stale copy is gone
    assert fleet.holding("a") == {other} and fleet.target("a") == other


def requeue_copy(worker: Worker, name: str, **status: Any) -> None:
    copy = worker.copy(name)
    assert copy is not None
    copy["status"] = {"state": "Pending", "numberOfRequeueings": 1,
                      "message": "pods failed to start", **status}


def test_a_copy_requeued_in_its_worker_goes_back_to_the_managers_queue() -> None:
    fleet = Fleet(Worker("w1"), Worker("w2", gpus=4))
    fleet.submit("a")  # 8 GPUs: only w1 has them
    fleet.cycle()
    requeue_copy(fleet.workers["w1"], "a")
    fleet.cycle()
    status = fleet.wrapper("a")["status"]
    assert fleet.target("a") is None and fleet.holding("a") == set()
    assert status["message"] == "requeued: worker cluster w1 requeued it: pods failed to start"
    assert status["numberOfRequeueings"] == 1
    fleet.cycle(2)
    assert fleet.target("a") == "w1" and fleet.holding("a") == {"w1"}
    assert fleet.wrapper("a")["status"]["numberOfRequeueings"] == 1


def test_a_failed_copy_is_taken_back_until_the_wrappers_requeue_limit() -> None:
    fleet = Fleet(Worker("w1"))
    fleet.submit("a", schedulingSpec={"requeuing": {"maxNumRequeuings": 1}})
    fleet.cycle()
    w1 = fleet.workers["w1"]
    requeue_copy(w1, "a", state="Failed", numberOfRequeueings=0, message="boom")
    fleet.cycle(3)  # taken back, copy deleted, sent again
    assert fleet.wrapper("a")["status"]["numberOfRequeueings"] == 1
    assert fleet.target("a") == "w1" and w1.copies_made() == 2
    requeue_copy(w1, "a", state="Failed", numberOfRequeueings=0, message="boom")
    fleet.cycle()
    status = fleet.wrapper("a")["status"]
    assert status["state"] == "Failed" and "requeued 1 time(s), the limit" in status["message"]
    writes = fleet.manager.status_writes("a")
    fleet.cycle(3)  # failed for good: nothing more is written or made
    assert fleet.manager.status_writes("a") == writes and w1.copies_made() == 2


def test_each_pass_renews_the_heartbeat_in_every_answering_worker() -> None:
    fleet = Fleet(Worker("w1"), Worker("w2"))
    versions = []
    for _ in range(3):
        fleet.cycle()
        leases = {w: worker.get("coordination.k8s.io/v1", "Lease", LEASE_NAMESPACE, LEASE_NAME)
                  for w, worker in fleet.workers.items()}
        assert all(lease is not None and lease["spec"]["leaseDurationSeconds"] == GRACE / 2
                   for lease in leases.values())
        versions.append({w: lease["metadata"]["resourceVersion"]  # type: ignore[index]
                         for w, lease in leases.items()})
    assert all(len({v[w] for v in versions}) == 3 for w in fleet.workers)  # a new record each


def test_a_copy_its_worker_stopped_for_a_lost_manager_is_taken_back() -> None:
    fleet = Fleet(Worker("w1"), Worker("w2", gpus=4))
    fleet.submit("a")  # 8 GPUs: only w1 has them
    fleet.cycle()
    requeue_copy(fleet.workers["w1"], "a", numberOfRequeueings=0, message="cut off",
                 conditions=[{"type": "PreemptCandidate", "reason": "ManagerLost"},
                             {"type": "Queueing", "reason": "ManagerLost"}])
    fleet.cycle()
    status = fleet.wrapper("a")["status"]
    assert fleet.target("a") is None and fleet.holding("a") == set()
    assert status["message"] == "requeued: worker cluster w1 stopped it: cut off"
    fleet.cycle(2)
    assert fleet.target("a") == "w1" and fleet.holding("a") == {"w1"}


def test_a_worker_whose_heartbeat_cannot_be_renewed_counts_as_not_answering() -> None:
    w1 = Worker("w1")
    fleet = Fleet(w1)
    fleet.submit("a")
    fleet.cycle()
    assert fleet.target("a") == "w1"
    w1.fail[("PATCH", "/apis/coordination.k8s.io/")] = ApiError(403, "Forbidden", "no leases")
    fleet.cycle()
    worker = fleet.manager.get("workload.codeflare.dev/v1beta1", "WorkerCluster", None, "w1")
    assert worker is not None and worker["status"]["reachable"] == "False"
    assert "its heartbeat (Lease dispatcher-system/dispatcher-manager) cannot be renewed" \
        in worker["status"]["message"]
    fleet.now += GRACE + 1  # its lists still answer: the grace runs all the same
    fleet.cycle()
    assert fleet.target("a") is None


def test_the_grace_runs_from_the_last_renewal_the_worker_acknowledged() -> None:
    """The worker's fence runs from the last renewal it saw; the manager's grace from the
    last one acknowledged, not from the first look that failed after it."""
    w1 = Worker("w1")
    fleet = Fleet(w1)
    fleet.submit("a")
    fleet.cycle()
    fleet.now += GRACE - 1  # a long pause of the manager itself: no pass, no renewal
    w1.down = True
    fleet.cycle()
    assert fleet.target("a") == "w1"
    fleet.now += 2  # GRACE + 1 after the last renewal, 2 s after the first failed look
    fleet.cycle()
    assert fleet.target("a") is None


def test_status_comes_back_without_the_workers_requeue_count_and_only_when_changed() -> None:
    fleet = Fleet(Worker("w1"))
    fleet.submit("a")
    fleet.cycle()
    copy = fleet.workers["w1"].copy("a")
    assert copy is not None
    copy["status"] = {"state": "Running", "running": 1, "numberOfRequeueings": 0}
    fleet.cycle()
    status = fleet.wrapper("a")["status"]
    assert status["state"] == "Running" and status["running"] == 1
    writes = fleet.manager.status_writes("a")
    fleet.cycle(3)
    assert fleet.manager.status_writes("a") == writes


def event(uid: str, copy: Mapping[str, Any], when: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"e{uid}", "namespace": "team", "uid": uid},
            "involvedObject": {"kind": "AppWrapper", "name": copy["metadata"]["name"],
                               "namespace": "team", "uid": copy["metadata"]["uid"]},
            "reason": "Dispatched", "message": f"event {uid}", "type": "Normal",
            "lastTimestamp": f"2027-01-15T08:00:{when:02d}Z"}


def mirrored(fleet: Fleet) -> list[str]:
    return sorted(e["message"] for e in fleet.manager.of_kind("Event"))


def test_a_copys_events_are_mirrored_once_each_and_a_bounded_number_per_pass() -> None:
    fleet = Fleet(Worker("w1"))
    fleet.submit("a")
    fleet.cycle()
    w1 = fleet.workers["w1"]
    copy = w1.copy("a")
    assert copy is not None
    for i in range(EVENTS_PER_PASS + 2):
        w1.put(event(f"u{i:02d}", copy, i))
    fleet.cycle()
    first = mirrored(fleet)
    assert len(first) == EVENTS_PER_PASS and "[w1] event u11" in first
    on_manager = next(e for e in fleet.manager.of_kind("Event"))
    assert on_manager["involvedObject"]["uid"] == fleet.wrapper("a")["metadata"]["uid"]
    fleet.cycle()
    assert len(mirrored(fleet)) == EVENTS_PER_PASS + 2
    def posts() -> int:
        return sum(1 for m, p in fleet.manager.writes if m == "POST" and "/events" in p)

    before = posts()
    fleet.cycle()
    assert posts() == before  # nothing new: nothing sent
    fleet.process = fleet.start()  # a restarted manager does not mirror them twice
    fleet.cycle(2)
    assert len(mirrored(fleet)) == EVENTS_PER_PASS + 2
    before = posts()
    fleet.cycle()
    assert posts() == before


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["cycle", "restart", "w1 down", "w1 up", "w2 down",
                                 "w2 up", "wait", "requeue", "lost answer"]),
                min_size=1, max_size=25))
def test_answering_workers_hold_a_copy_only_where_the_wrapper_is_sent(steps: list[str]
                                                                       ) -> None:
    fleet = Fleet(Worker("w1"), Worker("w2"))
    fleet.submit("a")
    for s in steps:
        if s == "cycle":
            fleet.cycle()
        elif s == "restart":
            fleet.process = fleet.start()
        elif s == "wait":
            fleet.now += GRACE + 1
        elif s == "requeue":
            for w in fleet.workers.values():
                if w.copy("a") is not None and not w.down:
                    requeue_copy(w, "a")
        elif s == "lost answer":
            for w in fleet.workers.values():
                w.lost_answer[("POST", AW_PATH)] = [ApiError(504, "Timeout", "no answer")]
        else:
            name, what = s.split()
            fleet.workers[name].down = what == "down"
        if s != "cycle":
            continue
        target = fleet.target("a")
        answering = {w.name for w in fleet.workers.values() if not w.down}
        assert fleet.holding("a") & answering <= ({target} if target else set())


def sample(fleet: Fleet, metric: str, cluster: str) -> float | None:
    return fleet.process.metrics.registry.get_sample_value(metric, {"cluster": cluster})


def test_metrics_per_worker_say_sent_reachable_and_free_gpus_and_go_with_the_worker() -> None:
    fleet = Fleet(Worker("w1"), Worker("w2", gpus=4))
    fleet.submit("a", gpus=6)  # only w1 has 6
    fleet.cycle(2)
    assert sample(fleet, "dispatcher_worker_wrappers_sent", "w1") == 1
    assert sample(fleet, "dispatcher_worker_free_gpus", "w1") == 2  # held for its pod
    assert sample(fleet, "dispatcher_worker_free_gpus", "w2") == 4
    fleet.workers["w2"].down = True
    fleet.cycle()
    assert sample(fleet, "dispatcher_worker_reachable", "w2") == 0
    assert sample(fleet, "dispatcher_worker_reachable", "w1") == 1
    del fleet.manager.objects["/apis/workload.codeflare.dev/v1beta1/workerclusters/w2"]
    fleet.cycle()
    for metric in ("dispatcher_worker_wrappers_sent", "dispatcher_worker_reachable",
                   "dispatcher_worker_free_gpus"):
        assert sample(fleet, metric, "w2") is None


def test_each_pass_is_timed_where_the_manager_serves_its_metrics() -> None:
    fleet = Fleet(Worker("w1"))
    fleet.submit("a")
    stop = asyncio.Event()

    async def run_two_passes() -> None:
        async def after_two() -> None:
            while fleet.process.metrics.passes < 2:
                fleet.now += 0.25  # each pass takes a quarter of a second, to its clock
                await asyncio.sleep(0)
            stop.set()

        watcher = asyncio.create_task(after_two())
        await fleet.process.run(stop)
        await watcher

    fleet.loop.run_until_complete(run_two_passes())
    registry = fleet.process.metrics.registry
    assert registry.get_sample_value("dispatcher_manager_pass_duration_seconds_count") == 2
    assert fleet.holding("a") == {"w1"}


def test_the_managers_health_is_its_passes() -> None:
    from dispatcher.controller.manager.manager_metrics import ManagerMetrics, ManagerServer

    now = [0.0]
    metrics = ManagerMetrics(clock=lambda: now[0])
    server = ManagerServer(metrics, port=0, max_age=120)
    assert server.health() == (False, "starting: no pass over the worker clusters finished yet")
    metrics.observe({})
    assert server.health()[0]
    now[0] = 500.0
    ok, why = server.health()
    assert not ok and "has not finished a pass for" in why


def test_the_managers_health_names_the_workers_not_answering_and_a_standby() -> None:
    from dispatcher.controller.manager.manager_metrics import (
        ManagerMetrics,
        ManagerServer,
        WorkerFigures,
    )

    metrics = ManagerMetrics(clock=lambda: 10.0)
    waiting: list[str | None] = ["waiting for Lease dispatcher-system/dispatcher-manager-leader"]
    server = ManagerServer(metrics, port=0, standby=lambda: waiting[0])
    assert server.health() == (
        True, "standby: waiting for Lease dispatcher-system/dispatcher-manager-leader")
    waiting[0] = None
    metrics.observe({"w1": WorkerFigures(1, True, 8), "w2": WorkerFigures(0, False, 0)})
    assert server.health() == (True, "ok: 1 passes, the last 0.0s ago; not answering: w2")


class Refuse:
    """--metrics-auth as a stand-in: only the token "good" may read /metrics."""

    async def check(self, authorization: str | None, path: str) -> tuple[int, str] | None:
        return None if authorization == "Bearer good" else (401, "a bearer token, please")

    async def close(self) -> None:
        pass


def test_the_managers_metrics_answer_only_whom_metrics_auth_lets_through() -> None:
    import aiohttp

    from dispatcher.controller.manager.manager_metrics import ManagerMetrics, ManagerServer

    async def scenario() -> list[int]:
        server = ManagerServer(ManagerMetrics(), port=0, host="127.0.0.1", auth=Refuse())
        await server.start()
        assert server._runner is not None
        port = next(a[1] for a in server._runner.addresses if isinstance(a, tuple))
        out = []
        async with aiohttp.ClientSession() as http:
            for headers in ({}, {"Authorization": "Bearer bad"},
                            {"Authorization": "Bearer good"}):
                async with http.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as r:
                    out.append(r.status)
            async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                out.append(r.status)  # the kubelet's probes carry no token
        await server.stop()
        return out

    assert asyncio.run(scenario()) == [401, 401, 200, 503]


GOLD = {"team": "gold"}


def team_quota(worker: Worker, gold: int) -> None:
    """Tree `team` in the worker: root (16 GPUs) over a hard gold leaf of `gold` GPUs."""
    worker.put(subtree("root", "team", [("root", {"nvidia.com/gpu": 16}, False)]))
    worker.put(subtree("kids", "team", [("gold", {"nvidia.com/gpu": gold}, True)],
                       parent="root"))


def admitted_there(worker: Worker, name: str, gpus: int) -> None:
    """A wrapper submitted in the worker itself and running there (its pods not bound:
    only its quota is counted, as its dispatcher counts it)."""
    aw = appwrapper(name, job(name, 1, gpus))
    aw["metadata"]["labels"] = dict(GOLD)
    aw["status"] = {"state": "Running"}
    worker.put(aw)


def test_a_gang_whose_quota_is_full_in_one_worker_goes_to_the_other() -> None:
    fleet = Fleet(Worker("w1", gpus=16), Worker("w2", gpus=16))
    for w in fleet.workers.values():
        team_quota(w, gold=8)
    admitted_there(fleet.workers["w1"], "local", 8)  # w1's gold is used up
    fleet.submit("a", labels=GOLD)
    fleet.cycle()
    assert fleet.target("a") == "w2"  # w1 would win the tie: same room, first by name


def test_a_wrapper_sent_and_not_yet_admitted_counts_and_the_wait_names_the_quota() -> None:
    fleet = Fleet(Worker("w1", gpus=16))
    team_quota(fleet.workers["w1"], gold=8)
    fleet.submit("a", labels=GOLD)
    fleet.cycle()
    assert fleet.target("a") == "w1"  # its copy is not admitted there yet
    fleet.submit("b", labels=GOLD)
    fleet.cycle(2)
    assert fleet.target("b") is None  # w1 has the room, not the quota
    assert fleet.wrapper("b")["status"]["message"] == (
        "no worker cluster can take the whole gang now: w1: its quota: gold (tree team) "
        "would use 16 of its 8 nvidia.com/gpu and cannot borrow: hardLimit")


@pytest.mark.parametrize("status", [404, 403])  # no CRD; a user who may not list them
def test_a_worker_whose_quota_trees_cannot_be_listed_takes_gangs_as_before(
        status: int, caplog: pytest.LogCaptureFixture) -> None:
    fleet = Fleet(Worker("w1", quota_error=status))
    fleet.submit("a", labels=GOLD)
    fleet.cycle(3)
    assert fleet.target("a") == "w1"
    assert fleet.process.clusters.links["w1"].reachable
    said = [r.message for r in caplog.records if "quotasubtrees cannot be listed" in r.message]
    assert len(said) == (1 if status == 403 else 0)


def rack_node(name: str, rack: str, gpus: int) -> dict[str, Any]:
    n = node(name, gpus)
    n["metadata"]["labels"] = {RACK: rack}
    return n


RACK = "topology.example.com/rack"


def test_a_gang_requiring_a_rack_goes_to_the_worker_with_one_free() -> None:
    w1, w2 = Worker("w1", gpus=4), Worker("w2", gpus=4)
    w1.put(rack_node("w1-n0", "r1", 4))
    w1.put(rack_node("w1-n1", "r2", 4))  # 8 GPUs, in two racks
    w2.put(rack_node("w2-n0", "r1", 4))
    w2.put(rack_node("w2-n1", "r1", 4))  # 8 GPUs in one rack
    fleet = Fleet(w1, w2, settings=ManagerSettings(grace=GRACE, topology=Topology((RACK,))))
    aw = appwrapper("a", job("a", 2, 4))
    aw["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"]["template"][
        "metadata"] = {"annotations": {"kueue.x-k8s.io/podset-required-topology": RACK}}
    fleet.manager.put(aw)
    fleet.cycle()
    assert fleet.target("a") == "w2"


def test_the_heartbeat_is_renewed_while_a_pass_runs_longer_than_the_fence() -> None:
    fleet = Fleet(Worker("w1"), settings=ManagerSettings(grace=GRACE, interval=0.01))
    w1 = fleet.workers["w1"]
    wedged, stop = asyncio.Event(), asyncio.Event()
    manager_cluster = fleet.process.own.current
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{LEASE_NAME}"

    async def slow() -> list[dict[str, Any]]:
        # The second pass waits here, as one making a thousand copies on a loaded machine
        # would, past the worker's fence (GRACE / 2 seconds): a second on the manager's
        # clock for each period between passes.
        if fleet.process.metrics.passes >= 1:
            wedged.set()
            # One renewal answered too slowly, early on: the next ones go on all the same.
            w1.fail[("PATCH", lease)] = ApiError(504, "Timeout", "too slow")
            begin = fleet.now
            while not stop.is_set():
                fleet.now += 1.0
                if fleet.now > begin + 3:
                    w1.fail.pop(("PATCH", lease), None)
                await asyncio.sleep(0.01)
        return await manager_cluster()

    fleet.process.own.current = slow  # type: ignore[method-assign]

    def renewed() -> float:
        lease = w1.get("coordination.k8s.io/v1", "Lease", LEASE_NAMESPACE, LEASE_NAME)
        assert lease is not None
        return datetime.fromisoformat(lease["spec"]["renewTime"]).timestamp()

    async def scenario() -> tuple[float, float, int]:
        run = asyncio.create_task(fleet.process.run(stop))
        await wedged.wait()
        started = fleet.now
        while fleet.now < started + 2 * GRACE:
            await asyncio.sleep(0.01)
        passes = fleet.process.metrics.passes
        stop.set()
        await run
        return started, renewed(), passes

    started, last, passes = fleet.loop.run_until_complete(scenario())
    assert passes == 1  # the second pass did not end while timed
    assert last > started + GRACE  # renewed all along, the fence (GRACE / 2) never ran out


def test_a_queue_posted_at_once_is_told_why_it_waits_a_share_each_pass_head_first() -> None:
    from dispatcher.controller.manager.passes import WAITING_WRITES_PER_PASS as SHARE

    fleet = Fleet(Worker("w1"))
    names = [f"aw-{i:03d}" for i in range(2 * SHARE + 10)]
    for name in names:
        fleet.submit(name, gpus=16)  # fits nowhere

    def told() -> list[str]:
        return [n for n in names if (fleet.wrapper(n).get("status") or {}).get("message")]

    fleet.cycle()
    assert told() == names[:SHARE]
    fleet.cycle(2)
    assert told() == names
    writes = sum(fleet.manager.status_writes(n) for n in names)
    fleet.cycle(2)
    assert sum(fleet.manager.status_writes(n) for n in names) == writes  # nothing new to say


def test_a_quiet_pass_does_not_look_again_at_what_did_not_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import dispatcher.controller.manager.passes as passes
    import dispatcher.controller.manager.worker_clusters as worker_clusters

    looked: list[str] = []
    parsed: list[str] = []
    step, kubeconfig_of = passes.rules.step, worker_clusters.kubeconfig_of

    def counted_step(worker: str, uid: str, *a: Any) -> Any:
        looked.append(uid)
        return step(worker, uid, *a)

    def counted_kubeconfig(worker: Mapping[str, Any], secret: Mapping[str, Any]) -> bytes:
        parsed.append(worker["metadata"]["name"])
        return kubeconfig_of(worker, secret)

    monkeypatch.setattr(passes.rules, "step", counted_step)
    monkeypatch.setattr(worker_clusters, "kubeconfig_of", counted_kubeconfig)
    fleet = Fleet(Worker("w1"))
    for name in ("a", "b"):
        fleet.submit(name, gpus=1)
    fleet.cycle(3)  # sent, copied, mirrored
    assert fleet.holding("a") == fleet.holding("b") == {"w1"}
    looked.clear()
    parsed.clear()
    fleet.cycle(5)
    assert looked == [] and parsed == []
    requeue_copy(fleet.workers["w1"], "a")  # its copy changes: looked at, taken back
    fleet.cycle()
    assert len(set(looked)) == 1 and fleet.target("a") is None


def test_a_worker_is_listed_once_then_each_pass_asks_it_only_for_the_heartbeat() -> None:
    w1 = Worker("w1")
    for i in range(1, 200):
        w1.put(node(f"w1-n{i}", 8))
    fleet = Fleet(w1)
    fleet.submit("a")
    fleet.cycle()
    assert sorted(w1.listed) == ["appwrappers", "events", "nodes", "pods", "quotasubtrees"]
    asked = len(w1.listed), len(w1.writes), len(w1.reads)
    fleet.cycle(10)
    assert len(w1.listed) == asked[0]  # nothing listed again
    assert len(w1.reads) == asked[2]
    assert [p for _, p in w1.writes[asked[1]:]] == \
        [f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{LEASE_NAME}"] * 10


def test_what_changes_in_a_worker_reaches_the_pass_through_its_watches() -> None:
    w1 = Worker("w1")
    fleet = Fleet(w1)
    fleet.submit("a")
    fleet.submit("b")
    fleet.cycle()
    assert fleet.target("a") == "w1" and fleet.target("b") is None  # 8 GPUs: one gang
    w1.put(node("w1-n1", 8))  # a node joins: seen without a listing
    fleet.cycle()
    assert fleet.target("b") == "w1"
    copy = w1.copy("a")
    assert copy is not None
    copy["status"] = {"state": "Running", "running": 1}
    fleet.cycle()
    assert fleet.wrapper("a")["status"]["state"] == "Running"
    assert sorted(w1.listed) == ["appwrappers", "events", "nodes", "pods", "quotasubtrees"]


def test_a_cut_watch_makes_the_worker_unreachable_and_it_catches_up_when_back() -> None:
    w1 = Worker("w1")
    fleet = Fleet(w1)
    fleet.submit("a")
    fleet.cycle()
    w1.down = True
    fleet.cycle()
    link = fleet.process.clusters.links["w1"]
    assert not link.reachable and "not watching" in link.problem
    copy = w1.copy("a")
    assert copy is not None
    copy["status"] = {"state": "Running", "running": 1}  # while the manager cannot see
    w1.down = False
    fleet.cycle()
    assert link.reachable and fleet.wrapper("a")["status"]["state"] == "Running"
    assert w1.copies_made() == 1


def test_a_worker_down_for_many_passes_has_its_workercluster_status_written_once() -> None:
    # "Not watching for 3s", "for 4s"... written at every pass would be a status write a
    # second per silent worker; the time is the manager's to count (since when it is down).
    w1 = Worker("w1")
    fleet = Fleet(w1)
    fleet.cycle()
    w1.down = True
    fleet.cycle()
    written = fleet.manager.status_writes("w1")
    view = fleet.process.clusters.links["w1"].look
    assert view is not None
    for _ in range(5):
        fleet.now += 7
        for informer in view.informers:  # their own clock: as if 7 s had passed there too
            if informer.lost_since is not None:
                informer.lost_since -= 7
        fleet.cycle()
    assert fleet.manager.status_writes("w1") == written
    status = fleet.manager.get("workload.codeflare.dev/v1beta1", "WorkerCluster", None,
                               "w1")["status"]  # type: ignore[index]
    assert status["reachable"] == "False" and "not watching" in status["message"]


def test_a_copys_events_are_found_among_many_without_reading_the_others() -> None:
    fleet = Fleet(Worker("w1"))
    fleet.submit("a")
    fleet.cycle()
    w1 = fleet.workers["w1"]
    copy = w1.copy("a")
    assert copy is not None
    other = {"metadata": {"name": "x", "uid": "someone-else"}}
    for i in range(300):
        w1.put(event(f"o{i:03d}", other, i % 60))
    w1.put(event("mine", copy, 1))
    fleet.cycle()
    view = fleet.process.clusters.links["w1"].look
    assert view is not None
    assert [e["metadata"]["uid"] for e in view.events_of(copy["metadata"]["uid"])] == ["mine"]
    assert mirrored(fleet) == ["[w1] event mine"]
    w1.objects = {p: o for p, o in w1.objects.items()
                  if not (o.get("kind") == "Event" and o["metadata"]["uid"] == "mine")}
    fleet.cycle()
    assert view.events_of(copy["metadata"]["uid"]) == []  # deleted there: forgotten here


DENIED = ('admission webhook "appwrappers.dispatcher.codeflare.dev" denied the request: '
          'metadata.labels.quota_context: quota node gold of tree quota_context needs use on '
          'quotasubtrees named quota_context:gold')


def test_a_copy_its_worker_refuses_fails_the_wrapper_with_the_workers_reason() -> None:
    w1 = Worker("w1")
    w1.fail[("POST", AW_PATH)] = ApiError(403, "Forbidden", DENIED)
    fleet = Fleet(w1)
    fleet.submit("a", labels=GOLD)
    fleet.cycle()
    status = fleet.wrapper("a")["status"]
    assert status["state"] == "Failed"
    assert status["message"] == f"failed: worker cluster w1 refused its copy: {DENIED}"
    assert fleet.target("a") is None
    fleet.cycle(3)  # not tried again: it would be refused again
    assert w1.copy_posts == 1 and fleet.wrapper("a")["status"]["state"] == "Failed"


def test_a_worker_where_the_manager_may_not_create_appwrappers_is_tried_again() -> None:
    w1 = Worker("w1")
    w1.fail[("POST", AW_PATH)] = ApiError(
        403, "Forbidden", 'appwrappers.workload.codeflare.dev is forbidden: User "system:'
        'serviceaccount:dispatcher-system:dispatcher-manager-access" cannot create resource '
        '"appwrappers"')
    fleet = Fleet(w1)
    fleet.submit("a")
    fleet.cycle(2)
    assert fleet.target("a") == "w1" and w1.copy_posts == 2  # the worker to fix, not it
    del w1.fail[("POST", AW_PATH)]
    fleet.cycle()
    assert fleet.holding("a") == {"w1"}


def test_a_view_lagging_the_managers_own_write_makes_no_copy() -> None:
    """The manager's AppWrappers are watched: a view that still shows a wrapper sent to a
    worker the API server no longer names (its watch behind) makes no copy there."""
    fleet = Fleet(Worker("w1"))
    fleet.submit("a")
    fleet.cycle()
    w1 = fleet.workers["w1"]
    assert fleet.holding("a") == {"w1"} and w1.copy_posts == 1
    uid = fleet.wrapper("a")["metadata"]["uid"]
    path = "/apis/workload.codeflare.dev/v1beta1/namespaces/team/appwrappers/a"
    fleet.manager.objects[path]["status"] = {"state": "Failed"}  # requeued, failed there
    assert fleet.target("a") is None
    w1.objects = {p: o for p, o in w1.objects.items() if o.get("kind") != "AppWrapper"}
    w1.publish()  # the worker's watch is current; the manager's own is behind
    fleet.loop.run_until_complete(idle(fleet))
    assert fleet.process.own.objects[uid]["status"]["workerCluster"] == "w1"
    fleet.loop.run_until_complete(fleet.process.cycle())
    assert w1.copy_posts == 1 and fleet.holding("a") == set()


# --- nothing a worker holds ends the manager -------------------------------------------


def huge_pod(name: str, node_name: str) -> dict[str, Any]:
    """A pod bound by someone else (spec.nodeName), asking 8E of an extended resource in
    each of two containers: more than a 64-bit count holds, summed on its node."""
    def box(c: str) -> dict[str, Any]:
        return {"name": c, "resources": {"requests": {"example.com/foo": "8E"},
                                         "limits": {"example.com/foo": "8E"}}}

    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team"},
            "spec": {"nodeName": node_name, "containers": [box("a"), box("b")]},
            "status": {"phase": "Running"}}


def lease_version(worker: Worker) -> str:
    lease = worker.get("coordination.k8s.io/v1", "Lease", LEASE_NAMESPACE, LEASE_NAME)
    assert lease is not None
    return str(lease["metadata"]["resourceVersion"])


def worker_status(fleet: Fleet, name: str) -> dict[str, Any]:
    worker = fleet.manager.get("workload.codeflare.dev/v1beta1", "WorkerCluster", None, name)
    assert worker is not None
    return dict(worker.get("status") or {})


def break_room(fleet: Fleet) -> None:
    """w1's free room cannot be counted: any error, not only an overflow."""
    view = fleet.process.clusters.links["w1"].look
    assert view is not None

    def broken() -> Any:
        raise RuntimeError("injected: the free matrix cannot be made")

    view.state.free_matrix = broken  # type: ignore[method-assign]


def break_bound(fleet: Fleet) -> None:
    """What w1 holds of a sent gang cannot be read."""
    view = fleet.process.clusters.links["w1"].look
    assert view is not None

    def broken(namespace: str, wrapper: str) -> int:
        raise KeyError("injected: no such pod")

    view.bound = broken  # type: ignore[method-assign]


class Exploding(dict[str, Any]):
    def get(self, *a: Any, **kw: Any) -> Any:
        raise ValueError("injected: an Event that cannot be read")


def break_events(fleet: Fleet) -> None:
    """The Events about w1's copies cannot be read (the sent wrapper's step fails)."""
    view = fleet.process.clusters.links["w1"].look
    assert view is not None
    view.events_by_object = Exploding(view.events_by_object)
    fleet.process.settled.clear()  # the copy step is taken again


def put_huge_pod(fleet: Fleet) -> None:
    fleet.workers["w1"].put(huge_pod("huge", "w1-n0"))


@pytest.mark.parametrize("breaking", [break_room, break_bound, break_events])
def test_what_a_worker_holds_costs_that_worker_only_and_says_so(breaking: Any) -> None:
    fleet = Fleet(Worker("w1"), Worker("w2"))
    fleet.submit("a")
    fleet.cycle(2)
    assert fleet.target("a") == "w1" and fleet.holding("a") == {"w1"}
    beats = {name: lease_version(w) for name, w in fleet.workers.items()}
    breaking(fleet)
    fleet.submit("b")  # 8 GPUs: w2 is free
    fleet.cycle(2)  # before: the pass raised, and `dispatcher run --manager` exited
    assert fleet.target("b") == "w2" and fleet.holding("b") == {"w2"}
    # w1 keeps what it was sent, its heartbeat goes on, as does the other's.
    assert fleet.target("a") == "w1" and fleet.holding("a") == {"w1"}
    assert all(lease_version(w) != beats[name] for name, w in fleet.workers.items())
    status = worker_status(fleet, "w1")
    assert status["reachable"] == "True"
    assert status["message"].startswith("the manager cannot use what it holds: ")
    assert "nothing is sent there until that is fixed" in status["message"]
    assert worker_status(fleet, "w2").get("message", "") == ""
    fleet.submit("c", gpus=1)  # w2 is full; w1 has no room, or none the manager can read
    fleet.cycle()
    assert fleet.target("c") is None
    assert "w1: the manager cannot use what it holds" in fleet.wrapper("c")["status"]["message"]


def test_a_pod_asking_beyond_64_bits_in_a_worker_costs_nothing() -> None:
    # A worker's tenant binds a pod asking 8E of a resource in two containers: its node's
    # free amount is below the 64-bit range. The manager's pass raised on it and
    # `dispatcher run --manager` exited; now the amount is counted bounded (none of that
    # resource free there) and the worker is used as before.
    fleet = Fleet(Worker("w1"))
    put_huge_pod(fleet)
    fleet.submit("b")
    fleet.cycle(2)
    assert fleet.target("b") == "w1" and fleet.holding("b") == {"w1"}
    assert worker_status(fleet, "w1").get("message", "") == ""


def test_an_unforeseen_error_in_a_pass_does_not_end_the_manager() -> None:
    fleet = Fleet(Worker("w1"))
    fleet.submit("a")
    stop = asyncio.Event()
    current = fleet.process.own.current
    calls = [0]

    async def failing_once() -> list[dict[str, Any]]:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("injected: a bug in the pass")
        return await current()

    fleet.process.own.current = failing_once  # type: ignore[method-assign]

    async def scenario() -> None:
        async def until_sent() -> None:
            while fleet.target("a") is None:
                fleet.now += 0.25
                await asyncio.sleep(0)
            stop.set()

        watcher = asyncio.create_task(until_sent())
        assert await fleet.process.run(stop) == 0
        await watcher

    fleet.loop.run_until_complete(asyncio.wait_for(scenario(), 30))
    assert calls[0] >= 2 and fleet.holding("a") == {"w1"}


# --- a pod counts for a sent gang only when its owner chain proves it ------------------

APPWRAPPER_LABEL = "workload.codeflare.dev/appwrapper"


def labelled_pod(name: str, gang: str, node_name: str, gpus: int = 0,
                 owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    refs = [] if owner is None else [{
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
        "controller": True}]
    limits = {"nvidia.com/gpu": gpus} if gpus else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team",
                         "labels": {APPWRAPPER_LABEL: gang}, "ownerReferences": refs},
            "spec": {"nodeName": node_name, "containers": [
                {"name": "c", "resources": {"limits": limits}}]},
            "status": {"phase": "Running"}}


def test_an_empty_pod_labelled_for_a_sent_gang_does_not_free_its_room() -> None:
    fleet = Fleet(Worker("w1"), Worker("w2", gpus=16))
    fleet.submit("a")  # 8 GPUs: w1 is the best fit (nothing left there)
    fleet.cycle(2)
    assert fleet.target("a") == "w1"  # its pod not made yet: the manager holds its room
    # A tenant of w1, who may create pods there, makes an empty one labelled for a.
    fleet.workers["w1"].put(labelled_pod("squat", "a", "w1-n0"))
    fleet.submit("b")  # 8 GPUs
    fleet.cycle(3)
    # Before: a counted as bound, its room free again: b sent to the full w1, stranded.
    assert fleet.target("b") == "w2"
    assert sample(fleet, "dispatcher_worker_free_gpus", "w1") == 0


def running_copy(worker: Worker, name: str, *items: dict[str, Any]) -> None:
    """The worker's dispatcher made the copy's items and recorded their uids."""
    copy = worker.copy(name)
    assert copy is not None
    made = []
    for item in items:
        item["metadata"]["ownerReferences"] = [{
            "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "name": name, "uid": copy["metadata"]["uid"], "controller": True}]
        made.append(worker.put(item))
    copy["status"] = {"state": "Running", "wrappedItems": [
        {"apiVersion": i["apiVersion"], "kind": i["kind"], "name": i["metadata"]["name"],
         "uid": i["metadata"]["uid"]} for i in made]}


def test_pods_proven_the_gangs_count_for_it_through_any_owner_chain() -> None:
    fleet = Fleet(Worker("w1", gpus=16), Worker("w2", gpus=16))
    fleet.submit("a", pods=2, gpus=4)
    fleet.cycle(2)
    first = fleet.target("a")
    assert first is not None
    w = fleet.workers[first]
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "a", "namespace": "team"}}
    running_copy(w, "a", deployment)
    made = w.get("apps/v1", "Deployment", "team", "a")
    assert made is not None
    replicas = w.put({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                      "metadata": {"name": "a-1", "namespace": "team", "ownerReferences": [{
                          "apiVersion": "apps/v1", "kind": "Deployment", "name": "a",
                          "uid": made["metadata"]["uid"], "controller": True}]}})
    for i in range(2):  # pod -> ReplicaSet (looked up in the worker) -> the Deployment made
        w.put(labelled_pod(f"a-{i}", "a", f"{first}-n0", 4, owner=replicas))
    fleet.cycle(3)
    # Proven: the 8 GPUs its pods take are not held for it a second time.
    assert sample(fleet, "dispatcher_worker_free_gpus", first) == 8


# --- the manager's queue keeps out what the controller's queue gate keeps out ----------

HELD = "workload.codeflare.dev/held-by"


def v1beta2_wrapper(name: str, **spec: Any) -> dict[str, Any]:
    from .test_runtime_v1beta2 import codeflare
    return codeflare(name, job(name, 1, 8), **spec)


@pytest.mark.parametrize("kind", ["held", "suspended", "managed elsewhere"])
def test_the_manager_sends_nothing_the_controller_would_keep_out_of_its_queue(kind: str
                                                                                ) -> None:
    fleet = Fleet(Worker("w1"))
    if kind == "held":
        fleet.submit("kept")
        fleet.wrapper("kept")["metadata"]["annotations"] = {HELD: "alice"}
    elif kind == "suspended":
        fleet.manager.put(v1beta2_wrapper("kept", suspend=True))
    else:
        fleet.manager.put(v1beta2_wrapper("kept", managedBy="kueue.x-k8s.io/multikueue"))
    fleet.submit("other")  # 8 GPUs: the whole worker, after it in the queue
    fleet.cycle(3)
    # Before: `kept` was sent, its copy waited (or was ignored) in w1, which it kept full.
    assert fleet.target("kept") is None and fleet.holding("kept") == set()
    assert fleet.target("other") == "w1"
    message = (fleet.wrapper("kept").get("status") or {}).get("message")
    assert message == {
        "held": "held by alice: it keeps its place in the queue and is not dispatched until "
                "released (kubectl appwrapper release kept)",
        "suspended": "suspended (spec.suspend is true): it keeps its place in the queue and "
                     "is not dispatched until spec.suspend is false",
        "managed elsewhere": None}[kind]  # another controller's: not a word written on it


def test_a_held_wrapper_released_is_sent_and_a_cancelled_one_fails() -> None:
    fleet = Fleet(Worker("w1", gpus=16))
    fleet.submit("held")
    fleet.wrapper("held")["metadata"]["annotations"] = {HELD: "alice"}
    fleet.submit("cancelled")
    fleet.wrapper("cancelled")["metadata"]["annotations"] = {
        "workload.codeflare.dev/cancelled-by": "bob"}
    fleet.cycle(2)
    assert fleet.target("held") is None and fleet.target("cancelled") is None
    status = fleet.wrapper("cancelled")["status"]
    assert status["state"] == "Failed"
    assert status["message"] == "cancelled by bob: it will not be dispatched"
    del fleet.wrapper("held")["metadata"]["annotations"][HELD]  # released
    fleet.cycle(2)
    assert fleet.target("held") == "w1" and fleet.holding("held") == {"w1"}
    assert fleet.target("cancelled") is None and fleet.holding("cancelled") == set()


def on_fleet_clock(fleet: Fleet) -> None:
    """The workers' API servers stamp what they create with the fleet's clock."""
    for w in fleet.workers.values():
        w.clock = lambda: fleet.now


def test_a_copy_that_never_starts_in_its_worker_is_taken_back_and_tried_elsewhere() -> None:
    fleet = Fleet(Worker("w1"), Worker("w2"),
                  settings=ManagerSettings(grace=GRACE, start_within=300.0))
    on_fleet_clock(fleet)
    fleet.submit("a")
    fleet.cycle()
    assert fleet.target("a") == "w1"
    copy = fleet.workers["w1"].copy("a")
    assert copy is not None  # it waits there: held by the worker's own admin, say
    copy["status"] = {"state": "Pending", "message": "held by admin: it keeps its place"}
    fleet.now += 299
    fleet.cycle(2)
    assert fleet.target("a") == "w1"  # within the bound: left there
    fleet.now += 2
    fleet.cycle()
    status = fleet.wrapper("a")["status"]
    assert fleet.target("a") is None and status["state"] == "Pending"
    assert status["message"] == ("requeued: worker cluster w1 did not start it within 300s "
                                 "(there: held by admin: it keeps its place)")
    assert not status.get("numberOfRequeueings")  # it never ran: no requeue counted
    fleet.cycle(2)
    # Tried elsewhere first, although w1 looks as free.
    assert fleet.target("a") == "w2" and fleet.holding("a") == {"w2"}


def test_a_copy_that_waits_is_not_taken_back_where_no_bound_is_set_and_started_ones_stay(
        ) -> None:
    fleet = Fleet(Worker("w1"), settings=ManagerSettings(grace=GRACE, start_within=0))
    on_fleet_clock(fleet)
    fleet.submit("a")
    fleet.cycle()
    fleet.now += 10_000
    fleet.cycle(2)
    assert fleet.target("a") == "w1"
    started = Fleet(Worker("w1"))  # the default bound
    on_fleet_clock(started)
    started.submit("a")
    started.cycle()
    copy = started.workers["w1"].copy("a")
    assert copy is not None
    copy["status"] = {"state": "Running", "running": 1}
    started.now += 10_000
    started.cycle(2)
    assert started.target("a") == "w1"


def test_the_start_bound_is_the_documented_default_and_a_negative_one_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    from dispatcher.cli import EXIT_INPUT, build_parser, main
    from dispatcher.fleet.copies import START_WITHIN

    given = build_parser().parse_args(["run", "--manager"]).worker_start_seconds
    assert given == ManagerSettings().start_within == START_WITHIN == 300.0
    assert main(["run", "--manager", "--worker-start-seconds", "-1"]) == EXIT_INPUT
    assert "--worker-start-seconds must be 0 (never) or more, got -1" in \
        capsys.readouterr().err



# --- the manager goes by what it recorded, never by a tenant's label -------------------


def test_a_tenants_own_cluster_label_is_not_taken_for_sent() -> None:
    """No webhook in the manager cluster: a tenant labels its wrapper with a worker."""
    fleet = Fleet(Worker("w1", gpus=4), Worker("w2"))
    fleet.submit("a", labels={CLUSTER_LABEL: "w1"})  # 8 GPUs: only w2 has them
    fleet.cycle(3)
    # Before: taken for sent to w1, a copy made there with no fit, queue or quota check.
    assert fleet.holding("a") == {"w2"} and fleet.target("a") == "w2"
    assert fleet.workers["w1"].copy_posts == 0


def test_a_wrapper_an_earlier_manager_sent_by_its_label_is_adopted_not_sent_again() -> None:
    fleet = Fleet(Worker("w1"), Worker("w2"))
    fleet.submit("a")
    fleet.cycle(2)
    assert fleet.target("a") == "w1"
    # As an earlier manager left it: the label names the worker, the status does not, and
    # the worker's dispatcher took the copy in (its status records whose copy it is).
    path = "/apis/workload.codeflare.dev/v1beta1/namespaces/team/appwrappers/a"
    stored = fleet.manager.objects[path]
    uid = stored["metadata"]["uid"]
    stored["metadata"]["labels"] = {CLUSTER_LABEL: "w1"}
    del stored["status"]["workerCluster"]
    copy = fleet.workers["w1"].copy("a")
    assert copy is not None
    copy["status"] = {"state": "Running", "managerUid": uid}
    fleet.process = fleet.start()
    fleet.cycle(3)
    assert fleet.target("a") == "w1" and fleet.holding("a") == {"w1"}
    assert fleet.workers["w1"].copies_made() == 1 and fleet.workers["w2"].copy_posts == 0


def test_an_arithmetic_fault_says_where_to_look() -> None:
    from dispatcher.controller.manager.worker_clusters import fault_message
    said = fault_message("counting its free room", OverflowError("Python int too large"))
    assert said.startswith("counting its free room failed (OverflowError: Python int too large)")
    assert "look for a pod asking, or a node offering, an enormous quantity" in said
    assert "enormous" not in fault_message("reading its pods", KeyError("spec"))
