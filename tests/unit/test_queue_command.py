"""`dispatcher queue` / `kubectl appwrapper queue`: the pending AppWrappers in the
dispatcher's order, what they ask for, and why they wait."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatcher import cli, visibility
from dispatcher.controller.kube import ApiError
from dispatcher.queue import Policy

from .stand_in_api import JsonHandler, stand_in

FIFO = Policy("fifo", order="arrival")
PRIORITY = Policy("priority", order="priority")
T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
GPU = "nvidia.com/gpu"


def job(pods: int, gpus: int, cpu: str = "2", memory: str = "8Gi",
        name: str = "j") -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": pods, "completions": pods, "template": {"spec": {
                "containers": [{"name": "c", "resources": {
                    "requests": {"cpu": cpu, "memory": memory},
                    "limits": {GPU: gpus}}}]}}}}


def aw(name: str, *items: dict[str, Any], namespace: str = "team", created: int = 0,
       status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                     "creationTimestamp": f"2027-01-15T07:{created:02d}:00Z"},
        "spec": {"resources": {"GenericItems": [{"generictemplate": i}
                                                for i in items or (job(1, 1),)]}, **spec}}
    if status is not None:
        obj["status"] = status
    return obj


def backoff(message: str) -> dict[str, Any]:
    return {"state": "Pending", "queuejobstate": "Backoff", "message": message,
            "conditions": [{"type": "Init", "status": "True"},
                           {"type": "Backoff", "status": "True",
                            "reason": "AppWrapperNotRunnable", "message": message}]}


def test_only_pending_appwrappers_in_arrival_order_under_fifo() -> None:
    objects = [
        aw("third", created=30),
        aw("first", created=10),
        aw("running", created=5, status={"state": "Running"}),
        aw("done", created=1, status={"state": "Completed"}),
        aw("failed", created=2, status={"state": "Failed"}),
        aw("second", created=20, status={"state": "Pending"}),
    ]
    rows = visibility.pending_queue(objects, FIFO, T0)
    assert [(r.position, r.name) for r in rows] == [(1, "first"), (2, "second"), (3, "third")]


def test_first_seen_is_the_controllers_stamp_before_the_creation_time() -> None:
    # Re-created from a backup: created late, but the dispatcher saw it first.
    early = aw("restored", created=50,
               status={"state": "Pending", "controllerfirsttimestamp": "2027-01-15T06:00:00Z"})
    rows = visibility.pending_queue([aw("other", created=10), early], FIFO, T0)
    assert [r.name for r in rows] == ["restored", "other"]
    assert rows[0].waiting_seconds == 2 * 3600


def test_priority_policy_puts_higher_priority_first_and_grows_sloped_ones() -> None:
    objects = [aw("low", created=1, priority=1), aw("high", created=2, priority=9),
               aw("sloped", created=0, priority=0, priorityslope=0.01)]
    rows = visibility.pending_queue(objects, PRIORITY, T0)
    # sloped: 0 + 0.01 x 3600 s queued = 36, ahead of 9
    assert [r.name for r in rows] == ["sloped", "high", "low"]
    assert rows[0].effective_priority == pytest.approx(36.0)
    assert [r.name for r in visibility.pending_queue(objects, FIFO, T0)] == [
        "sloped", "low", "high"]


def test_requests_are_the_whole_gangs() -> None:
    objects = [aw("pair", job(2, 4, cpu="1500m", memory="1Gi"),
                  job(1, 0, cpu="1", memory="1Gi", name="k"))]
    (row,) = visibility.pending_queue(objects, FIFO, T0)
    assert row.pods == 3
    assert row.requests[GPU] == 8
    assert row.requests["cpu"] == 4000
    assert row.requests["memory"] == 3 * 2**30


def test_custompodresources_count_as_the_dispatcher_counts_them() -> None:
    item = {"generictemplate": {"apiVersion": "example.com/v1", "kind": "Widget",
                                "metadata": {"name": "w"}},
            "custompodresources": [{"replicas": 2, "requests": {GPU: 3}}]}
    obj = aw("custom")
    obj["spec"]["resources"]["GenericItems"] = [item]
    (row,) = visibility.pending_queue([obj], FIFO, T0)
    assert (row.pods, row.requests[GPU]) == (2, 6)


def test_reason_is_the_latest_condition_and_the_status_message() -> None:
    message = "Fragmented: 16 nvidia.com/gpu free in total, but at most 2 on any node"
    rows = visibility.pending_queue([aw("a", status=backoff(message))], FIFO, T0)
    assert (rows[0].condition, rows[0].reason, rows[0].message) == (
        "Backoff", "AppWrapperNotRunnable", message)


def test_invalid_ones_come_last_without_a_position() -> None:
    bad = aw("bad", {"apiVersion": "example.com/v1", "kind": "Widget",
                     "metadata": {"name": "w"}}, created=0)
    rows = visibility.pending_queue([bad, aw("good", created=5)], FIFO, T0)
    assert [(r.position, r.name) for r in rows] == [(1, "good"), (None, "bad")]
    assert rows[1].reason == "InvalidSpec"
    assert "custompodresources" in rows[1].message


def estimated(message: str, start: str) -> dict[str, Any]:
    return {**backoff(message), "estimatedStart": start}


def test_table() -> None:
    objects = [aw("big", job(4, 8), created=0,
                  status=estimated("InsufficientResources: x", "2027-01-15T10:10:00Z")),
               aw("new", created=59)]
    rows = visibility.pending_queue(objects, FIFO, T0)
    lines = visibility.to_table(rows, FIFO, "cluster", None).splitlines()
    assert lines[0] == "policy fifo: 2 pending in all namespaces"
    assert lines[1].split() == ["#", "APPWRAPPER", "PRIORITY", "PODS", "GPUS", "CPU", "MEMORY",
                                "WAITING", "ETA", "STATUS", "MESSAGE"]
    assert lines[2].split()[:10] == ["1", "team/big", "0", "4", "32", "8", "32Gi", "1h0m",
                                     "in", "2h10m"]
    assert lines[2].split()[10] == "Backoff/AppWrapperNotRunnable"
    assert lines[2].endswith("InsufficientResources: x")
    assert lines[3].split()[7:10] == ["1m0s", "unknown", "-"]
    assert "not taken in by a dispatcher yet" in lines[3]
    empty = visibility.to_table([], FIFO, "namespace", "team")
    assert empty == ("policy fifo: 0 pending in namespace team; positions count only this "
                     "namespace (listing AppWrappers in all namespaces is not allowed)")


def test_json() -> None:
    rows = visibility.pending_queue([aw("big", job(4, 8, cpu="500m"), created=0)], FIFO, T0)
    data = json.loads(visibility.to_json(rows, FIFO, "cluster", "team"))
    assert data["policy"] == "fifo" and data["scope"] == "cluster"
    assert data["namespace"] == "team"
    (entry,) = data["pending"]
    assert entry["position"] == 1 and entry["name"] == "big" and entry["pods"] == 4
    assert entry["requests"] == {"cpu": "2", "memory": str(32 * 2**30), GPU: "32"}
    assert entry["firstSeen"] == "2027-01-15T07:00:00Z"
    assert entry["waitingSeconds"] == 3600
    assert entry["estimatedStart"] is None and entry["estimatedStartInSeconds"] is None


def test_the_estimated_start_in_json_and_when_it_is_overdue() -> None:
    objects = [aw("a", created=0, status=estimated("x", "2027-01-15T08:30:00Z")),
               aw("b", created=1, status=estimated("x", "2027-01-15T07:59:30Z"))]
    rows = visibility.pending_queue(objects, FIFO, T0)
    data = json.loads(visibility.to_json(rows, FIFO))
    first, second = data["pending"]
    assert first["estimatedStart"] == "2027-01-15T08:30:00Z"
    assert first["estimatedStartInSeconds"] == 1800
    assert second["estimatedStartInSeconds"] == -30
    # Past its estimate and still waiting: the next cycles should start it.
    assert [visibility.eta(r) for r in rows] == ["in 30m", "now"]


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (59.9, "59s"), (61, "1m1s"), (601, "10m"), (3 * 3600 + 120, "3h2m"),
    (2 * 86400 + 3600, "2d1h"),
])
def test_duration(seconds: float, text: str) -> None:
    assert visibility.duration(seconds) == text


# --- listing -------------------------------------------------------------------------

class PagedKube:
    """Answers list requests from pages; refuses the cluster-wide list when told to."""

    def __init__(self, items: list[dict[str, Any]], cluster_status: int = 200) -> None:
        self.items = items
        self.cluster_status = cluster_status
        self.paths: list[str] = []

    async def request(self, method: str, path: str, body: Any = None,
                      query: dict[str, str] | None = None, **_: Any) -> Any:
        self.paths.append(path)
        cluster_wide = "/namespaces/" not in path
        if cluster_wide and self.cluster_status != 200:
            raise ApiError(self.cluster_status, "Forbidden", "no")
        ns = None if cluster_wide else path.split("/namespaces/")[1].split("/")[0]
        items = [i for i in self.items if ns is None or i["metadata"]["namespace"] == ns]
        start = int((query or {}).get("continue", 0))
        page = items[start:start + 2]
        more = start + 2 < len(items)
        return {"items": page, "metadata": {"continue": str(start + 2) if more else ""}}


def test_listing_pages_and_prefers_the_whole_cluster() -> None:
    items = [aw(f"a{i}", namespace="team" if i % 2 else "other") for i in range(5)]
    kube = PagedKube(items)
    listing = asyncio.run(visibility.list_appwrappers(kube, "team"))
    assert len(listing.objects) == 5 and listing.scope == "cluster"
    assert listing.namespace == "team"
    assert len(kube.paths) == 3


def test_listing_falls_back_to_the_namespace_when_the_cluster_is_forbidden() -> None:
    kube = PagedKube([aw("a", namespace="team"), aw("b", namespace="other")], 403)
    listing = asyncio.run(visibility.list_appwrappers(kube, "team"))
    assert [o["metadata"]["name"] for o in listing.objects] == ["a"]
    assert listing.scope == "namespace"
    with pytest.raises(visibility.ClusterError, match="cannot list AppWrappers"):
        asyncio.run(visibility.list_appwrappers(kube, None))


def test_listing_without_the_crd_says_to_install_it() -> None:
    with pytest.raises(visibility.ClusterError, match="install the CRD"):
        asyncio.run(visibility.list_appwrappers(PagedKube([], 404), "team"))


# --- the commands, against a stand-in API server ----------------------------------------

class FakeApi(JsonHandler):
    objects: list[dict[str, Any]] = []
    forbid_cluster = False

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/apis/workload.codeflare.dev/v1beta1/appwrappers" and self.forbid_cluster:
            self._send(403, {"kind": "Status", "reason": "Forbidden",
                             "message": "appwrappers is forbidden"})
            return
        ns = path.split("/namespaces/")[1].split("/")[0] if "/namespaces/" in path else None
        items = [o for o in self.objects if ns is None or o["metadata"]["namespace"] == ns]
        self._send(200, {"kind": "AppWrapperList", "items": items, "metadata": {}})



@pytest.fixture
def api(tmp_path: Path) -> Iterator[Path]:
    FakeApi.objects = [aw("mine", created=2), aw("theirs", namespace="other", created=1)]
    FakeApi.forbid_cluster = False
    with stand_in(FakeApi, tmp_path, namespace="team") as kubeconfig:
        yield kubeconfig


def test_queue_command_shows_the_contexts_namespace_with_global_positions(
        api: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["queue", "--kubeconfig", str(api), "-o", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["namespace"] == "team" and data["scope"] == "cluster"
    assert [(e["position"], e["name"]) for e in data["pending"]] == [(2, "mine")]


def test_queue_command_all_namespaces(api: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["queue", "--kubeconfig", str(api), "-A"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "policy fifo: 2 pending in all namespaces"
    assert [line.split()[1] for line in out[2:]] == ["other/theirs", "team/mine"]


def test_kubectl_plugin_with_only_namespace_rights(
        api: Path, capsys: pytest.CaptureFixture[str]) -> None:
    FakeApi.forbid_cluster = True
    assert cli.kubectl_plugin(["queue", "--kubeconfig", str(api), "-n", "team"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "positions count only this namespace" in out[0]
    assert out[2].split()[:2] == ["1", "team/mine"]


def test_errors_exit_with_a_message(api: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["queue", "--kubeconfig", str(api), "--policy", "nope"]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    assert cli.kubectl_plugin(["queue", "--kubeconfig", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err.startswith("kubectl appwrapper queue: cannot read the "
                                              "kubeconfig")
    FakeApi.forbid_cluster = True
    assert cli.main(["queue", "--kubeconfig", str(api), "-A"]) == 1
    assert "forbidden" in capsys.readouterr().err
