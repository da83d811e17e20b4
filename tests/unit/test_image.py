"""localcluster/image.py, the image's one description, as the Dockerfile and the OCI config
say it; and the parts of its daemonless build (localcluster/image_build.py) that need no
root: what each cached step is keyed by, and where the archive goes."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from localcluster import dockerfile, image_build
from localcluster.image import (
    REPO,
    WHEEL_SOURCES,
    Image,
    describe,
    index_annotations,
    install_commands,
    oci_config,
)

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
IMAGE = describe()


def test_the_image_is_the_package_s_version_named_for_containerd() -> None:
    assert IMAGE.version == PROJECT["version"] and IMAGE.distribution == PROJECT["name"]
    assert index_annotations(IMAGE) == {
        "org.opencontainers.image.ref.name": PROJECT["version"],
        "io.containerd.image.name": f"localhost/dispatcher:{PROJECT['version']}"}


def test_the_oci_config_says_what_the_dockerfile_says() -> None:
    config = oci_config(IMAGE, "amd64")["config"]
    text = dockerfile.render(IMAGE)
    assert f"\nUSER {config['User']}\n" in text
    assert f"\nENTRYPOINT {json.dumps(config['Entrypoint'])}\n" in text
    assert f"\nCMD {json.dumps(config['Cmd'])}\n" in text
    assert f"\nWORKDIR {config['WorkingDir']}\n" in text
    ports = " ".join(p.removesuffix("/tcp") for p in config["ExposedPorts"])
    assert f"\nEXPOSE {ports}\n" in text
    assert all(f" {item}" in text for item in config["Env"])
    assert all(f"{k}={json.dumps(v)}" in text for k, v in config["Labels"].items())
    assert config["Labels"]["org.opencontainers.image.version"] == IMAGE.version


def test_the_dockerfile_follows_the_description() -> None:
    other = dataclasses.replace(IMAGE, user="1000:1000", ports=(9000,), suite="trixie",
                                packages=("python3", "tini"), prefix="/srv/app")
    text = dockerfile.render(other)
    assert "\nUSER 1000:1000\n" in text and "\nEXPOSE 9000\n" in text
    assert text.count("FROM debian:trixie-slim") == 2
    assert "--no-install-recommends python3 tini \\\n" in text
    assert "COPY --from=build /srv/app /srv/app" in text and "PATH=/srv/app/bin:" in text


def test_both_builds_install_with_the_same_commands() -> None:
    text = dockerfile.render(IMAGE)
    joined = " ".join(text.replace("\\\n", " ").split())
    for command in install_commands(IMAGE, dockerfile.WHEELS, '"$(echo /wheels/pip-*.whl)"'):
        assert " ".join(command.split()) in joined


def test_the_oci_config_carries_the_description() -> None:
    config = oci_config(IMAGE, "amd64")
    assert (config["architecture"], config["os"]) == ("amd64", "linux")
    assert config["config"] == {
        "User": "65532:65532",
        "Env": ["PATH=/opt/dispatcher/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
                ":/sbin:/bin", "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"],
        "Entrypoint": ["dispatcher"], "Cmd": ["run", "--metrics-port", "8080"],
        "ExposedPorts": {"8080/tcp": {}, "9443/tcp": {}}, "WorkingDir": "/",
        "Labels": {"org.opencontainers.image.title": "dispatcher",
                   "org.opencontainers.image.version": PROJECT["version"]}}
    assert config["created"] == "2026-01-01T00:00:00Z"  # the fixed epoch, not the build's


def test_the_wheels_are_fetched_for_the_image_s_python_and_c_library() -> None:
    argv = image_build.pip_download_argv(IMAGE, REPO)
    assert "--only-binary=:all:" in argv and f"--python-version={IMAGE.python}" in argv
    tags = image_build.platform_tags(IMAGE, "x86_64")
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux2014_x86_64" in tags and "linux_x86_64" not in tags
    assert argv[-len(PROJECT["dependencies"]) - 1:] == [*PROJECT["dependencies"], "pip"]


def test_the_base_is_minbase_with_the_packages_made_small() -> None:
    argv = image_build.mmdebstrap_argv(IMAGE)
    assert "--variant=minbase" in argv and argv[-1] == IMAGE.suite
    assert f"--include={','.join(IMAGE.packages)}" in argv
    assert "--dpkgopt=path-exclude=/usr/share/doc/*" in argv


def copy_sources(to: Path) -> Path:
    to.mkdir(exist_ok=True)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        (to / name).write_bytes((REPO / name).read_bytes())
    for name in ("dispatcher", "localcluster"):
        (to / name).mkdir()
        (to / name / "__init__.py").write_text("")
    return to


def test_the_sources_key_sees_the_sources_only(tmp_path: Path) -> None:
    repo = copy_sources(tmp_path)
    first = image_build.sources_digest(repo)
    (repo / "dispatcher" / "__pycache__").mkdir()
    (repo / "dispatcher" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"x")
    (repo / "appwrapper_dispatcher.egg-info").mkdir()
    (repo / "notes.txt").write_text("not in the wheel")
    assert image_build.sources_digest(repo) == first
    (repo / "dispatcher" / "new.py").write_text("x = 1\n")
    assert image_build.sources_digest(repo) != first
    assert set(WHEEL_SOURCES) <= {p.name for p in repo.iterdir()}


def test_the_archive_key_changes_with_the_description(tmp_path: Path) -> None:
    repo = copy_sources(tmp_path / "repo")
    (tmp_path / "wheels").mkdir()
    base = image_build.Base(tmp_path, image_build.oci.Layer(tmp_path, "sha256:0", 0, "sha256:1"))
    key = image_build.archive_key(IMAGE, base, tmp_path / "wheels", repo)
    assert key == image_build.archive_key(IMAGE, base, tmp_path / "wheels", repo)
    other = dataclasses.replace(IMAGE, cmd=("run", "--metrics-port", "9090"))
    assert image_build.archive_key(other, base, tmp_path / "wheels", repo) != key
    (tmp_path / "wheels" / "a-1-py3-none-any.whl").write_bytes(b"w")
    assert image_build.archive_key(IMAGE, base, tmp_path / "wheels", repo) != key


@pytest.mark.parametrize("out, expected", [
    ("dist/", "dist/dispatcher-{v}.oci.tar"), ("dist/named.tar", "dist/named.tar")])
def test_the_archive_is_copied_to_a_file_or_into_a_folder(tmp_path: Path, out: str,
                                                          expected: str) -> None:
    cached = tmp_path / "cached.oci.tar"
    cached.write_bytes(b"archive")
    got = image_build._deliver(cached, f"{tmp_path}/{out}", IMAGE)
    assert got == tmp_path / expected.format(v=IMAGE.version)
    assert got.read_bytes() == b"archive"


def test_building_needs_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_build.os, "geteuid", lambda: 1000)
    with pytest.raises(image_build.ImageError, match="needs root"):
        image_build._require_root("building")


def test_the_description_is_frozen() -> None:
    assert isinstance(IMAGE, Image)
    with pytest.raises(dataclasses.FrozenInstanceError):
        IMAGE.user = "0:0"  # type: ignore[misc]
