"""``python -m localcluster image``: the image localcluster/image.py describes, built with
no container engine and no registry, as an OCI image archive.

Its steps, each cached under ``<cache>/images/`` by a hash of what goes into it:

1. the Debian root filesystem (mmdebstrap's minbase with the description's packages, made
   small as debian:*-slim is) and its layer: ``base-<suite>-<key>/``;
2. the dependencies' wheels for the image's Python and C library, from the package index:
   ``wheels-<key>/``;
3. the package's wheel, built from a copy of its sources, installed with the others into a
   venv in a copy of the root filesystem (in a chroot, with no index), byte-compiled: the
   venv is the second layer;
4. the archive of both layers and the image's config: ``<name>-<version>-<key>.oci.tar``,
   keyed by the base layer, the wheels, the package's sources and the description, so a
   build with nothing changed only finds it.

Building a step needs root (mmdebstrap, chroot); finding them all built does not. With
``fresh`` every step is done again, e.g. for Debian's security updates, which the keys do
not see.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import config, oci
from .image import (
    DPKG_PATH_EXCLUDES,
    DPKG_PATH_INCLUDES,
    REPO,
    WHEEL_SOURCES,
    Image,
    describe,
    index_annotations,
    install_commands,
    oci_config,
    python_commands,
)

#: Built archives kept in the cache (the newest), so switching branches back and forth
#: finds them.
KEEP_ARCHIVES = 3
LAYER = "layer.tar.gz"
LAYER_JSON = "layer.json"
#: Where the wheels are inside the root filesystem while they are installed.
WHEELS_INSIDE = "/tmp/wheels"
#: The chroot's environment: nothing of the caller's (its pip settings name host paths).
CHROOT_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LC_ALL": "C.UTF-8",
              "PYTHONDONTWRITEBYTECODE": "1"}


class ImageError(RuntimeError):
    pass


@dataclass(frozen=True)
class Built:
    path: Path
    size: int  # bytes
    seconds: float
    reused: bool  # found in the cache, nothing built


@dataclass(frozen=True)
class Base:
    rootfs: Path
    layer: oci.Layer


def _say(msg: str) -> None:
    print(f"[localcluster] image: {msg}", file=sys.stderr, flush=True)


def images_dir() -> Path:
    return config.cache_dir() / "images"


def build_image(out: str | Path | None = None, *, fresh: bool = False, repo: Path = REPO
                ) -> Built:
    """The image's archive, built or found in the cache; copied to ``out`` when given (a
    file, or a folder, existing or written with a final /: then named
    ``<name>-<version>.oci.tar`` in it)."""
    start = time.monotonic()
    image = describe(repo)
    images_dir().mkdir(parents=True, exist_ok=True)
    base = base_layer(image, fresh=fresh)
    wheels = dependency_wheels(image, repo, fresh=fresh)
    key = archive_key(image, base, wheels, repo)
    archive = images_dir() / f"{image.name}-{image.version}-{key}.oci.tar"
    reused = archive.is_file() and not fresh
    if not reused:
        _build_archive(image, base, wheels, repo, archive)
        _prune_archives(image)
    path = _deliver(archive, out, image)
    return Built(path, path.stat().st_size, time.monotonic() - start, reused)


def archive_name(image: Image) -> str:
    return f"{image.name}-{image.version}.oci.tar"


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


def missing() -> list[str]:
    """What this machine lacks to build the image, each as a sentence that says the fix."""
    out = []
    if os.geteuid() != 0:
        out.append("the image's build needs root (mmdebstrap, chroot): run it as root")
    if shutil.which("mmdebstrap") is None:
        out.append("the image's build needs mmdebstrap (apt-get install mmdebstrap)")
    return out


def _require_root(why: str) -> None:
    if os.geteuid() != 0:
        raise ImageError(f"{why} needs root (mmdebstrap and chroot): run it with sudo")


# --- 1. the Debian root filesystem ---------------------------------------------------------

def mmdebstrap_argv(image: Image) -> list[str]:
    """mmdebstrap's options: the target and sources follow."""
    return [
        "mmdebstrap", "--mode=root", "--format=directory", "--variant=minbase",
        f"--include={','.join(image.packages)}",
        # Merged /usr with symbolic links, not the usrmerge package (and perl with it).
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        *(f"--dpkgopt=path-exclude={p}" for p in DPKG_PATH_EXCLUDES),
        *(f"--dpkgopt=path-include={p}" for p in DPKG_PATH_INCLUDES),
        '--aptopt=Acquire::Languages "none"',
        *(f'--customize-hook=chroot "$1" {c}' for c in python_commands(image)),
        # What dpkg and debconf keep of the state before the last change.
        '--customize-hook=rm -f "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old',
        image.suite,
    ]


