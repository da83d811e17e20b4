"""Pod-set inference: every kind and default of DESIGN.md §2, node rules, invalid items."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.kinds import (
    KNOWN_KINDS,
    NO_POD_KINDS,
    InvalidItem,
    PodConstraints,
    PodSet,
    Requirement,
    Toleration,
    constraints_of,
    found_pod_template_paths,
    group_kind,
    infer_pod_sets,
    item_pod_sets,
    pod_set_from_template,
    pod_template_paths,
)

Mi, Gi = 2**20, 2**30


def tmpl(cpu: str = "1", gpu: int = 0, **spec: Any) -> dict[str, Any]:
    requests: dict[str, Any] = {"cpu": cpu}
    resources: dict[str, Any] = {"requests": requests}
    if gpu:
        requests["nvidia.com/gpu"] = gpu
        resources["limits"] = {"nvidia.com/gpu": gpu}  # as Kubernetes requires
    return {
        "metadata": {"labels": {"app": "x"}},
        "spec": {"containers": [{"name": "main", "resources": resources}], **spec},
    }


def shape(sets: Sequence[PodSet] | None) -> list[tuple[str, int]]:
    assert sets is not None
    return [(s.name, s.count) for s in sets]


def invalid(obj: dict[str, Any], custom: list[dict[str, Any]] | None = None) -> str:
    with pytest.raises(InvalidItem) as e:
        item_pod_sets(obj, custom)
    return str(e.value)


# --- Ray --------------------------------------------------------------------------------


def worker(name: str | None = "g", **fields: Any) -> dict[str, Any]:
    group: dict[str, Any] = {"template": tmpl(gpu=1), **fields}
    if name is not None:
        group["groupName"] = name
    return group


def ray_cluster(*groups: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    return {
        "apiVersion": f"ray.io/{version}", "kind": "RayCluster", "metadata": {"name": "rc"},
        "spec": {"headGroupSpec": {"template": tmpl("2")}, "workerGroupSpecs": list(groups)},
    }


def test_ray_cluster_head_and_worker_groups() -> None:
    sets = infer_pod_sets(ray_cluster(worker("gpu", replicas=4), worker("cpu", replicas=2)))
    assert shape(sets) == [("head", 1), ("worker/gpu", 4), ("worker/cpu", 2)]
    assert sets is not None
    assert sets[0].request == {"cpu": 2000, "pods": 1}
    assert sets[1].request == {"cpu": 1000, "nvidia.com/gpu": 1, "pods": 1}


@pytest.mark.parametrize(
    ("fields", "count"),
    [
        ({}, 0),                                              # replicas and min missing
        ({"minReplicas": 2}, 2),                              # replicas missing -> min
        ({"replicas": 3}, 3),                                 # max missing = unbounded
        ({"replicas": 1, "minReplicas": 2}, 2),               # below min
        ({"replicas": 9, "maxReplicas": 5}, 5),               # above max
        ({"replicas": 3, "minReplicas": 1, "maxReplicas": 5}, 3),
        ({"replicas": 3, "minReplicas": 4, "maxReplicas": 2}, 2),  # crossed bounds: max wins
        ({"replicas": 2, "numOfHosts": 4}, 8),                # multi-host groups
        ({"minReplicas": 2, "numOfHosts": 2}, 4),
        ({"replicas": 2, "numOfHosts": 0}, 0),
        ({"replicas": 4, "suspend": True}, 0),
        ({"replicas": 4, "suspend": False}, 4),
        ({"replicas": 0, "minReplicas": 0}, 0),
        ({"replicas": 2147483647}, 2147483647),
    ],
)
def test_ray_worker_group_count(fields: dict[str, Any], count: int) -> None:
    assert shape(infer_pod_sets(ray_cluster(worker("g", **fields))))[1] == ("worker/g", count)


def test_ray_group_without_name_is_named_by_position() -> None:
    assert shape(infer_pod_sets(ray_cluster(worker(None, replicas=1))))[1] == ("worker/0", 1)


@pytest.mark.parametrize("version", ["v1", "v1alpha1", "v1beta1"])
def test_ray_any_version_of_the_group(version: str) -> None:
    assert shape(infer_pod_sets(ray_cluster(version=version))) == [("head", 1)]


@pytest.mark.parametrize("field", ["replicas", "minReplicas", "maxReplicas", "numOfHosts"])
def test_ray_negative_counts_are_invalid(field: str) -> None:
    message = invalid(ray_cluster(worker("g"), worker("h", **{field: -1})))
    assert message == f"spec.workerGroupSpecs[1].{field} is -1: {field} must be 0 or more"


def test_ray_non_integer_replicas_are_invalid() -> None:
    message = invalid(ray_cluster(worker("g", replicas="3")))
    assert message == "spec.workerGroupSpecs[0].replicas is '3': it must be a whole number"


def ray_job(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj"},
            "spec": {"entrypoint": "python x.py", **spec}}


def cluster_spec() -> dict[str, Any]:
    return {"headGroupSpec": {"template": tmpl("1")},
            "workerGroupSpecs": [worker("w", replicas=2)]}


def test_ray_job_default_mode_adds_kuberays_default_submitter_pod() -> None:
    sets = infer_pod_sets(ray_job(rayClusterSpec=cluster_spec()))
    assert shape(sets) == [("head", 1), ("worker/w", 2), ("submitter", 1)]
    assert sets is not None
    assert sets[2].request == {"cpu": 500, "memory": 200 * Mi, "pods": 1}


def test_ray_job_submitter_pod_template_is_used() -> None:
    job = ray_job(rayClusterSpec=cluster_spec(), submissionMode="K8sJobMode",
                  submitterPodTemplate=tmpl("3", nodeSelector={"pool": "cpu"}))
    sets = infer_pod_sets(job)
    assert sets is not None
    assert sets[-1].name == "submitter"
    assert sets[-1].request == {"cpu": 3000, "pods": 1}
    assert sets[-1].constraints.node_selector == (("pool", "cpu"),)


@pytest.mark.parametrize("mode", ["HTTPMode", "InteractiveMode", "SidecarMode"])
def test_ray_job_other_modes_have_no_submitter_pod(mode: str) -> None:
    sets = infer_pod_sets(ray_job(rayClusterSpec=cluster_spec(), submissionMode=mode))
    assert shape(sets) == [("head", 1), ("worker/w", 2)]


def test_ray_job_on_an_existing_cluster_creates_only_the_submitter() -> None:
    sets = infer_pod_sets(ray_job(clusterSelector={"ray.io/cluster": "shared"}))
    assert shape(sets) == [("submitter", 1)]
    sets = infer_pod_sets(ray_job(clusterSelector={"ray.io/cluster": "shared"},
                                  submissionMode="HTTPMode"))
    assert sets == []


def test_ray_job_with_selector_and_cluster_spec_counts_the_cluster() -> None:
    sets = infer_pod_sets(ray_job(clusterSelector={"a": "b"}, rayClusterSpec=cluster_spec()))
    assert shape(sets) == [("head", 1), ("worker/w", 2), ("submitter", 1)]


def test_ray_job_needs_a_cluster() -> None:
    assert "neither rayClusterSpec nor clusterSelector" in invalid(ray_job())


def test_ray_job_cluster_errors_name_the_nested_path() -> None:
    spec = cluster_spec()
    spec["workerGroupSpecs"][0]["replicas"] = -2
    assert invalid(ray_job(rayClusterSpec=spec)).startswith(
        "spec.rayClusterSpec.workerGroupSpecs[0].replicas is -2"
    )


# --- Kubeflow ---------------------------------------------------------------------------

KUBEFLOW = [
    ("TFJob", "tfReplicaSpecs"),
    ("PyTorchJob", "pytorchReplicaSpecs"),
    ("XGBoostJob", "xgbReplicaSpecs"),
    ("MXJob", "mxReplicaSpecs"),
    ("JAXJob", "jaxReplicaSpecs"),
    ("PaddleJob", "paddleReplicaSpecs"),
]


def kubeflow(kind: str, field: str, specs: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    return {"apiVersion": f"kubeflow.org/{version}", "kind": kind, "metadata": {"name": "j"},
            "spec": {field: specs}}


@pytest.mark.parametrize(("kind", "field"), KUBEFLOW)
def test_kubeflow_replica_specs(kind: str, field: str) -> None:
    obj = kubeflow(kind, field, {
        "Worker": {"replicas": 4, "template": tmpl(gpu=8)},
        "Master": {"template": tmpl("2")},  # replicas missing -> 1
    })
    sets = infer_pod_sets(obj)
    assert shape(sets) == [("Master", 1), ("Worker", 4)]
    assert sets is not None
    assert sets[1].request == {"cpu": 1000, "nvidia.com/gpu": 8, "pods": 1}
    assert pod_template_paths(obj) == [
        ["spec", field, "Master", "template"], ["spec", field, "Worker", "template"],
    ]


def test_kubeflow_replica_types_are_case_insensitive_and_ordered_alphabetically() -> None:
    obj = kubeflow("TFJob", "tfReplicaSpecs", {
        "worker": {"replicas": 2, "template": tmpl()},
        "PS": {"replicas": 1, "template": tmpl()},
        "Chief": {"template": tmpl()},
    })
    assert shape(infer_pod_sets(obj)) == [("Chief", 1), ("PS", 1), ("worker", 2)]


def test_kubeflow_duplicate_replica_types_differing_in_case_are_invalid() -> None:
    obj = kubeflow("PyTorchJob", "pytorchReplicaSpecs", {
        "Worker": {"template": tmpl()}, "worker": {"template": tmpl()},
    })
    assert "has both Worker and worker" in invalid(obj)


def test_kubeflow_negative_replicas_are_invalid() -> None:
    obj = kubeflow("PyTorchJob", "pytorchReplicaSpecs", {"Worker": {"replicas": -1}})
    assert invalid(obj) == (
        "spec.pytorchReplicaSpecs.Worker.replicas is -1: replicas must be 0 or more"
    )


def test_kubeflow_explicit_zero_replicas() -> None:
    obj = kubeflow("TFJob", "tfReplicaSpecs", {"Worker": {"replicas": 0, "template": tmpl()}})
    assert shape(infer_pod_sets(obj)) == [("Worker", 0)]


@pytest.mark.parametrize(
    ("specs", "expected"),
    [
        ({"Launcher": {"template": tmpl()}, "Worker": {"template": tmpl()}},
         [("Launcher", 1), ("Worker", 0)]),
        ({"launcher": {"template": tmpl()}, "worker": {"template": tmpl()}},
         [("launcher", 1), ("worker", 0)]),
        ({"Launcher": {"replicas": 1, "template": tmpl()},
          "Worker": {"replicas": 16, "template": tmpl(gpu=1)}},
         [("Launcher", 1), ("Worker", 16)]),
    ],
)
@pytest.mark.parametrize("version", ["v1", "v2beta1"])
def test_mpijob_defaults(specs: dict[str, Any], expected: list[tuple[str, int]],
                         version: str) -> None:
    obj = kubeflow("MPIJob", "mpiReplicaSpecs", specs, version)
    assert shape(infer_pod_sets(obj)) == expected


def test_a_kubeflow_malformed_quantity_names_the_full_path_and_container() -> None:
    obj = kubeflow("PyTorchJob", "pytorchReplicaSpecs", {"Worker": {"template": {"spec": {
        "containers": [{"name": "trainer", "resources": {"requests": {"memory": "10 Gi"}}}],
    }}}})
    message = invalid(obj)
    assert message.startswith(
        "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0] (trainer): "
        "resources.requests.memory '10 Gi' is not a Kubernetes quantity"
    )
    assert "16Gi" in message  # and what a valid one looks like


# --- batch: Job and JobSet --------------------------------------------------------------


def job(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"template": tmpl(), **spec}}


@pytest.mark.parametrize(
    ("spec", "count"),
    [
        ({}, 1),
        ({"parallelism": 4}, 4),                       # completions missing = parallelism
        ({"completions": 10}, 1),                      # parallelism missing = 1
        ({"parallelism": 4, "completions": 10}, 4),
        ({"parallelism": 10, "completions": 4}, 4),
        ({"parallelism": 0}, 0),
        ({"parallelism": 3, "completions": 0}, 0),
        ({"parallelism": 5, "completions": 5, "completionMode": "Indexed"}, 5),
    ],
)
def test_job_count(spec: dict[str, Any], count: int) -> None:
    assert shape(infer_pod_sets(job(**spec))) == [("pod", count)]


@pytest.mark.parametrize("field", ["parallelism", "completions"])
def test_job_negative_counts_are_invalid(field: str) -> None:
    assert invalid(job(**{field: -3})) == f"spec.{field} is -3: {field} must be 0 or more"


def test_job_fractional_counts_are_invalid() -> None:
    assert invalid(job(parallelism=1.5)) == "spec.parallelism is 1.5: it must be a whole number"


def jobset(*replicated: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "js"}, "spec": {"replicatedJobs": list(replicated)}}


def rjob(name: str, replicas: int | None = None, **job_spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name,
                           "template": {"spec": {"template": tmpl(gpu=1), **job_spec}}}
    if replicas is not None:
        out["replicas"] = replicas
    return out


def test_jobset_replicas_times_the_job_rule() -> None:
    obj = jobset(rjob("driver"), rjob("workers", 3, parallelism=4, completions=4),
                 rjob("ps", 2, parallelism=2, completions=1))
    assert shape(infer_pod_sets(obj)) == [("driver", 1), ("workers", 12), ("ps", 2)]
    assert pod_template_paths(obj) == [
        ["spec", "replicatedJobs", i, "template", "spec", "template"] for i in range(3)
    ]


def test_jobset_negative_replicas_are_invalid() -> None:
    assert invalid(jobset(rjob("a"), rjob("b", -1))) == (
        "spec.replicatedJobs[1].replicas is -1: replicas must be 0 or more"
    )
    assert invalid(jobset(rjob("a", 1, parallelism=-1))) == (
        "spec.replicatedJobs[0].template.spec.parallelism is -1: parallelism must be 0 or more"
    )


# --- core -------------------------------------------------------------------------------


def pod() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": tmpl("250m", gpu=2)["spec"]}


def test_pod_is_one_pod_of_its_own_spec() -> None:
    sets = infer_pod_sets(pod())
    assert shape(sets) == [("pod", 1)]
    assert sets is not None
    assert sets[0].request == {"cpu": 250, "nvidia.com/gpu": 2, "pods": 1}
    assert pod_template_paths(pod()) == [[]]


def test_pod_errors_point_into_its_spec() -> None:
    p = pod()
    p["spec"]["containers"][0]["resources"]["limits"] = {"memory": "-1"}
    assert invalid(p).startswith(
        "spec.containers[0] (main): resources.limits.memory '-1' is negative"
    )


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [("apps/v1", "Deployment"), ("apps/v1", "StatefulSet"), ("apps/v1", "ReplicaSet"),
     ("v1", "ReplicationController")],
)
def test_replicated_workloads(api_version: str, kind: str) -> None:
    obj: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "d"},
                           "spec": {"template": tmpl()}}
    assert shape(infer_pod_sets(obj)) == [("pod", 1)]  # replicas missing -> 1
    obj["spec"]["replicas"] = 5
    assert shape(infer_pod_sets(obj)) == [("pod", 5)]
    obj["spec"]["replicas"] = 0
    assert shape(infer_pod_sets(obj)) == [("pod", 0)]
    assert pod_template_paths(obj) == [["spec", "template"]]
    obj["spec"]["replicas"] = -1
    assert invalid(obj) == "spec.replicas is -1: replicas must be 0 or more"


@pytest.mark.parametrize(
    ("api_version", "kind"),
    [("v1", "Service"), ("v1", "ConfigMap"), ("v1", "Secret"), ("v1", "PersistentVolumeClaim"),
     ("v1", "ServiceAccount"), ("rbac.authorization.k8s.io/v1", "Role"),
     ("rbac.authorization.k8s.io/v1", "RoleBinding"), ("networking.k8s.io/v1", "Ingress"),
     ("networking.k8s.io/v1", "NetworkPolicy"), ("policy/v1", "PodDisruptionBudget"),
     ("route.openshift.io/v1", "Route")],
)
def test_objects_that_create_no_pods_wrap_fine(api_version: str, kind: str) -> None:
    obj = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}, "spec": {}}
    assert infer_pod_sets(obj) == []
    assert item_pod_sets(obj, None) == []
    assert pod_template_paths(obj) == []


def test_every_no_pod_kind_is_known_to_create_nothing() -> None:
    for group, kind in NO_POD_KINDS:
        api_version = f"{group}/v1" if group else "v1"
        assert infer_pod_sets({"apiVersion": api_version, "kind": kind}) == []
    assert not NO_POD_KINDS & KNOWN_KINDS


def test_known_kinds_cover_the_design_table() -> None:
    assert {
        ("ray.io", "RayCluster"), ("ray.io", "RayJob"),
        *(("kubeflow.org", k) for k, _ in KUBEFLOW), ("kubeflow.org", "MPIJob"),
        ("batch", "Job"), ("jobset.x-k8s.io", "JobSet"),
        ("apps", "Deployment"), ("apps", "StatefulSet"), ("apps", "ReplicaSet"), ("", "Pod"),
    } <= KNOWN_KINDS


# --- groups, unknown kinds, nested AppWrappers -------------------------------------------


@pytest.mark.parametrize(
    ("api_version", "expected"),
    [("v1", ""), ("apps/v1", "apps"), ("ray.io/v1alpha1", "ray.io"),
     ("kubeflow.org/v2beta1", "kubeflow.org")],
)
def test_group_kind(api_version: str, expected: str) -> None:
    assert group_kind({"apiVersion": api_version, "kind": "K"}) == (expected, "K")


def test_the_group_matters_not_just_the_kind() -> None:
    assert infer_pod_sets({"apiVersion": "v1", "kind": "Job", "spec": {}}) is None
    assert infer_pod_sets({"apiVersion": "example.com/v1", "kind": "Deployment"}) is None
    assert infer_pod_sets({"apiVersion": "batch/v2", "kind": "Job",
                           "spec": {"template": tmpl()}}) is not None


def test_unknown_kind_asks_for_custompodresources() -> None:
    obj = {"apiVersion": "foo.example.com/v1", "kind": "Foo", "metadata": {"name": "f"}}
    assert infer_pod_sets(obj) is None
    assert invalid(obj) == (
        "kind Foo (foo.example.com/v1) is not one the dispatcher knows how to count pods for: "
        "add spec.resources.GenericItems[i].custompodresources listing its pods' replicas and "
        "requests"
    )
    with pytest.raises(InvalidItem, match=r"GenericItems\[3\]\.custompodresources"):
        item_pod_sets(obj, [], index=3)


def test_unknown_kind_with_custompodresources_is_fine() -> None:
    obj = {"apiVersion": "foo.example.com/v1", "kind": "Foo"}
    sets = item_pod_sets(obj, [{"replicas": 2, "requests": {"cpu": "1", "nvidia.com/gpu": 1}}])
    assert sets == [PodSet("custom/0", 2, {"cpu": 1000, "nvidia.com/gpu": 1, "pods": 1})]


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"kind": "Job"}, "the wrapped object has no apiVersion: every object needs both"),
        ({"apiVersion": "batch/v1"}, "the wrapped object has no kind"),
        ({"metadata": {}}, "the wrapped object has no apiVersion and no kind"),
        ({"apiVersion": "a/b/c", "kind": "Job"}, "apiVersion 'a/b/c' is not group/version"),
        ({"apiVersion": "batch/", "kind": "Job"}, "apiVersion 'batch/' is not group/version"),
        ({"apiVersion": 1, "kind": "Job"}, "apiVersion and kind must be strings"),
    ],
)
def test_missing_or_bad_api_version_and_kind(obj: dict[str, Any], message: str) -> None:
    assert invalid(obj).startswith(message)
    assert invalid(obj, [{"replicas": 1}]).startswith(message)


@pytest.mark.parametrize("group", ["workload.codeflare.dev", "mcad.ibm.com"])
def test_an_appwrapper_cannot_wrap_an_appwrapper(group: str) -> None:
    obj = {"apiVersion": f"{group}/v1beta1", "kind": "AppWrapper", "spec": {}}
    assert invalid(obj).startswith("an AppWrapper cannot wrap another AppWrapper")
    assert invalid(obj, [{"replicas": 1}]).startswith("an AppWrapper cannot wrap another")


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ({"apiVersion": "batch/v1", "kind": "Job", "spec": []}, "spec must be a map, not a list"),
        ({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
          "spec": {"replicatedJobs": {"a": 1}}}, "spec.replicatedJobs must be a list, not a map"),
        ({"apiVersion": "ray.io/v1", "kind": "RayCluster",
          "spec": {"workerGroupSpecs": ["x"]}}, "spec.workerGroupSpecs[0] must be a map, not 'x'"),
        ({"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": "pod"}},
         "spec.template must be a map, not 'pod'"),
        ({"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": 3}}},
         "spec.template.spec must be a map, not 3"),
        ({"apiVersion": "batch/v1", "kind": "Job",
          "spec": {"template": {"spec": {"containers": {}}}}},
         "spec.template.spec.containers must be a list of containers"),
    ],
)
def test_malformed_objects_name_the_field(obj: dict[str, Any], message: str) -> None:
    assert invalid(obj) == message or invalid(obj).startswith(message)


# --- template paths (where the controller puts its label) -------------------------------


def resolve(obj: Any, path: list[str | int]) -> Any:
    for part in path:
        obj = obj[part]
    return obj


@pytest.mark.parametrize(
    "obj",
    [
        ray_cluster(worker("a", replicas=1), worker("b")),
        ray_job(rayClusterSpec=cluster_spec(), submitterPodTemplate=tmpl()),
        kubeflow("MPIJob", "mpiReplicaSpecs", {"Launcher": {"template": tmpl()},
                                               "Worker": {"template": tmpl()}}),
        jobset(rjob("a"), rjob("b", 2)),
        job(),
        pod(),
    ],
)
def test_every_template_path_leads_to_a_pod_template(obj: dict[str, Any]) -> None:
    paths = pod_template_paths(obj)
    sets = infer_pod_sets(obj)
    assert sets is not None and len(paths) == len(sets)
    for path in paths:
        assert "containers" in resolve(obj, path)["spec"]


def test_paths_of_ray_objects() -> None:
    assert pod_template_paths(ray_cluster(worker("a"))) == [
        ["spec", "headGroupSpec", "template"], ["spec", "workerGroupSpecs", 0, "template"],
    ]
    # KubeRay's default submitter pod has no template in the object to label.
    assert pod_template_paths(ray_job(rayClusterSpec=cluster_spec())) == [
        ["spec", "rayClusterSpec", "headGroupSpec", "template"],
        ["spec", "rayClusterSpec", "workerGroupSpecs", 0, "template"],
    ]
    assert pod_template_paths(ray_job(clusterSelector={"a": "b"},
                                      submitterPodTemplate=tmpl())) == [
        ["spec", "submitterPodTemplate"],
    ]


def test_unknown_kinds_have_no_template_paths() -> None:
    assert pod_template_paths({"apiVersion": "x.io/v1", "kind": "X"}) == []


# --- node rules -------------------------------------------------------------------------


def affinity(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}


def test_constraints_of_reads_selector_tolerations_and_required_affinity() -> None:
    spec = {
        "nodeSelector": {"zone": "a", "gpu": "a100"},
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "dedicated", "value": "ml"},
        ],
        "affinity": {
            **affinity(
                {"matchExpressions": [
                    {"key": "type", "operator": "In", "values": ["b", "a", "b"]},
                    {"key": "spot", "operator": "DoesNotExist"},
                ]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
            ),
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []},
        },
    }
    c = constraints_of(spec)
    assert c.node_selector == (("gpu", "a100"), ("zone", "a"))
    assert c.tolerations == (
        Toleration("dedicated", "Equal", "ml", ""),
        Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"),
    )
    assert c.affinity_terms == (
        (Requirement("metadata.name", "In", ("n1",)),),
        (Requirement("spot", "DoesNotExist"), Requirement("type", "In", ("a", "b"))),
    )


def test_no_rules_is_no_constraints() -> None:
    assert constraints_of({}) == PodConstraints()
    assert constraints_of({"affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1}]}}}) == PodConstraints()


def test_gt_lt_keep_their_value() -> None:
    c = constraints_of({"affinity": affinity(
        {"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["3"]}]})})
    assert c.affinity_terms == ((Requirement("gpus", "Gt", ("3",)),),)


def test_an_empty_term_is_kept_because_it_selects_no_node() -> None:
    c = constraints_of({"affinity": affinity({})})
    assert c.affinity_terms == ((),)


def test_node_name_pins_the_pod_to_that_node() -> None:
    assert constraints_of({"nodeName": "n7"}).affinity_terms == (
        (Requirement("metadata.name", "In", ("n7",)),),
    )
    c = constraints_of({"nodeName": "n7", "affinity": affinity(
        {"matchExpressions": [{"key": "a", "operator": "Exists"}]},
        {"matchExpressions": [{"key": "b", "operator": "Exists"}]})})
    assert all(Requirement("metadata.name", "In", ("n7",)) in t for t in c.affinity_terms)
    assert len(c.affinity_terms) == 2


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"tolerations": [{"key": "a", "operator": "Equals"}]},
         "spec.tolerations[0].operator is 'Equals': use Equal or Exists"),
        ({"affinity": affinity({"matchExpressions": [{"key": "a", "operator": "in"}]})},
         "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
         ".nodeSelectorTerms[0].matchExpressions[0].operator is 'in': use one of"),
        ({"affinity": affinity({"matchFields": [{"key": "spec.x", "operator": "In"}]})},
         "matchFields[0].key is 'spec.x': matchFields supports only metadata.name"),
        ({"affinity": affinity()}, "nodeSelectorTerms is empty: list at least one term"),
        ({"nodeSelector": ["a"]}, "spec.nodeSelector must be a map, not a list"),
        ({"tolerations": {"key": "a"}}, "spec.tolerations must be a list, not a map"),
    ],
)
def test_bad_node_rules_are_invalid(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidItem) as e:
        constraints_of(spec)
    assert message in str(e.value)


tolerations = st.lists(st.fixed_dictionaries({
    "key": st.sampled_from(["a", "b", ""]),
    "operator": st.sampled_from(["Equal", "Exists"]),
    "value": st.sampled_from(["", "x"]),
    "effect": st.sampled_from(["", "NoSchedule", "NoExecute"]),
}), max_size=4)
expressions = st.lists(st.fixed_dictionaries({
    "key": st.sampled_from(["zone", "type"]),
    "operator": st.sampled_from(["In", "NotIn"]),
    "values": st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3),
}), min_size=1, max_size=3)
terms = st.lists(expressions, min_size=1, max_size=3)


def rules(tols: list[dict[str, str]], raw_terms: list[list[dict[str, Any]]]) -> dict[str, Any]:
    return {"tolerations": tols,
            "affinity": affinity(*({"matchExpressions": t} for t in raw_terms))}


@given(tolerations, terms, st.randoms(use_true_random=False))
def test_equal_rules_in_any_order_give_equal_constraints(
    tols: list[dict[str, str]], raw_terms: list[list[dict[str, Any]]], rnd: Any
) -> None:
    shuffled = [
        rnd.sample([{**e, "values": rnd.sample(e["values"], len(e["values"]))} for e in t], len(t))
        for t in raw_terms
    ]
    a = constraints_of(rules(tols, raw_terms))
    b = constraints_of(rules(rnd.sample(tols, len(tols)), rnd.sample(shuffled, len(shuffled))))
    assert a == b
    assert hash(a) == hash(b)


# --- pod_set_from_template --------------------------------------------------------------


def test_pod_set_from_template() -> None:
    ps = pod_set_from_template("w", 3, tmpl("2", gpu=4, tolerations=[{"operator": "Exists"}]))
    assert ps.name == "w" and ps.count == 3
    assert ps.request == {"cpu": 2000, "nvidia.com/gpu": 4, "pods": 1}
    assert ps.constraints.tolerations == (Toleration("", "Exists", "", ""),)


def test_missing_template_or_spec_is_an_empty_pod() -> None:
    assert pod_set_from_template("x", 2, None).request == {"pods": 1}
    assert pod_set_from_template("x", 2, {"metadata": {}}).request == {"pods": 1}


def test_pod_set_from_template_errors_use_the_given_path() -> None:
    bad = {"spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "?"}}}]}}
    with pytest.raises(InvalidItem, match=r"^a\.b\.template\.spec\.containers\[0\] \(c\): "):
        pod_set_from_template("x", 1, bad, path="a.b.template")


def test_equal_demands_share_a_cache_key() -> None:
    a = pod_set_from_template("a", 2, tmpl("1", nodeSelector={"x": "1", "y": "2"}))
    b = pod_set_from_template("b", 2, tmpl("1000m", nodeSelector={"y": "2", "x": "1"}))
    assert a.key == b.key


# --- custompodresources ------------------------------------------------------------------


def test_custompodresources_win_over_inference() -> None:
    obj = job(parallelism=10)
    sets = item_pod_sets(obj, [
        {"replicas": 3, "requests": {"cpu": "2"}, "limits": {"cpu": "4", "nvidia.com/gpu": 1}},
        {"requests": {"memory": "1Gi"}},   # replicas missing -> 1
        {"replicas": 0, "requests": {"cpu": "1"}},
    ])
    assert shape(sets) == [("custom/0", 3), ("custom/1", 1), ("custom/2", 0)]
    assert sets[0].request == {"cpu": 2000, "nvidia.com/gpu": 1, "pods": 1}
    assert sets[1].request == {"memory": Gi, "pods": 1}


def test_custompodresources_none_or_empty_means_infer() -> None:
    assert shape(item_pod_sets(job(parallelism=2), None)) == [("pod", 2)]
    assert shape(item_pod_sets(job(parallelism=2), [])) == [("pod", 2)]


def test_custompodresources_take_node_rules_pairwise_when_templates_line_up() -> None:
    obj = kubeflow("PyTorchJob", "pytorchReplicaSpecs", {
        "Master": {"template": tmpl(nodeSelector={"role": "master"})},
        "Worker": {"replicas": 2, "template": tmpl(nodeSelector={"role": "worker"})},
    })
    sets = item_pod_sets(obj, [{"replicas": 1}, {"replicas": 2}])
    assert [s.constraints.node_selector for s in sets] == [
        (("role", "master"),), (("role", "worker"),),
    ]


def test_custompodresources_take_the_only_templates_rules_for_all() -> None:
    obj = job(template=tmpl(nodeSelector={"pool": "gpu"}))
    sets = item_pod_sets(obj, [{"replicas": 1}, {"replicas": 2}, {"replicas": 3}])
    assert all(s.constraints.node_selector == (("pool", "gpu"),) for s in sets)


def test_custompodresources_without_a_clear_template_get_no_rules() -> None:
    obj = ray_cluster(worker("a", replicas=1, template=tmpl(nodeSelector={"x": "y"})))
    sets = item_pod_sets(obj, [{"replicas": 3}])  # 2 templates, 1 entry
    assert sets[0].constraints == PodConstraints()


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"replicas": -1}, "custompodresources[1].replicas is -1: replicas must be 0 or more"),
        ({"replicas": "2"}, "custompodresources[1].replicas is '2': it must be a whole number"),
        ({"requests": {"cpu": "1 core"}},
         "custompodresources[1].requests.cpu '1 core' is not a Kubernetes quantity"),
        ({"limits": {"memory": "-5Gi"}}, "custompodresources[1].limits.memory '-5Gi' is negative"),
        ({"requests": "cpu=1"}, "custompodresources[1].requests must be a map"),
        ("2 pods", "custompodresources[1] must be a map with replicas, requests and limits"),
    ],
)
def test_bad_custompodresources_are_invalid(entry: Any, message: str) -> None:
    assert invalid(job(), [{"replicas": 1}, entry]).startswith(message)


def test_inference_does_not_mutate_the_object() -> None:
    obj = ray_job(rayClusterSpec=cluster_spec())
    before = copy.deepcopy(obj)
    infer_pod_sets(obj)
    pod_template_paths(obj)
    item_pod_sets(obj, [{"replicas": 4, "requests": {"nvidia.com/gpu": "1"}}])
    assert obj == before


def test_the_pod_templates_of_a_kind_the_dispatcher_does_not_know_are_found() -> None:
    """Every mapping below the top whose spec lists containers, the outermost only, in
    the object's order: a LeaderWorkerSet's two, a list's items, none at the top."""
    pod = {"metadata": {"labels": {"x": "y"}}, "spec": {"containers": [{"name": "c"}]}}
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "spec": {"leaderWorkerTemplate": {"leaderTemplate": pod, "workerTemplate": pod}}}
    assert found_pod_template_paths(lws) == [
        ["spec", "leaderWorkerTemplate", "leaderTemplate"],
        ["spec", "leaderWorkerTemplate", "workerTemplate"]]
    nested = {"spec": {"containers": []}, "groups": [
        {"name": "a", "template": {"spec": {"containers": [], "inner": {"template": pod}}}},
        {"name": "b", "template": {"spec": {"initContainers": []}}}]}
    assert found_pod_template_paths(nested) == [["groups", 0, "template"]]
