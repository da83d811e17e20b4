"""On a clone of the repository alone (no ../shared beside it), the suites that read other
projects' files say what they need and are skipped; under CI=true their absence fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shared_files import REPO, require

SUITES = ("tests/unit/test_mcad_conformance.py", "tests/unit/test_conformance_runner.py")


def _environment(tmp_path: Path, ci: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(MCAD_V1BETA1=str(tmp_path / "no-v1beta1"), MCAD_KUTTL=str(tmp_path / "no-kuttl"))
    if ci:
        env["CI"] = "true"
    return env


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_a_missing_corpus_skips_with_what_it_needs(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        require(tmp_path / "gone", "MCAD's kuttl suites", "MCAD_KUTTL")
    assert str(skipped.value) == (f"needs MCAD's kuttl suites in {tmp_path / 'gone'}: set "
                                  "MCAD_KUTTL=DIR, or put the shared/ folder beside the "
                                  "checkout")


def test_a_missing_corpus_fails_in_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="set MCAD_KUTTL=DIR"):
        require(tmp_path / "gone", "MCAD's kuttl suites", "MCAD_KUTTL")


def test_the_conformance_suites_are_skipped_on_a_clone_alone(tmp_path: Path) -> None:
    done = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES],
                _environment(tmp_path, ci=False))
    # 5: pytest's "no tests collected", as both modules are skipped whole.
    assert done.returncode in (0, 5), done.stdout + done.stderr
    assert "2 skipped" in done.stdout
    assert "set MCAD_V1BETA1=DIR" in done.stdout and "set MCAD_KUTTL=DIR" in done.stdout


def test_the_conformance_suites_fail_in_ci_without_the_corpus(tmp_path: Path) -> None:
    done = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES],
                _environment(tmp_path, ci=True))
    assert done.returncode != 0
    assert "2 errors" in done.stdout and "set MCAD_KUTTL=DIR" in done.stdout


@pytest.mark.parametrize("ci", [False, True])
def test_make_conformance_says_what_it_needs(tmp_path: Path, ci: bool) -> None:
    done = _run(["-m", "tests.conformance.mcad_kuttl"], _environment(tmp_path, ci))
    assert done.returncode == (1 if ci else 0)
    assert done.stdout.strip() == (
        f"MCAD kuttl suites {'FAILED' if ci else 'skipped'}: needs MCAD's kuttl suites "
        f"(test/kuttl-test*.yaml) in {tmp_path / 'no-kuttl' / 'test'}: set MCAD_KUTTL=DIR, "
        "or put the shared/ folder beside the checkout")
