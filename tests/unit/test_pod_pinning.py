"""The pod webhook: a gang's pod is pinned as it is created, to room its gang holds — the
gate path's rule, without the gate-lifting PATCH — and otherwise keeps its gate."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from dispatcher.controller.items.shaping import PLACEMENT_GATE
from dispatcher.controller.loop.runtime import Dispatcher
from dispatcher.controller.operator import pins_of
from dispatcher.controller.pods.placement import PIN_TOKEN_ANNOTATION, token_key
from dispatcher.controller.pods.pod_pinning import TOKEN_SECONDS, Pins, PodPinning
from dispatcher.controller.webhook.server import PIN_PODS_PATH, WebhookServer

from .fake_kube import FakeKube
from .test_placement import (
    gated_pod,
    one_pod_job,
    pinned_to,
    pinning,
    two_pod_job,
)
from .test_runtime import Clock, appwrapper, created_job, node, run


class Leading:
    """Stands for the operator: what the loop pins with while it leads (None: a standby,
    or the loop not started yet)."""

    def __init__(self, d: Dispatcher) -> None:
        self.now: Pins | None = pins_of(d)

    def pins(self) -> Pins | None:
        return self.now


def creating(pod: dict[str, Any], uid: str, dry_run: bool = False) -> dict[str, Any]:
    """The AdmissionReview request kube-apiserver sends for a pod the Job controller
    creates: no name yet (generateName), no uid."""
    obj = copy.deepcopy(pod)
    name = obj["metadata"].pop("name")
    obj["metadata"]["generateName"] = name.rsplit("-", 1)[0] + "-"
    return {"uid": uid, "operation": "CREATE", "namespace": "team", "dryRun": dry_run,
            "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": obj}


def applied(pod: dict[str, Any], patch: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The pod with the webhook's JSON patch applied (add and remove at any depth)."""
    obj = copy.deepcopy(pod)
    for op in patch or []:
        *parents, last = op["path"].strip("/").split("/")
        target = obj
        for part in parents:
            target = target[part]
        if op["op"] == "add":
            target[last] = op["value"]
        elif op["op"] == "remove":
            del target[last]
        else:
            raise AssertionError(f"unexpected op {op}")
    return obj


async def dispatched(kube: FakeKube, clock: Clock, job: dict[str, Any]
                     ) -> tuple[Dispatcher, PodPinning, dict[str, Any]]:
    kube.put(node("n1"))
    kube.put(node("n2"))
    kube.put(appwrapper("a", job))
    d = await pinning(kube, clock)
    await d.cycle()
    d.ready = True  # as after start(), when the operator hands it to the webhook
    hook = PodPinning(Leading(d).pins)
    return d, hook, created_job(kube, "a")


def pod_patches(kube: FakeKube) -> int:
    return sum(1 for method, path in kube.writes if method == "PATCH" and "/pods/" in path)


def test_each_pod_of_a_gang_is_pinned_as_it_is_created_and_never_patched() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, hook, job = await dispatched(kube, clock, two_pod_job("a"))
        made = []
        for i in range(2):
            pod = gated_pod(job, f"a-{i}")
            patched = applied(pod, await hook.review(creating(pod, f"r{i}")))
            assert "schedulingGates" not in patched["spec"]
            assert patched["metadata"]["annotations"][PIN_TOKEN_ANNOTATION] == f"r{i}"
            made.append(patched)
        assert sorted(n for p in made for n in pinned_to(p)) == ["n1", "n2"]
        for p in made:  # the API server names them; the watch brings them
            d.on_pod("ADDED", copy.deepcopy(kube.put(p)))
        await d.cycle()
        assert pod_patches(kube) == 0
        assert d.memory.pin_tokens == {}
        assert sorted(str(d.state.pinned(("team", f"a-{i}"))) for i in range(2)) == ["n1", "n2"]
        assert d.memory.pods_pinned == {"created": 2, "gate": 0}  # dispatcher_pods_pinned_total

    run(scenario)


def test_a_pod_its_gang_holds_no_room_for_keeps_its_gate_for_the_loop() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, hook, job = await dispatched(kube, clock, one_pod_job("a", completions=2))
        first, second = gated_pod(job, "a-0"), gated_pod(job, "a-1")
        assert pinned_to(applied(first, await hook.review(creating(first, "r0"))))
        assert await hook.review(creating(second, "r1")) is None  # created at its gate
        assert d.memory.pods_pinned == {"created": 0, "gate": 0}  # none seen yet

    run(scenario)


