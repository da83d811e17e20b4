"""Every kind of the README's table, wrapped for real and run through its real operator.

For each kind an AppWrapper wraps a small object of that kind (1-GPU pods, a few of them);
the test checks what a user would: the operator creates exactly the pods the dispatcher
counted for the gang (its own pod-set inference, the same as `dispatcher plan`), the
AppWrapper is Running with all of them, then Completed when the pods succeed. A second
AppWrapper of the same kind, beside it, has one pod fail with exit code 1, a permanent
failure (the Kubeflow operators' `restartPolicy: ExitCode` retries 128 and above and fails
on 1-127; a Job with `backoffLimit: 0` fails at once), and must end Failed. Deleting the
AppWrappers removes what they created.

What a kind cannot report is said per kind:
- RayCluster, Deployment and StatefulSet never finish on their own: dispatch, pods,
  Running, teardown.
- RayJob: KubeRay learns that a job succeeded from the Ray dashboard of the head pod, and
  kwok's pods serve nothing, so a RayJob whose submitter pod succeeds stays RUNNING here:
  dispatch, the head, worker and submitter pods, Running, teardown. Its failure needs no
  dashboard: a submitter pod that fails (no retries) fails the RayJob, and the AppWrapper.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from dispatcher.kinds import infer_pod_sets
from localcluster import Cluster, Kubectl, wait_for
from localcluster.testing import container, outcome, phase

from .dispatcher_process import DispatcherProcess, install_crd, wait_quiet

LABEL = "workload.codeflare.dev/appwrapper"
# Long enough for the operator to create every pod of the gang before the first ends.
RUN_FOR = "4s"
SUCCEED = outcome("succeed", run_for=RUN_FOR)
FAIL = outcome("fail", run_for=RUN_FOR, exit_code=1)
RUN = outcome("run")

Annotations = dict[str, str]
T = TypeVar("T")


def template(name: str, annotations: Annotations, **spec: Any) -> dict[str, Any]:
    """A pod template of one 1-GPU container named ``name`` (operators read the exit code
    of the container with their framework's name: pytorch, tensorflow, mxnet...)."""
    return {"metadata": {"annotations": dict(annotations)},
            "spec": {"containers": [container(name=name, gpus=1)], **spec}}


# --- one builder per kind: (name, fail?) -> the object. Not fail: every pod succeeds after
# --- RUN_FOR. Fail: the pods of one replica type fail with exit code 1 after RUN_FOR, the
# --- others keep running, so only that failure can end it.

@dataclass(frozen=True)
class Kind:
    id: str
    build: Callable[[str, bool], dict[str, Any]]  # (name, fail?) -> object
    pods: int  # what its operator creates: the test's own count, beside the dispatcher's
    succeeds: bool = True  # its operator reports success here
    fails: bool = True  # and failure


def kubeflow(kind: str, key: str, container_name: str, replicas: dict[str, int],
             failing: str) -> Callable[[str, bool], dict[str, Any]]:
    def build(name: str, fail: bool) -> dict[str, Any]:
        specs = {}
        for role, n in replicas.items():
            ann = (FAIL if role == failing else RUN) if fail else SUCCEED
            specs[role] = {"replicas": n, "restartPolicy": "ExitCode",
                           "template": template(container_name, ann)}
        spec: dict[str, Any] = {key: specs}
        if kind == "MXJob":
            spec["jobMode"] = "MXTrain"
        return {"apiVersion": "kubeflow.org/v1", "kind": kind, "metadata": {"name": name},
                "spec": spec}
    return build


def mpijob(name: str, fail: bool) -> dict[str, Any]:
    # The launcher decides the MPIJob's end; workers run until it is over.
    launcher = FAIL if fail else SUCCEED
    return {"apiVersion": "kubeflow.org/v1", "kind": "MPIJob", "metadata": {"name": name},
            "spec": {"mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never",
                             "template": template("mpi", launcher)},
                "Worker": {"replicas": 1, "restartPolicy": "Never",
                           "template": template("mpi", RUN if fail else SUCCEED)}}}}


def job_spec(pods: int, fail: bool) -> dict[str, Any]:
    return {"parallelism": pods, "completions": pods, "backoffLimit": 0,
            "template": template("main", FAIL if fail else SUCCEED, restartPolicy="Never")}


