"""Other projects' files some suites read where they lie, beside the checkout (../shared).

A clone of the repository alone does not have them: there, each such suite says in one
line what it needs and is skipped. Under CI (CI=true) they are always there, and a
missing one fails: a conformance suite skipped in CI would claim nothing while looking
green.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
# MCAD's AppWrappers (manifests/, cluster.yaml, expected.tsv) and its kuttl suites (test/).
MCAD_V1BETA1 = Path(os.environ.get("MCAD_V1BETA1", SHARED / "conformance/mcad-v1beta1"))
MCAD_KUTTL = Path(os.environ.get("MCAD_KUTTL", SHARED / "conformance/mcad-kuttl"))
# codeflare's AppWrapper v1beta2: its CRD, samples/ and docs/.
APPWRAPPER_V1BETA2 = Path(os.environ.get("APPWRAPPER_V1BETA2",
                                         SHARED / "conformance/appwrapper-v1beta2"))


def missing(path: Path, what: str, variable: str) -> str | None:
    """None when `path` exists; else the one line saying what is needed and how to give it."""
    if path.exists():
        return None
    return (f"needs {what} in {path}: set {variable}=DIR, or put the shared/ folder beside "
            "the checkout")


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def require(path: Path, what: str, variable: str) -> None:
    """Skip the calling test or module when `path` is missing; under CI=true, fail it."""
    why = missing(path, what, variable)
    if why is None:
        return
    if in_ci():
        pytest.fail(why, pytrace=False)
    pytest.skip(why, allow_module_level=True)