def test_a_pod_claiming_a_gang_it_does_not_belong_to_is_not_pinned() -> None:
    """A label is not proof: a pod whose controller is not the Job made for the gang (a
    user's own pod with the label copied) gets none of the gang's room."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        _d, hook, job = await dispatched(kube, clock, one_pod_job("a"))
        forged = gated_pod(job, "x-0")
        forged["metadata"]["ownerReferences"][0]["uid"] = "not-the-job"
        assert await hook.review(creating(forged, "r0")) is None
        orphan = gated_pod(job, "y-0")
        del orphan["metadata"]["ownerReferences"]
        assert await hook.review(creating(orphan, "r1")) is None
        # The room is still there for the real pod.
        real = gated_pod(job, "a-0")
        assert await hook.review(creating(real, "r2")) is not None

    run(scenario)


def test_nothing_is_pinned_before_the_loop_runs_while_blind_or_on_a_dry_run() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, _, job = await dispatched(kube, clock, one_pod_job("a"))
        leading = Leading(d)
        hook = PodPinning(leading.pins)
        pod = gated_pod(job, "a-0")
        assert await hook.review(creating(pod, "r0", dry_run=True)) is None
        d.blind = lambda: "the pods watch is down"
        assert await hook.review(creating(pod, "r1")) is None
        d.blind = lambda: None
        leading.now = None  # a standby, or the loop not started yet
        assert await hook.review(creating(pod, "r2")) is None
        assert d.memory.pin_tokens == {}
        leading.now = pins_of(d)
        assert await hook.review(creating(pod, "r3")) is not None
        ungated = copy.deepcopy(pod)
        ungated["spec"].pop("schedulingGates")
        assert await hook.review(creating(ungated, "r4")) is None

    run(scenario)


def test_a_pin_whose_pod_never_came_lapses_and_its_room_goes_to_the_next_pod() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, hook, job = await dispatched(kube, clock, one_pod_job("a"))
        pod = gated_pod(job, "a-0")
        assert await hook.review(creating(pod, "r0")) is not None
        # Refused after the webhook (another admission plugin): no pod, the Job retries.
        assert await hook.review(creating(pod, "r1")) is None
        assert d.state.pinned(token_key("team", "r0")) is not None
        await d.pod_placer.lapse_tokens(hook.clock() + TOKEN_SECONDS + 1)
        assert d.state.pinned(token_key("team", "r0")) is None
        assert await hook.review(creating(pod, "r2")) is not None

    run(scenario)


def test_a_pod_copying_another_pods_pin_token_does_not_take_its_pin() -> None:
    """The token annotation is anyone's to write: a pod of another gang (or none) that
    carries the token of a pin made for a's pod leaves that pin to a's pod."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, hook, job = await dispatched(kube, clock, one_pod_job("a"))
        pod = gated_pod(job, "a-0")
        patched = applied(pod, await hook.review(creating(pod, "r0")))
        (node_name,) = pinned_to(patched)
        for labels in ({"workload.codeflare.dev/appwrapper": "b"}, {}):
            thief = {"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": f"thief-{len(labels)}", "namespace": "team",
                                  "labels": labels,
                                  "annotations": {PIN_TOKEN_ANNOTATION: "r0"}},
                     "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}
            d.on_pod("ADDED", copy.deepcopy(kube.put(thief)))
            assert d.state.pinned(("team", thief["metadata"]["name"])) is None
        d.on_pod("ADDED", copy.deepcopy(kube.put(patched)))
        assert d.state.pinned(("team", "a-0")) == node_name
        assert d.memory.pin_tokens == {}

    run(scenario)


