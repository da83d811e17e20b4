"""The CRD's conversion endpoint takes the list-sized ConversionReviews the API server sends
(`kubectl get aw -A` as v1beta2 converts the whole list in one review), within a bound that
still protects the webhook's memory; AdmissionReviews keep their own, smaller bound."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from dispatcher.api.conversion import to_v1beta1
from dispatcher.controller.webhook.conversions import MAX_CONVERSION_BYTES, MAX_REQUEST_BYTES
from dispatcher.controller.webhook.server import CONVERT_PATH, VALIDATE_PATH, WebhookServer

V1 = "workload.codeflare.dev/v1beta1"
V2 = "workload.codeflare.dev/v1beta2"


def stored(count: int) -> list[dict[str, Any]]:
    """`count` wrappers written as v1beta2, as the API server stores them (v1beta1)."""
    one = to_v1beta1({
        "apiVersion": V2, "kind": "AppWrapper",
        "metadata": {"name": "job", "namespace": "team-a", "uid": "u",
                     "labels": {"kueue.x-k8s.io/queue-name": "default-queue"}},
        "spec": {"components": [{
            "podSets": [{"path": "template.spec.template", "replicas": 4}],
            "template": {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job"},
                         "spec": {"parallelism": 4, "template": {"spec": {
                             "restartPolicy": "Never", "containers": [{
                                 "name": "trainer", "image": "busybox:1.36",
                                 "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}}}}}]},
    })
    out = []
    for i in range(count):
        aw = copy.deepcopy(one)
        aw["metadata"].update(name=f"job-{i}", uid=f"uid-{i}")
        out.append(aw)
    return out


def review(objects: list[dict[str, Any]], version: str = V2) -> bytes:
    return json.dumps({"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
                       "request": {"uid": "r", "desiredAPIVersion": version,
                                   "objects": objects}}).encode()


async def post(path: str, body: bytes) -> tuple[int, bytes]:
    server = WebhookServer(None, None)  # type: ignore[arg-type]
    async with TestClient(TestServer(server.app())) as http:
        answer = await http.post(path, data=body,
                                 headers={"Content-Type": "application/json"})
        return answer.status, await answer.read()


def test_a_list_of_10000_wrappers_is_converted_in_one_review() -> None:
    body = review(stored(10_000))
    assert MAX_REQUEST_BYTES < len(body) < MAX_CONVERSION_BYTES
    status, answer = asyncio.run(post(CONVERT_PATH, body))
    assert status == 200
    response = json.loads(answer)["response"]
    assert response["result"] == {"status": "Success"}
    converted = response["convertedObjects"]
    assert len(converted) == 10_000
    assert {o["apiVersion"] for o in converted} == {V2}
    assert converted[9_999]["metadata"]["name"] == "job-9999"
    assert converted[0]["spec"]["components"][0]["podSets"][0]["replicas"] == 4


def test_a_review_past_the_documented_bound_is_refused_unread() -> None:
    padding = b" " * (MAX_CONVERSION_BYTES + 1 - len(review([])))
    status, answer = asyncio.run(post(CONVERT_PATH, review([]) + padding))
    assert status == 413
    assert b"larger than 64 MiB" in answer


def test_an_admission_review_keeps_its_own_bound() -> None:
    body = json.dumps({"request": {"uid": "r", "object": {"pad": "x" * MAX_REQUEST_BYTES}}})
    status, _ = asyncio.run(post(VALIDATE_PATH, body.encode()))
    assert status == 413


def test_a_small_review_and_a_bad_one_are_answered_as_before() -> None:
    status, answer = asyncio.run(post(CONVERT_PATH, review(stored(1))))
    assert status == 200 and json.loads(answer)["response"]["result"]["status"] == "Success"
    assert asyncio.run(post(CONVERT_PATH, b"{}"))[0] == 400
