"""`dispatcher plan --live -f wrapper.yaml`: the live cluster (a stand-in API server here)
is listed, never written; the answer says when and where the wrapper would start, whom it
would preempt, which quota it would borrow and what it would delay."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.cli import kubectl_plugin, main

from .stand_in_api import JsonHandler, stand_in

EXAMPLE = Path(__file__).parents[2] / "examples" / "plan" / "quota"
GPU = "nvidia.com/gpu"
NOW = "2026-11-01T10:15:00Z"
PATHS = {"Node": "/api/v1/nodes", "Pod": "/api/v1/pods",
         "QuotaSubtree": "/apis/quota.codeflare.dev/v1alpha1/quotasubtrees",
         "AppWrapper": "/apis/workload.codeflare.dev/v1beta1/appwrappers"}


class Api(JsonHandler):
    lists: dict[str, list[dict[str, Any]]] = {}
    methods: list[str] = []

    def do_GET(self) -> None:
        self.methods.append("GET")
        path = self.path.split("?")[0]
        if path not in self.lists:
            self._send(404, {"kind": "Status", "reason": "NotFound", "message": "not found"})
            return
        self._send(200, {"kind": "List", "items": self.lists[path], "metadata": {}})

    def do_POST(self) -> None:
        self.methods.append("POST")
        self._send(405, {"kind": "Status"})

    do_PATCH = do_PUT = do_DELETE = do_POST



def serve(objects: list[dict[str, Any]], quota: bool = True) -> None:
    """What the stand-in lists: list items carry no kind, as from the real API."""
    Api.lists = {p: [] for k, p in PATHS.items() if quota or k != "QuotaSubtree"}
    Api.methods = []
    for o in objects:
        items = o["items"] if o["kind"] == "List" else [o]
        for item in items:
            Api.lists[PATHS[item["kind"]]].append(
                {k: v for k, v in item.items() if k not in ("kind", "apiVersion")})


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[Path]:
    with stand_in(Api, tmp_path) as path:
        yield path


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def live(kubeconfig: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert main(["plan", "--live", "--kubeconfig", str(kubeconfig), "--now", NOW,
                 *argv]) == 0
    out = capsys.readouterr().out
    return json.loads(out) if "json" in argv else out


def example_with_urgent_submitted(tmp_path: Path) -> Path:
    wrappers = docs(EXAMPLE / "appwrappers.yaml")
    urgent = [w for w in wrappers if w["metadata"]["name"] == "urgent"]
    serve(docs(EXAMPLE / "cluster.yaml") + [w for w in wrappers if w not in urgent])
    path = tmp_path / "urgent.yaml"
    path.write_text(yaml.safe_dump_all(urgent))
    return path


def test_live_plan_says_whom_it_preempts_and_where_without_writing(
        kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    urgent = example_with_urgent_submitted(tmp_path)
    out = live(kubeconfig, capsys, "-f", str(urgent), "--policy", "priority-preemption",
               "-o", "json")
    (answer,) = out["answers"]
    assert (answer["namespace"], answer["name"], answer["decision"]) == (
        "team-a", "urgent", "preempt")
    assert answer["preempts"] == ["team-b/train-big"]
    assert answer["reclaims"] == ["team-b/train-big"]
    assert answer["nodes"] == ["gpu-1"] and answer["startsAt"] == "2026-11-01T10:15:00+00:00"
    assert set(Api.methods) == {"GET"}
    table = live(kubeconfig, capsys, "-f", str(urgent), "--policy", "priority-preemption")
    assert "team-a/urgent: preempt (Preempting)" in table
    assert "  preempts: team-b/train-big" in table
    assert "nothing was created" in table.splitlines()[0]


def test_live_plan_says_which_quota_it_borrows(
        kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The example's nodes and quota tree, nothing running: team-a's quota is 8 GPUs.
    (listing,) = [d for d in docs(EXAMPLE / "cluster.yaml") if d["kind"] == "List"]
    serve([i for i in listing["items"] if i["kind"] in ("Node", "QuotaSubtree")])
    urgent = docs(EXAMPLE / "appwrappers.yaml")[2]
    assert urgent["metadata"]["name"] == "urgent"
    urgent["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"].update(
        parallelism=2, completions=2)
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(urgent))
    out = live(kubeconfig, capsys, "-f", str(path), "-o", "json")
    (answer,) = out["answers"]
    assert answer["decision"] == "dispatch"
    assert answer["borrows"] == [{"tree": "quota_gpu", "leaf": "team-a", "from": "cluster"}]
    table = live(kubeconfig, capsys, "-f", str(path))
    assert "  borrows: quota of cluster for team-a (tree quota_gpu)" in table


def node(name: str) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": {"cpu": "96", "memory": "1Ti", "pods": "110",
                                       GPU: "8"}}}


def appwrapper(name: str, gpus: int, created: str, seconds: int, priority: int = 0,
               running: bool = False, pods: int = 1) -> dict[str, Any]:
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"parallelism": pods, "completions": pods, "template": {"spec": {
               "containers": [{"name": "c", "resources": {"limits": {GPU: gpus}}}]}}}}
    obj: dict[str, Any] = {
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": "team", "creationTimestamp": created,
                     "annotations": {"workload.codeflare.dev/expectedDurationSeconds":
                                     str(seconds)}},
        "spec": {"priority": priority, "resources": {"GenericItems": [{"generictemplate": job}]}}}
    if running:
        obj["status"] = {"state": "Running", "queuejobstate": "Running", "conditions": [
            {"type": "Dispatched", "status": "True",
             "lastTransitionMicroTime": "2026-11-01T10:10:00.000000Z"}]}
    return obj


def one_node_busy_and_a_queue() -> list[dict[str, Any]]:
    """One 8-GPU node, busy until 10:20 (started 10:10, 10 min expected); `waiting` is
    next."""
    pod = {"kind": "Pod", "metadata": {"name": "running-0", "namespace": "team",
                                       "labels": {"workload.codeflare.dev/appwrapper":
                                                  "running"}},
           "spec": {"nodeName": "n1", "containers": [{"name": "c", "resources": {
               "limits": {GPU: "8"}}}]}, "status": {"phase": "Running"}}
    return [node("n1"), pod,
            appwrapper("running", 8, "2026-11-01T10:00:00Z", 600, running=True),
            appwrapper("waiting", 8, "2026-11-01T10:05:00Z", 600)]


def urgent_behind_a_busy_node(tmp_path: Path) -> Path:
    """The cluster of `one_node_busy_and_a_queue`; a file of an urgent 30-minute job."""
    serve(one_node_busy_and_a_queue(), quota=False)
    path = tmp_path / "urgent.yaml"
    path.write_text(yaml.safe_dump(appwrapper("urgent", 8, NOW, 1800, priority=10)))
    return path


def test_live_plan_says_when_it_would_start_and_whom_it_delays(
        kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = urgent_behind_a_busy_node(tmp_path)
    out = live(kubeconfig, capsys, "-f", str(path), "--policy", "priority", "-o", "json")
    (answer,) = out["answers"]
    assert answer["decision"] == "wait"
    assert answer["startsAt"] == "2026-11-01T10:20:00+00:00" and answer["nodes"] == ["n1"]
    assert answer["delays"] == [{"namespace": "team", "name": "waiting",
                                 "before": "2026-11-01T10:20:00+00:00",
                                 "after": "2026-11-01T10:50:00+00:00"}]
    table = live(kubeconfig, capsys, "-f", str(path), "--policy", "priority")
    assert "  delays: team/waiting from 10:20:00 UTC to 10:50:00 UTC" in table


def test_live_plan_says_which_reservation_it_moves(
        kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = urgent_behind_a_busy_node(tmp_path)
    out = live(kubeconfig, capsys, "-f", str(path), "--policy", "reserve", "-o", "json")
    reservation = out["answers"][0]["reservation"]
    assert reservation["moved"] is True
    assert reservation["before"] == {"namespace": "team", "name": "waiting",
                                     "startsAt": "2026-11-01T10:20:00+00:00", "nodes": ["n1"]}
    assert reservation["after"]["name"] == "urgent"
    short = tmp_path / "short.yaml"
    short.write_text(yaml.safe_dump(appwrapper("short", 8, NOW, 60)))
    out = live(kubeconfig, capsys, "-f", str(short), "--policy", "reserve", "-o", "json")
    assert out["answers"][0]["reservation"]["moved"] is False
    assert out["answers"][0]["delays"] == []


def test_live_plan_input_errors(kubeconfig: Path, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--live"]) == 2
    assert "--live takes the AppWrappers to try with -f" in capsys.readouterr().err
    assert main(["plan", "--live", "-f", str(tmp_path / "missing.yaml"), "--kubeconfig",
                 str(kubeconfig)]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["plan"]) == 2
    assert "give --cluster CLUSTER.yaml and AppWrapper files, or --live" in (
        capsys.readouterr().err)
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(appwrapper("x", 8, NOW, 60)))
    assert main(["plan", "--live", "-f", str(path), "--kubeconfig",
                 str(tmp_path / "nope")]) == 1
    assert "nope does not exist: pass the path of a kubeconfig" in capsys.readouterr().err


def test_plan_of_files_under_reserve_reserves_for_the_head(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # n1 busy until 10:20; n2 free. big needs both; long (2 h) and short (1 min) fit now.
    cluster = tmp_path / "cluster.yaml"
    busy = one_node_busy_and_a_queue()
    cluster.write_text(yaml.safe_dump_all([busy[0], node("n2"), busy[1]]))
    wrappers = tmp_path / "aws.yaml"
    wrappers.write_text(yaml.safe_dump_all([
        busy[2], appwrapper("big", 8, "2026-11-01T10:01:00Z", 600, pods=2),
        appwrapper("long", 8, "2026-11-01T10:02:00Z", 7200),
        appwrapper("short", 8, "2026-11-01T10:03:00Z", 60)]))
    assert main(["plan", "--cluster", str(cluster), "--policy", "reserve", "--now", NOW,
                 "-o", "json", str(wrappers)]) == 0
    decisions = {d["name"]: d for d in json.loads(capsys.readouterr().out)["decisions"]}
    assert decisions["big"]["message"].startswith(
        "reserved: starts at 10:20:00 UTC on nodes n1, n2; ")
    assert decisions["long"]["reason"] == "WaitingForReservation"
    assert decisions["short"]["decision"] == "dispatch"
    assert decisions["short"]["message"].startswith(
        "backfilled: expected to end before the reservation of team/big at 10:20:00 UTC")


def test_the_kubectl_plugin_plans_on_the_live_cluster(
        kubeconfig: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = urgent_behind_a_busy_node(tmp_path)
    assert kubectl_plugin(["plan", "-f", str(path), "--kubeconfig", str(kubeconfig),
                           "--now", NOW, "--policy", "priority", "-o", "json"]) == 0
    (answer,) = json.loads(capsys.readouterr().out)["answers"]
    assert answer["decision"] == "wait"
    assert answer["startsAt"] == "2026-11-01T10:20:00+00:00" and answer["nodes"] == ["n1"]
    assert answer["delays"][0]["name"] == "waiting"
    assert set(Api.methods) == {"GET"}
    with pytest.raises(SystemExit):
        kubectl_plugin(["plan", "--kubeconfig", str(kubeconfig)])
    assert "-f/--filename" in capsys.readouterr().err


@pytest.mark.parametrize("enabled", [True, False])
def test_the_answer_is_read_without_the_cycle_collector_and_leaves_it_as_it_was(
        enabled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its passes over the thousands of wrappers read cost as much as reading them."""
    from dispatcher import whatif
    from dispatcher.policy_files import load_policy

    seen: list[bool] = []
    read = whatif.appwrappers_from_documents

    def reading(*args: Any, **kwargs: Any) -> Any:
        seen.append(gc.isenabled())
        return read(*args, **kwargs)

    monkeypatch.setattr(whatif, "appwrappers_from_documents", reading)
    (gc.enable if enabled else gc.disable)()
    try:
        whatif.what_if(whatif.Live([], []), [], load_policy("fifo"), "per-node", 0.0)
        assert seen == [False, False] and gc.isenabled() is enabled
    finally:
        gc.enable()