def test_the_patch_keeps_the_pods_own_rules_gates_and_annotations_and_can_be_undone() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, hook, job = await dispatched(kube, clock, one_pod_job("a"))
        pod = gated_pod(job, "a-0")
        own_term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]}
        preferred = [{"weight": 1, "preference": own_term}]
        pod["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [own_term]},
                "preferredDuringSchedulingIgnoredDuringExecution": preferred},
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
        pod["spec"]["schedulingGates"].insert(0, {"name": "example.com/other"})
        pod["metadata"]["annotations"] = {"team": "vision"}
        for n in ("n1", "n2"):
            kube.put(node(n) | {"metadata": {"name": n, "labels": {"zone": "z"}}})
            d.on_node("MODIFIED", kube.get("v1", "Node", None, n) or {})
        original = copy.deepcopy(pod)
        patched = applied(pod, await hook.review(creating(pod, "r0")))
        (term,) = patched["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term["matchExpressions"] == own_term["matchExpressions"]
        assert term["matchFields"][0]["values"] in (["n1"], ["n2"])
        assert patched["spec"]["affinity"]["nodeAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"] == preferred
        assert patched["spec"]["affinity"]["podAffinity"] == original["spec"]["affinity"][
            "podAffinity"]
        assert patched["spec"]["schedulingGates"] == [{"name": "example.com/other"}]
        assert patched["metadata"]["annotations"] == {"team": "vision",
                                                      PIN_TOKEN_ANNOTATION: "r0"}
        # A later webhook adds a sidecar: called again, this one undoes the pin exactly.
        patched["spec"]["containers"].append({"name": "proxy", "resources": {
            "requests": {"cpu": "500m"}}})
        again = applied(patched, await hook.review(creating(patched, "r0-again")))
        undone = copy.deepcopy(original)
        undone["spec"]["containers"] = again["spec"]["containers"]
        assert again == undone  # gated again, its own rules and annotations as they were
        assert again["spec"]["schedulingGates"] == [{"name": "example.com/other"},
                                                    {"name": PLACEMENT_GATE}]
        assert d.memory.pin_tokens == {} and d.state.pinned(token_key("team", "r0")) is None

    run(scenario)


def test_a_pod_of_another_gang_copying_a_token_cannot_undo_the_pin() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, hook, job = await dispatched(kube, clock, one_pod_job("a"))
        patched = applied(gated_pod(job, "a-0"),
                          await hook.review(creating(gated_pod(job, "a-0"), "r0")))
        other = copy.deepcopy(patched)
        other["metadata"]["labels"]["workload.codeflare.dev/appwrapper"] = "b"
        other["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 4
        assert await hook.review(creating(other, "x0")) is None
        assert d.state.pinned(token_key("team", "r0")) == pinned_to(patched)[0]

    run(scenario)


def test_called_again_with_the_pod_unchanged_the_pin_stays() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, hook, job = await dispatched(kube, clock, one_pod_job("a"))
        pod = gated_pod(job, "a-0")
        patched = applied(pod, await hook.review(creating(pod, "r0")))
        assert await hook.review(creating(patched, "r0-again")) is None
        assert d.state.pinned(token_key("team", "r0")) == pinned_to(patched)[0]

    run(scenario)


def test_a_pod_created_before_its_jobs_uid_is_recorded_waits_for_it() -> None:
    """The Job controller may create the first pods before the Job's create answer (its
    uid, the proof) has reached the dispatcher."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, hook, job = await dispatched(kube, clock, one_pod_job("a"))
        pod = gated_pod(job, "a-0")
        d.memory.ownership.forget(("team", "a"))
        asyncio.get_running_loop().call_later(
            0.2, d.memory.ownership.add_item, job["metadata"]["uid"], ("team", "a"))
        assert await hook.review(creating(pod, "r0")) is not None
        d.memory.ownership.forget(("team", "a"))  # never recorded: after a second, its gate
        assert await hook.review(creating(gated_pod(job, "a-1"), "r1")) is None

    run(scenario)


def test_a_pod_whose_owner_is_no_item_is_not_kept_waiting() -> None:
    """A pod two owners below an item (JobSet -> Job -> pod) or forged: its proof is the
    loop's to look up, and its creation is not held up for it."""
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        _, hook, job = await dispatched(kube, clock, one_pod_job("a"))
        hook.clock = lambda: 0.0  # its deadline never comes: a wait would never end
        below = gated_pod(job, "a-0")
        below["metadata"]["ownerReferences"][0].update(kind="Job", name="a-workers-0",
                                                       uid="uid-of-a-child-job")
        forged = gated_pod(job, "a-1")
        forged["metadata"]["ownerReferences"][0]["uid"] = "not-the-job"
        for i, pod in enumerate((below, forged)):
            assert await asyncio.wait_for(hook.review(creating(pod, f"r{i}")), 10) is None

    run(scenario)


def test_no_pin_when_the_api_server_stopped_waiting_for_the_answer() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        d, hook, job = await dispatched(kube, clock, one_pod_job("a"))
        pod = gated_pod(job, "a-0")
        assert await hook.review(creating(pod, "r0"), gone=lambda: True) is None
        assert d.memory.pin_tokens == {}
        assert await hook.review(creating(pod, "r1")) is not None

    run(scenario)


def test_the_endpoint_answers_with_the_reviews_uid_and_never_refuses_a_pod() -> None:
    async def scenario(kube: FakeKube, clock: Clock) -> None:
        _, hook, job = await dispatched(kube, clock, one_pod_job("a"))
        server = WebhookServer(None, None, pods=hook)  # type: ignore[arg-type]
        async with TestClient(TestServer(server.app())) as http:
            body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                    "request": creating(gated_pod(job, "a-0"), "r0")}
            answer = await (await http.post(PIN_PODS_PATH, json=body)).json()
            response = answer["response"]
            assert response["uid"] == "r0" and response["allowed"] is True
            assert response["patchType"] == "JSONPatch"
            ops = json.loads(base64.b64decode(response["patch"]))
            assert {op["path"] for op in ops} == {
                "/spec/affinity", "/spec/schedulingGates", "/metadata/annotations"}

            def broken(*_: Any) -> None:
                raise RuntimeError("boom")

            hook.review = broken  # type: ignore[method-assign]
            body["request"]["uid"] = "r1"
            response = (await (await http.post(PIN_PODS_PATH, json=body)).json())["response"]
            assert response == {"uid": "r1", "allowed": True}
            assert (await http.post(PIN_PODS_PATH, data=b"{}")).status == 400

    run(scenario)
