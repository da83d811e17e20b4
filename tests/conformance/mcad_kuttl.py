"""Run MCAD's own kuttl suites against `dispatcher run` on the local cluster.

    python -m tests.conformance.mcad_kuttl [--suite NAME ...] [--keep-cluster]
    make conformance

MCAD's files (../shared/conformance/mcad-kuttl, `$MCAD_KUTTL`) are used as they are:
kuttl reads its test steps where they lie. Only these differ, each for a reason:

- the TestSuite files are the project's (tests/conformance/suites/): MCAD's helm install
  becomes `dispatcher run` (tests/conformance/ctl.py), same tests, same timeouts;
- the step files that act on MCAD's own installation are replaced by the project's
  (tests/conformance/steps/): the restart deletes MCAD's pod -> kill and restart the
  dispatcher; in asserts, MCAD's helm Deployment -> the dispatcher's /healthz
  (INSTALL_ASSERTS);
- MCAD's manifests that the API server refuses are patched minimally (PATCHES below).

For a test case with a replaced or patched file, kuttl runs a copy of the case directory
made of symbolic links to MCAD's files plus the replacements (under the output
directory). The node profile is `mcad-kind` (MCAD's CI: kind nodes `test-control-plane`
and `test-worker`). Each result is compared with tests/conformance/expected.yaml: the run
fails when a case passes or fails other than expected (update that file and the README's
table together).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localcluster import Cluster, Kubectl, build, config, wait_for
from tests.shared_files import MCAD_KUTTL, in_ci, missing

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROFILE = "mcad-kind"
# MCAD's TestSuite files, in the order its CI ran them.
SUITES = (
    "kuttl-test.yaml",
    "kuttl-test-deployment-03.yaml",
    "kuttl-test-deployment-02.yaml",
    "kuttl-test-deployment-01.yaml",
    "kuttl-test-borrowing.yaml",
    "kuttl-test-extended-resources.yaml",
)


@dataclass(frozen=True)
class Patch:
    """One value changed in one document of one of MCAD's manifests."""

    file: str  # relative to MCAD_KUTTL
    path: tuple[str | int, ...]  # into the (only) document
    was: Any  # what MCAD's file says; anything else fails the run (MCAD's file changed)
    becomes: Any
    why: str


_SELECTOR_MISMATCH = ("the Deployment's spec.template.metadata.labels.app does not match its "
                      "spec.selector.matchLabels.app: the API server refuses such a Deployment "
                      "(with or without any dispatcher), so MCAD's assert that it runs could "
                      "never hold; the template label is set to the selector's value")
_TEMPLATE_APP = ("spec", "resources", "GenericItems", 0, "generictemplate", "spec", "template",
                 "metadata", "labels", "app")
PATCHES: tuple[Patch, ...] = (
    Patch("test/e2e-kuttl-deployment-01/steps/01-install.yaml", _TEMPLATE_APP,
          "deployment-echoserver-01", "no-quota-deployment-01", _SELECTOR_MISMATCH),
    Patch("test/e2e-kuttl-deployment-02/steps/02-install.yaml", _TEMPLATE_APP,
          "deployment-echoserver-01", "no-quota-deployment-02", _SELECTOR_MISMATCH),
    Patch("test/e2e-kuttl-deployment-03/steps/02-install.yaml", _TEMPLATE_APP,
          "deployment-echoserver-01", "no-quota-deployment-02", _SELECTOR_MISMATCH),
)


@dataclass
class CaseResult:
    name: str  # e.g. e2e-kuttl/quota-forest
    passed: bool
    seconds: float
    failed_step: str = ""
    details: list[str] = field(default_factory=list)


def out_dir() -> Path:
    return config.cache_dir() / "conformance" / config.cluster_name()


# ------------------------------------------------------------------ what kuttl runs


# Only with --newer-job-conditions: in MCAD's two asserts that a Job's status.conditions list
# is exactly [Complete] (Kubernetes >= 1.31 lists SuccessCriteriaMet first), that list is
# checked by a command instead (Complete is True), so the steps after them run too.
JOB_CONDITION_ASSERTS = (
    "test/e2e-kuttl-deployment-01/steps/03-assert.yaml",
    "test/e2e-kuttl-extended-resources/steps/02-assert.yaml",
)
_COMPLETE = ("test \"$(kubectl get job -n {ns} {name} -o jsonpath="
             "'{{.status.conditions[?(@.type==\"Complete\")].status}}')\" = True")


