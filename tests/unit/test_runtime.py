"""The controller's runtime against an in-memory API: what a user would see in status."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any

from dispatcher.controller.kube.client import ApiError, Resource
from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.queue import Policy

from .fake_kube import FakeKube

FIFO = Policy("fifo", order="arrival")
LABEL = "workload.codeflare.dev/appwrapper"
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def node(name: str, gpus: int = 8) -> dict[str, Any]:
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": alloc, "capacity": alloc}}


def job(name: str, pods: int, gpus: int) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": pods, "completions": pods, "template": {"spec": {
                "containers": [{"name": "c", "resources": {
                    "limits": {"nvidia.com/gpu": gpus}}}]}}}}


def appwrapper(name: str, *items: dict[str, Any], created: int = 0,
               **spec: Any) -> dict[str, Any]:
    stamp = f"2027-01-15T08:00:{created:02d}Z"
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name, "namespace": "team", "creationTimestamp": stamp},
            "spec": {"resources": {"GenericItems": [{"generictemplate": i} for i in items]},
                     **spec}}


def pod(aw: str, name: str, node_name: str, phase: str, gpus: int,
        owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod labelled for `aw`; it counts for the gang only when `owner` (the Job the
    dispatcher created) is its controller."""
    refs = [] if owner is None else [{
        "apiVersion": owner["apiVersion"], "kind": owner["kind"],
        "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"],
        "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team", "labels": {LABEL: aw},
                         "ownerReferences": refs},
            "spec": {"nodeName": node_name, "containers": [
                {"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
            "status": {"phase": phase}}


def created_job(kube: FakeKube, name: str) -> dict[str, Any]:
    j = kube.get("batch/v1", "Job", "team", name)
    assert j is not None, f"Job {name} was not created"
    return j


def run(scenario: Callable[[FakeKube, Clock], Coroutine[Any, Any, None]]) -> None:
    clock = Clock()
    asyncio.run(scenario(FakeKube(clock), clock))


async def started(kube: FakeKube, clock: Clock, policy: Policy = FIFO,
                  **options: Any) -> Dispatcher:
    d = Dispatcher(kube, policy, clock=clock, **options)  # type: ignore[arg-type]
    for obj in await kube.list(_res("Node")):
        d.on_node("ADDED", obj)
    for obj in await kube.list(_res("AppWrapper")):
        d.on_appwrapper("ADDED", obj)
    for obj in await kube.list(_res("Pod")):
        d.on_pod("ADDED", obj)
    return d


def _res(kind: str) -> Resource:
    return Resource("", kind, "", True)


def aw_status(kube: FakeKube, name: str) -> dict[str, Any]:
    obj = kube.get("workload.codeflare.dev/v1beta1", "AppWrapper", "team", name)
    assert obj is not None
    status: dict[str, Any] = obj.get("status", {})
    return status


def types(kube: FakeKube, name: str) -> list[str]:
    return [c["type"] for c in aw_status(kube, name).get("conditions", [])]


def test_only_the_gang_that_fits_is_created_and_the_other_says_why() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("first", job("first", 2, 4), created=1))
        kube.put(appwrapper("second", job("second", 2, 4), created=2))
        d = await started(kube, clock)
        await d.cycle()
        assert types(kube, "first") == ["Init", "Queueing", "HeadOfLine", "Dispatched"]
        assert aw_status(kube, "first")["state"] == "Running"
        created = kube.get("batch/v1", "Job", "team", "first")
        assert created is not None
        assert created["metadata"]["labels"][LABEL] == "first"
        assert created["spec"]["template"]["metadata"]["labels"][LABEL] == "first"
        (owner,) = created["metadata"]["ownerReferences"]
        assert owner["kind"] == "AppWrapper" and owner["name"] == "first"
        assert owner["controller"] is True
        second = aw_status(kube, "second")
        assert types(kube, "second") == ["Init", "Queueing", "Backoff"]
        assert second["conditions"][-1]["reason"] == "AppWrapperNotRunnable"
        assert second["message"].startswith("InsufficientResources:")
        assert kube.get("batch/v1", "Job", "team", "second") is None
        assert aw_status(kube, "second")["requestedGPUs"] == 8
        writes = kube.status_writes("second")
        await d.cycle()
        await d.cycle()
        assert kube.status_writes("second") == writes  # nothing changed: nothing written
        events = kube.of_kind("Event")
        assert {e["reason"] for e in events} >= {"AppWrapperRunnable", "AppWrapperNotRunnable"}

    run(scenario)


def test_running_then_completed_with_pod_counts() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 2, 4)))
        d = await started(kube, clock)
        await d.cycle()
        j = created_job(kube, "a")
        d.on_pod("ADDED", pod("a", "a-0", "n1", "Running", 4, j))
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"  # one of two pods is not a gang
        d.on_pod("ADDED", pod("a", "a-1", "n1", "Running", 4, j))
        await d.cycle()
        status = aw_status(kube, "a")
        assert types(kube, "a")[-1] == "Running" and status["running"] == 2
        j = kube.get("batch/v1", "Job", "team", "a")
        assert j is not None
        j["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        d.on_pod("MODIFIED", pod("a", "a-0", "n1", "Succeeded", 4, j))
        d.on_pod("MODIFIED", pod("a", "a-1", "n1", "Succeeded", 4, j))
        await d.cycle()
        status = aw_status(kube, "a")
        assert status["state"] == "Completed" and status["Succeeded"] == 2

    run(scenario)


def test_running_hold_completion_then_completed_as_in_mcad() -> None:
    """MCAD's kuttl deployment-01 step 03: the item with completionstatus is done while the
    other's pod still runs: state RunningHoldCompletion; Completed once no pod is left."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        wrapper = appwrapper("a", job("a1", 1, 1), job("a2", 1, 1),
                             schedulingSpec={"minAvailable": 1})
        wrapper["spec"]["resources"]["GenericItems"][0]["completionstatus"] = "Complete"
        kube.put(wrapper)
        d = await started(kube, clock)
        await d.cycle()
        j1, j2 = created_job(kube, "a1"), created_job(kube, "a2")
        d.on_pod("ADDED", pod("a", "a1-0", "n1", "Running", 1, j1))
        d.on_pod("ADDED", pod("a", "a2-0", "n1", "Running", 1, j2))
        await d.cycle()
        assert aw_status(kube, "a")["state"] == "Running"
        j1["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        d.on_pod("MODIFIED", pod("a", "a1-0", "n1", "Succeeded", 1, j1))
        clock.now += 60  # the wrapped objects' outcome is read again
        await d.cycle()
        status = aw_status(kube, "a")
        assert status["state"] == "RunningHoldCompletion"
        assert status["queuejobstate"] == "RunningHoldCompletion"
        assert status["conditions"][-1]["reason"] == "SomeItemsCompleted"
        d.on_pod("MODIFIED", pod("a", "a2-0", "n1", "Succeeded", 1, j2))
        clock.now += 60
        await d.cycle()
        assert aw_status(kube, "a")["state"] == "Completed"

    run(scenario)


def test_gang_that_does_not_start_is_torn_down_and_requeued() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 2, 4), schedulingSpec={
            "requeuing": {"timeInSeconds": 60}}))
        d = await started(kube, clock)
        await d.cycle()
        d.on_pod("ADDED", pod("a", "a-0", "n1", "Pending", 4, created_job(kube, "a")))
        clock.now += 59
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"
        clock.now += 1
        await d.cycle()
        status = aw_status(kube, "a")
        assert status["numberOfRequeueings"] == 1
        assert status["requeueingTimeInSeconds"] == 120
        assert "PreemptCandidate" in types(kube, "a")
        assert kube.get("batch/v1", "Job", "team", "a") is None  # torn down
        await d.cycle()
        assert types(kube, "a")[-1] == "Backoff"  # its old pod still holds the GPUs
        d.on_pod("DELETED", pod("a", "a-0", "n1", "Pending", 4))  # garbage-collected
        await d.cycle()  # back in the queue, and it fits again
        assert types(kube, "a")[-1] == "Dispatched"
        assert kube.get("batch/v1", "Job", "team", "a") is not None

    run(scenario)


def test_requeue_limit_fails_the_wrapper_instead_of_requeuing_again() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 4), schedulingSpec={
            "requeuing": {"timeInSeconds": 60, "maxNumRequeuings": 1}}))
        d = await started(kube, clock)
        await d.cycle()
        clock.now += 60
        await d.cycle()  # no pod started: first requeue
        assert aw_status(kube, "a")["numberOfRequeueings"] == 1
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"
        clock.now += 120
        await d.cycle()  # still nothing running, and the one allowed requeue is spent
        status = aw_status(kube, "a")
        assert status["state"] == "Failed"
        assert status["conditions"][-1]["reason"] == "RequeueLimitReached"
        assert kube.get("batch/v1", "Job", "team", "a") is None

    run(scenario)


def test_refused_create_and_refused_cleanup_still_tell_the_user() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        worker = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}}
        kube.put(appwrapper("a", job("a", 1, 1), worker))
        d = await started(kube, clock)
        kube.fail[("POST", "/api/v1/namespaces/team/configmaps")] = ApiError(
            403, "Forbidden", "cannot create configmaps")
        kube.fail[("DELETE", "/apis/batch/v1/namespaces/team/jobs")] = ApiError(
            403, "Forbidden", "cannot delete jobs")
        await d.cycle()
        status = aw_status(kube, "a")
        assert status["state"] == "Failed"
        assert status["conditions"][-1]["reason"] == "ItemCreationFailure"
        assert "cannot create configmaps" in status["conditions"][-1]["message"]

    run(scenario)


def test_restart_after_dispatched_was_written_creates_the_items_once() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 1), job("a2", 1, 1)))
        d = await started(kube, clock)
        kube.fail[("POST", "/apis/batch/v1/namespaces/team/jobs")] = ApiError(
            503, "ServiceUnavailable", "overloaded")
        await d.cycle()  # Dispatched written; creating the items meets a 503
        kube.fail.clear()
        assert types(kube, "a")[-1] == "Dispatched"  # a 503 is no verdict on the spec
        assert kube.of_kind("Job") == []
        # The dispatcher crashes after creating one Job: a new one finds Dispatched.
        obj = kube.get("workload.codeflare.dev/v1beta1", "AppWrapper", "team", "a")
        assert obj is not None
        kube.put(job("a", 1, 1) | {"metadata": {
            "name": "a", "namespace": "team",
            "ownerReferences": [{"uid": obj["metadata"]["uid"], "kind": "AppWrapper"}]}})
        d2 = await started(kube, clock)
        await d2.cycle()
        jobs = sorted(j["metadata"]["name"] for j in kube.of_kind("Job"))
        assert jobs == ["a", "a2"]  # the missing one created, the existing one adopted
        await d2.cycle()
        assert len(kube.of_kind("Job")) == 2

    run(scenario)


def test_object_of_someone_else_is_never_taken_over() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(job("taken", 1, 1) | {"metadata": {"name": "taken", "namespace": "team"}})
        kube.put(appwrapper("a", job("taken", 1, 1)))
        d = await started(kube, clock)
        await d.cycle()
        status = aw_status(kube, "a")
        assert status["state"] == "Failed"
        assert status["conditions"][-1]["reason"] == "ItemCreationFailure"
        assert "already exists and does not belong to this AppWrapper" in status["message"]
        assert kube.get("batch/v1", "Job", "team", "taken") is not None  # left alone

    run(scenario)


def test_bad_input_fails_alone_and_the_queue_goes_on() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("empty", created=1))
        widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
        kube.put(appwrapper("unknown", widget, created=2))
        uninstalled = appwrapper("uninstalled", widget, created=3)
        uninstalled["spec"]["resources"]["GenericItems"][0]["custompodresources"] = [
            {"replicas": 1, "requests": {"cpu": "1"}}]
        kube.put(uninstalled)
        kube.put(appwrapper("good", job("good", 1, 1), created=4))
        d = await started(kube, clock)
        await d.cycle()
        assert aw_status(kube, "empty")["message"] == \
            "spec.resources.GenericItems is empty: wrap at least one object"
        assert "custompodresources" in aw_status(kube, "unknown")["message"]
        # Widget is not among the kinds this installation allows, pods declared or not.
        assert "add Widget.example.com to allowedKinds.add" \
            in aw_status(kube, "uninstalled")["message"]
        for name in ("empty", "unknown", "uninstalled"):
            assert aw_status(kube, name)["state"] == "Failed"
        assert types(kube, "good")[-1] == "Dispatched"

    run(scenario)


def test_a_quantity_too_long_to_read_fails_the_wrapper_with_a_message() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        huge = job("huge", 1, 1)
        limits = huge["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        limits["cpu"] = "1" * 5000  # more digits than Python reads as an int
        kube.put(appwrapper("huge", huge, created=1))
        kube.put(appwrapper("good", job("good", 1, 1), created=2))
        d = await started(kube, clock)
        await d.cycle()
        status = aw_status(kube, "huge")
        assert status["state"] == "Failed"
        assert status["conditions"][-1]["reason"] == "InvalidSpec"
        assert status["message"].startswith(
            "spec.resources.GenericItems[0]: spec.template.spec.containers[0] (c): "
            "resources.limits.cpu '1111")
        assert "has 5000 digits, more than the 100 a quantity may have" in status["message"]
        assert types(kube, "good")[-1] == "Dispatched"

    run(scenario)


def test_deleted_appwrapper_frees_its_reservation() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 8), created=1))
        kube.put(appwrapper("b", job("b", 1, 8), created=2))
        d = await started(kube, clock)
        await d.cycle()
        assert types(kube, "b")[-1] == "Backoff"
        a = kube.get("workload.codeflare.dev/v1beta1", "AppWrapper", "team", "a")
        assert a is not None
        d.on_appwrapper("DELETED", a)
        await d.cycle()
        assert types(kube, "b")[-1] == "Dispatched"

    run(scenario)


def test_priority_policy_orders_by_priority() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("low", job("low", 1, 8), created=1, priority=1))
        kube.put(appwrapper("high", job("high", 1, 8), created=2, priority=9))
        d = await started(kube, clock, Policy("priority", order="priority"))
        await d.cycle()
        assert types(kube, "high")[-1] == "Dispatched"
        assert types(kube, "low")[-1] == "Backoff"

    run(scenario)


def test_losing_the_only_big_node_says_the_gang_can_no_longer_fit() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("small", gpus=4))
        kube.put(node("big", gpus=8))
        kube.put(appwrapper("a", job("a", 1, 8)))
        d = await started(kube, clock)
        d.on_pod("ADDED", pod("other", "busy", "big", "Running", 8))
        await d.cycle()
        assert "empty cluster" not in aw_status(kube, "a")["message"]
        d.on_node("DELETED", node("big"))
        await d.cycle()
        assert "would not fit even on an empty cluster" in aw_status(kube, "a")["message"]
        d.on_pod("DELETED", pod("other", "busy", "big", "Running", 8))
        d.on_node("ADDED", node("big", gpus=8))
        await d.cycle()
        assert types(kube, "a")[-1] == "Dispatched"

    run(scenario)


def test_an_error_while_creating_items_is_retried_not_left_half_done() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("a", job("a", 1, 1)))
        d = await started(kube, clock)

        class Flaky(ConnectionResetError):
            pass

        real_resource = kube.resource
        calls = 0

        async def flaky_resource(api_version: str, kind: str) -> Resource | None:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise Flaky("connection reset")
            return await real_resource(api_version, kind)

        kube.resource = flaky_resource  # type: ignore[method-assign]
        await d.cycle()  # the error is logged; the wrapper stays Dispatched
        assert kube.get("batch/v1", "Job", "team", "a") is None
        await d.cycle()
        assert kube.get("batch/v1", "Job", "team", "a") is not None
        assert aw_status(kube, "a")["state"] == "Running"

    run(scenario)


def test_plain_text_404_from_the_api_server_means_the_kind_is_not_served() -> None:
    class Response:
        status, reason = 404, "Not Found"

        async def read(self) -> bytes:
            return b"404 page not found\n"

        def release(self) -> None:
            pass

    class Api:
        configuration = type("Configuration", (), {"host": "https://127.0.0.1:6443"})

        async def call_api(self, *args: Any, **kwargs: Any) -> Response:
            return Response()

    from dispatcher.controller.kube.client import Kube

    kube = Kube(Api())  # type: ignore[arg-type]
    assert asyncio.run(kube.resource("example.com/v1", "Widget")) is None


def test_wrappers_created_in_the_same_second_keep_the_order_they_arrived_in() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        d = await started(kube, clock)
        # alpha gets the smaller uid, but zeta reaches the dispatcher first.
        alpha = kube.put(appwrapper("alpha", job("alpha", 1, 8)))
        zeta = kube.put(appwrapper("zeta", job("zeta", 1, 8)))
        second = datetime.fromisoformat("2027-01-15T08:00:00Z").timestamp()
        clock.now = second + 0.1
        d.on_appwrapper("ADDED", copy.deepcopy(zeta))
        clock.now = second + 0.2
        d.on_appwrapper("ADDED", copy.deepcopy(alpha))
        await d.cycle()
        assert aw_status(kube, "zeta")["state"] == "Running"
        assert types(kube, "alpha")[-1] == "Backoff"
        stamp = aw_status(kube, "zeta")["controllerfirsttimestamp"]
        assert stamp.startswith("2027-01-15T08:00:00.1")

    run(scenario)


def test_an_allowed_kind_whose_crd_is_not_installed_says_so() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        from dispatcher.kinds.scope import DEFAULT_ALLOWED_KINDS

        kube.put(node("n1"))
        widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
        aw = appwrapper("uninstalled", widget)
        aw["spec"]["resources"]["GenericItems"][0]["custompodresources"] = [
            {"replicas": 1, "requests": {"cpu": "1"}}]
        kube.put(aw)
        d = Dispatcher(kube, FIFO, clock=clock,  # type: ignore[arg-type]
                       allowed_kinds=DEFAULT_ALLOWED_KINDS | {("example.com", "Widget")})
        for obj in await kube.list(_res("Node")):
            d.on_node("ADDED", obj)
        for obj in await kube.list(_res("AppWrapper")):
            d.on_appwrapper("ADDED", obj)
        await d.cycle()
        status = aw_status(kube, "uninstalled")
        assert status["state"] == "Failed"
        assert "is not served by this cluster; install its CRD" in status["message"]

    run(scenario)


async def running_configmap_wrapper(kube: FakeKube, clock: Clock) -> Dispatcher:
    """A dispatcher with one running AppWrapper, "quiet", that wraps a ConfigMap."""
    kube.put(node("n1"))
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}}
    kube.put(appwrapper("quiet", cm, created=1))
    d = await started(kube, clock)
    await d.cycle()
    assert types(kube, "quiet")[-1] == "Running"
    return d


def test_a_running_wrapper_with_nothing_due_is_not_judged_at_every_cycle(
        monkeypatch: Any) -> None:
    """Cycles run for everyone's news; a running wrapper whose pods, objects and
    deadlines have not moved is left alone (judging each one at every cycle cost a status
    serialisation per running wrapper per cycle), and looked at again after a while."""
    import dispatcher.controller.loop.runtime as runtime
    import dispatcher.controller.loop.stepping as stepping

    judged: list[str] = []
    real = stepping.judge

    def counting(aw: Any, *args: Any, **kwargs: Any) -> Any:
        judged.append(aw.metadata.name)
        return real(aw, *args, **kwargs)

    monkeypatch.setattr(stepping, "judge", counting)

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d = await running_configmap_wrapper(kube, clock)
        judged.clear()
        for i in range(10):  # others come and go: each makes a cycle
            clock.now += 1
            other = appwrapper(f"other{i}", job(f"other{i}", 1, 1), created=2 + i)
            kube.put(other)
            d.on_appwrapper("ADDED", kube.get(
                "workload.codeflare.dev/v1beta1", "AppWrapper", "team", f"other{i}") or {})
            await d.cycle()
        assert "quiet" not in judged
        clock.now += runtime.IDLE_STEP_SECONDS
        await d.cycle()
        assert judged.count("quiet") == 1
        assert types(kube, "quiet")[-1] == "Running"

    run(scenario)


def test_a_queue_that_waits_as_it_did_costs_no_status_copies(monkeypatch: Any) -> None:
    """Every queued wrapper is decided at every cycle; one whose status already says why
    it waits is left alone (a copy of each waiting wrapper's status per cycle was a
    twentieth of the dispatcher's time with 500 queued)."""
    from dispatcher.controller.record.status import StatusWriter

    begun: list[str] = []
    real = StatusWriter.begin

    def counting(self: StatusWriter, t: Any, now: float) -> Any:
        begun.append(t.key[1])
        return real(self, t, now)

    monkeypatch.setattr(StatusWriter, "begin", counting)

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("first", job("first", 1, 8), created=0))  # takes the node
        kube.put(appwrapper("big", job("big", 1, 8), created=1))  # waits: the head
        for i in range(5):
            kube.put(appwrapper(f"w{i}", job(f"w{i}", 1, 1), created=2 + i))
        d = await started(kube, clock)
        await d.cycle()
        assert types(kube, "w0")[-1] == "Queueing"
        assert types(kube, "big")[-1] == "Backoff"
        begun.clear()
        for _ in range(3):
            clock.now += 1
            d.wake.set()
            await d.cycle()
        assert [k for k in begun if k.startswith("w")] == []
        assert types(kube, "w4")[-1] == "Queueing"

    run(scenario)


def test_the_loop_spaces_cycles_by_what_the_last_one_cost(monkeypatch: Any) -> None:
    """Pods change all the time on a busy cluster, and each change wakes the loop; when a
    cycle costs 0.2 s the next waits 0.6 s, so deciding never takes most of the process's
    time from the requests it decides (back to back, 1.2 s of wake-ups made a cycle
    every debounce)."""
    import time

    import dispatcher.controller.loop.runtime as runtime

    starts: list[float] = []

    async def costly(self: Dispatcher, wait: bool = True) -> None:
        starts.append(time.monotonic())
        self.last_cycle_seconds = 0.2  # as if it took that long

    monkeypatch.setattr(Dispatcher, "cycle", costly)
    assert runtime.CYCLE_SPACING * 0.2 > runtime.DEBOUNCE_SECONDS

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d = await started(kube, clock)
        d.start()
        end = time.monotonic() + 1.2
        while time.monotonic() < end:
            d.wake.set()
            await asyncio.sleep(0.01)
        await d.stop()
        assert 1 <= len(starts) <= 3
        gaps = [b - a for a, b in itertools.pairwise(starts)]
        assert all(g >= 0.6 for g in gaps)

    run(scenario)


def test_a_deadline_added_to_a_running_wrapper_counts_at_once() -> None:
    """An edit that changes no item (here a dispatch deadline, long past) is judged at the
    next cycle, not at the next idle look."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d = await running_configmap_wrapper(kube, clock)
        clock.now += 120
        await d.cycle()
        obj = kube.get("workload.codeflare.dev/v1beta1", "AppWrapper", "team", "quiet")
        assert obj is not None
        edited = copy.deepcopy(obj)
        edited["spec"]["schedulingSpec"] = {"dispatchDuration": {"limit": 60}}
        edited["metadata"]["generation"] = int(obj["metadata"].get("generation") or 1) + 1
        kube.put(edited)
        d.on_appwrapper("MODIFIED", kube.get(
            "workload.codeflare.dev/v1beta1", "AppWrapper", "team", "quiet") or {})
        clock.now += 1
        await d.cycle()
        status = aw_status(kube, "quiet")
        assert status["state"] == "Failed"
        assert status["conditions"][-1]["reason"] == "DispatchDeadlineExceeded"

    run(scenario)


def test_under_backfill_a_head_past_the_starvation_guard_is_said_to_hold_the_line() -> None:
    """What `kubectl describe` and `why` show of a wrapper that backfill no longer lets
    pass the head: that the head has waited past the guard, as plan says."""
    from dispatcher.policy_files import load_policy

    async def scenario(kube: FakeKube, clock: Clock) -> None:
        kube.put(node("n1"))
        kube.put(appwrapper("hog", job("hog", 1, 6), created=1))
        kube.put(appwrapper("head", job("head", 1, 8), created=2))
        d = await started(kube, clock, load_policy("backfill"))
        await d.cycle()
        assert aw_status(kube, "head")["message"].startswith("InsufficientResources:")
        clock.now += 1900  # the head, created 2 s after T0, has waited past 30m
        small = appwrapper("small", job("small", 1, 1), created=3)
        kube.put(small)
        d.on_appwrapper("ADDED", kube.get("workload.codeflare.dev/v1beta1", "AppWrapper",
                                          "team", "small"))
        await d.cycle()
        assert aw_status(kube, "small")["conditions"][-1]["message"].startswith(
            "waiting for the AppWrappers ahead of it (backfill policy): the head has waited "
            "over 30m, past the starvation guard: nothing passes it until it starts")

    run(scenario)
