"""Users of the local cluster, so tests act as real tenants rather than as the admin.

kube-apiserver trusts client certificates signed by the cluster's CA (kwokctl keeps it in
``<cluster dir>/pki/ca.crt`` and ``ca.key``): the certificate's common name is the user
name, its organisations the groups. Each user gets a kubeconfig of their own in
``<cluster dir>/users/<name>.kubeconfig``:

- ``alice`` may create AppWrappers and batch Jobs in namespace ``team-a``;
- ``bob`` may create AppWrappers only, in namespace ``team-b``;
- ``admin`` is bound to ``cluster-admin``.

:func:`grant` gives a user rights in any namespace (tests use fresh ones) and
:func:`revoke` takes them back.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import pki
from .kube import Kubectl

# Every user is in system:authenticated anyway; this group only makes the test users easy
# to find in audit logs and SubjectAccessReviews.
USERS_GROUP = "dispatcher.local:users"
ROLE_LABEL = "dispatcher.local/test-user-role"
# What a tenant does with what they may create: create it and look at it afterwards.
VERBS = ("create", "get", "list", "watch", "update", "patch", "delete")
APPWRAPPERS = "appwrappers.workload.codeflare.dev"
JOBS = "jobs.batch"


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = (USERS_GROUP,)
    namespace: str | None = None  # their team's namespace
    resources: tuple[str, ...] = ()  # what they may create there ("jobs.batch", ...)
    cluster_admin: bool = False


USERS = (
    User("alice", namespace="team-a", resources=(APPWRAPPERS, JOBS)),
    User("bob", namespace="team-b", resources=(APPWRAPPERS,)),
    User("admin", cluster_admin=True),
)


def users_dir(cluster_dir: Path) -> Path:
    return cluster_dir / "users"


def kubeconfig(cluster_dir: Path, user: str) -> Path:
    """The kubeconfig file that acts as ``user`` (see :data:`USERS`)."""
    path = users_dir(cluster_dir) / f"{user}.kubeconfig"
    if not path.exists():
        known = ", ".join(u.name for u in USERS)
        raise FileNotFoundError(f"no kubeconfig for user {user!r} in {path.parent}; users of "
                                f"the local cluster: {known} (`python -m localcluster up` "
                                "creates them)")
    return path


def ensure(cluster_dir: Path, kubectl: Kubectl) -> None:
    """Create the users' namespaces, RBAC and kubeconfigs unless they exist already."""
    missing = [u for u in USERS if not (users_dir(cluster_dir) / f"{u.name}.kubeconfig").exists()]
    if not missing:
        return
    objects: list[dict[str, Any]] = []
    for user in USERS:
        if user.namespace:
            objects.append({"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": user.namespace}})
            objects.extend(_role_objects(user.name, user.namespace, user.resources))
        if user.cluster_admin:
            objects.append({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": f"dispatcher-local-{user.name}-cluster-admin"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "cluster-admin"},
                "subjects": [_subject(user.name)],
            })
    kubectl.apply(objects)
    for user in missing:
        write_kubeconfig(cluster_dir, kubectl, user)


def enforce_pod_security(kubectl: Kubectl, level: str) -> None:
    """The users' namespaces enforce a Pod Security Standard (`baseline`: no privileged pod,
    no host path, network or namespace): where pods really run, a tenant's Job must not
    reach the machine."""
    for user in USERS:
        if user.namespace:
            kubectl("label", "namespace", user.namespace,
                    f"pod-security.kubernetes.io/enforce={level}", "--overwrite")


def write_kubeconfig(cluster_dir: Path, kubectl: Kubectl, user: User) -> Path:
    """A client certificate for ``user`` signed by the cluster's CA, in a kubeconfig that
    points at the same API server as the admin's."""
    path = users_dir(cluster_dir) / f"{user.name}.kubeconfig"
    client_kubeconfig(cluster_dir, kubectl, path, user.name, user.groups, user.namespace)
    return path


def client_kubeconfig(cluster_dir: Path, kubectl: Kubectl, path: Path, name: str,
                      groups: Sequence[str] = (), namespace: str | None = None) -> None:
    """Write at `path` a kubeconfig acting as user `name` in `groups` (a client certificate
    of the cluster's CA), for the API server of the admin's kubeconfig."""
    cert_pem, key_pem = pki.issue(cluster_dir, name, organizations=groups)
    admin = yaml.safe_load(Path(kubectl.kubeconfig).read_text())
    context = next(c for c in admin["contexts"]
                   if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": name,
        "clusters": [cluster],
        "users": [{"name": name, "user": {
            "client-certificate-data": _b64(cert_pem),
            "client-key-data": _b64(key_pem),
        }}],
        "contexts": [{"name": name, "context": {
            "cluster": cluster["name"], "user": name,
            **({"namespace": namespace} if namespace else {})}}],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(config))
    tmp.chmod(0o600)
    tmp.rename(path)


def grant(kubectl: Kubectl, user: str, namespace: str, resources: Sequence[str],
          verbs: Sequence[str] = VERBS) -> str:
    """Let ``user`` use ``resources`` ("appwrappers.workload.codeflare.dev", "jobs.batch",
    "pods"...) in ``namespace``; returns the Role's name, for :func:`revoke`."""
    objects = _role_objects(user, namespace, tuple(resources), tuple(verbs))
    kubectl.apply(objects)
    name: str = objects[0]["metadata"]["name"]
    return name


def revoke(kubectl: Kubectl, namespace: str, role: str) -> None:
    """Take back what :func:`grant` gave (its Role and RoleBinding)."""
    kubectl("delete", "role,rolebinding", role, "-n", namespace, "--ignore-not-found")


def _role_objects(user: str, namespace: str, resources: Sequence[str],
                  verbs: Sequence[str] = VERBS) -> list[dict[str, Any]]:
    by_group: dict[str, list[str]] = {}
    for resource in resources:
        plural, _, group = resource.partition(".")
        by_group.setdefault(group, []).append(plural)
    digest = hashlib.sha256(f"{sorted(resources)}{sorted(verbs)}".encode()).hexdigest()[:6]
    name = f"{user}-{digest}"
    meta = {"name": name, "namespace": namespace, "labels": {ROLE_LABEL: user}}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": [{"apiGroups": [group], "resources": sorted(plurals), "verbs": list(verbs)}
                   for group, plurals in sorted(by_group.items())]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [_subject(user)]},
    ]


def _subject(user: str) -> dict[str, str]:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