# MCAD's asserts on its own installation (its helm release's Deployment
# kube-system/mcad-controller has a replica available): that object becomes a check that the
# dispatcher's /healthz answers 200; the rest of the file is MCAD's.
INSTALL_ASSERTS = (
    "test/e2e-kuttl-deployment-01/steps/04-assert.yaml",
    "test/e2e-kuttl-deployment-02/steps/03-assert.yaml",
)


def _is_mcad_install(doc: dict[str, Any]) -> bool:
    meta = doc.get("metadata") or {}
    return (doc.get("kind"), meta.get("namespace"), meta.get("name")) == (
        "Deployment", "kube-system", "mcad-controller")


def _install_checked_by_healthz(file: str, dest: Path) -> None:
    docs = [d for d in yaml.safe_load_all((MCAD_KUTTL / file).read_text()) if d]
    kept = [d for d in docs if not _is_mcad_install(d)]
    if len(kept) == len(docs):
        raise SystemExit(f"{file}: no assert on MCAD's Deployment any more: MCAD's file changed")
    step = {"apiVersion": "kuttl.dev/v1beta1", "kind": "TestAssert",
            "commands": [{"script": "$DISPATCHER_CTL healthy"}]}
    dest.write_text(f"# {file} of MCAD (tests/conformance/mcad_kuttl.py): its assert on MCAD's "
                    "helm Deployment kube-system/mcad-controller is the dispatcher's /healthz\n"
                    + yaml.safe_dump_all([step, *kept], sort_keys=False))


def _replacements() -> dict[str, Path]:
    """MCAD file (relative to MCAD_KUTTL/test) -> the project's replacement."""
    steps = HERE / "steps"
    return {str(p.relative_to(steps)): p for p in steps.rglob("*.yaml")}


def _job_conditions_checked_by_command(file: str, dest: Path) -> None:
    """MCAD's assert, but each Job's exact conditions list becomes a Complete=True check."""
    docs = [d for d in yaml.safe_load_all((MCAD_KUTTL / file).read_text()) if d]
    commands = []
    for d in docs:
        if d.get("kind") == "Job" and "conditions" in (d.get("status") or {}):
            del d["status"]["conditions"]
            meta = d["metadata"]
            commands.append({"script": _COMPLETE.format(ns=meta["namespace"],
                                                        name=meta["name"])})
    if not commands:
        raise SystemExit(f"{file}: no Job conditions to check any more: MCAD's file changed")
    step = {"apiVersion": "kuttl.dev/v1beta1", "kind": "TestAssert", "commands": commands}
    dest.write_text(f"# {file} of MCAD, with --newer-job-conditions (tests/conformance/"
                    "mcad_kuttl.py): the Jobs' status.conditions checked by a command\n"
                    + yaml.safe_dump_all([step, *docs], sort_keys=False))


def _patched(patch: Patch, dest: Path) -> None:
    doc = yaml.safe_load((MCAD_KUTTL / patch.file).read_text())
    node = doc
    for key in patch.path[:-1]:
        node = node[key]
    if node[patch.path[-1]] != patch.was:
        raise SystemExit(f"{patch.file}: {'.'.join(map(str, patch.path))} is "
                         f"{node[patch.path[-1]]!r}, not {patch.was!r}: MCAD's file changed; "
                         "review the patch in tests/conformance/mcad_kuttl.py")
    node[patch.path[-1]] = patch.becomes
    dest.write_text(f"# {patch.file} of MCAD, patched by tests/conformance/mcad_kuttl.py: "
                    f"{'.'.join(map(str, patch.path))} = {patch.becomes!r}\n"
                    + yaml.safe_dump(doc, sort_keys=False))


