"""The image's description (localcluster/image.py) as a Dockerfile, for those with a container
engine: ``python -m localcluster image --dockerfile > Dockerfile``.

Two stages on the suite's slim image: the first builds the wheels (the package's, its
dependencies', pip's), the second installs the runtime packages and takes the venv the
first installed from them with the description's own commands.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterable

from .image import REPO, WHEEL_SOURCES, Image, install_commands, python_commands

#: Only the first stage builds wheels, with Debian's pip.
BUILD_PACKAGES = ("python3-pip",)
WHEELS = "/wheels"
WIDTH = 80  # of a command's lines, after the indent

HEADER = """\
# The dispatcher's image, for those with a container engine:
#   docker build -t registry.example.com/dispatcher:{version} .
# Generated from localcluster/image.py by `python -m localcluster image --dockerfile`:
# edit that, not this. `make image` builds the same image with no engine.
#
# {base} with Debian's python3; the package and its dependencies installed
# from wheels into a venv at {prefix}, byte-compiled; a non-root user. Nothing is
# written at run time: the pod runs with a read-only root filesystem."""


def render(image: Image) -> str:
    """The Dockerfile, whole."""
    base = f"debian:{image.suite}-slim"
    lines = [HEADER.format(version=image.version, base=base, prefix=image.prefix),
             *_build_stage(image, base), "", *_final_stage(image, base)]
    return "\n".join(lines) + "\n"


def _run(commands: Iterable[str]) -> str:
    """One RUN of shell commands, each on lines of its own."""
    return "RUN " + " \\\n    && ".join(_wrap(c) for c in commands)


def _wrap(command: str) -> str:
    """A long command over several lines, cut between words."""
    return " \\\n        ".join(textwrap.wrap(command, width=WIDTH, break_long_words=False,
                                              break_on_hyphens=False))


def _apt_install(packages: Iterable[str]) -> list[str]:
    return ["apt-get update",
            f"apt-get install -y --no-install-recommends {' '.join(packages)}",
            "rm -rf /var/lib/apt/lists/*"]


def _build_stage(image: Image, base: str) -> list[str]:
    # pip is run from its wheel: the venv itself gets no pip (nothing to install at run time).
    pip = f'"$(echo {WHEELS}/pip-*.whl)"'
    return [
        f"FROM {base} AS build",
        _run(_apt_install((*image.packages, *BUILD_PACKAGES))),
        "WORKDIR /src",
        *_copy_sources(),
        _run((f"python3 -m pip wheel --no-cache-dir --wheel-dir {WHEELS} . pip",
              *install_commands(image, WHEELS, pip))),
    ]


def _copy_sources() -> list[str]:
    """The files in one COPY, each folder in its own (COPY takes a folder's content)."""
    files = [name for name in WHEEL_SOURCES if not (REPO / name).is_dir()]
    folders = [name for name in WHEEL_SOURCES if (REPO / name).is_dir()]
    return [f"COPY {' '.join(files)} ./", *(f"COPY {name} ./{name}" for name in folders)]


def _final_stage(image: Image, base: str) -> list[str]:
    env = " \\\n    ".join(f"{k}={v}" for k, v in image.env)
    labels = " \\\n      ".join(f"{k}={json.dumps(v)}" for k, v in image.labels.items())
    return [
        f"FROM {base}",
        _run((*_apt_install(image.packages), *python_commands(image))),
        f"COPY --from=build {image.prefix} {image.prefix}",
        f"ENV {env}",
        f"LABEL {labels}",
        f"USER {image.user}",
        f"WORKDIR {image.workdir}",
        f"EXPOSE {' '.join(str(p) for p in image.ports)}",
        # Exec form, so that the stop signal reaches the dispatcher itself.
        f"ENTRYPOINT {json.dumps(list(image.entrypoint))}",
        f"CMD {json.dumps(list(image.cmd))}",
    ]
