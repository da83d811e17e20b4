"""One queue, several clusters: a manager (`dispatcher run --manager`) and two workers, three
local control planes side by side (`<cluster>-manager`, `-w1`, `-w2`; 2 nodes x 8 GPUs each).

Each worker runs `dispatcher run` as today; the manager sends each AppWrapper to a worker
where its whole gang fits, mirrors its status back, and deletes copies it no longer sends.
Invariants are checked by sampling all three clusters while the tests run. Tenants act
with their own credentials: in the manager cluster, one who may create AppWrappers; in a
worker, one who may create pods there.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localcluster import Cluster, Kubectl, users, wait_for
from localcluster.testing import container, register_workers

from .dispatcher_process import DispatcherProcess
from .fleet import WORKERS, FleetClusters
from .test_actions import viewer_token
from .test_controller import appwrapper, job

REPO = Path(__file__).resolve().parents[2]
WORKER_CRD = REPO / "crds" / "workerclusters.workload.codeflare.dev.yaml"
AW_LABEL = "workload.codeflare.dev/appwrapper"
GRACE = 45  # --worker-grace of the manager, seconds (the least it takes)
HANDOVER_GRACE = 240  # the leader-kill test's: workers fence its copies after 120 s unheard


@dataclass
class Fleet:
    manager: Cluster
    workers: dict[str, Cluster]
    process: DispatcherProcess
    worker_processes: dict[str, DispatcherProcess]

    def kubectl(self, name: str, namespace: str) -> Kubectl:
        cluster = self.manager if name == "manager" else self.workers[name]
        return cluster.kubectl(namespace)

    def copies(self, namespace: str, name: str) -> set[str]:
        """The workers holding a copy of the wrapper (a worker not answering: skipped)."""
        return {w for w, c in self.workers.items() if c.apiserver_ready()
                and c.kubectl(namespace).run("get", "aw", name, check=False).returncode == 0}

    def running_in(self, namespace: str, name: str) -> set[str]:
        out = set()
        for w, c in self.workers.items():
            if not c.apiserver_ready():
                continue
            pods = c.kubectl(namespace).items("pods", "-l", f"{AW_LABEL}={name}")
            if any(p["status"].get("phase") == "Running" for p in pods):
                out.add(w)
        return out


def start_dispatchers(manager: Cluster, workers: dict[str, Cluster], grace: float
                      ) -> tuple[DispatcherProcess, dict[str, DispatcherProcess]]:
    """Each worker's `dispatcher run`, then the manager's `dispatcher run --manager`."""
    worker_processes = {w: DispatcherProcess(c.kubeconfig, c.logs, f"dispatcher-{w}")
                        for w, c in workers.items()}
    for p in worker_processes.values():
        p.start("fifo")
    process = DispatcherProcess(manager.kubeconfig, manager.logs, "manager")
    process.start("fifo", extra_args=["--manager", "--worker-grace", str(grace)])
    return process, worker_processes


@pytest.fixture(scope="module")
def fleet(fleet_clusters: FleetClusters) -> Iterator[Fleet]:
    fleet_clusters.up()  # quick when a module before brought them up
    manager, workers = fleet_clusters.manager, fleet_clusters.workers
    register_workers(manager.kubectl(), {w: c.kubeconfig for w, c in workers.items()},
                     WORKER_CRD)
    process, worker_processes = start_dispatchers(manager, workers, GRACE)
    yield Fleet(manager, workers, process, worker_processes)
    process.stop()
    for p in worker_processes.values():
        p.stop()


@pytest.fixture
def ns(fleet: Fleet) -> Iterator[str]:
    name = f"mc-{uuid.uuid4().hex[:6]}"
    fleet.manager.kubectl()("create", "namespace", name)
    if not fleet.process.alive():
        fleet.process.start("fifo", extra_args=["--manager", "--worker-grace", str(GRACE)])
    yield name
    fleet.kubectl("manager", name)("delete", "aw", "--all", "--wait=false")
    # The manager deletes the copies; their Jobs' pods go with them: every GPU free again.
    for w in WORKERS:
        k = fleet.kubectl(w, name)
        wait_for(lambda k=k: not k.items("aw") and not k.items("pods"), 90,
                 f"the copies and pods in {w}/{name} to be gone")


def gpus_gang(name: str, pods: int, gpus: int) -> dict[str, Any]:
    return appwrapper(name, job(name, pods, gpus))


def sent_to(k: Kubectl, name: str) -> str | None:
    """The worker the manager recorded it sent the wrapper to."""
    target = (k.json("aw", name).get("status") or {}).get("workerCluster")
    return str(target) if target else None


def test_two_gangs_go_to_different_workers_and_status_comes_back(fleet: Fleet, ns: str
                                                                 ) -> None:
    mk = fleet.kubectl("manager", ns)
    for name in ("a", "b"):
        mk.apply(gpus_gang(name, 2, 8))  # a whole worker each
    targets = {n: wait_for(lambda n=n: sent_to(mk, n), 60, f"{n} to be sent") for n in "ab"}
    assert sorted(targets.values()) == ["w1", "w2"]
    for n, w in targets.items():
        wait_for(lambda n=n, w=w: fleet.running_in(ns, n) == {w}, 90, f"{n} Running in {w}")
        wait_for(lambda n=n: mk.json("aw", n).get("status", {}).get("state") == "Running", 60,
                 f"{n}'s Running state mirrored to the manager")
    assert "CLUSTER" not in mk("get", "aw").splitlines()[0]  # in -o wide only
    table = mk("get", "aw", "-o", "wide")
    at = table.splitlines()[0].index("CLUSTER")
    assert {line.split()[0]: line[at:].split()[0]
            for line in table.splitlines()[1:]} == targets
    # Deleting the manager's wrapper deletes the copy (and so its pods).
    mk("delete", "aw", "a")
    k = fleet.kubectl(targets["a"], ns)
    wait_for(lambda: k.run("get", "aw", "a", check=False).returncode != 0, 60,
             "the copy of a to be deleted")


def test_a_gang_too_big_for_any_worker_waits_naming_each_workers_best(fleet: Fleet, ns: str
                                                                       ) -> None:
    mk = fleet.kubectl("manager", ns)
    mk.apply(gpus_gang("huge", 1, 16))  # one pod of 16 GPUs: every node has 8
    message = wait_for(lambda: mk.json("aw", "huge").get("status", {}).get("message"), 60,
                       "a message on huge")
    assert "w1: 8 of 16 nvidia.com/gpu free on one node" in message
    assert "w2: 8 of 16 nvidia.com/gpu free on one node" in message
    assert sent_to(mk, "huge") is None and fleet.copies(ns, "huge") == set()


def test_a_worker_gone_past_the_grace_has_its_gang_run_on_the_other_once(fleet: Fleet, ns: str
                                                                          ) -> None:
    mk = fleet.kubectl("manager", ns)
    mk.apply(gpus_gang("g", 2, 4))
    first = wait_for(lambda: sent_to(mk, "g"), 60, "g to be sent")
    wait_for(lambda: fleet.running_in(ns, "g") == {first}, 90, f"g Running in {first}")
    other = next(w for w in WORKERS if w != first)
    gone = fleet.workers[first]
    gone.stop_apiserver()
    try:
        wait_for(lambda: sent_to(mk, "g") == other, GRACE + 60, f"g to be sent to {other}")
        wait_for(lambda: fleet.running_in(ns, "g") == {other}, 90, f"g Running in {other}")
        # Sampled while the first worker is away: the manager names one worker only.
        for _ in range(5):
            assert sent_to(mk, "g") == other
            time.sleep(1)
    finally:
        gone.start_apiserver()
    # Back: its stale copy is deleted, not resurrected, and the gang runs in one place.
    wait_for(lambda: fleet.copies(ns, "g") == {other}, 60, f"the stale copy in {first} deleted")
    # ... in the very pass in which the manager first heard from it again.
    log = fleet.process.this_run()
    came_back = re.findall(rf"pass (\d+): worker cluster {first} answers", log)
    deleted = re.findall(rf"pass (\d+): deleting copy {ns}/g in worker cluster {first}", log)
    assert came_back and deleted and deleted[0] == came_back[-1], (came_back, deleted)
    k = fleet.kubectl(first, ns)
    wait_for(lambda: not k.items("pods", "-l", f"{AW_LABEL}=g"), 90,
             f"g's pods in {first} to be gone")
    for _ in range(10):
        assert fleet.copies(ns, "g") == {other}
        assert fleet.running_in(ns, "g") == {other}
        time.sleep(1)


def test_a_manager_killed_mid_dispatch_makes_no_second_copy(fleet: Fleet, ns: str) -> None:
    mk = fleet.kubectl("manager", ns)
    names = [f"s{i}" for i in range(6)]
    for name in names:
        mk.apply(gpus_gang(name, 1, 2))
    # Killed as the first copies are being made: some wrappers named their worker, some
    # had their copy made, some neither.
    wait_for(lambda: any(sent_to(mk, n) for n in names), 60, "the first wrapper to be sent")
    fleet.process.kill()
    fleet.process.start("fifo", extra_args=["--manager", "--worker-grace", str(GRACE)])
    wait_for(lambda: all(sent_to(mk, n) for n in names), 90, "every wrapper to be sent")
    for _ in range(10):  # sampled: one copy each, in the worker its wrapper names
        for n in names:
            assert fleet.copies(ns, n) == {sent_to(mk, n)}, n
        time.sleep(0.5)


def manager_args(*more: str) -> list[str]:
    return ["--manager", "--worker-grace", str(GRACE), *more]


def test_a_killed_manager_leader_hands_over_and_no_copy_is_made_twice(fleet: Fleet, ns: str
                                                                     ) -> None:
    """Two manager replicas on one Lease: the leader is killed while it sends; the
    standby takes over and finishes, one copy each, in the one worker each names."""
    mk = fleet.kubectl("manager", ns)
    fleet.process.stop()  # the fixture's single manager makes way for two replicas
    replicas = [DispatcherProcess(fleet.manager.kubeconfig, fleet.manager.logs,
                                  f"manager-replica-{i}") for i in range(2)]
    try:
        # Workers stop the copies of a manager unheard for half its grace, and the new
        # leader then sends them again (by design: nothing runs twice). Under a CPU hog the
        # hand-over (Lease expiry, start-up, first look at each worker) took longer than
        # 45 s / 2, and every copy was made twice; what is tested here is a hand-over
        # within the fence's window, so the window is made wide.
        elect = ["--manager", "--worker-grace", str(HANDOVER_GRACE), "--leader-elect",
                 "--lease-namespace", "default"]
        replicas[0].start("fifo", extra_args=elect)
        replicas[1].start("fifo", extra_args=elect, wait=False)
        names = [f"h{i}" for i in range(8)]
        for name in names:
            mk.apply(gpus_gang(name, 1, 2))
        wait_for(lambda: any(sent_to(mk, n) for n in names), 60, "the first wrapper sent")
        assert not replicas[1].leading()  # the standby waits: one replica sends
        replicas[0].kill()  # the leader, mid-dispatch: no release of the Lease
        wait_for(replicas[1].leading, 90, "the standby to take the Lease over")
        wait_for(lambda: all(sent_to(mk, n) for n in names), 90, "every wrapper to be sent")
        for _ in range(10):  # sampled: one copy each, in the worker its wrapper names
            for n in names:
                assert fleet.copies(ns, n) == {sent_to(mk, n)}, n
            time.sleep(0.5)
        made = re.findall(r"(\S+) copied to worker cluster", replicas[0].this_run() +
                          replicas[1].this_run())
        assert sorted(made) == sorted(set(made)), made  # no copy POSTed twice with success
    finally:
        for r in replicas:
            r.stop()
        fleet.process.start("fifo", extra_args=manager_args())


def test_a_worker_whose_watches_are_cut_is_unreachable_then_caught_up(fleet: Fleet, ns: str
                                                                      ) -> None:
    """The worker's API server stopped (well within the grace): the manager marks it
    unreachable, keeps its wrapper there, and when it is back its watches are open again:
    a change there (the copy deleted) reaches the manager, and nothing is sent twice."""
    mk = fleet.kubectl("manager", ns)
    mk.apply(gpus_gang("c", 1, 2))
    first = wait_for(lambda: sent_to(mk, "c"), 60, "c to be sent")
    wait_for(lambda: fleet.running_in(ns, "c") == {first}, 90, f"c Running in {first}")
    cluster = fleet.workers[first]
    worker = fleet.manager.kubectl()

    def reachable() -> str:
        return str(worker.json("workercluster", first).get("status", {}).get("reachable"))

    cluster.stop_apiserver()
    try:
        wait_for(lambda: reachable() == "False", GRACE / 2, f"{first} marked unreachable")
        assert sent_to(mk, "c") == first  # within the grace: left where it is
    finally:
        cluster.start_apiserver()
    wait_for(lambda: reachable() == "True", 60, f"{first} answering again")
    # Caught up: the copy deleted in the worker by someone else is seen by the manager,
    # which makes it again (it is still sent there), once.
    fleet.kubectl(first, ns)("delete", "aw", "c", "--wait=true")
    wait_for(lambda: fleet.copies(ns, "c") == {first}, 60, f"c's copy made again in {first}")
    wait_for(lambda: fleet.running_in(ns, "c") == {first}, 90, f"c Running in {first} again")
    for _ in range(10):
        assert fleet.copies(ns, "c") == {first} and sent_to(mk, "c") == first
        time.sleep(0.5)


def clusters_view(port: int, token: str | None) -> tuple[int, Any]:
    """The manager's Clusters view as its page asks for it: (status, body)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/dashboard/api/clusters",
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_managers_clusters_view_lists_the_workers_and_where_a_wrapper_went(
        fleet: Fleet, ns: str) -> None:
    """The manager's Clusters view (/dashboard/ on its metrics port), read with the token of
    a user allowed to list AppWrappers everywhere: both workers answering with their nodes
    and GPUs, and the worker a dispatched wrapper went to."""
    mk = fleet.kubectl("manager", ns)
    token = viewer_token(fleet.manager.kubectl(), ns)
    fleet.process.start("fifo", extra_args=manager_args(), healthz=True)
    port = fleet.process.healthz_port
    assert port is not None
    try:
        assert clusters_view(port, None)[0] == 401
        mk.apply(gpus_gang("v", 1, 2))
        target = wait_for(lambda: sent_to(mk, "v"), 60, "v to be sent")

        def shown() -> Any:
            status, view = clusters_view(port, token)
            assert status in (200, 503), (status, view)
            sent = {(s["namespace"], s["name"]): s["worker"]
                    for s in (view["sent"] if status == 200 else ())}
            answering = status == 200 and all(w["reachable"] for w in view["workers"])
            return answering and (ns, "v") in sent and (view, sent)

        view, sent = wait_for(shown, 60, "the view to show v sent and both workers")
        assert sent[(ns, "v")] == target
        workers = {w["name"]: w for w in view["workers"]}
        assert sorted(workers) == ["w1", "w2"]
        for name, w in workers.items():
            assert (w["answering"], w["nodes"], w["gpusTotal"]) == ("yes", 2, 16), name
            assert 0 <= w["gpusFree"] <= 16, name
        assert workers[target]["gpusFree"] <= 14  # v's 2 GPUs are taken or held there
        assert workers[target]["sent"] >= 1
    finally:
        fleet.process.start("fifo", extra_args=manager_args())


