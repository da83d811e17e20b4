"""The Dockerfile, for those with a container engine: rendered from the image's description
(localcluster/image.py), which `make image` builds without an engine
(tests/packaging/test_image.py). No engine runs here, so what `docker build` would make of it
is checked against deploy/ and pyproject.toml, with hadolint's main rules."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.cli import build_parser
from localcluster import dockerfile
from localcluster.image import describe

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments dropped, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


DOCKERFILE = instructions((REPO / "Dockerfile").read_text())


def each(name: str) -> list[str]:
    return [args for word, args in DOCKERFILE if word == name]


def deployments() -> list[dict[str, Any]]:
    docs = [d for f in (REPO / "deploy" / "base").glob("*.yaml")
            for d in yaml.safe_load_all(f.read_text()) if d]
    return [d for d in docs if d["kind"] == "Deployment"]


def test_instructions_are_read_whole() -> None:
    assert instructions("# c\nRUN a \\\n    b\nUSER 1\n") == [("RUN", "a      b"), ("USER", "1")]


def test_the_dockerfile_is_the_image_s_description_rendered() -> None:
    assert (REPO / "Dockerfile").read_text() == dockerfile.render(describe()), (
        "the Dockerfile differs from localcluster/image.py's description: run "
        "`python -m localcluster image --dockerfile > Dockerfile`")


def test_base_images_are_pinned_to_a_debian_whose_python_the_package_supports() -> None:
    floor = tuple(int(n) for n in PYPROJECT["project"]["requires-python"].strip(">=").split("."))
    image = describe()
    for base in each("FROM"):
        name, _, tag = base.split()[0].partition(":")
        assert tag and tag != "latest", f"FROM {base}: pin a tag (hadolint DL3006, DL3007)"
        assert (name, tag) == ("debian", f"{image.suite}-slim")
    assert tuple(int(n) for n in image.python.split(".")) >= floor  # the suite's python3


def test_it_runs_as_the_non_root_user_deploy_asks_for() -> None:
    user = each("USER")[-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, "a numeric non-root USER (DL3002; runAsNonRoot)"
    for d in deployments():
        context = d["spec"]["template"]["spec"]["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"]) == (int(uid), int(gid))


def test_the_command_is_the_installed_dispatcher_and_parses() -> None:
    (entrypoint,), (cmd,) = each("ENTRYPOINT"), each("CMD")
    # Exec form, so the stop signal reaches the dispatcher itself (DL3025).
    entry, args = json.loads(entrypoint), json.loads(cmd)
    assert entry == ["dispatcher"] and entry[0] in PYPROJECT["project"]["scripts"]
    assert build_parser().parse_args(args).command == "run"
    for d in deployments():  # deploy/ runs the entry point with its own args
        container = d["spec"]["template"]["spec"]["containers"][0]
        assert "command" not in container
        build_parser().parse_args(container["args"])


def test_it_exposes_the_ports_deploy_uses() -> None:
    exposed = {int(p) for args in each("EXPOSE") for p in args.split()}
    used = {p["containerPort"] for d in deployments()
            for p in d["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert exposed == used


def test_it_installs_the_package_from_the_wheel_of_what_it_copies() -> None:
    copied = [Path(src) for args in each("COPY") if not args.startswith("--from")
              for src in args.split()[:-1]]
    assert all((REPO / path).exists() for path in copied), copied
    assert Path(PYPROJECT["project"]["readme"]) in copied
    assert Path("pyproject.toml") in copied and Path("dispatcher") in copied
    (install,) = [" ".join(r.split()) for r in each("RUN") if "pip install" in r]
    assert "pip wheel --no-cache-dir --wheel-dir /wheels . " in install  # the copied sources
    assert "--no-cache-dir" in install.split("pip install")[1]  # DL3042
    # Only the wheels the stage built: the package's, as pyproject.toml names it.
    assert "--no-index --no-cache-dir" in install
    assert f"--find-links /wheels {PYPROJECT['project']['name']} " in install


def test_the_apt_lists_are_removed_where_they_are_fetched() -> None:
    for run in each("RUN"):
        if "apt-get update" in run:
            assert "--no-install-recommends" in run  # DL3015
            assert "rm -rf /var/lib/apt/lists/*" in run  # DL3009


@pytest.mark.parametrize("word", ["ADD", "MAINTAINER"])
def test_no_instruction_hadolint_refuses(word: str) -> None:
    assert each(word) == []  # DL3020: COPY, not ADD; DL4000: MAINTAINER is deprecated


def test_nothing_is_written_at_run_time() -> None:
    # The pods run with a read-only root filesystem: no .pyc files next to the package.
    env = " ".join(each("ENV"))
    assert "PYTHONDONTWRITEBYTECODE=1" in env
    for d in deployments():
        assert d["spec"]["template"]["spec"]["containers"][0]["securityContext"][
            "readOnlyRootFilesystem"] is True
