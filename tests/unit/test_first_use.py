"""What a new user sees first: the version, and a mistyped or missing file named for what it
is, with the file's name in every error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import yaml
from pydantic import BaseModel

from dispatcher import cli, version
from dispatcher.api.models import AppWrapperSpec

from .test_plan import aw, node, write

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
BROKEN_YAML = "name: x\norder: [priority\n"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"dispatcher {version()}\n"
    with pytest.raises(SystemExit):
        cli.kubectl_plugin(["--version"])
    assert capsys.readouterr().out.startswith("kubectl appwrapper ")


@pytest.mark.parametrize("command", [
    ["plan", "--cluster", "CLUSTER", "APPWRAPPERS"],
    ["run"],
    # (queue shows the order the running dispatcher publishes: it takes no policy)
    ["simulate", "--nodes", "1", "--trace", "APPWRAPPERS"],
])
def test_a_missing_policy_file_is_said_to_be_missing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    files = {"CLUSTER": write(tmp_path, "c.yaml", node("n1")),
             "APPWRAPPERS": write(tmp_path, "a.yaml", aw("a", 1, 1))}
    argv = [files.get(a, a) for a in command]
    assert cli.main([*argv, "--policy", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert err == f"dispatcher {command[0]}: policy file {tmp_path / 'nope.yaml'} does not exist\n"
    assert cli.main([*argv, "--policy", str(tmp_path)]) == 2
    assert f"policy file {tmp_path} is not a file" in capsys.readouterr().err


def test_a_policy_name_that_is_not_built_in_is_still_an_unknown_policy(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "c.yaml", node("n1"))
    assert cli.main(["plan", "--cluster", cluster, "--policy", "lottery", cluster]) == 2
    assert "unknown policy 'lottery'" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--policy", "--config", "--cluster", "APPWRAPPERS"])
def test_yaml_errors_name_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   flag: str) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(BROKEN_YAML)
    files = {"--cluster": write(tmp_path, "c.yaml", node("n1")),
             "APPWRAPPERS": write(tmp_path, "a.yaml", aw("a", 1, 1))}
    files[flag] = str(broken)
    extra = [flag, str(broken)] if flag in ("--policy", "--config") else []
    assert cli.main(["plan", "--cluster", files["--cluster"], *extra, files["APPWRAPPERS"]]) == 2
    err = capsys.readouterr().err
    assert f'in "{broken}", line 2' in err and "<unicode string>" not in err


@pytest.mark.parametrize("flag", ["--trace", "--quota"])
def test_simulate_yaml_errors_name_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            flag: str) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text(BROKEN_YAML)
    files = {"--trace": str(EXAMPLES / "simulate" / "trace.yaml"), flag: str(broken)}
    argv = ["simulate", "--nodes", "1", "--trace", files["--trace"]]
    if flag == "--quota":
        argv += ["--quota", str(broken)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f'in "{broken}", line 2' in err and "<unicode string>" not in err


TYPO = """\
apiVersion: workload.codeflare.dev/v1beta1
kind: AppWrapper
metadata: {name: typo, namespace: team}
spec:
  priorty: 5
  schedulingSpec:
    requeuing: {timeinseconds: 10}
  resources:
    GenericItems:
    - replica: 1
      generictemplate:
        apiVersion: batch/v1
        kind: Job
        metadata: {name: j}
        spec:
          template:
            spec:
              containers: [{name: c, image: x, resources: {limits: {nvidia.com/gpu: 1}}}]
"""


def test_plan_warns_of_unknown_fields_as_kubectl_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "c.yaml", node("n1"))
    typo = tmp_path / "typo.yaml"
    typo.write_text(TYPO)
    assert cli.main(["plan", "-o", "json", "--cluster", cluster, str(typo)]) == 0
    (decision,) = json.loads(capsys.readouterr().out)["decisions"]
    assert decision["decision"] == "dispatch"
    assert decision["warnings"] == [
        "spec.priorty: unknown field, ignored (did you mean priority?)",
        "spec.resources.GenericItems[0].replica: unknown field, ignored (did you mean "
        "replicas?)",
        "spec.schedulingSpec.requeuing.timeinseconds: unknown field, ignored (did you mean "
        "timeInSeconds?)",
    ]


def _crd_properties(schema: dict[str, Any]) -> Iterator[tuple[str, set[str]]]:
    """(path, the fields the CRD's schema knows there) for every object with properties."""
    def walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, set[str]]]:
        if node.get("type") == "array":
            yield from walk(node.get("items") or {}, path + "[]")
            return
        props = node.get("properties") or {}
        if props and not node.get("x-kubernetes-preserve-unknown-fields"):
            yield path, set(props)
            for name, sub in props.items():
                yield from walk(sub, f"{path}.{name}")
    yield from walk(schema["properties"]["spec"], "spec")


def _model_fields(model: type[BaseModel], path: str) -> Iterator[tuple[str, set[str]]]:
    yield path, set(model.model_fields)
    for name, info in model.model_fields.items():
        annotation = info.annotation
        inner = get_args(annotation)[0] if get_origin(annotation) is list else annotation
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            suffix = "[]" if inner is not annotation else ""
            yield from _model_fields(inner, f"{path}.{name}{suffix}")


def test_the_fields_plan_knows_are_the_crds() -> None:
    """What plan calls unknown is what the API server prunes and kubectl reports."""
    crd = yaml.safe_load((REPO / "crds" / "appwrappers.workload.codeflare.dev.yaml")
                         .read_text())
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]
    assert dict(_model_fields(AppWrapperSpec, "spec")) == dict(_crd_properties(schema))


def test_plan_exits_2_when_every_appwrapper_is_invalid(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = write(tmp_path, "c.yaml", node("n1"))
    invalid = aw("bad", 1, 1)
    invalid["spec"]["resources"]["GenericItems"] = []
    assert cli.main(["plan", "--cluster", cluster, write(tmp_path, "one.yaml", invalid)]) == 2
    out = capsys.readouterr()
    assert "team/bad" in out.out and "invalid" in out.out  # the decisions are still shown
    assert out.err == ("dispatcher plan: the AppWrapper is invalid: nothing can be dispatched "
                       "(the messages above say why)\n")
    other = dict(invalid, metadata={"name": "worse", "namespace": "team"})
    assert cli.main(["plan", "--cluster", cluster,
                     write(tmp_path, "two.yaml", invalid, other)]) == 2
    assert "all 2 AppWrappers are invalid" in capsys.readouterr().err
    # One valid beside them: it is decided, and that is a plan.
    assert cli.main(["plan", "--cluster", cluster,
                     write(tmp_path, "mixed.yaml", invalid, aw("good", 1, 1))]) == 0
