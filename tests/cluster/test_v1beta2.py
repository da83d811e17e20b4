"""AppWrapper v1beta2 beside v1beta1 on the local cluster: the CRD of deploy/v1beta2, its
conversion webhook served by `dispatcher run --webhook-port`, teams of both versions in one
quota tree, and codeflare's samples run as they are.

The local cluster has no pod network, so the CRD's conversion webhook (like the admission
webhook, tests/cluster/webhook_process.py) calls the process on loopback by URL, with the
CA of the Secret it made: what the dispatcher patches in for itself when the CRD names its
Service. Default profile: 4 nodes x 8 GPUs, 64 CPUs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from localcluster import Cluster, Kubectl, users, wait_for

from ..shared_files import APPWRAPPER_V1BETA2, require
from .dispatcher_process import (
    QUOTA_CRD,
    REPO,
    DispatcherProcess,
    forget_discovery,
    install_crd,
    wait_quiet,
)
from .test_controller import LABEL, appwrapper, job, pods_of
from .test_sharing import subtree
from .webhook_process import SECRET, free_port, register_url_webhooks, unregister_webhooks

SYSTEM = "dispatcher-v1beta2"  # the webhook's Secret
CRD_NAME = "appwrappers.workload.codeflare.dev"
V1BETA1 = "appwrappers.v1beta1.workload.codeflare.dev"
V1BETA2 = "appwrappers.v1beta2.workload.codeflare.dev"
# Installation defaults for wrappers that set no annotation, and the most any annotation
# may ask for: seconds, so the samples' 10 s graces and pauses take 3 s here. A
# LeaderWorkerSet (a kind the dispatcher does not know: it counts the pods its pod sets
# declare) is allowed, as codeflare's sample needs.
CONFIG = {"faultTolerance": {"failureGracePeriod": "2s", "retryPausePeriod": "2s",
                             "gracePeriodMaximum": "3s"},
          "allowedKinds": {"add": ["LeaderWorkerSet.leaderworkerset.x-k8s.io"]}}


@pytest.fixture(scope="module")
def v1beta2_served(local_cluster: Cluster, kubectl: Kubectl,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[DispatcherProcess]:
    """`dispatcher run` serving both webhooks, the AppWrapper CRD with v1beta2 and its
    conversion webhook calling it; v1beta1 only again afterwards."""
    install_crd(kubectl)
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(QUOTA_CRD))
    kubectl("wait", "--for=condition=Established", "--timeout=60s",
            "crd/quotasubtrees.quota.codeflare.dev")
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM}})
    config = tmp_path_factory.mktemp("v1beta2") / "config.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    port = free_port()
    register_url_webhooks(kubectl, port)
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs / "v1beta2")
    try:
        wait_quiet(kubectl)
        d.start("priority-preemption", extra_args=[
            "--webhook-port", str(port), "--webhook-host", "127.0.0.1",
            "--webhook-cert-host", "127.0.0.1", "--namespace", SYSTEM,
            "--config", str(config)])
        ca = wait_for(lambda: _ca(kubectl), 60, f"the webhook's Secret {SYSTEM}/{SECRET}")
        kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                input=yaml.safe_dump_all(v1beta2_crds(kubectl, port, ca)))
        kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{CRD_NAME}")
        forget_discovery()
        wait_for(lambda: _converts(kubectl), 60,
                 f"kube-apiserver to convert a v1beta2 AppWrapper; log: {d.log_path}")
        yield d
        # The tests' namespaces are emptied while v1beta2 is still served: dropping it
        # mid-way can make the namespace controller miss AppWrappers (left in no namespace).
        wait_quiet(kubectl)
        d.finish()
    finally:
        d.stop()
        unregister_webhooks(kubectl)
        install_crd(kubectl)  # server-side apply of crds/ drops v1beta2 and the conversion
        kubectl("delete", "namespace", SYSTEM, "--wait=false", "--ignore-not-found")


def v1beta2_crds(kubectl: Kubectl, port: int, ca: str) -> list[dict[str, Any]]:
    """deploy/v1beta2, its conversion webhook calling https://127.0.0.1:PORT with ``ca``."""
    docs = [d for d in yaml.safe_load_all(kubectl("kustomize", str(REPO / "deploy/v1beta2")))
            if d]
    crd = next(d for d in docs if d["metadata"]["name"] == CRD_NAME)
    hook = crd["spec"]["conversion"]["webhook"]
    hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}"
                                   f"{hook['clientConfig']['service']['path']}",
                            "caBundle": ca}
    return docs


