"""Run codeflare's AppWrapper end-to-end suite against `dispatcher run` serving v1beta2.

    python -m tests.conformance.appwrapper_e2e [--keep-cluster]
    make conformance

The suite is the Go package `test/e2e` of github.com/project-codeflare/appwrapper (the
version localcluster/versions.py pins), compiled as it is by `go test -c` into the build
cache (`make cluster-build`). It runs with its own label filter for the specs a cluster
without Kueue runs (`Standalone || Webhook`, as that project's standalone CI), against:

- the AppWrapper CRD of deploy/v1beta2 (v1beta1 and v1beta2 served), its conversion
  webhook and the admission webhooks called at `https://127.0.0.1:PORT` (the local
  cluster has no pod network), all served by one `dispatcher run --webhook-port PORT`;
- the local cluster's default nodes and operators (PyTorchJob, RayCluster, JobSet).

The specs whose expected entry says `node: real` need containers that really run (an init
container that never ends): they run in a second pass, on a cluster with a real node
(`localcluster up --real-node`), its taint lifted and the fake nodes cordoned for them, so
their pods land there. Where a real node cannot run (not root, Debian's packages missing),
that pass says so in one line and is skipped; under CI it fails.

The suite makes what else it needs itself (its namespace `e2e-test`, the ClusterRole of
its limited user); they are deleted afterwards, and the CRD is put back to v1beta1 only.
Each spec's result is compared with tests/conformance/appwrapper_e2e_expected.yaml, which
lists every spec of the suite: `pass`; `fail` with why (what the dispatcher does not do yet:
the spec runs, and the day it passes the run says so); or `excluded` with why (not run:
another label, or something the local cluster cannot give). The run fails when a spec does
otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from localcluster import Cluster, Kubectl, build, config, node, wait_for
from localcluster.cluster import ClusterError
from localcluster.node import NodeError
from tests.cluster.dispatcher_process import REPO, DispatcherProcess, forget_discovery
from tests.cluster.webhook_process import (
    CONFIGURATION,
    free_port,
    register_url_webhooks,
    unregister_webhooks,
)
from tests.shared_files import APPWRAPPER_V1BETA2, in_ci, missing

HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "appwrapper_e2e_expected.yaml"
WRAPPER = "appwrapper"
LABEL_FILTER = "Standalone || Webhook"
#: The suite's own bound (Ginkgo's --timeout); the process is stopped a minute after it.
SUITE_TIMEOUT = 30 * 60
#: The dispatcher's namespace: its webhook keeps its certificates in a Secret there.
SYSTEM_NAMESPACE = "appwrapper-e2e-system"
#: What the suite makes for itself (test/e2e/util_test.go), deleted after the run.
SUITE_NAMESPACE = "e2e-test"
SUITE_RBAC = "clusterrole/e2e-test:limited", "clusterrolebinding/e2e-test:limited"
CRD = "customresourcedefinition/appwrappers.workload.codeflare.dev"
CONVERSION_PATH = "/convert-appwrappers"
#: The cluster of the real-node pass (the real node's tests share it).
REAL_CLUSTER = "dispatcher-real"


@dataclass
class SpecResult:
    name: str  # the spec's full text: its containers' texts and its own, space-separated
    state: str  # Ginkgo's: passed, failed, skipped, timedout, panicked, ...
    seconds: float
    failure: str = ""


def out_dir() -> Path:
    return config.cache_dir() / "conformance" / f"{config.cluster_name()}-{WRAPPER}"


# ------------------------------------------------------------------ the cluster's side


def crd_with_url_conversion(kubectl: Kubectl, port: int) -> list[dict[str, Any]]:
    """deploy/v1beta2 rendered, its conversion webhook called at the loopback URL."""
    docs = [d for d in yaml.safe_load_all(kubectl("kustomize", str(REPO / "deploy/v1beta2")))
            if d]
    for doc in docs:
        webhook = ((doc.get("spec") or {}).get("conversion") or {}).get("webhook")
        if webhook:
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{CONVERSION_PATH}"}
    return docs


def copy_ca_to_conversion(kubectl: Kubectl) -> None:
    """The webhook patches its CA into the webhook configurations; the conversion webhook,
    called by URL rather than through its Service, gets the same CA."""
    def bundle() -> str | None:
        hooks = kubectl.json("mutatingwebhookconfiguration", CONFIGURATION)["webhooks"]
        return str(hooks[0]["clientConfig"].get("caBundle") or "") or None

    ca = wait_for(bundle, 60, "the webhook to patch its CA into its configurations")
    kubectl("patch", CRD, "--type=json", "-p", json.dumps([
        {"op": "add", "path": "/spec/conversion/webhook/clientConfig/caBundle", "value": ca}]))


def v1beta2_served(kubectl: Kubectl) -> bool:
    """A v1beta2 AppWrapper goes through conversion and admission (a server-side dry run)."""
    probe = {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
             "metadata": {"name": "v1beta2-probe", "namespace": "default"},
             "spec": {"components": [{"template": {
                 "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
                 "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}]}}
    proc = kubectl.run("create", "--dry-run=server", "-f", "-", check=False,
                       input=yaml.safe_dump(probe))
    return proc.returncode == 0


def install(kubectl: Kubectl, dispatcher: DispatcherProcess, port: int) -> None:
    kubectl.apply(crd_with_url_conversion(kubectl, port), server_side=True)
    kubectl("wait", "--for=condition=Established", "--timeout=60s", CRD)
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": SYSTEM_NAMESPACE}})
    register_url_webhooks(kubectl, port)
    dispatcher.start("fifo", extra_args=[
        "--webhook-port", str(port), "--webhook-host", "127.0.0.1",
        "--webhook-cert-host", "127.0.0.1", "--namespace", SYSTEM_NAMESPACE])
    copy_ca_to_conversion(kubectl)
    wait_for(lambda: v1beta2_served(kubectl), 60,
             f"a v1beta2 AppWrapper to be accepted; log: {dispatcher.log_path}")


def uninstall(kubectl: Kubectl, dispatcher: DispatcherProcess) -> None:
    """What the suite and this runner made, gone; the CRD serves v1beta1 only again."""
    kubectl("delete", "appwrappers.v1beta1.workload.codeflare.dev", "--all", "-n",
            SUITE_NAMESPACE, "--wait=false", "--ignore-not-found", check=False)
    kubectl("delete", "namespace", SUITE_NAMESPACE, SYSTEM_NAMESPACE, "--wait=false",
            "--ignore-not-found", check=False)
    kubectl("delete", *SUITE_RBAC, "--ignore-not-found", check=False)
    wait_for(lambda: not kubectl.run("get", "namespace", SUITE_NAMESPACE, "-o", "name",
                                     check=False).stdout.strip(),
             180, f"namespace {SUITE_NAMESPACE} to be gone")
    dispatcher.stop()
    unregister_webhooks(kubectl)
    v1beta1_only(kubectl)


def v1beta1_only(kubectl: Kubectl) -> None:
    """The CRD of crds/ again. Its conversion goes first: re-applying crds/ would leave the
    CA bundle patched in (another field manager's) under a strategy that takes none."""
    kubectl("patch", CRD, "--type=json", "-p", json.dumps([
        {"op": "replace", "path": "/spec/conversion", "value": {"strategy": "None"}}]))
    kubectl("apply", "--server-side", "--force-conflicts", "-f",
            str(REPO / "crds" / "appwrappers.workload.codeflare.dev.yaml"))
    forget_discovery()


# ------------------------------------------------------------------ the suite


def on_real_node(want: dict[str, Any]) -> bool:
    return want.get("node") == "real" and want.get("result") != "excluded"


def pattern(names: list[str]) -> str:
    """A regular expression matching the full text of each spec named."""
    # Not anchored at the start: Ginkgo matches a text with more before the containers'.
    return "|".join(f"{re.escape(n)}$" for n in names)


def command(binary: Path, expected: dict[str, Any], report: Path, real_node: bool = False
            ) -> list[str]:
    """The fake nodes' pass skips the excluded specs and the real node's; the real node's
    pass runs only those."""
    cmd = [str(binary), f"--ginkgo.label-filter={LABEL_FILTER}",
           f"--ginkgo.timeout={SUITE_TIMEOUT}s", f"--ginkgo.json-report={report}",
           "--ginkgo.v", "--ginkgo.no-color"]
    real = [name for name, want in expected.items() if on_real_node(want)]
    if real_node:
        return [*cmd, f"--ginkgo.focus={pattern(real)}"]
    skipped = [name for name, want in expected.items() if want.get("result") == "excluded"]
    return cmd + ([f"--ginkgo.skip={pattern(skipped + real)}"] if skipped + real else [])


def parse(report: dict[str, Any] | list[dict[str, Any]]) -> list[SpecResult]:
    """Every spec of Ginkgo's JSON report (run, skipped or filtered out), and the suite's
    setup when it failed (then no spec ran)."""
    suites = report if isinstance(report, list) else [report]
    results = []
    for suite in suites:
        for spec in suite.get("SpecReports") or []:
            node = spec.get("LeafNodeType")
            state = str(spec.get("State"))
            if node != "It" and state == "passed":
                continue
            name = " ".join([*(spec.get("ContainerHierarchyTexts") or []),
                             spec.get("LeafNodeText") or node])
            failure = (spec.get("Failure") or {}).get("Message") or ""
            results.append(SpecResult(name, state, (spec.get("RunTime") or 0) / 1e9,
                                      failure))
    return results


def run_suite(binary: Path, expected: dict[str, Any], env: dict[str, str],
              work: Path, real_node: bool = False) -> tuple[list[SpecResult], str]:
    report, log = work / "report.json", work / "e2e.log"
    print(f"== {WRAPPER} (label filter {LABEL_FILTER!r}"
          f"{', on the real node' if real_node else ''}; log: {log})", flush=True)
    with log.open("w") as fh:
        try:
            subprocess.run(command(binary, expected, report, real_node), env=env, cwd=work,
                           stdout=fh,
                           stderr=subprocess.STDOUT, check=False, timeout=SUITE_TIMEOUT + 60)
        except subprocess.TimeoutExpired:
            return [], f"the suite did not end within {SUITE_TIMEOUT + 60} s; log: {log}"
    if not report.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        return [], f"no report written; log: {log}\n{tail}"
    return parse(json.loads(report.read_text())), ""


# ------------------------------------------------------------------ the verdict


def compare(results: list[SpecResult], expected: dict[str, Any]) -> list[str]:
    """What differs from the expected file, one line each."""
    wanted = {"pass": "passed", "fail": "failed", "excluded": "skipped"}
    seen = {r.name for r in results}
    out = []
    for r in results:
        want = (expected.get(r.name) or {}).get("result")
        if want is None:
            out.append(f"{r.name}: {r.state}, not in {EXPECTED.name}")
        elif wanted.get(want) != r.state:
            out.append(f"{r.name}: {r.state}, expected {want}")
    out += [f"{name}: not in the suite any more" for name in expected if name not in seen]
    return out


def report(results: list[SpecResult], expected: dict[str, Any], error: str,
           seconds: float, work: Path) -> int:
    print(f"\ncodeflare's AppWrapper e2e suite against the dispatcher ({seconds:.0f} s; "
          f"logs: {work})")
    for r in results:
        verdict = "excluded" if r.state == "skipped" else r.state
        print(f"  {r.name[:100]:100} {verdict:9} {r.seconds:6.1f} s")
        if r.failure:
            print("      " + r.failure.strip().splitlines()[0][:200])
    ran = [r for r in results if r.state != "skipped"]
    passed = [r for r in ran if r.state == "passed"]
    print(f"{len(passed)}/{len(ran)} selected specs passed, "
          f"{len(results) - len(ran)} excluded")
    surprises = (compare(results, expected) if results else []) + ([error] if error else [])
    if surprises:
        print(f"\n{len(surprises)} difference(s) from tests/conformance/{EXPECTED.name}:")
        for line in surprises:
            print(f"  {line}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.conformance.appwrapper_e2e",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep-cluster", action="store_true",
                    default=os.environ.get("DISPATCHER_KEEP_CLUSTER") == "1",
                    help="leave the local cluster running (also DISPATCHER_KEEP_CLUSTER=1)")
    args = ap.parse_args(argv)
    why = missing(APPWRAPPER_V1BETA2, "codeflare's AppWrapper v1beta2 files",
                  "APPWRAPPER_V1BETA2")
    if why is not None:
        print(f"AppWrapper e2e suite {'FAILED' if in_ci() else 'skipped'}: {why}")
        return 1 if in_ci() else 0
    expected = yaml.safe_load(EXPECTED.read_text()) or {}
    binary = build.binary(WRAPPER, "e2e.test")
    work = out_dir()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t0 = time.monotonic()
    results, error = one_pass(Cluster(), binary, expected, work, args.keep_cluster)
    real = [name for name, want in expected.items() if on_real_node(want)]
    if real:
        real_results, real_error = real_node_pass(binary, expected, work / "real-node",
                                                  args.keep_cluster)
        results = merge(results, real_results)
        error = error or real_error
        if not real_results and not real_error:
            expected = {n: {**w, "result": "excluded"} if n in real else w
                        for n, w in expected.items()}
    return report(results, expected, error, time.monotonic() - t0, work)


def one_pass(cluster: Cluster, binary: Path, expected: dict[str, Any], work: Path,
             keep: bool, real_node: bool = False) -> tuple[list[SpecResult], str]:
    """The suite on `cluster` (started if need be, and then stopped unless `keep`)."""
    work.mkdir(parents=True, exist_ok=True)
    was_running = cluster.is_running(real_node or None)
    cluster.up(real_node=real_node)
    kubectl = cluster.kubectl()
    dispatcher = DispatcherProcess(cluster.kubeconfig, work)
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
           "PATH": f"{build.installed('kubernetes')}{os.pathsep}{os.environ.get('PATH', '')}"}
    try:
        install(kubectl, dispatcher, free_port())
        with node.alone(kubectl) if real_node else contextlib.nullcontext():
            return run_suite(binary, expected, env, work, real_node)
    finally:
        try:
            uninstall(kubectl, dispatcher)
        finally:
            if not was_running and not keep:
                cluster.down()


def real_node_pass(binary: Path, expected: dict[str, Any], work: Path, keep: bool
                   ) -> tuple[list[SpecResult], str]:
    """The specs that need containers to run, on a real node; none where it cannot run."""
    problems = node.missing()
    if problems:
        why = "the specs that need a real node: " + "; ".join(problems)
        print(f"{'FAILED' if in_ci() else 'skipped'}: {why}")
        return [], why if in_ci() else ""
    try:
        return one_pass(Cluster(REAL_CLUSTER), binary, expected, work, keep, real_node=True)
    except (ClusterError, NodeError, TimeoutError) as e:
        return [], f"the real node's pass did not run: {e}"


def merge(results: list[SpecResult], real: list[SpecResult]) -> list[SpecResult]:
    """The first pass's results, with those of the specs the real node's pass ran."""
    ran = {r.name: r for r in real if r.state != "skipped"}
    return [ran.get(r.name, r) for r in results]


if __name__ == "__main__":
    sys.exit(main())