def test_dirs(test_dir: str, views: Path, newer_job_conditions: bool = False) -> str:
    """MCAD's test directory, or a view of it where some file is replaced or patched."""
    src = MCAD_KUTTL / test_dir
    rel = str(Path(test_dir).relative_to("test"))
    replaced = {k: v for k, v in _replacements().items() if k.startswith(rel + "/")}
    patched = {p.file: p for p in PATCHES if p.file.startswith(test_dir.rstrip("/") + "/")}
    conditions = {f for f in JOB_CONDITION_ASSERTS if newer_job_conditions
                  and f.startswith(test_dir.rstrip("/") + "/")}
    install = {f for f in INSTALL_ASSERTS if f.startswith(test_dir.rstrip("/") + "/")}
    if not replaced and not patched and not conditions and not install:
        return str(src)
    view = views / rel
    shutil.rmtree(view, ignore_errors=True)
    for case in sorted(p for p in src.iterdir() if p.is_dir()):
        (view / case.name).mkdir(parents=True)
        for f in sorted(case.iterdir()):
            dest = view / case.name / f.name
            key = f"{rel}/{case.name}/{f.name}"
            if key in replaced:
                shutil.copyfile(replaced[key], dest)
            elif f"test/{key}" in patched:
                _patched(patched[f"test/{key}"], dest)
            elif f"test/{key}" in conditions:
                _job_conditions_checked_by_command(f"test/{key}", dest)
            elif f"test/{key}" in install:
                _install_checked_by_healthz(f"test/{key}", dest)
            else:
                dest.symlink_to(f)
    return str(view)


def suite_file(name: str, work: Path, newer_job_conditions: bool = False) -> Path:
    """The project's TestSuite for MCAD's `name`, with absolute paths."""
    suite = yaml.safe_load((HERE / "suites" / name).read_text())
    suite["testDirs"] = [test_dirs(d, work / "views", newer_job_conditions)
                         for d in suite["testDirs"]]
    suite["artifactsDir"] = str(work / "artifacts" / name.removesuffix(".yaml"))
    Path(suite["artifactsDir"]).mkdir(parents=True, exist_ok=True)
    path = work / "suites" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(suite, sort_keys=False))
    return path


# ------------------------------------------------------------------ running

_CASE = re.compile(r"--- (PASS|FAIL): kuttl/harness/(\S+) \(([\d.]+)s\)")
_HEADER = re.compile(r"^=== (?:RUN|CONT|NAME|PAUSE)\s+kuttl/harness/(\S+)")
_FAILED_STEP = re.compile(r"failed in step (\S+)")


def parse(output: str, test_dir: str) -> list[CaseResult]:
    """The cases of one kuttl run, from its `go test -v` style output: each case's log
    lines follow a `=== RUN/CONT/NAME kuttl/harness/<case>` header."""
    own: dict[str, list[str]] = {}
    current = ""
    for line in output.splitlines():
        header = _HEADER.match(line)
        if header:
            current = header.group(1)
        elif line.startswith("=== "):
            current = ""
        elif current:
            own.setdefault(current, []).append(line.strip())
    results = []
    for m in _CASE.finditer(output):
        case = m.group(2)
        res = CaseResult(f"{test_dir}/{case}", m.group(1) == "PASS", float(m.group(3)))
        if not res.passed:
            lines = own.get(case, [])
            for ln in lines:
                step = _FAILED_STEP.search(ln)
                if step:
                    res.failed_step = step.group(1)
            # kuttl's verdicts ("resource Job:ns/name: .status...: mismatch"), not the diffs.
            res.details = [ln for ln in lines if ln.startswith("case.go")][-6:]
        results.append(res)
    return results


def run_suite(name: str, kuttl: Path, env: dict[str, str], work: Path,
              newer_job_conditions: bool = False) -> list[CaseResult]:
    cfg = suite_file(name, work, newer_job_conditions)
    test_dir = Path(yaml.safe_load((HERE / "suites" / name).read_text())["testDirs"][0]).name
    log = work / f"{name.removesuffix('.yaml')}.log"
    print(f"== {name} (kuttl log: {log})", flush=True)
    start = time.monotonic()
    with log.open("w") as fh:
        proc = subprocess.run([str(kuttl), "test", "--config", str(cfg)], env=env, cwd=work,
                              stdout=fh, stderr=subprocess.STDOUT, check=False)
    output = log.read_text(errors="replace")
    results = parse(output, test_dir)
    if not results:
        results = [CaseResult(f"{test_dir}/*", False, time.monotonic() - start,
                              "setup", output.strip().splitlines()[-15:])]
    elif proc.returncode != 0 and all(r.passed for r in results):
        results.append(CaseResult(f"{test_dir}/*", False, 0.0, "suite",
                                  output.strip().splitlines()[-15:]))
    return results