def _ca(kubectl: Kubectl) -> str | None:
    proc = kubectl.run("get", "secret", SECRET, "-n", SYSTEM, "-o",
                       "jsonpath={.data.ca\\.crt}", check=False)
    return proc.stdout.strip() or None


def _converts(kubectl: Kubectl) -> bool:
    """A v1beta2 create is stored as v1beta1: the API server must call the webhook."""
    probe = v1beta2("conversion-probe", job("probe", 1, 0))
    probe["metadata"]["namespace"] = "default"
    return kubectl.run("create", "--dry-run=server", "-f", "-", check=False,
                       input=yaml.safe_dump(probe)).returncode == 0


# --- builders and readers ----------------------------------------------------------------

def v1beta2(name: str, template: dict[str, Any], labels: dict[str, str] | None = None
            ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "workload.codeflare.dev/v1beta2", "kind": "AppWrapper",
            "metadata": meta, "spec": {"components": [{"template": template}]}}


def of_team(wrapper: dict[str, Any], team: str) -> dict[str, Any]:
    wrapper["metadata"].setdefault("labels", {})["quota_gpu"] = team
    return wrapper


def as_v2(k: Kubectl, name: str) -> dict[str, Any]:
    """What `kubectl get appwrappers.v1beta2.workload.codeflare.dev NAME` shows."""
    obj: dict[str, Any] = k.json(V1BETA2, name)
    assert obj["apiVersion"] == "workload.codeflare.dev/v1beta2"
    return obj


