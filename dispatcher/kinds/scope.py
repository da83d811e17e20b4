"""Which kinds an installation lets AppWrappers create, and which never.

The dispatcher creates wrapped objects with its own service account, so what it agrees
to create is a security boundary (issue 11): an allow-list of kinds, set by the
installation, and cluster-scoped kinds refused always (an AppWrapper is namespaced and
so is everything it creates).

Kinds are named as ``Kind.group`` (``Job.batch``, ``PyTorchJob.kubeflow.org``), or just
``Kind`` for the core group (``Service``), and matched in any version of their group.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from dispatcher.kinds.registry import KNOWN_KINDS, NO_POD_KINDS

GroupKind = tuple[str, str]

# Kinds that create no pods but may carry a right a user should not get through the
# dispatcher's service account; an installation allows them explicitly if it wants them:
# - Role, RoleBinding: the API server checks that whoever creates a Role holds its
#   rights, and a RoleBinding's role's rights; that is the dispatcher, not the user, so a
#   user could be granted whatever the dispatcher may do in the namespace.
# - Endpoints, EndpointSlice: send a Service's traffic to any address (CVE-2021-25740);
#   Kubernetes' own edit role no longer grants them.
# - LimitRange, ResourceQuota: the namespace's policy, its administrator's, not a job's.
# - Secret: to adopt and remove what it created, the dispatcher would need to read every
#   Secret of the cluster; deploy/ does not grant that (add it with the RBAC to match).
OPT_IN_KINDS: frozenset[GroupKind] = frozenset({
    ("", "Secret"),
    ("rbac.authorization.k8s.io", "Role"),
    ("rbac.authorization.k8s.io", "RoleBinding"),
    ("", "Endpoints"),
    ("discovery.k8s.io", "EndpointSlice"),
    ("", "LimitRange"),
    ("", "ResourceQuota"),
})

# The table of docs/guide/appwrappers.md: every kind whose pods are counted, and those
# that create none.
DEFAULT_ALLOWED_KINDS: frozenset[GroupKind] = KNOWN_KINDS | (NO_POD_KINDS - OPT_IN_KINDS)


def owner_kinds(allowed: Collection[GroupKind]) -> frozenset[GroupKind]:
    """The kinds that may stand in a pod's owner chain up to an object the dispatcher
    created: those it knows that make pods (a Job, a ReplicaSet below a Deployment, a
    RayCluster below a RayJob) and those an installation allows beyond them (a
    LeaderWorkerSet), never a kind that makes none (a ConfigMap)."""
    return KNOWN_KINDS | (frozenset(allowed) - NO_POD_KINDS)


# Well-known cluster-scoped kinds, for `dispatcher plan` (no API server to ask); the
# controller adds what discovery says of the kinds it does not know.
CLUSTER_SCOPED_KINDS: frozenset[GroupKind] = frozenset({
    ("", "Namespace"),
    ("", "Node"),
    ("", "PersistentVolume"),
    ("", "ComponentStatus"),
    ("rbac.authorization.k8s.io", "ClusterRole"),
    ("rbac.authorization.k8s.io", "ClusterRoleBinding"),
    ("apiextensions.k8s.io", "CustomResourceDefinition"),
    ("apiregistration.k8s.io", "APIService"),
    ("admissionregistration.k8s.io", "MutatingWebhookConfiguration"),
    ("admissionregistration.k8s.io", "ValidatingWebhookConfiguration"),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy"),
    ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding"),
    ("admissionregistration.k8s.io", "MutatingAdmissionPolicy"),
    ("admissionregistration.k8s.io", "MutatingAdmissionPolicyBinding"),
    ("authentication.k8s.io", "TokenReview"),
    ("authentication.k8s.io", "SelfSubjectReview"),
    ("authorization.k8s.io", "SubjectAccessReview"),
    ("authorization.k8s.io", "SelfSubjectAccessReview"),
    ("authorization.k8s.io", "SelfSubjectRulesReview"),
    ("certificates.k8s.io", "CertificateSigningRequest"),
    ("certificates.k8s.io", "ClusterTrustBundle"),
    ("flowcontrol.apiserver.k8s.io", "FlowSchema"),
    ("flowcontrol.apiserver.k8s.io", "PriorityLevelConfiguration"),
    ("networking.k8s.io", "IngressClass"),
    ("networking.k8s.io", "IPAddress"),
    ("networking.k8s.io", "ServiceCIDR"),
    ("node.k8s.io", "RuntimeClass"),
    ("resource.k8s.io", "DeviceClass"),
    ("scheduling.k8s.io", "PriorityClass"),
    ("storage.k8s.io", "CSIDriver"),
    ("storage.k8s.io", "CSINode"),
    ("storage.k8s.io", "StorageClass"),
    ("storage.k8s.io", "VolumeAttachment"),
    ("storage.k8s.io", "VolumeAttributesClass"),
    ("cert-manager.io", "ClusterIssuer"),
    ("kueue.x-k8s.io", "ClusterQueue"),
    ("kueue.x-k8s.io", "Cohort"),
    ("kueue.x-k8s.io", "ResourceFlavor"),
    ("kueue.x-k8s.io", "WorkloadPriorityClass"),
    ("scheduling.sigs.k8s.io", "ElasticQuota"),
})

_KIND = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_GROUP = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def kind_name(group_kind: GroupKind) -> str:
    """`("batch", "Job")` -> `Job.batch`; the core group's kinds stand alone."""
    group, kind = group_kind
    return f"{kind}.{group}" if group else kind


def parse_kind_name(text: str) -> GroupKind:
    """`Job.batch` -> `("batch", "Job")`, `Service` -> `("", "Service")`; ValueError else."""
    kind, _, group = text.strip().partition(".")
    if not _KIND.fullmatch(kind) or (group and not _GROUP.fullmatch(group)):
        raise ValueError(
            f"{text!r} is not a kind: write Kind.group (Job.batch, PyTorchJob.kubeflow.org), "
            "or Kind alone for the core group (Service)")
    return group, kind