def batch_job(name: str, fail: bool) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": job_spec(2, fail)}


def jobset(name: str, fail: bool) -> dict[str, Any]:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2,
                                         "template": {"spec": job_spec(1, fail)}}]}}


def pod(name: str, fail: bool) -> dict[str, Any]:
    obj = template("main", FAIL if fail else SUCCEED, restartPolicy="Never")
    obj["metadata"]["name"] = name
    return {"apiVersion": "v1", "kind": "Pod", **obj}


def replicated(kind: str) -> Callable[[str, bool], dict[str, Any]]:
    def build(name: str, fail: bool) -> dict[str, Any]:
        labels = {"app": name}
        t = template("main", RUN)
        t["metadata"]["labels"] = labels
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name},
                "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": t}}
    return build


def ray_cluster_spec() -> dict[str, Any]:
    def ray(role: str, gpus: int) -> dict[str, Any]:
        return {"metadata": {"annotations": dict(RUN)},
                "spec": {"containers": [container(name=role, image="rayproject/ray:2.9.0",
                                                  gpus=gpus)]}}
    return {"headGroupSpec": {"rayStartParams": {}, "template": ray("ray-head", 0)},
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": 1, "minReplicas": 1,
                                  "maxReplicas": 1, "rayStartParams": {},
                                  "template": ray("ray-worker", 1)}]}


def raycluster(name: str, fail: bool) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": name},
            "spec": ray_cluster_spec()}


def rayjob(name: str, fail: bool) -> dict[str, Any]:
    submitter = {"metadata": {"annotations": dict(FAIL if fail else SUCCEED)},
                 "spec": {"restartPolicy": "Never", "containers": [
                     container(name="ray-job-submitter", image="rayproject/ray:2.9.0")]}}
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": name},
            "spec": {"entrypoint": "python -c 'print(42)'", "shutdownAfterJobFinishes": False,
                     "rayClusterSpec": ray_cluster_spec(), "submitterPodTemplate": submitter,
                     "submitterConfig": {"backoffLimit": 0}}}


KINDS = [
    Kind("PyTorchJob", kubeflow("PyTorchJob", "pytorchReplicaSpecs", "pytorch",
                                {"Master": 1, "Worker": 1}, failing="Worker"), pods=2),
    Kind("TFJob", kubeflow("TFJob", "tfReplicaSpecs", "tensorflow",
                           {"Chief": 1, "Worker": 1}, failing="Worker"), pods=2),
    Kind("XGBoostJob", kubeflow("XGBoostJob", "xgbReplicaSpecs", "xgboost",
                                {"Master": 1, "Worker": 1}, failing="Worker"), pods=2),
    Kind("MXJob", kubeflow("MXJob", "mxReplicaSpecs", "mxnet",
                           {"Scheduler": 1, "Server": 1, "Worker": 1}, failing="Worker"),
         pods=3),
    Kind("JAXJob", kubeflow("JAXJob", "jaxReplicaSpecs", "jax", {"Worker": 2},
                            failing="Worker"), pods=2),
    Kind("PaddleJob", kubeflow("PaddleJob", "paddleReplicaSpecs", "paddle",
                               {"Master": 1, "Worker": 1}, failing="Worker"), pods=2),
    Kind("MPIJob", mpijob, pods=2),
    Kind("Job", batch_job, pods=2),
    Kind("JobSet", jobset, pods=2),
    Kind("Pod", pod, pods=1),
    Kind("Deployment", replicated("Deployment"), pods=2, succeeds=False, fails=False),
    Kind("StatefulSet", replicated("StatefulSet"), pods=2, succeeds=False, fails=False),
    Kind("RayCluster", raycluster, pods=2, succeeds=False, fails=False),
    Kind("RayJob", rayjob, pods=3, succeeds=False),  # no Ray dashboard: see the docstring
]


# --- the dispatcher and what a user sees ------------------------------------------------

