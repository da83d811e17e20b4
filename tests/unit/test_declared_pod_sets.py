"""v1beta2 pod sets: declared or inferred, checked as codeflare's webhook does, and
podSetInfos applied to what is counted and created."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from dispatcher.admission import queued_from_appwrapper
from dispatcher.api.conversion import to_v1beta1
from dispatcher.api.models import parse_appwrapper
from dispatcher.controller.items.shaping import gate_pods, pod_paths, prepared_items
from dispatcher.resources import PODS
from tests.shared_files import APPWRAPPER_V1BETA2, require

V2 = "workload.codeflare.dev/v1beta2"


def pod_spec(cpu: str = "1") -> dict[str, Any]:
    return {"containers": [{"name": "c", "image": "busybox",
                            "resources": {"requests": {"cpu": cpu}}}]}


def job(name: str = "job", parallelism: int = 2) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": parallelism, "completions": parallelism,
                     "template": {"spec": pod_spec()}}}


def lws() -> dict[str, Any]:
    return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "lws"},
            "spec": {"replicas": 2, "leaderWorkerTemplate": {
                "size": 3, "leaderTemplate": {"spec": pod_spec("100m")},
                "workerTemplate": {"spec": pod_spec("200m")}}}}


def wrapper(*components: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": V2, "kind": "AppWrapper",
            "metadata": {"name": "aw", "namespace": "team", "uid": "u1"},
            "spec": {"components": list(components)}}


def queued(obj: dict[str, Any]) -> Any:
    return queued_from_appwrapper(parse_appwrapper(to_v1beta1(obj)), 0.0)


def counts(obj: dict[str, Any]) -> list[tuple[int, int, int]]:
    q = queued(obj)
    assert q.invalid is None, q.invalid
    return [(g.item, g.pod_set.count, g.pod_set.request["cpu"]) for g in q.gang]


def test_a_known_kind_without_pod_sets_has_them_inferred() -> None:
    assert counts(wrapper({"template": job(parallelism=3)})) == [(0, 3, 1000)]


def test_declared_pod_sets_of_an_unknown_kind_are_counted_from_their_templates() -> None:
    component = {"template": lws(), "podSets": [
        {"path": "template.spec.leaderWorkerTemplate.leaderTemplate", "replicas": 2},
        {"path": "template.spec.leaderWorkerTemplate.workerTemplate", "replicas": 4}]}
    assert counts(wrapper(component)) == [(0, 2, 100), (0, 4, 200)]


def test_declared_pod_sets_that_disagree_with_a_known_kind_are_refused() -> None:
    component = {"template": job(parallelism=2),
                 "podSets": [{"path": "template.spec.template", "replicas": 5}]}
    assert queued(wrapper(component)).invalid == (
        "spec.components[0].podSets[0].replicas: is 5, but Job will create 2 pods from "
        "template.spec.template: correct replicas, or remove podSets to let them be counted")


def pytorch_job() -> dict[str, Any]:
    gpu = {"containers": [{"name": "c", "image": "busybox",
                           "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "pt"},
            "spec": {"pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": {"spec": gpu}},
                "Worker": {"replicas": 1, "template": {"spec": gpu}}}}}


def test_declaring_fewer_pod_sets_than_a_known_kind_has_is_refused() -> None:
    # The Worker left out would run outside the room and quota the Master was admitted
    # with (codeflare's webhook refuses it too).
    component = {"template": pytorch_job(), "podSets": [
        {"path": "template.spec.pytorchReplicaSpecs.Master.template", "replicas": 1}]}
    assert queued(wrapper(component)).invalid == (
        "spec.components[0].podSets: declares 1 pod set, but PyTorchJob has 2 pod templates "
        "(template.spec.pytorchReplicaSpecs.Master.template, "
        "template.spec.pytorchReplicaSpecs.Worker.template): declare one pod set for each, "
        "or remove podSets to let them be counted")


def test_declaring_every_pod_set_of_a_known_kind_is_accepted() -> None:
    component = {"template": pytorch_job(), "podSets": [
        {"path": f"template.spec.pytorchReplicaSpecs.{r}.template", "replicas": 1}
        for r in ("Master", "Worker")]}
    q = queued(wrapper(component))
    assert q.invalid is None
    assert [g.pod_set.request["nvidia.com/gpu"] for g in q.gang] == [2, 2]


@pytest.mark.parametrize(("path", "why"), [
    ("template.spec.nothing", "'template.spec.nothing' is not in the component's template"),
    ("template.spec", "'template.spec' is not a pod template"),
    ("spec.template", "'spec.template' must start with template"),
    ("template..spec", "is not a path such as template.spec.template"),
])
def test_a_path_that_is_not_a_pod_template_is_refused(path: str, why: str) -> None:
    component = {"template": lws(), "podSets": [{"path": path}]}
    invalid = queued(wrapper(component)).invalid
    assert invalid is not None
    assert invalid.startswith("spec.components[0].podSets[0].path: ")
    assert why in invalid


def test_a_wrapper_whose_components_make_no_pods_is_refused() -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}}
    invalid = queued(wrapper({"template": service})).invalid
    assert invalid is not None and invalid.startswith("spec.components: no component creates pods")


def test_more_than_eight_pod_sets_are_refused() -> None:
    invalid = queued(wrapper(*[{"template": job(f"j{i}")} for i in range(9)])).invalid
    assert invalid is not None and "9 pod sets, more than the 8" in invalid


def test_an_unknown_kind_beside_a_job_makes_no_pods() -> None:
    config = {"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {"name": "t"}}
    assert counts(wrapper({"template": job()}, {"template": config})) == [(0, 2, 1000)]


def test_the_same_checks_apply_to_mcad_wrappers_unchanged() -> None:
    mcad = {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
            "metadata": {"name": "aw"}, "spec": {"resources": {"GenericItems": [
                {"generictemplate": {"apiVersion": "example.com/v1", "kind": "Thing",
                                     "metadata": {"name": "t"}}}]}}}
    invalid = queued_from_appwrapper(parse_appwrapper(mcad), 0.0).invalid
    assert invalid is not None and "custompodresources" in invalid


def infos_wrapper() -> dict[str, Any]:
    return wrapper({"template": lws(), "podSets": [
        {"path": "template.spec.leaderWorkerTemplate.leaderTemplate", "replicas": 2},
        {"path": "template.spec.leaderWorkerTemplate.workerTemplate", "replicas": 4}],
        "podSetInfos": [{}, {"nodeSelector": {"pool": "b"}, "labels": {"team": "x"},
                             "tolerations": [{"key": "gpu", "operator": "Exists"}],
                             "schedulingGates": [{"name": "example.com/wait"}]}]})


def test_pod_set_infos_decide_where_the_pods_may_run() -> None:
    q = queued(infos_wrapper())
    assert q.invalid is None
    leader, worker = (g.pod_set for g in q.gang)
    assert leader.constraints.node_selector == ()
    assert worker.constraints.node_selector == (("pool", "b"),)
    assert [t.key for t in worker.constraints.tolerations] == ["gpu"]


def test_pod_set_infos_and_the_gang_label_are_on_the_created_templates() -> None:
    aw = parse_appwrapper(to_v1beta1(infos_wrapper()))
    (obj,) = prepared_items(aw)
    lwt = obj["spec"]["leaderWorkerTemplate"]
    assert lwt["leaderTemplate"]["metadata"]["labels"]["workload.codeflare.dev/appwrapper"] == "aw"
    worker = lwt["workerTemplate"]
    assert worker["metadata"]["labels"]["team"] == "x"
    assert worker["metadata"]["labels"]["workload.codeflare.dev/appwrapper"] == "aw"
    assert worker["spec"]["nodeSelector"] == {"pool": "b"}
    assert worker["spec"]["schedulingGates"] == [{"name": "example.com/wait"}]
    gate_pods(obj, pod_paths(aw, 0, obj))
    assert [g["name"] for g in worker["spec"]["schedulingGates"]] == [
        "example.com/wait", "dispatcher.codeflare.dev/placement"]
    assert [g["name"] for g in lwt["leaderTemplate"]["spec"]["schedulingGates"]] == [
        "dispatcher.codeflare.dev/placement"]


def test_more_pod_set_infos_than_pod_sets_are_refused() -> None:
    invalid = queued(wrapper({"template": job(), "podSetInfos": [{}, {}]})).invalid
    assert invalid == ("spec.components[0].podSetInfos: 2 entries for 1 pod sets: one entry "
                       "per pod set, in their order")


SAMPLE_PODS = {
    "wrapped-job.yaml": 1, "wrapped-gpu-job.yaml": 1, "wrapped-pod.yaml": 1,
    "wrapped-failing-pod.yaml": 1, "wrapped-failing-job.yaml": 1,
    "wrapped-deployment.yaml": 2, "wrapped-jobset.yaml": 5, "wrapped-pytorch-job.yaml": 3,
    "wrapped-failing-pytorch-job.yaml": 2, "wrapped-leader-worker-set.yaml": 5,
}


@pytest.mark.parametrize("sample", sorted(SAMPLE_PODS))
def test_every_codeflare_sample_is_a_valid_gang(sample: str) -> None:
    path = APPWRAPPER_V1BETA2 / "samples" / sample
    require(path, "codeflare's AppWrapper v1beta2 samples", "APPWRAPPER_V1BETA2")
    q = queued(yaml.safe_load(path.read_text()))
    assert q.invalid is None
    assert sum(g.pod_set.count for g in q.gang) == SAMPLE_PODS[sample]
    assert all(g.pod_set.request[PODS] == 1 for g in q.gang)


def test_declaring_one_pod_set_twice_to_leave_another_out_is_refused() -> None:
    # As many pod sets as PyTorchJob has templates, the CPU-only Master twice: the eight
    # 2-GPU Workers would run outside the room and quota two CPU pods were admitted with.
    pt = pytorch_job()
    pt["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"] = pod_spec()
    pt["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 8
    master = "template.spec.pytorchReplicaSpecs.Master.template"
    component = {"template": pt, "podSets": [{"path": master, "replicas": 1},
                                             {"path": master, "replicas": 1}]}
    assert queued(wrapper(component)).invalid == (
        "spec.components[0].podSets[1].path: template.spec.pytorchReplicaSpecs.Master."
        "template is declared already (podSets[0]); declare each of PyTorchJob's pod "
        "templates once: template.spec.pytorchReplicaSpecs.Master.template, "
        "template.spec.pytorchReplicaSpecs.Worker.template")