def base_layer(image: Image, *, fresh: bool = False) -> Base:
    """The root filesystem and its layer, made once per suite, packages and sources."""
    argv = mmdebstrap_argv(image)
    folder = images_dir() / f"base-{image.suite}-{_digest(argv, image.sources, image.epoch)}"
    if fresh or not (folder / LAYER_JSON).is_file():
        _make_base(image, argv, folder)
    found = json.loads((folder / LAYER_JSON).read_text())
    return Base(folder / "rootfs", oci.Layer(path=folder / LAYER, **found))


def _make_base(image: Image, argv: list[str], folder: Path) -> None:
    _require_root("building the Debian root filesystem")
    if shutil.which("mmdebstrap") is None:
        raise ImageError("mmdebstrap is not installed: apt-get install mmdebstrap")
    _say(f"Debian {image.suite} with {', '.join(image.packages)} (mmdebstrap)")
    with _staged(folder) as work:
        _run([*argv, str(work / "rootfs"), *image.sources],
             env={**os.environ, "SOURCE_DATE_EPOCH": str(image.epoch)}, quiet=False)
        layer = oci.write_layer(work / "rootfs", work / LAYER, epoch=image.epoch)
        (work / LAYER_JSON).write_text(json.dumps(
            {"digest": layer.digest, "size": layer.size, "diff_id": layer.diff_id}))


@contextmanager
def _staged(folder: Path) -> Iterator[Path]:
    """A folder beside ``folder`` that replaces it once the step is done, so that a step
    stopped half-way is never found."""
    work = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f"{folder.name}."))
    try:
        yield work
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if folder.exists():
        shutil.rmtree(folder)
    work.rename(folder)


# --- 2. the dependencies' wheels -------------------------------------------------------------

def requirements(repo: Path) -> list[str]:
    """The package's dependencies, and pip, which installs them."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], "pip"]


def platform_tags(image: Image, machine: str) -> list[str]:
    """Every manylinux tag the image's C library runs, newest first."""
    major, minor = (int(n) for n in image.glibc.split("."))
    return [*(f"manylinux_{major}_{m}_{machine}" for m in range(minor, 4, -1)),
            *(f"manylinux{legacy}_{machine}" for legacy in ("2014", "2010", "1"))]


def pip_download_argv(image: Image, repo: Path) -> list[str]:
    """pip's arguments to fetch wheels (never sources to build) for the image's Python."""
    version = image.python.replace(".", "")
    return ["download", "--quiet", "--only-binary=:all:", "--implementation=cp",
            f"--python-version={image.python}", f"--abi=cp{version}",
            *(f"--platform={tag}" for tag in platform_tags(image, platform.machine())),
            *requirements(repo)]


def dependency_wheels(image: Image, repo: Path, *, fresh: bool = False) -> Path:
    """The folder of the dependencies' wheels, fetched once per list of requirements."""
    argv = pip_download_argv(image, repo)
    folder = images_dir() / f"wheels-{_digest(argv)}"
    if fresh or not folder.is_dir():
        _say("the dependencies' wheels (pip download)")
        with _staged(folder) as work:
            _run([sys.executable, "-m", "pip", *argv, "--dest", str(work)])
    return folder


# --- 3. the package, installed ---------------------------------------------------------------

def _files(repo: Path) -> list[Path]:
    """The files the package's wheel is built from, sorted; no byte-compiled files."""
    found: list[Path] = []
    for name in WHEEL_SOURCES:
        top = repo / name
        found += [p for p in top.rglob("*") if p.is_file()] if top.is_dir() else [top]
    return sorted(p for p in found if not _is_build_output(p.relative_to(repo)))


def _is_build_output(path: Path) -> bool:
    return "__pycache__" in path.parts or path.suffix == ".pyc" or any(
        part.endswith(".egg-info") for part in path.parts)


