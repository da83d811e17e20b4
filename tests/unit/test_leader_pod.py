"""Only the leader's pod carries the label the pod webhook's Service selects."""

from __future__ import annotations

import asyncio
from typing import Any

from dispatcher.controller.kube.client import ApiError
from dispatcher.controller.kube.leader_pod import LEADER_LABEL, own_pod, step_down, take_lead


class Pods:
    """The pods of one namespace, as far as labels go."""

    def __init__(self, labelled: set[str], names: set[str]) -> None:
        self.labels = {n: ({LEADER_LABEL: "true"} if n in labelled else {}) for n in names}
        self.forbidden = False

    async def request(self, method: str, path: str, body: Any = None,
                      query: dict[str, str] | None = None,
                      content_type: str = "application/json") -> Any:
        if self.forbidden:
            raise ApiError(403, "Forbidden", "pods is forbidden")
        if method == "GET":
            assert query == {"labelSelector": LEADER_LABEL}
            return {"items": [{"metadata": {"name": n}} for n, labels in
                              sorted(self.labels.items()) if LEADER_LABEL in labels]}
        assert method == "PATCH" and content_type == "application/merge-patch+json"
        name = path.rsplit("/", 1)[1]
        for k, v in body["metadata"]["labels"].items():
            if v is None:
                self.labels[name].pop(k, None)
            else:
                self.labels[name][k] = v
        return {}

    def leaders(self) -> list[str]:
        return sorted(n for n, labels in self.labels.items() if LEADER_LABEL in labels)


def test_the_new_leader_takes_the_label_from_the_dead_one() -> None:
    pods = Pods(labelled={"dispatcher-a"}, names={"dispatcher-a", "dispatcher-b"})
    asyncio.run(take_lead(pods, ("dispatcher-system", "dispatcher-b")))  # type: ignore[arg-type]
    assert pods.leaders() == ["dispatcher-b"]


def test_a_replica_clears_its_own_label_before_it_campaigns() -> None:
    """A container restarted after it lost the lead keeps its pod and that pod's label."""
    pods = Pods(labelled={"dispatcher-a"}, names={"dispatcher-a", "dispatcher-b"})
    asyncio.run(step_down(pods, ("dispatcher-system", "dispatcher-a")))  # type: ignore[arg-type]
    assert pods.leaders() == []


def test_without_the_right_to_label_it_still_runs() -> None:
    pods = Pods(labelled=set(), names={"dispatcher-a"})
    pods.forbidden = True
    asyncio.run(step_down(pods, ("dispatcher-system", "dispatcher-a")))  # type: ignore[arg-type]
    asyncio.run(take_lead(pods, ("dispatcher-system", "dispatcher-a")))  # type: ignore[arg-type]
    assert pods.leaders() == []


def test_the_pod_is_known_from_the_downward_api(monkeypatch: Any) -> None:
    monkeypatch.delenv("POD_NAME", raising=False)
    monkeypatch.setenv("POD_NAMESPACE", "dispatcher-system")
    assert own_pod() is None
    monkeypatch.setenv("POD_NAME", "dispatcher-a")
    assert own_pod() == ("dispatcher-system", "dispatcher-a")