def cleanup(kubectl: Kubectl, baseline: set[str], env: dict[str, str]) -> None:
    """Between suites: the dispatcher stopped, no AppWrapper, quota tree or new namespace."""
    subprocess.run([*env["DISPATCHER_CTL"].split(), "stop"], env=env, check=False)
    for kind in ("appwrappers.workload.codeflare.dev", "quotasubtrees.quota.codeflare.dev"):
        kubectl.run("delete", kind, "--all", "-A", "--wait=false", check=False)
    extra = sorted({n["metadata"]["name"] for n in kubectl.items("namespaces")} - baseline)
    if extra:
        kubectl.run("delete", "namespace", "--wait=false", *extra, check=False)

    def gone() -> bool:
        names = {n["metadata"]["name"] for n in kubectl.items("namespaces")}
        # No AppWrapper CRD (a suite that installs none) is no AppWrapper either.
        left = kubectl.run("get", "appwrappers", "-A", "-o", "name", check=False).stdout
        return not (names - baseline) and not left.strip()

    wait_for(gone, 180, "the suite's namespaces and AppWrappers to be gone")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.conformance.mcad_kuttl",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", action="append", choices=SUITES,
                    help="run only this MCAD TestSuite (repeatable)")
    ap.add_argument("--keep-cluster", action="store_true",
                    default=os.environ.get("DISPATCHER_KEEP_CLUSTER") == "1",
                    help="leave the local cluster running (also DISPATCHER_KEEP_CLUSTER=1)")
    ap.add_argument("--newer-job-conditions", action="store_true",
                    help="replace MCAD's two asserts of a Job's exact status.conditions list "
                         "(Kubernetes >= 1.31 adds SuccessCriteriaMet) by a check that "
                         "Complete is True; every case is then expected to pass")
    args = ap.parse_args(argv)
    why = missing(MCAD_KUTTL / "test", "MCAD's kuttl suites (test/kuttl-test*.yaml)",
                  "MCAD_KUTTL")
    if why is not None:
        print(f"MCAD kuttl suites {'FAILED' if in_ci() else 'skipped'}: {why}")
        return 1 if in_ci() else 0
    expected = yaml.safe_load((HERE / "expected.yaml").read_text()) or {}
    if args.newer_job_conditions:
        expected = {name: {"result": "pass"} for name in expected}
    work = out_dir()
    if (work / "dispatcher" / "dispatcher.pid").exists():  # left by an interrupted run
        subprocess.run([sys.executable, str(HERE / "ctl.py"), "stop"], check=False,
                       env={**os.environ, "CONFORMANCE_STATE": str(work / "dispatcher")})
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.monotonic()
    kuttl = build.binary("kuttl", "kubectl-kuttl")
    cluster = Cluster()
    was_running = cluster.is_running()
    cluster.up(profile=PROFILE, operators=False)
    kubectl = cluster.kubectl()
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "PATH": f"{build.installed('kubernetes')}{os.pathsep}{os.environ.get('PATH', '')}",
        "DISPATCHER_CTL": f"{sys.executable} {HERE / 'ctl.py'}",
        "DISPATCHER_PYTHON": sys.executable,
        "CONFORMANCE_STATE": str(work / "dispatcher"),
        "MCAD_KUTTL": str(MCAD_KUTTL),
        "REPO": str(REPO),
    }
    baseline = {n["metadata"]["name"] for n in kubectl.items("namespaces")}
    results: list[CaseResult] = []
    try:
        for name in args.suite or SUITES:
            try:
                results += run_suite(name, kuttl, env, work, args.newer_job_conditions)
            finally:
                cleanup(kubectl, baseline, env)
    finally:
        if not was_running and not args.keep_cluster:
            cluster.down()
    return report(results, expected, time.monotonic() - t0, work)


def report(results: list[CaseResult], expected: dict[str, Any], seconds: float,
           work: Path) -> int:
    surprises = []
    print(f"\nMCAD kuttl suites against the dispatcher ({seconds:.0f} s; logs: {work})")
    for r in results:
        want = expected.get(r.name) or {}
        want_pass = want.get("result") == "pass"
        verdict = "pass" if r.passed else f"FAIL at step {r.failed_step}"
        ok = r.passed == want_pass and (r.passed or want.get("step") == r.failed_step)
        print(f"  {r.name:45} {verdict:28} {r.seconds:6.1f} s"
              + ("" if ok else "   <- expected " + (
                  "pass" if want_pass else f"fail at step {want.get('step')}")))
        if not r.passed:
            for line in r.details:
                print(f"      {line}")
        if not ok:
            surprises.append(r.name)
    if surprises:
        print(f"\n{len(surprises)} case(s) differ from tests/conformance/expected.yaml: "
              f"{', '.join(surprises)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