def sources_digest(repo: Path) -> str:
    sha = hashlib.sha256()
    for path in _files(repo):
        sha.update(f"{path.relative_to(repo)}\0{path.stat().st_mode & 0o111}\0".encode())
        sha.update(hashlib.sha256(path.read_bytes()).digest())
    return sha.hexdigest()[:16]


def build_wheel(repo: Path, work: Path, epoch: int) -> Path:
    """The package's wheel, from a copy of its sources (so nothing else of the checkout,
    not even a stale build/ folder, gets into it)."""
    src, dist = work / "src", work / "dist"
    for path in _files(repo):
        (src / path.relative_to(repo)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, src / path.relative_to(repo))
    _say("the package's wheel (pip wheel)")
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir",
          str(dist), str(src)], env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)})
    (wheel,) = dist.glob("*.whl")
    return wheel


def install(image: Image, rootfs: Path, wheels: Iterable[Path]) -> None:
    """The description's install commands, in a chroot of ``rootfs``, from ``wheels``."""
    _require_root("installing the package into the root filesystem")
    inside = rootfs / WHEELS_INSIDE.lstrip("/")
    inside.mkdir(parents=True)
    for wheel in wheels:
        shutil.copy2(wheel, inside / wheel.name)
    (pip,) = inside.glob("pip-*.whl")
    _say(f"installing {image.distribution} into {image.prefix} (chroot, no index)")
    for command in install_commands(image, WHEELS_INSIDE, f"{WHEELS_INSIDE}/{pip.name}"):
        _run(["chroot", str(rootfs), "/bin/sh", "-c", command], env=CHROOT_ENV)
    shutil.rmtree(inside)


# --- 4. the archive --------------------------------------------------------------------------

def wheels_digest(folder: Path) -> str:
    sha = hashlib.sha256()
    for wheel in sorted(folder.glob("*.whl")):
        sha.update(f"{wheel.name}\0".encode() + hashlib.sha256(wheel.read_bytes()).digest())
    return sha.hexdigest()[:16]


def archive_key(image: Image, base: Base, wheels: Path, repo: Path) -> str:
    return _digest(repr(image), base.layer.digest, wheels_digest(wheels), sources_digest(repo))


def _build_archive(image: Image, base: Base, wheels: Path, repo: Path, archive: Path) -> None:
    with tempfile.TemporaryDirectory(dir=images_dir(), prefix="build-") as tmp:
        work = Path(tmp)
        wheel = build_wheel(repo, work, image.epoch)
        rootfs = work / "rootfs"
        _run(["cp", "-a", str(base.rootfs), str(rootfs)])  # keeps owners, links, devices
        install(image, rootfs, [wheel, *wheels.glob("*.whl")])
        _say("writing the layers and the archive")
        app = oci.write_layer(rootfs, work / "app.tar.gz", epoch=image.epoch,
                              under=image.prefix.lstrip("/"))
        partial = work / archive.name
        oci.write_archive(partial, oci_config(image, oci.architecture()), [base.layer, app],
                          annotations=index_annotations(image), epoch=image.epoch)
        partial.replace(archive)


def _prune_archives(image: Image) -> None:
    built = sorted(images_dir().glob(f"{image.name}-*.oci.tar"),
                   key=lambda p: p.stat().st_mtime, reverse=True)
    for old in built[KEEP_ARCHIVES:]:
        old.unlink()


def _deliver(archive: Path, out: str | Path | None, image: Image) -> Path:
    if out is None:
        return archive
    path = Path(out)
    if path.is_dir() or str(out).endswith("/"):
        path = path / archive_name(image)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(archive, path)
    return path


def _run(argv: list[str], env: dict[str, str] | None = None, quiet: bool = True) -> None:
    """Run a step; on failure, raise with what it printed (all of it goes to the terminal
    when not ``quiet``)."""
    done = subprocess.run(argv, env=env, check=False, text=True,
                          stdout=subprocess.PIPE if quiet else None,
                          stderr=subprocess.STDOUT if quiet else None)
    if done.returncode != 0:
        raise ImageError(f"{' '.join(argv[:3])} ... exited {done.returncode}"
                         + (f":\n{done.stdout[-3000:]}" if quiet else ""))
