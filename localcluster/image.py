"""The dispatcher's container image, described once.

Two builds read this description: ``python -m localcluster image`` (``make image``) builds
the image without a container engine or registry (localcluster/image_build.py), and
``python -m localcluster image --dockerfile`` renders the ``Dockerfile`` for those with an
engine (localcluster/dockerfile.py). Both install the same Debian packages, then the same
wheels into the same venv with the same commands, and give the image the same user,
environment, entry point and ports.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

#: The Debian archive the root filesystem comes from.
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"

#: What minbase would otherwise install that a pod never reads (as debian:*-slim excludes
#: them); the licences stay.
DPKG_PATH_EXCLUDES = (
    "/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
    "/usr/share/groff/*", "/usr/share/lintian/*", "/usr/share/linda/*",
)
DPKG_PATH_INCLUDES = ("/usr/share/doc/*/copyright",)

#: Fixed, so that two builds of the same inputs are byte-identical: every file's time is
#: clamped to it and it is the image's creation time (2026-01-01T00:00:00Z).
SOURCE_DATE_EPOCH = 1767225600

#: What the package's wheel is built from: pyproject.toml, its readme and licence, and the
#: packages it finds.
WHEEL_SOURCES = ("pyproject.toml", "README.md", "LICENSE", "dispatcher", "localcluster")

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Image:
    """Everything that makes the image, and nothing about how it is built."""

    version: str
    distribution: str  # the package's name on the package index
    source: str | None = None  # where its sources are published, when they are
    name: str = "dispatcher"
    suite: str = "bookworm"
    #: bookworm's python3 and C library: the dependencies' wheels must fit them.
    python: str = "3.11"
    glibc: str = "2.36"
    packages: tuple[str, ...] = ("python3", "ca-certificates")
    prefix: str = "/opt/dispatcher"  # the venv the package is installed into
    user: str = "65532:65532"  # numeric, so Kubernetes can check runAsNonRoot
    ports: tuple[int, ...] = (8080, 9443)  # metrics and health; the webhook
    entrypoint: tuple[str, ...] = ("dispatcher",)
    cmd: tuple[str, ...] = ("run", "--metrics-port", "8080")
    workdir: str = "/"
    epoch: int = SOURCE_DATE_EPOCH
    extra_env: tuple[tuple[str, str], ...] = field(default=(
        # The pods run with a read-only root filesystem: nothing is written next to the
        # package (it is byte-compiled at build time instead).
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("PYTHONUNBUFFERED", "1"),
    ))

    @property
    def tag(self) -> str:
        return self.version

    @property
    def reference(self) -> str:
        """The name ``ctr images import`` gives it: ``localhost/dispatcher:VERSION``."""
        return f"localhost/{self.name}:{self.tag}"

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        return (("PATH", f"{self.prefix}/bin:{SYSTEM_PATH}"), *self.extra_env)

    @property
    def sources(self) -> tuple[str, ...]:
        """The APT sources of the root filesystem: the release, its updates and security."""
        return (f"deb {MIRROR} {self.suite} main",
                f"deb {MIRROR} {self.suite}-updates main",
                f"deb {SECURITY_MIRROR} {self.suite}-security main")

    @property
    def labels(self) -> dict[str, str]:
        labels = {"org.opencontainers.image.title": self.name,
                  "org.opencontainers.image.version": self.version}
        if self.source:
            labels["org.opencontainers.image.source"] = self.source
        return labels


def describe(repo: Path = REPO) -> Image:
    """The image of the package in ``repo``, versioned as its pyproject.toml says."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    urls = project.get("urls", {})
    return Image(version=project["version"], distribution=project["name"],
                 source=urls.get("Source") or urls.get("Repository"))


def python_commands(image: Image) -> tuple[str, ...]:
    """Run in the Debian root filesystem once its packages are in. Debian byte-compiles
    Python's library against each file's time, which the image's clamped times no longer
    match; hash-based files stay valid, so a pod with a read-only root starts fast."""
    return ("python3 -m compileall -q -f --invalidation-mode unchecked-hash"
            f" /usr/lib/python{image.python} /usr/lib/python3/dist-packages",)


def install_commands(image: Image, wheels: str, pip: str) -> tuple[str, ...]:
    """Install the package from the wheels in the folder ``wheels`` (no index: nothing is
    downloaded) into a venv without pip, with pip run from its wheel at ``pip``; then
    byte-compile the venv with hashes, for the same reason as Python's own library."""
    venv_python = f"{image.prefix}/bin/python"
    return (
        f"python3 -m venv --without-pip {image.prefix}",
        f"{venv_python} {pip}/pip install --no-index --no-cache-dir --no-compile"
        f" --disable-pip-version-check --find-links {wheels} {image.distribution}",
        f"{venv_python} -m compileall -q --invalidation-mode unchecked-hash {image.prefix}",
    )


def oci_config(image: Image, architecture: str) -> dict[str, Any]:
    """The image's OCI config, but for its layers' digests (the archive's writer adds them)."""
    created = datetime.fromtimestamp(image.epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "created": created, "architecture": architecture, "os": "linux",
        "config": {
            "User": image.user, "Env": [f"{k}={v}" for k, v in image.env],
            "Entrypoint": list(image.entrypoint), "Cmd": list(image.cmd),
            "ExposedPorts": {f"{port}/tcp": {} for port in image.ports},
            "WorkingDir": image.workdir, "Labels": image.labels},
        "history": [
            {"created": created, "created_by": f"mmdebstrap --variant=minbase {image.suite}"
                                              f" {','.join(image.packages)}"},
            {"created": created, "created_by": f"pip install {image.distribution}"
                                              f"=={image.version} into {image.prefix}"}],
    }


def index_annotations(image: Image) -> dict[str, str]:
    """The index's names of the image: its tag, and the name containerd imports it as."""
    return {"org.opencontainers.image.ref.name": image.tag,
            "io.containerd.image.name": image.reference}