@pytest.fixture(scope="module")
def dispatcher(local_cluster: Cluster, kubectl: Kubectl) -> Iterator[DispatcherProcess]:
    install_crd(kubectl)
    d = DispatcherProcess(local_cluster.kubeconfig, local_cluster.logs, "dispatcher-kinds")
    d.start("fifo")
    wait_quiet(kubectl)
    yield d
    d.finish()


def appwrapper(obj: dict[str, Any]) -> dict[str, Any]:
    name = obj["metadata"]["name"]
    return {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": name},
            "spec": {"resources": {"GenericItems": [{"generictemplate": obj}]}}}


def counted(obj: dict[str, Any]) -> int:
    """The pods the dispatcher counts for ``obj`` (its own inference)."""
    sets = infer_pod_sets(obj)
    assert sets is not None, f"the dispatcher does not know {obj['kind']}"
    return sum(s.count for s in sets)


def status(k: Kubectl, name: str) -> dict[str, Any]:
    got: dict[str, Any] = k.json("appwrapper", name).get("status") or {}
    return got


def pods_of(k: Kubectl, name: str) -> list[dict[str, Any]]:
    return k.items("pods", "-l", f"{LABEL}={name}")


def until(k: Kubectl, name: str, check: Callable[[], T | None], what: str,
          timeout: float = 90) -> T:
    """wait_for, and on timeout say what the AppWrapper and its pods look like."""
    try:
        return wait_for(check, timeout, what)
    except TimeoutError as e:
        pods = [(p["metadata"]["name"], phase(p)) for p in pods_of(k, name)]
        raise TimeoutError(f"{e}; pods now: {pods}; AppWrapper: {status(k, name)}") from None


def reached(k: Kubectl, name: str, ctype: str) -> dict[str, Any]:
    """The AppWrapper's status once it has had a condition ``ctype`` (it may be past it)."""
    def check() -> dict[str, Any] | None:
        s = status(k, name)
        return s if ctype in [c.get("type") for c in s.get("conditions") or []] else None

    return until(k, name, check, f"AppWrapper {name} to reach {ctype}")


def wait_gang(k: Kubectl, name: str, count: int) -> list[dict[str, Any]]:
    """Exactly ``count`` pods of the AppWrapper, all started (Running or already ended)."""
    def check() -> list[dict[str, Any]] | None:
        got = pods_of(k, name)
        started = all(phase(p) in ("Running", "Succeeded", "Failed") for p in got)
        return got if len(got) == count and started else None

    return until(k, name, check, f"{count} started pods of {name}")


@pytest.mark.parametrize("kind", KINDS, ids=[k.id for k in KINDS])
def test_wrapped_kind_runs_end_to_end(dispatcher: DispatcherProcess, kubectl: Kubectl,
                                      k: Kubectl, kind: Kind) -> None:
    ok = kind.build("ok", False)
    bad = kind.build("bad", True) if kind.fails else None
    assert counted(ok) == kind.pods, "the dispatcher counts another number of pods"
    for obj in (ok, bad):
        if obj is not None:
            k.apply(appwrapper(obj))

    pods = wait_gang(k, "ok", counted(ok))
    assert {p["metadata"]["name"] for p in pods_of(k, "ok")} == {
        p["metadata"]["name"] for p in pods}, "the operator created more pods than counted"
    reached(k, "ok", "Running")
    if bad is not None:
        wait_gang(k, "bad", counted(bad))

    if kind.succeeds:
        done = reached(k, "ok", "Completed")
        assert done["state"] == "Completed" and done["conditions"][-1]["reason"] == "PodsCompleted"
    else:
        now = status(k, "ok")
        assert now["state"] == "Running", now
        assert now["running"] + now["Succeeded"] == kind.pods, now
    if bad is not None:
        failed = reached(k, "bad", "Failed")
        assert failed["state"] == "Failed", failed
        assert failed["conditions"][-1]["reason"] == "WrappedObjectFailed", failed

    # Teardown: deleting the AppWrappers removes the objects they created and the pods.
    k("delete", "appwrappers", "--all", "--wait=false")
    plural = ok["kind"].lower() + "s"
    wait_for(lambda: not k.items(plural, "-l", LABEL) and not k.items("pods", "-l", LABEL),
             60, f"the {plural} and pods of the AppWrappers to be deleted")
    wait_quiet(kubectl)
