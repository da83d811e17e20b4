"""The MCAD kuttl runner reads MCAD's files where they lie: what kuttl is given instead."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conformance.mcad_kuttl import HERE, MCAD_KUTTL, PATCHES, SUITES, parse, suite_file
from tests.shared_files import require

require(MCAD_KUTTL / "test", "MCAD's kuttl suites (test/kuttl-test*.yaml)", "MCAD_KUTTL")


def test_every_mcad_suite_has_its_replacement_with_the_same_tests_and_timeout() -> None:
    assert sorted(SUITES) == sorted(p.name for p in (MCAD_KUTTL / "test").glob("kuttl-test*"))
    for name in SUITES:
        mcad = yaml.safe_load((MCAD_KUTTL / "test" / name).read_text())
        ours = yaml.safe_load((HERE / "suites" / name).read_text())
        assert ours["testDirs"] == mcad["testDirs"] and ours["timeout"] == mcad["timeout"]
        assert "helm" not in yaml.safe_dump(ours)


def test_views_link_mcad_files_and_only_patch_manifests(tmp_path: Path) -> None:
    cfg = yaml.safe_load(suite_file("kuttl-test-deployment-02.yaml", tmp_path).read_text())
    (view,) = cfg["testDirs"]
    steps = Path(view) / "steps"
    mcad = MCAD_KUTTL / "test/e2e-kuttl-deployment-02/steps"
    assert sorted(p.name for p in steps.iterdir()) == sorted(p.name for p in mcad.iterdir())
    for f in steps.iterdir():
        if f.name in ("03-restart-mcad.yaml", "03-assert.yaml"):  # MCAD's own installation
            assert not f.is_symlink() and "DISPATCHER_CTL" in f.read_text()
        elif f.name == "02-install.yaml":  # the selector mismatch, on a copy
            doc = yaml.safe_load(f.read_text())
            template = doc["spec"]["resources"]["GenericItems"][0]["generictemplate"]["spec"]
            assert template["template"]["metadata"]["labels"] == template["selector"][
                "matchLabels"]
        else:
            assert f.is_symlink() and f.resolve() == (mcad / f.name).resolve()
    # A test directory with nothing to replace is MCAD's own.
    cfg = yaml.safe_load(suite_file("kuttl-test.yaml", tmp_path).read_text())
    assert cfg["testDirs"] == [str(MCAD_KUTTL / "test/e2e-kuttl/")]
    assert all("assert" not in Path(p.file).name for p in PATCHES)


def test_parse_reports_each_case_and_the_step_it_failed() -> None:
    out = "\n".join([
        "=== RUN   kuttl/harness/quota-forest",
        "=== CONT  kuttl/harness/quota-errors",
        "    case.go:328: failed in step 3-install",
        "    case.go:330: resource Job:a/b: .status.conditions: slice length mismatch: 1 != 2",
        "=== NAME  kuttl",
        "--- FAIL: kuttl (10.00s)",
        "        --- PASS: kuttl/harness/quota-forest (167.19s)",
        "        --- FAIL: kuttl/harness/quota-errors (18.53s)",
    ])
    forest, errors = parse(out, "e2e-kuttl")
    assert (forest.name, forest.passed, forest.seconds) == ("e2e-kuttl/quota-forest", True,
                                                            167.19)
    assert (errors.passed, errors.failed_step) == (False, "3-install")
    assert errors.details[-1].endswith("slice length mismatch: 1 != 2")
