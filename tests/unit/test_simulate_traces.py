"""Reading traces for `dispatcher simulate`: CSV and YAML, and errors that point at the line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dispatcher.admission import queued_from_appwrapper
from dispatcher.api.models import parse_appwrapper
from dispatcher.cli import main
from dispatcher.simulate.traces import TraceError, read_csv, read_trace, read_yaml

GPU = "nvidia.com/gpu"
HEADER = "job_id,submission_time,duration,num_gpu\n"


def shapes(text: str, gpus_per_node: int = 8) -> list[tuple[str, int, int]]:
    """(job, pods, GPUs per pod) of every job of a CSV trace."""
    out = []
    for j in read_csv(text, "t.csv", gpus_per_node).jobs:
        (g,) = j.wrapper.gang
        out.append((j.name, g.pod_set.count, g.pod_set.request.get(GPU, 0)))
    return out


def test_csv_jobs_become_gangs_of_whole_nodes() -> None:
    text = HEADER + "a,0,10,1\nb,5,10,8\nc,6,10,16\nd,7,10,64\ne,8,10,0\n"
    assert shapes(text) == [("a", 1, 1), ("b", 1, 8), ("c", 2, 8), ("d", 8, 8), ("e", 1, 0)]
    assert shapes(text, gpus_per_node=4) == [("a", 1, 1), ("b", 2, 4), ("c", 4, 4),
                                             ("d", 16, 4), ("e", 1, 0)]


def test_csv_columns_in_any_order_extra_columns_and_blank_lines() -> None:
    text = "num_gpu,job_id,user,duration,submission_time\n\n4,x,alice,30.5,12\n"
    (job,) = read_csv(text, "t.csv").jobs
    assert (job.name, job.submit, job.duration, job.gpus, job.where) == (
        "x", 12.0, 30.5, 4, "t.csv:3")
    assert job.wrapper.first_seen == 12.0  # the queue sees the submission time


def test_csv_limit_takes_the_first_jobs() -> None:
    text = HEADER + "".join(f"j{i},{i},1,1\n" for i in range(10))
    assert [j.name for j in read_csv(text, "t.csv", limit=3).jobs] == ["j0", "j1", "j2"]


@pytest.mark.parametrize(("body", "message"), [
    ("a,0,10,1\nb,zero,10,1\n", "t.csv:3: submission_time must be a number of seconds, "
                                "got 'zero'"),
    ("a,0,-5,1\n", "t.csv:2: duration must be a number of seconds ≥ 0, got '-5'"),
    ("a,0,10,1.5\n", "t.csv:2: num_gpu must be a whole number ≥ 0, got '1.5'"),
    ("a,0,10,-1\n", "t.csv:2: num_gpu must be a whole number ≥ 0, got '-1'"),
    ("a,0,10\n", "t.csv:2: expected 4 columns (job_id,submission_time,duration,num_gpu), "
                 "got 3"),
    ("a,0,10,1\n,1,10,1\n", "t.csv:3: job_id is empty"),
    ("a,0,10,1\nb,0,1,1\na,5,10,1\n", "t.csv:4: duplicate job_id a (also at t.csv:2)"),
    ("a,0,nan,1\n", "t.csv:2: duration must be a number of seconds ≥ 0, got 'nan'"),
])
def test_bad_csv_rows_name_file_and_line(body: str, message: str) -> None:
    with pytest.raises(TraceError) as err:
        read_csv(HEADER + body, "t.csv")
    assert str(err.value) == message


def test_csv_header_and_empty_file() -> None:
    with pytest.raises(TraceError, match=r"t.csv:1: the header lacks duration, num_gpu"):
        read_csv("job_id,submission_time\n", "t.csv")
    with pytest.raises(TraceError, match=r"t.csv: empty file"):
        read_csv("\n", "t.csv")
    with pytest.raises(TraceError, match=r"t.csv: no jobs"):
        read_csv(HEADER, "t.csv")


def pytorch(name: str, workers: int, gpus: int, **meta: object) -> dict[str, object]:
    def container() -> dict[str, object]:  # a new dict each time: no YAML anchors
        return {"name": "c", "resources": {"limits": {GPU: gpus, "cpu": "4"}}}

    spec = {"replicas": workers, "template": {"spec": {"containers": [container()]}}}
    master = {"template": {"spec": {"containers": [container()]}}}  # replicas missing: 1
    return {
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": "team", **meta},
        "spec": {"priority": 3, "resources": {"GenericItems": [{"generictemplate": {
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"pytorchReplicaSpecs": {"Master": master, "Worker": spec}}}}]}},
    }


def test_yaml_entries_and_annotated_appwrappers_in_one_file(tmp_path: Path) -> None:
    annotated = pytorch("b", 1, 8, annotations={
        "simulate.workload.codeflare.dev/submit-time": "120",
        "simulate.workload.codeflare.dev/duration": "1800"})
    docs = [
        [{"submitTime": 0, "duration": 3600, "appwrapper": pytorch("a", 3, 8)}],
        annotated,
        {"apiVersion": "v1", "kind": "List", "items": [
            {"submitTime": 300.5, "duration": 60, "appwrapper": pytorch("c", 0, 2)}]},
    ]
    path = tmp_path / "trace.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    trace = read_trace(path)
    assert [(j.name, j.submit, j.duration, j.pods, j.gpus) for j in trace.jobs] == [
        ("team/a", 0, 3600, 4, 32), ("team/b", 120, 1800, 2, 16), ("team/c", 300.5, 60, 1, 2)]
    # The gang is exactly what the controller infers for the same AppWrapper.
    expected = queued_from_appwrapper(parse_appwrapper(pytorch("a", 3, 8)), 0)
    assert trace.jobs[0].wrapper.gang == expected.gang
    assert trace.jobs[0].wrapper.priority == 3
    lines = path.read_text().splitlines()
    for job in trace.jobs:  # each job points at the line its entry starts on
        line = int(job.where.rsplit(":", 1)[1])
        assert job.name.split("/")[1] in "\n".join(lines[line - 1:line + 12])


def write_yaml(tmp: Path, text: str) -> Path:
    path = tmp / "t.yaml"
    path.write_text(text)
    return path


def entry(submit: object = 0, duration: object = 10, **extra: object) -> str:
    aw = pytorch("x", 1, 8)
    return yaml.safe_dump([{"submitTime": submit, "duration": duration, **extra,
                            "appwrapper": aw}], sort_keys=False)


@pytest.mark.parametrize(("text", "message"), [
    (entry(duration=-1), "t.yaml:1: duration must be a number of seconds ≥ 0, got '-1'"),
    (entry(submit="soon"), "t.yaml:1: submitTime must be a number of seconds, got 'soon'"),
    (entry(priority=3), "t.yaml:1: unknown field(s) priority: an entry has submitTime, "
                        "duration and appwrapper"),
    ("- {duration: 5, appwrapper: {}}\n", "t.yaml:1: the entry has no submitTime"),
    ("- 42\n", "t.yaml:1: expected an AppWrapper or a mapping with submitTime, duration "
               "and appwrapper, got int"),
    ("- {kind: Pod}\n", "t.yaml:1: expected an AppWrapper or a mapping with submitTime, "
                        "duration and appwrapper, got kind 'Pod'"),
])
def test_bad_yaml_entries_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = write_yaml(tmp_path, text)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert str(err.value) == message.replace("t.yaml", str(path))


def test_yaml_errors_point_at_the_entry_not_the_file_start(tmp_path: Path) -> None:
    good = entry()
    bad = pytorch("y", 1, 8)
    bad["spec"]["resources"]["GenericItems"][0]["replicas"] = -2  # type: ignore[index]
    text = good + yaml.safe_dump([{"submitTime": 1, "duration": 1, "appwrapper": bad}])
    start = len(good.splitlines()) + 1
    with pytest.raises(TraceError) as err:
        read_yaml(text, "t.yaml")
    assert str(err.value).startswith(f"t.yaml:{start}: invalid AppWrapper: ")
    assert "GenericItems[0].replicas" in str(err.value)


def test_yaml_unknown_kind_and_missing_annotations(tmp_path: Path) -> None:
    unknown = pytorch("z", 1, 8)
    item = unknown["spec"]["resources"]["GenericItems"][0]  # type: ignore[index]
    item["generictemplate"]["apiVersion"] = "example.com/v1"
    item["generictemplate"]["kind"] = "Mystery"
    text = yaml.safe_dump([{"submitTime": 1, "duration": 1, "appwrapper": unknown}])
    with pytest.raises(TraceError, match=r"t.yaml:1: AppWrapper team/z is invalid: .*"
                                         r"Mystery.*custompodresources"):
        read_yaml(text, "t.yaml")
    with pytest.raises(TraceError, match=r"t.yaml:1: the AppWrapper has no annotation "
                                         r"simulate.workload.codeflare.dev/submit-time"):
        read_yaml(yaml.safe_dump(pytorch("w", 1, 8)), "t.yaml")


def test_yaml_duplicates_and_syntax_errors(tmp_path: Path) -> None:
    twice = entry() + entry(submit=5)
    with pytest.raises(TraceError, match=r"t.yaml:\d+: duplicate AppWrapper team/x "
                                         r"\(also at t.yaml:1\)"):
        read_yaml(twice, "t.yaml")
    with pytest.raises(TraceError, match=r"t.yaml:2: not valid YAML: mapping values"):
        read_yaml("- submitTime: 1\n  duration: 2: 3\n", "t.yaml")
    with pytest.raises(TraceError, match=r"t.yaml: no jobs"):
        read_yaml("# nothing\n", "t.yaml")


def test_the_command_reports_trace_errors_and_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + "a,0,10,1\nb,1,10,many\n")
    assert main(["simulate", "--trace", str(path), "--nodes", "1"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"dispatcher simulate: {path}:3: num_gpu must be a whole number "
                            "≥ 0, got 'many'\n")
    assert main(["simulate", "--trace", str(tmp_path / "missing.csv"), "--nodes", "1"]) == 2
    assert "missing.csv: cannot read" in capsys.readouterr().err