def as_v1(k: Kubectl, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = k.json(V1BETA1, name)
    assert obj["apiVersion"] == "workload.codeflare.dev/v1beta1"
    return obj


def v2_conditions(obj: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions") or []}


def wait_phase(k: Kubectl, name: str, phase: str, timeout: float = 90) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = as_v2(k, name)
        return obj if obj.get("status", {}).get("phase") == phase else None

    try:
        return wait_for(check, timeout, f"AppWrapper {name} to reach phase {phase}")
    except TimeoutError as e:
        raise TimeoutError(f"{e}; v1beta2 status now: {as_v2(k, name).get('status')}"
                           ) from None


RUNNING = {"QuotaReserved": "True", "ResourcesDeployed": "True", "PodsReady": "True",
           "Unhealthy": "False"}


def wait_condition(k: Kubectl, name: str, ctype: str, timeout: float = 120) -> None:
    """Until the latest v1beta1 condition is ``ctype``. (Read naming v1beta1: with both
    versions served, plain `appwrapper` is v1beta2.)"""
    def check() -> bool:
        found = as_v1(k, name).get("status", {}).get("conditions") or [{}]
        return bool(found[-1].get("type") == ctype)

    wait_for(check, timeout, f"AppWrapper {name} to reach {ctype}")


def preempted(k: Kubectl, name: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        found = as_v1(k, name).get("status", {}).get("conditions") or []
        return next((c for c in found if c.get("reason") == "Preempted"), None)

    return wait_for(check, 60, f"{name} to be preempted")


# --- two teams, two versions, one quota tree ---------------------------------------------

def test_teams_of_both_versions_share_a_quota_tree_and_preempt_each_other(
        v1beta2_served: DispatcherProcess, k: Kubectl) -> None:
    """gold writes v1beta2, bronze v1beta1; each is guaranteed 16 of the 32 GPUs and may
    borrow the other's idle share. A v1beta2 wrapper reclaims what a v1beta1 one borrows; a
    v1beta1 wrapper of higher priority preempts a v1beta2 one of its own team. Each shows
    in both versions."""
    k.apply(subtree("gpus", [{"name": "all", "quotas": {"requests": {"nvidia.com/gpu": 32}}}]))
    k.apply(subtree("teams", [
        {"name": "gold", "quotas": {"requests": {"nvidia.com/gpu": 16}}},
        {"name": "bronze", "quotas": {"requests": {"nvidia.com/gpu": 16}}}], parent="all"))
    try:
        # bronze takes every GPU: 16 of its own, 16 borrowed from gold's idle share.
        k.apply(of_team(appwrapper("bronze-big", job("bronze-big", 4, 8)), "bronze"))
        wait_condition(k, "bronze-big", "Running")
        seen = as_v2(k, "bronze-big")  # an MCAD wrapper, in v1beta2 terms
        assert seen["status"]["phase"] == "Running"
        assert v2_conditions(seen) == RUNNING
        assert seen["spec"]["components"][0]["template"]["kind"] == "Job"
        assert [c["kind"] for c in seen["status"]["componentStatus"]] == ["Job"]

        # gold, within its quota, takes back what bronze borrows: the whole gang goes.
        k.apply(of_team(v1beta2("gold-v2", job("gold-v2", 2, 8)), "gold"))
        reclaim = preempted(k, "bronze-big")
        assert "to reclaim the quota it borrows" in reclaim["message"]
        assert f"{k.namespace}/gold-v2" in reclaim["message"]
        wait_condition(k, "gold-v2", "Running")  # its pods up: PodsReady
        gold = wait_phase(k, "gold-v2", "Running")
        assert v2_conditions(gold) == RUNNING
        assert len(pods_of(k, "gold-v2")) == 2
        assert as_v1(k, "gold-v2")["status"]["state"] == "Running"
        # bronze, over its quota now, waits, suspended; none of its pods is left.
        waiting = wait_phase(k, "bronze-big", "Suspended")
        assert v2_conditions(waiting)["QuotaReserved"] == "False"
        assert as_v1(k, "bronze-big")["status"]["state"] == "Pending"
        wait_for(lambda: not pods_of(k, "bronze-big"), 60, "bronze-big's pods to go")
        k("delete", V1BETA1, "bronze-big")

        # bronze runs within its own quota: 32 of 32 GPUs taken.
        k.apply(of_team(appwrapper("bronze-own", job("bronze-own", 2, 8)), "bronze"))
        wait_condition(k, "bronze-own", "Running")
        kept = {p["metadata"]["uid"] for p in pods_of(k, "bronze-own")}
        # A v1beta1 wrapper of gold with a higher priority (v1beta2 has none: 0) preempts
        # gold's v1beta2 one; bronze's, within its quota, is not touched.
        k.apply(of_team(appwrapper("gold-urgent", job("gold-urgent", 2, 8), priority=10),
                        "gold"))
        by_priority = preempted(k, "gold-v2")
        assert f"preempted by {k.namespace}/gold-urgent" in by_priority["message"]
        wait_condition(k, "gold-urgent", "Running")
        assert v2_conditions(as_v2(k, "gold-urgent")) == RUNNING
        suspended = wait_phase(k, "gold-v2", "Suspended")
        assert v2_conditions(suspended)["QuotaReserved"] == "False"
        assert as_v1(k, "gold-v2")["status"]["state"] == "Pending"
        wait_for(lambda: not pods_of(k, "gold-v2"), 60, "gold-v2's pods to go")
        assert {p["metadata"]["uid"] for p in pods_of(k, "bronze-own")} == kept
        # Written as v1beta2, it still reads as it was written.
        assert as_v2(k, "gold-v2")["spec"]["components"][0]["template"]["metadata"][
            "name"] == "gold-v2"
    finally:
        k("delete", "quotasubtrees", "--all", "--wait=false")


# --- progress guarantee -------------------------------------------------------------------

FT = "workload.codeflare.dev.appwrapper/"


def test_pods_that_never_terminate_are_deleted_at_once_after_the_forceful_deletion_grace(
        v1beta2_served: DispatcherProcess, k: Kubectl) -> None:
    """A pod whose node never confirms its deletion (kwok: `dispatcher.local/on-delete:
    hang`) stays Terminating when the reset deletes its Job; the forceful-deletion grace
    later the dispatcher deletes it with gracePeriodSeconds 0 (a Warning Event names it),
    and the wrapper goes on: created again, then Failed at its retry limit, no pod left."""
    stuck = job("stuck", 1, 1, "pending")  # bound, never Running: past its warmup grace
    stuck["spec"]["template"]["metadata"]["annotations"]["dispatcher.local/on-delete"] = "hang"
    wrapper = v1beta2("stuck", stuck)
    wrapper["metadata"]["annotations"] = {
        FT + "warmupGracePeriodDuration": "2s", FT + "retryLimit": "1",
        FT + "forcefulDeletionGracePeriodDuration": "3s"}
    k.apply(wrapper)
    try:
        first = wait_for(lambda: pods_of(k, "stuck") or None, 60, "the pod of stuck")[0]
        name, uid = first["metadata"]["name"], first["metadata"]["uid"]

        def terminating() -> bool:
            pod = k.run("get", "pod", name, "-o", "json", check=False)
            return pod.returncode == 0 and "deletionTimestamp" in pod.stdout

        wait_for(terminating, 60, f"the reset to delete the Job, leaving {name} Terminating")
        wait_for(lambda: uid not in {p["metadata"]["uid"] for p in pods_of(k, "stuck")}, 60,
                 f"{name} to be deleted at once after the forceful-deletion grace")
        failed = wait_phase(k, "stuck", "Failed", timeout=120)
        assert failed["status"]["resettingCount"] == 1
        wait_for(lambda: not pods_of(k, "stuck"), 60, "the pods of the failed wrapper to go")
        told = k.items("events", "--field-selector",
                       "involvedObject.name=stuck,reason=ForcefulDeletion")
        # One for the reset's deletion (naming the first pod), one for the failure's.
        assert any(name in e["message"] for e in told), told
        assert {e["type"] for e in told} == {"Warning"}
    finally:
        # Without the forceful deletion its pods would stay for ever, and every later
        # test would wait for them.
        k("delete", "pods", "-l", f"{LABEL}=stuck", "--force", "--grace-period=0",
          "--ignore-not-found")


# --- codeflare's samples -----------------------------------------------------------------

SAMPLES = APPWRAPPER_V1BETA2 / "samples"
# sample -> (its end here, resets before it). Pods on the fake nodes run their `sleep N`
# (then `exit M`) for N seconds; any other command runs forever.
ENDS: dict[str, tuple[str, int]] = {
    "wrapped-deployment.yaml": ("Running", 0),     # a Deployment runs until deleted
    "wrapped-job.yaml": ("Running", 0),            # `sleep 600`: Succeeded 10 min later
    "wrapped-gpu-job.yaml": ("Running", 0),        # the same, on 4 GPUs
    "wrapped-pod.yaml": ("Running", 0),            # `sleep 600` after its init container
    "wrapped-jobset.yaml": ("Succeeded", 0),       # 5 pods `sleep 100`
    # 2 groups of a leader and 2 workers (nginx: they run until deleted).
    "wrapped-leader-worker-set.yaml": ("Running", 0),
    "wrapped-failing-job.yaml": ("Failed", 3),     # `sleep 15; exit 1`, retryLimit 3
    "wrapped-failing-pod.yaml": ("Failed", 1),     # `sleep 5; exit 1`, retryLimit 1
    # The Worker's command `sleep 10; exit 1` fails; the default retryLimit is 3.
    "wrapped-failing-pytorch-job.yaml": ("Failed", 3),
}
EXCLUDED = {
    # Its end, Succeeded, is the real image training MNIST for an epoch; here python3 runs
    # forever.
    "wrapped-pytorch-job.yaml": "needs its real image (mnist.py) to succeed",
}


def test_every_sample_is_run_or_excluded_with_a_reason() -> None:
    require(SAMPLES, "codeflare's AppWrapper v1beta2 samples", "APPWRAPPER_V1BETA2")
    assert sorted(p.name for p in SAMPLES.glob("*.yaml")) == sorted({**ENDS, **EXCLUDED})


def test_codeflares_samples_run_to_their_end(v1beta2_served: DispatcherProcess,
                                             k: Kubectl) -> None:
    """Applied as they are (the Kueue label, no namespace); the failing ones reset
    retryLimit times, then are Failed."""
    require(SAMPLES, "codeflare's AppWrapper v1beta2 samples", "APPWRAPPER_V1BETA2")
    names = {}
    for sample in ENDS:
        text = (SAMPLES / sample).read_text()
        names[sample] = yaml.safe_load(text)["metadata"]["name"]
        k("apply", "-f", "-", input=text)
    for sample, (end, resets) in ENDS.items():
        name = names[sample]
        done = wait_phase(k, name, end, timeout=300)
        assert done["status"]["resettingCount"] == resets, name
        if end == "Running":
            # Running once its objects are created (as codeflare's); PodsReady once its
            # pods run.
            wait_for(lambda n=name: v2_conditions(as_v2(k, n)) == RUNNING, 60,
                     f"{name}'s pods to be ready")
            assert pods_of(k, name), name
        if end == "Failed":
            v1 = as_v1(k, name)
            assert v1["status"]["state"] == "Failed", name
            assert any(c.get("reason") == "RetryLimitReached"
                       for c in v1["status"]["conditions"]), (name, v1["status"])
    assert as_v2(k, "sample-gpu-job")["metadata"]["labels"] == {
        "kueue.x-k8s.io/queue-name": "default-queue"}



# --- a hostile tenant and the v1beta2 reads of everyone ----------------------------------------

APPWRAPPERS = "appwrappers.workload.codeflare.dev"
V1BETA2_FIELDS = "workload.codeflare.dev/v1beta2"
UNCONVERTED = "workload.codeflare.dev/unconverted"


def _alice(kubectl: Kubectl, namespace: str, as_user: Callable[[str], Kubectl]) -> Kubectl:
    users.grant(kubectl, "alice", namespace, [APPWRAPPERS, "jobs.batch"])
    alice = as_user("alice").in_namespace(namespace)
    wait_for(lambda: alice.run("auth", "can-i", "create", "jobs.batch").stdout.strip() == "yes",
             30, "alice's grants to take effect")
    return alice


@contextlib.contextmanager
def validation_skipping(kubectl: Kubectl, namespace: str) -> Iterator[None]:
    """The validating webhook skips `namespace` meanwhile: as on an install whose webhook
    was not there when these wrappers were stored."""
    name = "validatingwebhookconfiguration/dispatcher-appwrappers"
    hooks = kubectl.json(name)["webhooks"]
    skip = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                  "values": [namespace]}]}
    kubectl("patch", name, "--type=json", "-p", json.dumps([
        {"op": "add", "path": f"/webhooks/{i}/namespaceSelector", "value": skip}
        for i in range(len(hooks))]))
    try:
        yield
    finally:
        kubectl("patch", name, "--type=json", "-p", json.dumps([
            {"op": "replace", "path": f"/webhooks/{i}/namespaceSelector", "value": {}}
            for i in range(len(hooks))]))


