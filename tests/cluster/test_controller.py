"""The dispatcher on a real control plane: gang dispatch, queueing, lifecycle, restarts.

One dispatcher process for the module (restarted by the tests that need another policy
or a crash); each test has its own namespace on the default profile, 4 nodes x 8 GPUs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster import Cluster, Kubectl, wait_for
from localcluster.testing import condition, container, outcome

from .dispatcher_process import DispatcherProcess, install_crd, wait_quiet

LABEL = "workload.codeflare.dev/appwrapper"


@pytest.fixture(scope="module")
def dispatcher(local_cluster: Cluster, kubectl: Kubectl) -> Iterator[DispatcherProcess]:
    install_crd(kubectl)
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs)
    d.start("fifo")
    yield d
    d.stop()


@pytest.fixture
def dispatched(dispatcher: DispatcherProcess, kubectl: Kubectl) -> Iterator[DispatcherProcess]:
    """A running dispatcher (fifo unless the test restarts it) and a quiet cluster."""
    if not dispatcher.alive() or dispatcher.policy != "fifo":
        dispatcher.start("fifo")
    wait_quiet(kubectl)
    yield dispatcher
    if not dispatcher.alive():
        pytest.fail(f"the dispatcher died during the test:\n{dispatcher.tail()}")


# --- builders -------------------------------------------------------------------------

def appwrapper(name: str, *items: dict[str, Any], priority: int = 0,
               scheduling: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"priority": priority,
                            "resources": {"GenericItems": [{"generictemplate": i}
                                                           for i in items]}}
    if scheduling:
        spec["schedulingSpec"] = scheduling
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name}, "spec": spec}


def job(name: str, pods: int, gpus: int, pod_outcome: str = "run") -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                     "template": {"metadata": {"annotations": outcome(pod_outcome)},
                                  "spec": {"restartPolicy": "Never",
                                           "containers": [container(gpus=gpus)]}}}}


def raycluster(name: str, workers: int, gpus: int) -> dict[str, Any]:
    def template(role: str, g: int) -> dict[str, Any]:
        return {"spec": {"containers": [container(name=role, image="rayproject/ray:2.9.0",
                                                  gpus=g)]}}
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name},
            "spec": {"headGroupSpec": {"rayStartParams": {}, "template": template("ray-head", 0)},
                     "workerGroupSpecs": [{"groupName": "gpu", "replicas": workers,
                                           "minReplicas": workers, "maxReplicas": workers,
                                           "rayStartParams": {},
                                           "template": template("ray-worker", gpus)}]}}


# --- observing ------------------------------------------------------------------------

def aw_of(k: Kubectl, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = k.json("appwrapper", name)
    return obj


def latest(aw: dict[str, Any]) -> dict[str, Any]:
    conditions = aw.get("status", {}).get("conditions") or [{}]
    return dict(conditions[-1])


def wait_condition(k: Kubectl, name: str, ctype: str, timeout: float = 60) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        aw = aw_of(k, name)
        return aw if latest(aw).get("type") == ctype else None

    try:
        return wait_for(check, timeout, f"AppWrapper {name} to reach {ctype}")
    except TimeoutError as e:
        raise TimeoutError(f"{e}; status now: {aw_of(k, name).get('status')}") from None


def pods_of(k: Kubectl, name: str) -> list[dict[str, Any]]:
    return k.items("pods", "-l", f"{LABEL}={name}")


def running_pods(k: Kubectl, name: str, count: int, timeout: float = 60) -> list[dict[str, Any]]:
    def check() -> list[dict[str, Any]] | None:
        got = pods_of(k, name)
        ok = len(got) == count and all(p["status"].get("phase") == "Running" for p in got)
        return got if ok else None

    return wait_for(check, timeout, f"{count} Running pods of {name}")


def stays(predicate: Any, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert predicate(), what
        time.sleep(0.5)


# --- the MCAD blog scenario -----------------------------------------------------------

def test_second_whole_pool_raycluster_waits_until_the_first_is_deleted(
        dispatched: DispatcherProcess, k: Kubectl) -> None:
    k.apply(appwrapper("ray-a", raycluster("ray-a", workers=4, gpus=8)))
    wait_condition(k, "ray-a", "Running", timeout=120)
    running_pods(k, "ray-a", 5)  # the head and 4 workers, from the real KubeRay operator
    k.apply(appwrapper("ray-b", raycluster("ray-b", workers=4, gpus=8)))
    aw = wait_condition(k, "ray-b", "Backoff")
    assert "nvidia.com/gpu" in latest(aw)["message"]
    assert aw["status"]["state"] == "Pending"
    stays(lambda: not pods_of(k, "ray-b") and not k.items("rayclusters", "-l",
                                                          f"{LABEL}=ray-b"),
          5, "nothing of ray-b may exist while it waits")

    k("delete", "appwrapper", "ray-a")
    wait_condition(k, "ray-b", "Running", timeout=120)
    running_pods(k, "ray-b", 5)
    assert not pods_of(k, "ray-a") or all(p["metadata"].get("deletionTimestamp")
                                          for p in pods_of(k, "ray-a"))
    types = [c["type"] for c in aw_of(k, "ray-b")["status"]["conditions"]]
    assert types[0] == "Init" and types[-3:] == ["HeadOfLine", "Dispatched", "Running"]
    assert "Backoff" in types


def test_fragmented_cluster_waits_with_a_message_and_creates_nothing(
        dispatched: DispatcherProcess, kubectl: Kubectl, k: Kubectl) -> None:
    # 6 of the 8 GPUs of every node taken by pods outside any AppWrapper: 8 free in all.
    nodes = sorted(n["metadata"]["name"] for n in kubectl.items("nodes", "-l", "type=kwok"))
    for i, node in enumerate(nodes):
        k.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"filler-{i}"},
                 "spec": {"nodeName": node, "containers": [container(gpus=6)]}})
    k.apply(appwrapper("needs-4", job("needs-4", pods=1, gpus=4)))
    aw = wait_condition(k, "needs-4", "Backoff")
    assert latest(aw)["message"] == (
        "Fragmented: 8 nvidia.com/gpu free in total, but at most 2 nvidia.com/gpu on any "
        "node; a pod needs 4 nvidia.com/gpu")
    stays(lambda: not pods_of(k, "needs-4") and not k.items("jobs"), 3,
          "no pod or Job of a waiting AppWrapper")
    events = k.items("events", "--field-selector", "involvedObject.name=needs-4")
    assert any(e["reason"] == "AppWrapperNotRunnable" for e in events)
    k("delete", "pod", "filler-0", "filler-1", "--wait=false")
    wait_condition(k, "needs-4", "Running")


# --- ordering -------------------------------------------------------------------------

def _block_then_release(k: Kubectl, first: str, second: str) -> list[str]:
    k.apply(appwrapper("blocker", job("blocker", pods=4, gpus=8)))
    wait_condition(k, "blocker", "Running")
    k.apply(appwrapper(first, job(first, pods=4, gpus=8), priority=1))
    time.sleep(1.1)  # distinct creation timestamps
    k.apply(appwrapper(second, job(second, pods=4, gpus=8), priority=10))
    for name in (first, second):  # both decided: one heads the line, one waits behind
        wait_for(lambda n=name: latest(aw_of(k, n)).get("type") in ("Backoff", "Queueing"),
                 30, f"{name} to wait")
    k("delete", "appwrapper", "blocker")

    def winner() -> str | None:
        for name in (first, second):
            if latest(aw_of(k, name)).get("type") in ("Dispatched", "Running"):
                return name
        return None

    won = wait_for(winner, 60, "one of the two to dispatch")
    other = second if won == first else first
    stays(lambda: latest(aw_of(k, other)).get("type") in ("Backoff", "Queueing"), 2,
          "only one of the two fits")
    return [won, other]


def test_fifo_dispatches_the_oldest_first(dispatched: DispatcherProcess, k: Kubectl) -> None:
    assert _block_then_release(k, "old-low", "new-high") == ["old-low", "new-high"]


def test_priority_dispatches_the_highest_first(dispatched: DispatcherProcess,
                                               k: Kubectl) -> None:
    dispatched.start("priority")
    assert _block_then_release(k, "old-low", "new-high") == ["new-high", "old-low"]


# --- lifecycle ------------------------------------------------------------------------

def test_gang_that_does_not_start_is_requeued_then_failed(dispatched: DispatcherProcess,
                                                           k: Kubectl) -> None:
    stuck = job("stuck", pods=2, gpus=1, pod_outcome="pending")
    k.apply(appwrapper("stuck", stuck, scheduling={
        "requeuing": {"timeInSeconds": 3, "growthType": "none", "maxNumRequeuings": 1}}))
    wait_for(lambda: aw_of(k, "stuck").get("status", {}).get("numberOfRequeueings") == 1, 60,
             "the first requeue")
    aw = wait_condition(k, "stuck", "Failed", timeout=60)
    types = [c["type"] for c in aw["status"]["conditions"]]
    assert types.count("PreemptCandidate") == 1 and types.count("Dispatched") == 2
    requeue = condition(aw, "PreemptCandidate")
    assert requeue is not None and requeue["reason"] == "MinPodsNotRunning"
    assert latest(aw)["reason"] == "RequeueLimitReached"
    wait_for(lambda: not k.items("jobs"), 30, "the stuck Job to be torn down")


def test_completed_job_completes_the_appwrapper(dispatched: DispatcherProcess,
                                                k: Kubectl) -> None:
    done = job("done", pods=2, gpus=1, pod_outcome="succeed")
    k.apply(appwrapper("done", done))
    aw = wait_condition(k, "done", "Completed", timeout=90)
    assert aw["status"]["state"] == "Completed"
    assert aw["status"]["Succeeded"] == 2


def test_deleting_the_appwrapper_deletes_what_it_created(dispatched: DispatcherProcess,
                                                         k: Kubectl) -> None:
    k.apply(appwrapper("gone", job("gone", pods=2, gpus=2)))
    running_pods(k, "gone", 2)
    k("delete", "appwrapper", "gone")
    wait_for(lambda: not k.items("jobs") and not pods_of(k, "gone"), 60,
             "the Job and its pods to be garbage-collected")


# --- restarts -------------------------------------------------------------------------

def test_crash_during_a_burst_of_dispatches_leaves_no_copy_and_no_orphan(
        dispatched: DispatcherProcess, k: Kubectl) -> None:
    names = [f"burst-{i}" for i in range(8)]
    dispatched.kill()
    k.apply([appwrapper(n, job(n, pods=2, gpus=1)) for n in names])
    dispatched.start("fifo")
    time.sleep(0.3)
    dispatched.kill()  # somewhere in the middle of dispatching
    dispatched.start("fifo")
    for n in names:
        wait_condition(k, n, "Running", timeout=90)
    jobs = k.items("jobs")
    assert sorted(j["metadata"]["name"] for j in jobs) == sorted(names)
    for j in jobs:
        owners = j["metadata"].get("ownerReferences") or []
        assert [o["name"] for o in owners] == [j["metadata"]["name"]]
    for n in names:
        assert len(pods_of(k, n)) == 2


def test_restart_adopts_a_dispatch_recorded_before_its_objects(
        dispatched: DispatcherProcess, k: Kubectl) -> None:
    """Killed right after writing Dispatched and before creating anything."""
    dispatched.kill()
    k.apply(appwrapper("half", job("half", pods=2, gpus=1)))
    k("patch", "appwrapper", "half", "--subresource=status", "--type=merge", "-p",
      '{"status": {"state": "Running", "queuejobstate": "Dispatched", "conditions": ['
      '{"type": "Init", "status": "True"},'
      '{"type": "Dispatched", "status": "True", "reason": "AppWrapperRunnable",'
      ' "lastTransitionMicroTime": "' + time.strftime("%Y-%m-%dT%H:%M:%S.000000Z",
                                                      time.gmtime()) + '"}]}}')
    dispatched.start("fifo")
    wait_condition(k, "half", "Running")
    assert [j["metadata"]["name"] for j in k.items("jobs")] == ["half"]


# --- bad input ------------------------------------------------------------------------

@pytest.mark.parametrize(("case", "item", "expected"), [
    ("no-items", None, "spec.resources.GenericItems is empty"),
    ("unknown-kind", {"apiVersion": "example.com/v1", "kind": "Widget",
                      "metadata": {"name": "w"}}, "custompodresources"),
    ("nested", {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                "metadata": {"name": "inner"}}, "cannot be nested"),
    ("other-namespace", {**job("j", 1, 1), "metadata": {"name": "j", "namespace": "kube-system"}},
     "must be in the AppWrapper's namespace"),
])
def test_bad_appwrapper_fails_alone_and_the_queue_goes_on(
        dispatched: DispatcherProcess, k: Kubectl, case: str, item: dict[str, Any] | None,
        expected: str) -> None:
    bad = appwrapper(f"bad-{case}", *([item] if item else []))
    k.apply(bad)
    aw = wait_condition(k, f"bad-{case}", "Failed")
    assert latest(aw)["reason"] == "InvalidSpec"
    assert expected in latest(aw)["message"]
    k.apply(appwrapper("good", job("good", pods=1, gpus=1)))
    wait_condition(k, "good", "Running")


def test_uninstalled_kind_fails_with_what_to_install(dispatched: DispatcherProcess,
                                                     k: Kubectl) -> None:
    # A kind the installation allows (scheduler-plugins' PodGroup, by default) whose CRD
    # this cluster does not have.
    group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
             "metadata": {"name": "g"}, "spec": {"minMember": 1}}
    k.apply({**appwrapper("podgroup"), "spec": {"resources": {"GenericItems": [
        {"generictemplate": group, "custompodresources": [
            {"replicas": 1, "requests": {"cpu": "1"}}]}]}}})
    aw = wait_condition(k, "podgroup", "Failed")
    assert latest(aw)["reason"] == "ItemCreationFailure"
    assert "not served by this cluster; install its CRD" in latest(aw)["message"]


def test_a_kind_the_installation_does_not_allow_fails_with_the_fix(
        dispatched: DispatcherProcess, k: Kubectl) -> None:
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    k.apply({**appwrapper("widget"), "spec": {"resources": {"GenericItems": [
        {"generictemplate": widget, "custompodresources": [
            {"replicas": 1, "requests": {"cpu": "1"}}]}]}}})
    aw = wait_condition(k, "widget", "Failed")
    assert latest(aw)["reason"] == "InvalidSpec"
    assert "add Widget.example.com to allowedKinds.add" in latest(aw)["message"]


@pytest.mark.parametrize(("patch", "field"), [
    ({"replicas": -1}, "replicas"),
    ({"requests": {"cpu": "two"}}, "requests.cpu"),
])
def test_schema_errors_are_refused_by_the_api_server(dispatched: DispatcherProcess, k: Kubectl,
                                                     patch: dict[str, Any], field: str) -> None:
    doc = appwrapper("refused", job("j", 1, 1))
    doc["spec"]["resources"]["GenericItems"][0]["custompodresources"] = [
        {"replicas": 1, "requests": {"cpu": "1"}} | patch]
    proc = k.run("apply", "-f", "-", input=__import__("yaml").safe_dump(doc), check=False)
    assert proc.returncode != 0 and field in proc.stderr


def test_a_template_that_names_its_node_runs_its_pods_there(
        dispatched: DispatcherProcess, kubectl: Kubectl, k: Kubectl) -> None:
    """The API server refuses a pod with spec.nodeName beside a scheduling gate: gated,
    such a Job never made a pod and was requeued for ever. Its pods go to the node they
    name, the one the dispatcher planned them on."""
    nodes = sorted(n["metadata"]["name"] for n in kubectl.items("nodes", "-l", "type=kwok"))
    named = job("named", pods=2, gpus=4)
    named["spec"]["template"]["spec"]["nodeName"] = nodes[-1]
    k.apply(appwrapper("named", named))
    pods = running_pods(k, "named", 2)
    assert {p["spec"]["nodeName"] for p in pods} == {nodes[-1]}
    aw = wait_condition(k, "named", "Running")
    assert aw["status"].get("numberOfRequeueings", 0) == 0
