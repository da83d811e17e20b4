"""`make release` builds helm and kustomize only, not the control plane (17-19 minutes
cold): the release asks for no other tool, and the Makefile builds no other."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from localcluster import build, release, versions

REPO = Path(__file__).resolve().parents[2]


def test_the_release_uses_only_the_release_tools(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    asked: list[str] = []

    def binary(wrapper: str, name: str | None = None) -> Path:
        asked.append(wrapper)
        if wrapper not in versions.RELEASE_TOOLS:
            raise build.BuildError(f"{wrapper} is not built")
        return Path("/bin") / (name or wrapper)

    def run(*argv: str | Path) -> str:
        if str(argv[0]).endswith("helm"):
            (tmp_path / "dist" / f"dispatcher-{release.package_version()}.tgz").touch()
        return "kind: Namespace\n"

    monkeypatch.setattr(build, "binary", binary)
    monkeypatch.setattr(release, "_run", run)
    assert release.main(["--dist", str(tmp_path / "dist")]) == 0
    assert set(asked) == {"helm", "kustomize"} == set(versions.RELEASE_TOOLS)


def test_make_release_builds_only_helm_and_kustomize() -> None:
    plan = subprocess.run(["make", "-n", "-W", "pyproject.toml", "release"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout
    builds = [line for line in plan.splitlines() if "-m localcluster build" in line]
    assert len(builds) == 1, plan
    assert "RELEASE_TOOLS" in builds[0]  # the tools named in versions.py
    assert "cluster-build" not in plan
    for wrapper in ("helm", "kustomize"):
        assert wrapper in versions.BUILD_ORDER and wrapper in build.WRAPPERS