def test_one_tenants_wrapper_never_breaks_v1beta2_reads_for_everyone(
        v1beta2_served: DispatcherProcess, kubectl: Kubectl, k: Kubectl, namespace: str,
        as_user: Callable[[str], Kubectl]) -> None:
    """Alice, with her own credentials: an unreadable v1beta2 annotation and a flipped
    managedBy are refused. Wrappers stored unchecked (an unreadable annotation; a template
    nested 260 deep) are failed by the dispatcher, which goes on dispatching, and a v1beta2
    list of every namespace still answers, showing what it cannot convert as such."""
    alice = _alice(kubectl, namespace, as_user)
    alice.apply(appwrapper("fine", job("fine", 1, 0)))
    for text in ("{not json", json.dumps({"managedBy": "kueue.x-k8s.io/multikueue"})):
        proc = alice.run("annotate", "--overwrite", V1BETA1, "fine",
                         f"{V1BETA2_FIELDS}={text}", check=False)
        assert proc.returncode != 0, text
    alice.apply(v1beta2("v2", job("v2", 1, 0)))
    proc = alice.run("patch", V1BETA2, "v2", "--type=merge", "-p",
                     json.dumps({"spec": {"managedBy": "kueue.x-k8s.io/multikueue"}}),
                     check=False)
    assert proc.returncode != 0 and "spec.managedBy cannot change" in proc.stderr
    mangled = appwrapper("mangled", job("mangled", 1, 0))
    mangled["metadata"]["annotations"] = {V1BETA2_FIELDS: "{not json"}
    deep = job("deep", 1, 0)
    value: dict[str, Any] = {}
    for _ in range(260):
        value = {"x": value}
    deep["spec"]["template"]["spec"]["containers"][0]["x"] = value
    with validation_skipping(kubectl, namespace):
        k("create", "-f", "-", input=json.dumps(mangled))
        k("create", "-f", "-", input=json.dumps(appwrapper("deep", deep)))
    wait_condition(k, "deep", "Failed")
    assert "nests more than 100 levels deep" in \
        as_v1(k, "deep")["status"]["conditions"][-1]["message"]
    k.apply(appwrapper("after", job("after", 1, 1)))
    wait_condition(k, "after", "Running")
    listed = {o["metadata"]["name"]: o for o in kubectl.items(V1BETA2, "-A")
              if o["metadata"]["namespace"] == namespace}
    assert {"fine", "v2", "mangled", "deep", "after"} <= set(listed)
    assert "remove the annotation" in listed["mangled"]["metadata"]["annotations"][UNCONVERTED]
    assert listed["mangled"]["spec"] == {"components": []}
    assert listed["fine"]["spec"]["components"][0]["template"]["kind"] == "Job"
    assert {o["metadata"]["name"] for o in alice.items(V1BETA2)} >= {"fine", "mangled"}
