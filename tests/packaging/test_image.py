"""`make image`: the image built with no container engine (localcluster/image_build.py) is an
OCI archive whose root filesystem runs the dispatcher as the image's user.

Needs root, mmdebstrap and umoci, and Debian's archive and the package index (the first
build; later ones find it in the cache). Without them the module is skipped with the reason;
under CI=true it fails. The archive is unpacked with umoci, a reader of its own; its
entry point runs in a chroot of the unpacked root filesystem, as the image's user. Where
containerd and runc are installed, a containerd of the test's own imports the archive and
runs the image with a read-only root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localcluster import image_build, wait_for
from localcluster.image import describe

pytestmark = pytest.mark.packaging
IMAGE = describe()


def _missing() -> str | None:
    why = image_build.missing() + [f"the image's test needs {tool} (apt-get install {tool})"
                                   for tool in ("umoci",) if shutil.which(tool) is None]
    return "; ".join(why) or None


if (why := _missing()) is not None:
    if os.environ.get("CI") == "true":
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)


@dataclass
class Unpacked:
    archive: Path
    rootfs: Path
    config: dict[str, Any]  # the image's OCI config


def _run(*argv: str | Path, env: dict[str, str] | None = None, timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> Unpacked:
    root = tmp_path_factory.mktemp("image")
    built = image_build.build_image(f"{root}/dist/")
    assert built.path == root / "dist" / f"dispatcher-{IMAGE.version}.oci.tar"
    layout = root / "layout"
    with tarfile.open(built.path) as tar:
        tar.extractall(layout, filter="data")
    _run("umoci", "unpack", "--image", f"{layout}:{IMAGE.tag}", root / "bundle")
    index = json.loads((layout / "index.json").read_text())
    manifest = _blob(layout, index["manifests"][0]["digest"])
    return Unpacked(built.path, root / "bundle" / "rootfs",
                    _blob(layout, manifest["config"]["digest"]))


def _blob(layout: Path, digest: str) -> Any:
    return json.loads((layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_text())


def _in_image(image: Unpacked, *args: str) -> subprocess.CompletedProcess[str]:
    """The entry point with ``args``, in a chroot of the image, as its user, with its env."""
    env = dict(item.split("=", 1) for item in image.config["config"]["Env"])
    return _run("chroot", f"--userspec={image.config['config']['User']}", image.rootfs,
                *image.config["config"]["Entrypoint"], *args, env=env)


def test_the_entry_point_runs_as_the_image_s_user(unpacked: Unpacked) -> None:
    assert (unpacked.rootfs / IMAGE.prefix.lstrip("/") / "bin" / "dispatcher").is_file()
    assert _in_image(unpacked, "--version").stdout.split() == ["dispatcher", IMAGE.version]
    assert "--metrics-port" in _in_image(unpacked, "run", "--help").stdout
    assert unpacked.config["config"]["User"] == "65532:65532"


def _walk(rootfs: Path) -> Iterator[tuple[Path, os.stat_result]]:
    for folder, dirs, files in os.walk(rootfs):
        for name in (*dirs, *files):
            path = Path(folder, name)
            yield path, path.lstat()


def test_nothing_is_world_writable_but_sticky_folders(unpacked: Unpacked) -> None:
    writable = [str(path.relative_to(unpacked.rootfs)) for path, st in _walk(unpacked.rootfs)
                if not os.path.islink(path) and st.st_mode & 0o002 and not st.st_mode & 0o1000]
    assert writable == []


def test_no_pip_cache_no_wheels_and_no_pip_in_the_venv(unpacked: Unpacked) -> None:
    rootfs = unpacked.rootfs
    assert not (rootfs / "root" / ".cache").exists()
    assert [p for p, _ in _walk(rootfs) if p.suffix == ".whl"] == []
    assert list((rootfs / "tmp").iterdir()) == []
    site = rootfs / IMAGE.prefix.lstrip("/") / "lib" / f"python{IMAGE.python}" / "site-packages"
    assert (site / "dispatcher").is_dir() and not (site / "pip").exists()
    lists = rootfs / "var" / "lib" / "apt" / "lists"
    assert [p for p in lists.rglob("*") if p.is_file() and p.name != "lock"] == []


def test_every_module_is_byte_compiled_for_a_read_only_root(unpacked: Unpacked) -> None:
    """Hash-based files that are never checked: valid whatever time the files were given."""
    prefix = unpacked.rootfs / IMAGE.prefix.lstrip("/")
    stdlib = unpacked.rootfs / "usr" / "lib" / f"python{IMAGE.python}"
    tag = f"cpython-{IMAGE.python.replace('.', '')}"
    for top in (prefix, stdlib):
        sources = [p for p in top.rglob("*.py") if "__pycache__" not in p.parts]
        assert sources
        for source in sources:
            compiled = source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc"
            assert compiled.read_bytes()[4:8] == b"\x01\0\0\0", compiled  # unchecked hash


def test_a_second_build_with_nothing_changed_is_found_in_the_cache(unpacked: Unpacked) -> None:
    assert image_build.build_image().reused


def test_the_archive_built_again_from_the_same_inputs_is_the_same_bytes(
        unpacked: Unpacked) -> None:
    cached = image_build.build_image().path
    first = cached.read_bytes()
    cached.unlink()  # the cached layers and wheels stay: the app is installed again
    again = image_build.build_image()
    assert not again.reused
    assert again.path.read_bytes() == first


@pytest.fixture
def containerd(tmp_path: Path) -> Iterator[list[str]]:
    """``ctr`` talking to a containerd of the test's own, in ``tmp_path``."""
    if not all(shutil.which(t) for t in ("containerd", "ctr", "runc")):
        why = "containerd, ctr or runc is not installed (make node-packages)"
        if os.environ.get("CI") == "true":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    sock = tmp_path / "containerd.sock"
    (tmp_path / "config.toml").write_text(
        f'version = 2\nroot = "{tmp_path}/root"\nstate = "{tmp_path}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{sock}"\n[ttrpc]\n  address = "{sock}.ttrpc"\n')
    with (tmp_path / "containerd.log").open("w") as log:
        daemon = subprocess.Popen(["containerd", "--config", str(tmp_path / "config.toml")],
                                  stdout=log, stderr=subprocess.STDOUT)
    try:
        def up() -> bool:
            assert daemon.poll() is None, (tmp_path / "containerd.log").read_text()
            return sock.exists()

        wait_for(up, 120, f"containerd to listen on {sock}")
        yield ["ctr", "--address", str(sock), "--namespace", "k8s.io"]
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


def test_containerd_imports_it_by_name_and_runs_it_read_only(unpacked: Unpacked,
                                                             containerd: list[str]) -> None:
    _run(*containerd, "images", "import", unpacked.archive, timeout=300)
    listed = _run(*containerd, "images", "ls", "--quiet").stdout.split()
    assert listed == [IMAGE.reference]
    ran = _run(*containerd, "run", "--rm", "--read-only", IMAGE.reference, "version-check",
               "dispatcher", "--version", timeout=120)
    assert ran.stdout.split() == ["dispatcher", IMAGE.version]
