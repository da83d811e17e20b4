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
from dispatcher.controller.kube.client import ApiError

from .stand_in_api import JsonHandler, stand_in

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


def at(position: int | None, policy: str = "priority", message: str = "waiting",
       **more: Any) -> dict[str, Any]:
    """A status the dispatcher wrote for a waiting AppWrapper at `position`."""
    status = {**backoff(message), "queuePolicy": policy, **more}
    if position is not None:
        status["queuePosition"] = position
    return status


def test_the_order_is_the_dispatchers_as_published_not_re_sorted() -> None:
    # Created in another order, and with priorities another policy would sort otherwise:
    # the positions the dispatcher wrote decide, and only pending ones are listed.
    objects = [
        aw("third", created=1, priority=9, status=at(3)),
        aw("first", created=30, priority=0, status=at(1)),
        aw("running", created=5, status={"state": "Running"}),
        aw("done", created=1, status={"state": "Completed"}),
        aw("failed", created=2, status={"state": "Failed"}),
        aw("second", created=20, status=at(2)),
    ]
    rows = visibility.pending_queue(objects, T0)
    assert [(r.position, r.name) for r in rows] == [(1, "first"), (2, "second"), (3, "third")]
    assert visibility.policy_of(rows) == "priority"


def test_unnumbered_ones_follow_oldest_first_and_invalid_ones_come_last() -> None:
    held = {"state": "Pending", "conditions": [{
        "type": "Queueing", "reason": "Held", "message": "held by alice: ..."}]}
    bad = aw("bad", {"apiVersion": "example.com/v1", "kind": "Widget",
                     "metadata": {"name": "w"}}, created=0, status=at(1))
    # Re-created from a backup: created late, but the dispatcher saw it first.
    restored = aw("restored", created=50, status={
        **held, "controllerfirsttimestamp": "2027-01-15T06:00:00Z"})
    rows = visibility.pending_queue([aw("new", created=10), restored, bad,
                                     aw("numbered", created=55, status=at(2))], T0)
    assert [(r.position, r.name) for r in rows] == [
        (2, "numbered"), (None, "restored"), (None, "new"), (None, "bad")]
    assert rows[1].waiting_seconds == 2 * 3600
    assert (rows[1].condition, rows[1].reason) == ("Queueing", "Held")
    assert rows[3].reason == "InvalidSpec" and "custompodresources" in rows[3].message


def test_effective_priority_grows_with_the_slope() -> None:
    (row,) = visibility.pending_queue(
        [aw("sloped", created=0, priority=1, priorityslope=0.01, status=at(1))], T0)
    assert row.effective_priority == pytest.approx(1 + 0.01 * 3600)


def test_requests_are_the_whole_gangs() -> None:
    objects = [aw("pair", job(2, 4, cpu="1500m", memory="1Gi"),
                  job(1, 0, cpu="1", memory="1Gi", name="k"))]
    (row,) = visibility.pending_queue(objects, T0)
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
    (row,) = visibility.pending_queue([obj], T0)
    assert (row.pods, row.requests[GPU]) == (2, 6)


def test_reason_is_the_latest_condition_and_the_status_message() -> None:
    message = "Fragmented: 16 nvidia.com/gpu free in total, but at most 2 on any node"
    rows = visibility.pending_queue([aw("a", status=backoff(message))], T0)
    assert (rows[0].condition, rows[0].reason, rows[0].message) == (
        "Backoff", "AppWrapperNotRunnable", message)


def estimated(message: str, start: str, position: int = 1) -> dict[str, Any]:
    return at(position, "fifo", message, estimatedStart=start)


