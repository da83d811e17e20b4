"""The installed version, as `dispatcher --version` and the build-info metric say it."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "dispatcher"  # the name pip installs the package under


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"  # run from a checkout that pip did not install