# --- tenants -------------------------------------------------------------------------

HELD = "workload.codeflare.dev/held-by"


def tenant_in(cluster: Cluster, user: str, namespace: str, resources: list[str]) -> Kubectl:
    """`user` (their own client certificate) with `resources` in `namespace` of `cluster`."""
    admin = cluster.kubectl()
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    users.grant(admin, user, namespace, resources)
    k = Kubectl(admin.binary, users.kubeconfig(cluster.dir, user), namespace)
    wait_for(lambda: all(k.run("auth", "can-i", "create", r).stdout.strip() == "yes"
                         for r in resources), 30, f"{user}'s rights in {cluster.name}")
    return k


def bound_pod(name: str, node: str, labels: dict[str, str] | None = None,
              asks: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod its tenant binds to `node` themselves (spec.nodeName), asking `asks` in each of
    two containers, or nothing."""
    boxes = []
    for i in (0, 1) if asks else (0,):
        c = container(name=f"c{i}", cpu="0", memory="0")
        if asks:
            c["resources"] = {"requests": dict(asks), "limits": dict(asks)}
        boxes.append(c)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"nodeName": node, "containers": boxes}}


def a_node(cluster: Cluster) -> str:
    return str(cluster.kubectl().items("nodes")[0]["metadata"]["name"])


def test_a_tenants_held_wrapper_stays_in_the_managers_queue_and_idles_no_worker(
        fleet: Fleet, ns: str) -> None:
    """Alice, a tenant of the manager cluster, holds her wrapper that asks a whole worker:
    it is not sent (its copy would only wait there), so two more such gangs run, one in
    each worker."""
    alice = tenant_in(fleet.manager, "alice", ns, [users.APPWRAPPERS])
    held = gpus_gang("held", 2, 8)
    held["metadata"]["annotations"] = {HELD: "alice"}
    alice.apply(held)
    # Decided about first (sent, or told why not): it heads the queue.
    wait_for(lambda: sent_to(alice, "held") or
             (alice.json("aw", "held").get("status") or {}).get("message"), 60,
             "the manager to decide about held")
    for name in ("g1", "g2"):
        alice.apply(gpus_gang(name, 2, 8))
    for name in ("g1", "g2"):
        wait_for(lambda name=name: fleet.running_in(ns, name), 90, f"{name} to run")
    assert fleet.running_in(ns, "g1") != fleet.running_in(ns, "g2")
    message = (alice.json("aw", "held").get("status") or {}).get("message", "")
    assert message.startswith("held by alice: it keeps its place in the queue"), message
    assert sent_to(alice, "held") is None and fleet.copies(ns, "held") == set()


def test_an_empty_pod_a_workers_tenant_labels_for_a_sent_gang_frees_none_of_its_room(
        fleet: Fleet, ns: str) -> None:
    """Bob, a tenant of the worker a gang was sent to, binds an empty pod labelled for that
    gang while its copy waits there: the manager still holds the gang's room, and the next
    gang goes to the other worker, not to the full one."""
    mk = fleet.kubectl("manager", ns)
    for p in fleet.worker_processes.values():
        p.stop()  # the copies wait there, their pods not made: the manager holds their room
    first = None
    try:
        mk.apply(gpus_gang("a", 2, 8))  # a whole worker
        first = wait_for(lambda: sent_to(mk, "a"), 60, "a to be sent")
        other = next(w for w in WORKERS if w != first)
        bob = tenant_in(fleet.workers[first], "bob", ns, ["pods"])
        bob.apply(bound_pod("squat", a_node(fleet.workers[first]), {AW_LABEL: "a"}))
        wait_for(lambda: bob.json("pod", "squat").get("status", {}).get("phase") == "Running",
                 60, "bob's pod to run")
        mk.apply(gpus_gang("b", 1, 8))
        # Before: a counted one pod bound, 8 GPUs of first looked free, and b went there.
        assert wait_for(lambda: sent_to(mk, "b"), 60, "b to be sent") == other
    finally:
        if first is not None:
            fleet.kubectl(first, ns)("delete", "pod", "squat", "--ignore-not-found",
                                     "--wait=false")
        for p in fleet.worker_processes.values():
            p.start("fifo")


def heartbeat(cluster: Cluster) -> str:
    lease = cluster.kubectl("dispatcher-system").json("lease", "dispatcher-manager")
    return str(lease["spec"]["renewTime"])


def test_a_pod_asking_more_than_a_count_holds_ends_nothing_of_the_manager(fleet: Fleet,
                                                                         ns: str) -> None:
    """Bob, a tenant of w1, binds a pod asking 8E of a resource in each of two containers:
    its node's free amount is below what a 64-bit count holds. The manager goes on: a gang
    is sent and runs, and every worker's heartbeat is renewed."""
    mk = fleet.kubectl("manager", ns)
    bob = tenant_in(fleet.workers["w1"], "bob", ns, ["pods"])
    try:
        bob.apply(bound_pod("huge", a_node(fleet.workers["w1"]),
                            asks={"example.com/foo": "8E"}))
        beats = {w: heartbeat(c) for w, c in fleet.workers.items()}
        mk.apply(gpus_gang("g", 2, 8))
        wait_for(lambda: fleet.running_in(ns, "g"), 90,
                 f"g to run (the manager's log: {fleet.process.tail()})")
        wait_for(lambda: all(heartbeat(c) != beats[w] for w, c in fleet.workers.items()),
                 30, "the heartbeat renewed in every worker")
        for _ in range(5):  # sampled: the manager runs on, pass after pass
            assert fleet.process.alive(), fleet.process.tail()
            time.sleep(1)
    finally:
        fleet.kubectl("w1", ns)("delete", "pod", "huge", "--ignore-not-found", "--wait=false")
