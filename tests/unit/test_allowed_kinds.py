"""Which kinds an AppWrapper may wrap: the installation's allow-list, never a
cluster-scoped kind (issue 11), and the configuration file that sets the list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatcher.api import parse_appwrapper
from dispatcher.config import ConfigError, load_config
from dispatcher.kinds.checks import check_kinds
from dispatcher.kinds.scope import (
    CLUSTER_SCOPED_KINDS,
    DEFAULT_ALLOWED_KINDS,
    kind_name,
    parse_kind_name,
)

CUSTOM = [{"replicas": 1, "requests": {"cpu": 1}}]


def aw(*templates: dict[str, Any], custom: bool = False) -> Any:
    items = [{"generictemplate": t, **({"custompodresources": CUSTOM} if custom else {})}
             for t in templates]
    return parse_appwrapper({
        "apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
        "metadata": {"name": "a", "namespace": "team"},
        "spec": {"resources": {"GenericItems": items}}})


def obj(api_version: str, kind: str, name: str = "x") -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}


README_TABLE = [
    ("ray.io/v1", "RayCluster"), ("ray.io/v1", "RayJob"), ("kubeflow.org/v1", "TFJob"),
    ("kubeflow.org/v1", "PyTorchJob"), ("kubeflow.org/v1", "XGBoostJob"),
    ("kubeflow.org/v1", "MXJob"), ("kubeflow.org/v1", "JAXJob"),
    ("kubeflow.org/v1", "PaddleJob"), ("kubeflow.org/v2beta1", "MPIJob"), ("batch/v1", "Job"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet"), ("apps/v1", "Deployment"),
    ("apps/v1", "StatefulSet"), ("apps/v1", "ReplicaSet"), ("v1", "Pod"), ("v1", "Service"),
    ("v1", "ConfigMap"), ("v1", "PersistentVolumeClaim"),
    ("v1", "ServiceAccount"), ("route.openshift.io/v1", "Route"),
]


@pytest.mark.parametrize(("api_version", "kind"), README_TABLE)
def test_the_readme_kinds_are_allowed_by_default(api_version: str, kind: str) -> None:
    assert check_kinds(aw(obj(api_version, kind)), DEFAULT_ALLOWED_KINDS) == []


@pytest.mark.parametrize(("api_version", "kind"), [
    ("rbac.authorization.k8s.io/v1", "RoleBinding"), ("rbac.authorization.k8s.io/v1", "Role"),
    ("v1", "Endpoints"), ("discovery.k8s.io/v1", "EndpointSlice"), ("v1", "ResourceQuota"),
    ("v1", "LimitRange"), ("v1", "Secret"), ("example.com/v1", "Widget"),
    ("apps/v1", "DaemonSet"),
])
def test_kinds_that_grant_rights_or_are_unknown_need_the_administrator(
        api_version: str, kind: str) -> None:
    (problem,) = check_kinds(aw(obj(api_version, kind, "it"), custom=True),
                             DEFAULT_ALLOWED_KINDS)
    group = api_version.rpartition("/")[0]
    name = f"{kind}.{group}" if group else kind
    assert problem.startswith(f"spec.resources.GenericItems[0]: {kind} 'it' is of a kind this "
                              f"dispatcher does not create ({name}; it creates ")
    assert problem.endswith(f"ask the administrator to add {name} to allowedKinds.add in the "
                            "dispatcher's configuration")


@pytest.mark.parametrize(("api_version", "kind"), [
    ("v1", "Namespace"), ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"), ("v1", "PersistentVolume"),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"), ("v1", "Node"),
])
def test_cluster_scoped_kinds_are_refused_even_with_custompodresources_and_allowed(
        api_version: str, kind: str) -> None:
    group = api_version.rpartition("/")[0]
    everything = DEFAULT_ALLOWED_KINDS | {(group, kind)}
    (problem,) = check_kinds(aw(obj(api_version, kind, "ns"), custom=True), everything)
    assert f"{kind} 'ns' is cluster-scoped" in problem
    assert "remove the item and have a cluster administrator create it" in problem


def test_discovered_cluster_scoped_kinds_are_refused_too() -> None:
    crd_kind = ("example.com", "ClusterWidget")
    wrapper = aw(obj("example.com/v1", "ClusterWidget"), custom=True)
    assert check_kinds(wrapper, DEFAULT_ALLOWED_KINDS | {crd_kind},
                       CLUSTER_SCOPED_KINDS | {crd_kind})[0].endswith(
        "remove the item and have a cluster administrator create it")


def test_each_refused_item_is_named_and_the_others_pass() -> None:
    problems = check_kinds(aw(obj("batch/v1", "Job", "train"), obj("v1", "Namespace", "mine"),
                              obj("example.com/v1", "Widget", "w")), DEFAULT_ALLOWED_KINDS)
    assert [p.split(":")[0] for p in problems] == ["spec.resources.GenericItems[1]",
                                                   "spec.resources.GenericItems[2]"]


def test_kind_names_round_trip() -> None:
    for gk in DEFAULT_ALLOWED_KINDS | CLUSTER_SCOPED_KINDS:
        assert parse_kind_name(kind_name(gk)) == gk
    with pytest.raises(ValueError, match=r"write Kind\.group"):
        parse_kind_name("batch/Job")


# --- the configuration file ---------------------------------------------------------


def test_no_file_means_the_defaults(tmp_path: Path) -> None:
    assert load_config(None).allowed_kinds == DEFAULT_ALLOWED_KINDS
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_config(empty).allowed_kinds == DEFAULT_ALLOWED_KINDS


def test_the_administrator_adds_and_removes_kinds(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("allowedKinds:\n  add: [RoleBinding.rbac.authorization.k8s.io, "
                    "Widget.example.com]\n  remove: [ServiceAccount]\n")
    allowed = load_config(path).allowed_kinds
    assert allowed == (DEFAULT_ALLOWED_KINDS | {("rbac.authorization.k8s.io", "RoleBinding"),
                                                ("example.com", "Widget")}) - {
                                                    ("", "ServiceAccount")}
    assert check_kinds(aw(obj("rbac.authorization.k8s.io/v1", "RoleBinding")), allowed) == []


def test_only_the_listed_kinds_without_defaults(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("allowedKinds: {defaults: false, add: [Job.batch]}\n")
    assert load_config(path).allowed_kinds == {("batch", "Job")}


@pytest.mark.parametrize(("text", "message"), [
    ("allowedKind: {}\n", "allowedKind: unknown field"),
    ("allowedKinds: {add: [Namespace]}\n",
     "allowedKinds.add: Namespace: cluster-scoped, and an AppWrapper creates objects only in "
     "its own namespace"),
    ("allowedKinds: {add: [batch/Job]}\n", "allowedKinds.add: 'batch/Job' is not a kind"),
    ("allowedKinds: {defaults: maybe}\n", "allowedKinds.defaults:"),
    ("- Job.batch\n", "a configuration is one mapping"),
    ("allowedKinds: [\n", "not valid YAML"),
])
def test_a_bad_file_is_refused_with_where_and_why(tmp_path: Path, text: str,
                                                  message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the configuration"):
        load_config(tmp_path / "nope.yaml")
