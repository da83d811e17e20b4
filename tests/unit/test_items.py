"""The objects the controller creates: MCAD's labels beside ours, only our owner, no
server-set fields."""

from __future__ import annotations

from typing import Any

from dispatcher.api import parse_appwrapper
from dispatcher.controller.items.shaping import prepared_items

OURS = "workload.codeflare.dev/appwrapper"
MCAD = "appwrapper.mcad.ibm.com"
RESOURCE = "resourceName"
HIJACK = {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
          "name": "someone-else", "uid": "victim-uid", "controller": True}


def container() -> dict[str, Any]:
    return {"containers": [{"name": "c", "image": "busybox"}]}


def prepare(*templates: dict[str, Any], name: str = "job-1") -> list[dict[str, Any]]:
    aw = parse_appwrapper({
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": name, "namespace": "team", "uid": "aw-uid"},
        "spec": {"resources": {"GenericItems": [{"generictemplate": t} for t in templates]}}})
    return prepared_items(aw)


DEPLOYMENT = {
    "apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "web", "labels": {"app": "web"}, "ownerReferences": [HIJACK],
                 "uid": "old-uid", "resourceVersion": "42", "generation": 3},
    "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
             "template": {"metadata": {"labels": {"app": "web"}}, "spec": container()}},
    "status": {"replicas": 5},
}

RAY = {
    "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "ray"},
    "spec": {"headGroupSpec": {"template": {"metadata": {"ownerReferences": [HIJACK]},
                                            "spec": container()}},
             "workerGroupSpecs": [{"groupName": "w", "replicas": 2,
                                   "template": {"metadata": None, "spec": container()}}]},
}


def test_mcads_labels_are_on_the_object_and_its_pod_template() -> None:
    (deployment,) = prepare(DEPLOYMENT)
    expected = {"app": "web", OURS: "job-1", MCAD: "job-1", RESOURCE: "web"}
    assert deployment["metadata"]["labels"] == expected
    assert deployment["spec"]["template"]["metadata"]["labels"] == expected
    # The selector is the user's: still matches the template.
    assert deployment["spec"]["selector"] == {"matchLabels": {"app": "web"}}


def test_every_pod_template_of_a_multi_template_kind_gets_them() -> None:
    (ray,) = prepare(RAY)
    head = ray["spec"]["headGroupSpec"]["template"]["metadata"]
    worker = ray["spec"]["workerGroupSpecs"][0]["template"]["metadata"]
    for meta in (ray["metadata"], head, worker):
        assert meta["labels"] == {OURS: "job-1", MCAD: "job-1", RESOURCE: "ray"}


def test_a_pod_is_its_own_template() -> None:
    (pod,) = prepare({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"generateName": "worker-", "labels": None},
                      "spec": container()})
    name = pod["metadata"]["name"]
    assert name.startswith("worker-") and len(name) == len("worker-") + 5
    assert pod["metadata"]["labels"] == {OURS: "job-1", MCAD: "job-1", RESOURCE: name}
    assert "generateName" not in pod["metadata"]


def test_user_owner_references_are_dropped_everywhere() -> None:
    deployment, ray = prepare(DEPLOYMENT, RAY)
    for obj in (deployment, ray):
        (owner,) = obj["metadata"]["ownerReferences"]
        assert (owner["name"], owner["uid"], owner["controller"]) == ("job-1", "aw-uid", True)
    assert "ownerReferences" not in ray["spec"]["headGroupSpec"]["template"]["metadata"]


def test_fields_the_api_server_sets_are_removed() -> None:
    (deployment,) = prepare(DEPLOYMENT)
    meta = deployment["metadata"]
    assert not {"uid", "resourceVersion", "generation"} & set(meta)
    assert "status" not in deployment
    assert meta["namespace"] == "team"


def test_a_name_too_long_for_a_label_value_goes_without_resource_name() -> None:
    long_name = "d" * 64  # a valid Deployment name: a subdomain of up to 253 characters
    (deployment,) = prepare({**DEPLOYMENT, "metadata": {"name": long_name}})
    labels = deployment["metadata"]["labels"]
    assert labels == {OURS: "job-1", MCAD: "job-1"}
    assert deployment["spec"]["template"]["metadata"]["labels"][MCAD] == "job-1"
