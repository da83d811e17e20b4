"""`dispatcher plan`, as a user runs it: files in, decisions out, exit 2 on unusable input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.cli import main

GPU = "nvidia.com/gpu"


def node(name: str, gpu: int = 8, **extra: Any) -> dict[str, Any]:
    alloc = {"cpu": "96", "memory": "1Ti", "pods": "110", GPU: str(gpu)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, **extra},
            "status": {"allocatable": alloc}}


def pod(name: str, node_name: str | None, gpu: int, phase: str = "Running") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"limits": {GPU: gpu}}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "x"},
            "spec": spec, "status": {"phase": phase}}


def aw(name: str, pods: int, gpus: int, created: str | None = None,
       priority: int = 0) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team"}
    if created:
        meta["creationTimestamp"] = created
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"parallelism": pods, "completions": pods, "template": {"spec": {
               "containers": [{"name": "c", "resources": {"limits": {GPU: gpus}}}]}}}}
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": meta, "spec": {"priority": priority,
                                       "resources": {"GenericItems": [{"generictemplate": job}]}}}


def write(tmp: Path, name: str, *docs: Any) -> str:
    path = tmp / name
    path.write_text(yaml.safe_dump_all(docs))
    return str(path)


def plan_json(capsys: pytest.CaptureFixture[str], *argv: str, status: int = 0
              ) -> dict[str, Any]:
    assert main(["plan", "-o", "json", *argv]) == status
    result: dict[str, Any] = json.loads(capsys.readouterr().out)
    return result


def test_plan_dispatches_what_fits_and_says_why_the_rest_waits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "cluster.yaml",
                    {"apiVersion": "v1", "kind": "List", "items": [node("n1"), node("n2")]},
                    pod("busy", "n2", 6), pod("done", "n1", 8, phase="Succeeded"),
                    pod("pending", None, 8))
    wrappers = write(tmp_path, "aws.yaml", aw("two-by-4", 2, 4), aw("one-by-8", 1, 8))
    out = plan_json(capsys, "--cluster", cluster, wrappers)
    assert out["policy"] == "fifo" and out["fit"] == "per-node"
    first, second = out["decisions"]
    assert (first["name"], first["decision"], first["reason"]) == ("two-by-4", "dispatch",
                                                                  "Dispatch")
    assert first["placements"] == [
        {"item": 0, "podSet": first["placements"][0]["podSet"], "pod": 0, "node": "n1"},
        {"item": 0, "podSet": first["placements"][0]["podSet"], "pod": 1, "node": "n1"},
    ]
    assert (second["decision"], second["reason"]) == ("wait", "InsufficientResources")
    assert "placements" not in second
    assert second["namespace"] == "team"


def test_queue_order_follows_creation_timestamps(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "c.yaml", node("n1"))
    wrappers = write(tmp_path, "a.yaml", aw("late", 1, 8, "2026-01-02T00:00:00Z"),
                     aw("early", 1, 8, "2026-01-01T00:00:00Z"))
    out = plan_json(capsys, "--cluster", cluster, "--now", "2026-01-03T00:00:00Z", wrappers)
    assert [(d["name"], d["decision"]) for d in out["decisions"]] == [("early", "dispatch"),
                                                                      ("late", "wait")]


def test_fragmented_cluster_per_node_vs_aggregate(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "c.yaml", *(node(f"n{i}") for i in range(8)),
                    *(pod(f"p{i}", f"n{i}", 6) for i in range(8)))
    wrappers = write(tmp_path, "a.yaml", aw("needs-8", 1, 8))
    per_node = plan_json(capsys, "--cluster", cluster, wrappers)["decisions"][0]
    assert per_node["decision"] == "wait"
    assert per_node["message"].startswith(
        "16 nvidia.com/gpu free in total, but at most 2 nvidia.com/gpu on any node")
    aggregate = plan_json(capsys, "--cluster", cluster, "--fit", "aggregate", wrappers)
    assert aggregate["decisions"][0]["decision"] == "dispatch"
    assert aggregate["decisions"][0]["placements"][0]["node"] is None


def test_backfill_and_priority_policies_by_name(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "c.yaml", node("n1"), node("n2"), pod("p", "n2", 4))
    wrappers = write(tmp_path, "a.yaml", aw("big", 2, 8, priority=5), aw("small", 1, 2))
    fifo = plan_json(capsys, "--cluster", cluster, wrappers)["decisions"]
    assert [d["decision"] for d in fifo] == ["wait", "wait"]
    backfill = plan_json(capsys, "--cluster", cluster, "--policy", "backfill", wrappers)
    assert backfill["policy"] == "backfill"
    assert [(d["name"], d["decision"]) for d in backfill["decisions"]] == [
        ("big", "wait"), ("small", "dispatch")]


def test_one_invalid_appwrapper_does_not_stop_the_others(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = aw("bad", 1, 1)
    bad["spec"]["resources"]["GenericItems"] = []
    unknown = aw("unknown-kind", 1, 1)
    unknown["spec"]["resources"]["GenericItems"][0]["generictemplate"] = {
        "apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    cluster = write(tmp_path, "c.yaml", node("n1"))
    wrappers = write(tmp_path, "a.yaml", bad, unknown, aw("good", 1, 1))
    decisions = plan_json(capsys, "--cluster", cluster, wrappers)["decisions"]
    by_name = {d["name"]: d for d in decisions}
    assert by_name["bad"]["decision"] == "invalid"
    assert "GenericItems" in by_name["bad"]["message"]
    assert by_name["unknown-kind"]["decision"] == "invalid"
    assert "custompodresources" in by_name["unknown-kind"]["message"]
    assert by_name["good"]["decision"] == "dispatch"


def test_table_output_is_the_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "c.yaml", node("n1"))
    wrappers = write(tmp_path, "a.yaml", aw("one", 1, 8), aw("two", 1, 8))
    assert main(["plan", "--cluster", cluster, wrappers]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "policy fifo, per-node fit: 1 dispatch, 1 wait, 0 invalid"
    assert out[1].split()[:4] == ["#", "APPWRAPPER", "DECISION", "REASON"]
    assert out[2].split()[:3] == ["1", "team/one", "dispatch"]
    assert out[3].split()[:4] == ["2", "team/two", "wait", "(head)"]


@pytest.mark.parametrize(
    ("cluster_text", "aws_text", "expected"),
    [
        ("kind: Node\nmetadata: {name: [unclosed\n", None, "c.yaml: not valid YAML"),
        ("- just\n- a list\n", None, "c.yaml, document 1: expected a Kubernetes object"),
        ("kind: Service\nmetadata: {name: s}\n", None,
         "c.yaml, document 1: a cluster file holds Nodes, Pods and QuotaSubtrees"),
        ("kind: Node\nmetadata: {name: n}\nstatus: {allocatable: {cpu: 'lots'}}\n", None,
         "c.yaml, document 1: not a usable Node"),
        (None, "---\nkind: AppWrapper\nmetadata: {name: a}\nspec: {}\n---\nkind: Pod\n",
         "a.yaml, document 2: expected an AppWrapper or a QuotaSubtree, got Pod"),
    ],
)
def test_unusable_files_exit_2_naming_file_and_document(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], cluster_text: str | None,
        aws_text: str | None, expected: str) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text(cluster_text or yaml.safe_dump(node("n1")))
    aws = tmp_path / "a.yaml"
    aws.write_text(aws_text or yaml.safe_dump(aw("x", 1, 1)))
    assert main(["plan", "--cluster", str(cluster), str(aws)]) == 2
    err = capsys.readouterr().err
    assert expected in err
    assert err.startswith("dispatcher plan: ")


def test_missing_file_and_unknown_policy_exit_2(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "c.yaml", node("n1"))
    assert main(["plan", "--cluster", str(tmp_path / "nope.yaml"), cluster]) == 2
    assert "nope.yaml: cannot read" in capsys.readouterr().err
    assert main(["plan", "--cluster", cluster, "--policy", "lottery", cluster]) == 2
    assert "unknown policy 'lottery': use one of backfill, fifo, priority" in (
        capsys.readouterr().err)


def test_duplicate_appwrapper_is_invalid_not_silently_merged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "c.yaml", node("n1"))
    wrappers = write(tmp_path, "a.yaml", aw("same", 1, 1), aw("same", 1, 2))
    decisions = plan_json(capsys, "--cluster", cluster, wrappers)["decisions"]
    assert [d["decision"] for d in decisions] == ["dispatch", "invalid"]
    assert "duplicate AppWrapper team/same" in decisions[1]["message"]


def test_plan_shows_what_mcad_would_accept_silently(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """custompodresources saying 1 pod (of as many GPUs) of a Job that runs 3: dispatched
    as declared, and the difference is in the table's message and the JSON's warnings."""
    declared = aw("declared-1", 3, 1)
    declared["spec"]["resources"]["GenericItems"][0]["custompodresources"] = [
        {"replicas": 1, "requests": {GPU: 3}}]
    declared["spec"]["schedulingSpec"] = {"requeuing": {"growthType": "quadratic"}}
    cluster = write(tmp_path, "c.yaml", node("n1"))
    wrappers = write(tmp_path, "a.yaml", declared, aw("plain", 1, 1))
    first, second = plan_json(capsys, "--cluster", cluster, wrappers)["decisions"]
    assert first["decision"] == "dispatch" and first["message"] == "its pod fits: on n1"
    assert [w.split(":")[0] for w in first["warnings"]] == [
        "spec.schedulingSpec.requeuing.growthType",
        "spec.resources.GenericItems[0].custompodresources"]
    assert "declares 1 pod, but Job 'declared-1' will create 3 pods" in first["warnings"][1]
    assert second["warnings"] == []
    assert main(["plan", "--cluster", cluster, wrappers]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert row.split()[:3] == ["1", "team/declared-1", "dispatch"]
    assert ("its pod fits: on n1; warning: spec.schedulingSpec.requeuing.growthType: "
            "'quadratic' is not exponential") in row
    assert "; warning: spec.resources.GenericItems[0].custompodresources: declares 1 pod" in row


def test_the_installation_decides_the_kinds(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    binding = aw("with-binding", 1, 1)
    binding["spec"]["resources"]["GenericItems"].append({"generictemplate": {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "grant"}}})
    namespace = aw("with-namespace", 1, 1)
    namespace["spec"]["resources"]["GenericItems"].append({
        "generictemplate": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "n"}},
        "custompodresources": [{"replicas": 1, "requests": {"cpu": 1}}]})
    cluster = write(tmp_path, "c.yaml", node("n1"))
    wrappers = write(tmp_path, "a.yaml", binding, namespace)
    default = plan_json(capsys, "--cluster", cluster, wrappers, status=2)["decisions"]
    assert [d["decision"] for d in default] == ["invalid", "invalid"]
    assert default[0]["message"].startswith(
        "spec.resources.GenericItems[1]: RoleBinding 'grant' is of a kind this dispatcher "
        "does not create")
    assert "Namespace 'n' is cluster-scoped" in default[1]["message"]
    config = tmp_path / "config.yaml"
    config.write_text("allowedKinds: {add: [RoleBinding.rbac.authorization.k8s.io]}\n")
    allowed = plan_json(capsys, "--cluster", cluster, "--config", str(config), wrappers)
    assert [d["decision"] for d in allowed["decisions"]] == ["dispatch", "invalid"]
    config.write_text("allowedKinds: {add: [Namespace]}\n")
    assert main(["plan", "--cluster", cluster, "--config", str(config), wrappers]) == 2
    assert "Namespace: cluster-scoped" in capsys.readouterr().err


QUOTA_EXAMPLE = Path(__file__).parents[2] / "examples" / "plan" / "quota"


def quota_plan(capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["plan", "--cluster", str(QUOTA_EXAMPLE / "cluster.yaml"), "--now",
                 "2026-11-01T10:15:00Z", *extra, str(QUOTA_EXAMPLE / "appwrappers.yaml")]) == 0
    return capsys.readouterr().out


def test_plan_shows_preemption_quota_nodes_and_usage(capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    lines = quota_plan(capsys, "--policy", "priority-preemption").splitlines()
    assert lines[0] == ("policy priority-preemption, per-node fit: 1 dispatch, 1 preempt, "
                        "1 wait, 0 invalid")
    assert lines[1].split() == ["#", "APPWRAPPER", "DECISION", "REASON", "QUOTA", "MESSAGE"]
    assert lines[2].split()[:5] == ["1", "team-a/urgent", "preempt", "Preempting", "team-a"]
    # Offline, the user gave the whole snapshot: the victim is named.
    assert ("dispatch after preempting team-b/train-big (reclaiming the quota it borrows); "
            "then its pod fits: on gpu-1") in lines[2]
    assert lines[4].split()[:4] == ["3", "team-c/sweep", "wait", "QuotaExceeded"]
    assert "QuotaExceeded  team-c (no room)  team-c (tree quota_gpu) would use 12 of its 8" in (
        lines[4])
    assert ("admitted before this cycle (2): team-b/train-big (team-b borrowing from cluster; "
            "preempted), team-c/notebook (team-c)") in lines
    usage = lines[lines.index("TREE       NODE      HARD  USED / NOMINAL        BORROWED"):]
    assert [line.split() for line in usage[1:]] == [
        ["quota_gpu", "cluster", "16/32", "nvidia.com/gpu", "-"],
        ["team-a", "8/8", "nvidia.com/gpu", "-"],
        ["team-b", "0/16", "nvidia.com/gpu", "-"],
        ["team-c", "yes", "8/8", "nvidia.com/gpu", "-"]]


def test_plan_json_carries_quota_and_preemptions(capsys: pytest.CaptureFixture[str]) -> None:
    out = json.loads(quota_plan(capsys, "--policy", "priority-preemption", "-o", "json"))
    urgent = out["decisions"][0]
    assert urgent["preempts"] == urgent["reclaims"] == ["team-b/train-big"]
    assert urgent["placements"][0]["node"] == "gpu-1"
    assert urgent["quota"] == [{"tree": "quota_gpu", "leaf": "team-a", "node": "team-a",
                                "borrows": False}]
    assert out["admitted"][0] == {"namespace": "team-b", "name": "train-big", "preempted": True,
                                  "quota": [{"tree": "quota_gpu", "leaf": "team-b",
                                             "node": "cluster", "borrows": True}]}
    nodes = {n["name"]: n for n in out["quota"]["nodes"]}
    assert nodes["team-c"] == {"tree": "quota_gpu", "name": "team-c", "parent": "cluster",
                               "hardLimit": True, "nominal": {GPU: 8}, "used": {GPU: 8},
                               "borrowed": {}}
    assert out["quota"]["problems"] == []


def test_without_preemption_the_borrower_keeps_running(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """Under fifo the root being full holds the line, as a full cluster does."""
    lines = quota_plan(capsys).splitlines()
    assert lines[2].split()[:6] == ["1", "team-a/urgent", "wait", "(head)", "QuotaExceeded",
                                    "team-a"]
    assert ("team-a (tree quota_gpu) fits its own quota, but cluster would use 36 of its 32 "
            "nvidia.com/gpu") in lines[2]
    assert lines[3].split()[:4] == ["2", "team-c/eval", "wait", "BehindHeadOfLine"]


def test_finished_appwrappers_are_left_out_and_quota_problems_are_shown(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    done = aw("done", 1, 8)
    done["status"] = {"state": "Completed", "queuejobstate": "Completed"}
    tree = {"apiVersion": "quota.codeflare.dev/v1alpha1", "kind": "QuotaSubtree",
            "metadata": {"name": "orphan", "namespace": "kube-system", "labels": {"tree": "t"}},
            "spec": {"parent": "missing", "children": [{"name": "x"}]}}
    cluster = write(tmp_path, "c.yaml", node("n1"), tree)
    wrappers = write(tmp_path, "a.yaml", done, aw("next", 1, 8))
    assert main(["plan", "--cluster", cluster, wrappers]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[2:3]] == ["team/next"]
    assert ("quota problem: quota tree t cannot be used: it has no root: exactly one "
            "QuotaSubtree of a tree has no spec.parent") in lines


def test_a_template_that_names_its_node_is_planned_there_or_waits(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As the controller runs it: a pod that names its node is planned on that node alone
    (it goes there without the scheduler), and waits while that node has no room."""
    cluster = write(tmp_path, "c.yaml", node("n1"), node("n2"), pod("busy", "n2", 4))
    named = aw("named", 1, 8)
    named["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"]["template"][
        "spec"]["nodeName"] = "n2"
    small = aw("small", 1, 4)
    small["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"]["template"][
        "spec"]["nodeName"] = "n2"
    out = plan_json(capsys, "--cluster", cluster, write(tmp_path, "a.yaml", named, small),
                    "--policy", "backfill")
    by_name = {d["name"]: d for d in out["decisions"]}
    assert by_name["named"]["decision"] == "wait"
    assert by_name["small"]["decision"] == "dispatch"
    assert [p["node"] for p in by_name["small"]["placements"]] == ["n2"]


