"""What a new user sees first: the version, and a mistyped or missing file named for what it
is, with the file's name in every error."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from dispatcher import cli

from .test_plan import aw, node, write

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BROKEN_YAML = "name: x\norder: [priority\n"


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"dispatcher {metadata.version('dispatcher')}\n"
    with pytest.raises(SystemExit):
        cli.kubectl_plugin(["--version"])
    assert capsys.readouterr().out.startswith("kubectl appwrapper ")


@pytest.mark.parametrize("command", [
    ["plan", "--cluster", "CLUSTER", "APPWRAPPERS"],
    ["run"],
    ["queue"],
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