def test_table() -> None:
    objects = [aw("big", job(4, 8), created=0,
                  status=estimated("InsufficientResources: x", "2027-01-15T10:10:00Z")),
               aw("new", created=59)]
    rows = visibility.pending_queue(objects, T0)
    lines = visibility.to_table(rows, "cluster", None).splitlines()
    assert lines[0] == ("policy fifo: 2 pending in all namespaces; positions in the whole "
                        "cluster's queue, as the dispatcher published them")
    assert lines[1].split() == ["#", "APPWRAPPER", "PRIORITY", "PODS", "GPUS", "CPU", "MEMORY",
                                "WAITING", "ETA", "STATUS", "MESSAGE"]
    assert lines[2].split()[:10] == ["1", "team/big", "0", "4", "32", "8", "32Gi", "1h",
                                     "in", "2h10m"]
    assert lines[2].split()[10] == "Backoff/AppWrapperNotRunnable"
    assert lines[2].endswith("InsufficientResources: x")
    assert lines[3].split()[0] == "-" and lines[3].split()[7:10] == ["1m", "unknown", "-"]
    assert "not taken in by a dispatcher yet" in lines[3]
    empty = visibility.to_table([], "namespace", "team")
    assert empty.startswith("policy unknown: 0 pending in namespace team")


def test_json() -> None:
    status = at(4, "fifo", quotaPositions=[{"tree": "t", "node": "gold", "position": 2}])
    rows = visibility.pending_queue([aw("big", job(4, 8, cpu="500m"), created=0,
                                        status=status)], T0)
    data = json.loads(visibility.to_json(rows, "cluster", "team"))
    assert data["policy"] == "fifo" and data["scope"] == "cluster"
    assert data["namespace"] == "team"
    (entry,) = data["pending"]
    assert entry["position"] == 4 and entry["name"] == "big" and entry["pods"] == 4
    assert entry["quotaPositions"] == [{"tree": "t", "node": "gold", "position": 2}]
    assert entry["requests"] == {"cpu": "2", "memory": str(32 * 2**30), GPU: "32"}
    assert entry["firstSeen"] == "2027-01-15T07:00:00Z"
    assert entry["waitingSeconds"] == 3600
    assert entry["estimatedStart"] is None and entry["estimatedStartInSeconds"] is None


def test_the_estimated_start_in_json_and_when_it_is_overdue() -> None:
    objects = [aw("a", created=0, status=estimated("x", "2027-01-15T08:30:00Z", 1)),
               aw("b", created=1, status=estimated("x", "2027-01-15T07:59:30Z", 2))]
    rows = visibility.pending_queue(objects, T0)
    data = json.loads(visibility.to_json(rows))
    first, second = data["pending"]
    assert first["estimatedStart"] == "2027-01-15T08:30:00Z"
    assert first["estimatedStartInSeconds"] == 1800
    assert second["estimatedStartInSeconds"] == -30
    # Past its estimate and still waiting: the next cycles should start it.
    assert [visibility.eta(r) for r in rows] == ["in 30m", "now"]


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
    FakeApi.objects = [aw("mine", created=2, status=at(2, "fifo")),
                       aw("theirs", namespace="other", created=1, status=at(1, "fifo"))]
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
    assert out[0].startswith("policy fifo: 2 pending in all namespaces")
    assert [line.split()[1] for line in out[2:]] == ["other/theirs", "team/mine"]


def test_kubectl_plugin_with_only_namespace_rights(
        api: Path, capsys: pytest.CaptureFixture[str]) -> None:
    FakeApi.forbid_cluster = True
    assert cli.kubectl_plugin(["queue", "--kubeconfig", str(api), "-n", "team"]) == 0
    out = capsys.readouterr().out.splitlines()
    # Listed alone, it keeps the place the dispatcher gave it in the whole queue.
    assert out[2].split()[:2] == ["2", "team/mine"]


def test_errors_exit_with_a_message(api: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    # The order is the dispatcher's: a policy given here changes nothing, and says so.
    assert cli.main(["queue", "--kubeconfig", str(api), "--policy", "priority", "-A"]) == 0
    out, err = capsys.readouterr()
    assert "--policy is ignored" in err and out.startswith("policy fifo:")
    assert cli.kubectl_plugin(["queue", "--kubeconfig", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err == (
        f"kubectl appwrapper queue: kubeconfig {tmp_path / 'missing'} does not exist: pass "
        "the path of a kubeconfig file (kubectl config view --raw > FILE)\n")
    FakeApi.forbid_cluster = True
    assert cli.main(["queue", "--kubeconfig", str(api), "-A"]) == 1
    assert "forbidden" in capsys.readouterr().err