def _deep_wrapper(tmp: Path, depth: int) -> str:
    """A wrapper whose Job nests `depth` levels deep, as JSON text (PyYAML's own dumper
    would not write it)."""
    wrapper = aw("deep", 1, 1)
    value = "{}"
    for _ in range(depth):
        value = '{"x":' + value + "}"
    container = wrapper["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"][
        "template"]["spec"]["containers"][0]
    container["x"] = "DEEP"
    path = tmp / f"deep-{depth}.json"
    path.write_text(json.dumps(wrapper).replace('"DEEP"', value))
    return str(path)


@pytest.mark.parametrize("depth", [150, 300])
def test_plan_says_a_deep_wrapper_is_invalid(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str],
                                             depth: int) -> None:
    cluster = write(tmp_path, "cluster.yaml", node("n1"))
    out = plan_json(capsys, "--cluster", cluster, _deep_wrapper(tmp_path, depth), status=2)
    (decision,) = out["decisions"]
    assert decision["decision"] == "invalid"
    assert "nests more than 100 levels deep" in decision["message"]


def test_plan_on_a_file_nested_900_deep_is_a_clear_error_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "cluster.yaml", node("n1"))
    deep = _deep_wrapper(tmp_path, 900)
    assert main(["plan", "--cluster", cluster, deep]) == 2
    err = capsys.readouterr().err
    assert f"{deep}: not valid YAML: nested too deep to be read" in err
    assert "Traceback" not in err and "RecursionError" not in err


def test_plan_prints_what_a_tenant_wrote_without_control_characters(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "cluster.yaml", node("n1"))
    wrapper = aw("escapes", 1, 1)
    wrapper["spec"]["resources"]["GenericItems"][0]["generictemplate"]["kind"] = \
        "Jo\x1b[2J\x1b[31mb\u202e"
    main(["plan", "--cluster", cluster, write(tmp_path, "aws.yaml", wrapper)])
    out = capsys.readouterr().out
    assert "team/escapes" in out and "Job" in out
    assert "\x1b" not in out and "\u202e" not in out
