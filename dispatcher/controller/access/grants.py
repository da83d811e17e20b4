"""What an AppWrapper claims beyond the objects it wraps, and whether it was granted.

Two things an AppWrapper says about itself decide what it may take from others: the quota
node it is charged to (a label whose key names a quota tree, MCAD's QuotaSubtree labels)
and its priority (which decides whom it may preempt). Taken as written, any tenant could
charge another team's quota node or outrank everyone. So each needs a grant, given the
Kubernetes way, with RBAC, and asked with a SubjectAccessReview (verb ``use``, in the
AppWrapper's namespace):

- a label ``<tree>: <node>`` where ``<tree>`` is the name of a quota tree and ``<node>``
  is not ``default`` (every tenant may use a tree's default leaf, as MCAD gives it to
  wrappers without a label): ``use`` on ``quotasubtrees`` (API group
  ``quota.codeflare.dev``) named ``<tree>:<node>``;
- ``spec.priority`` above 0: ``use`` on ``appwrappers/priority`` (API group
  ``workload.codeflare.dev``) named the value (``"1000"``), as a PriorityClass names a
  value a pod may use;
- ``spec.priorityslope`` above 0 (a priority that grows while it waits, without bound):
  ``use`` on ``appwrappers/priority`` named ``slope``.

Both are resources the API server serves (``appwrappers/priority`` as a subresource
only RBAC knows), so ``kubectl auth can-i`` can ask about them. The verb ``use`` means
nothing to the API server for them: a grant lets its holder do nothing to any object. A
cluster-admin (every verb on every resource) holds every grant.

The admission webhook asks as the requester (webhook/admission_review.py); the controller asks
again as the recorded creator before it admits a wrapper (grant_screen.py).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dispatcher.controller.kube.client import ApiError, Kube, Resource
from dispatcher.controller.record.status import APPWRAPPERS
from dispatcher.quota import DEFAULT_NODE, TREE_LABEL

from .creator import Access, UserInfo

USE = "use"
QUOTA_SUBTREES = Resource("quota.codeflare.dev/v1alpha1", "QuotaSubtree", "quotasubtrees", True)
PRIORITY = "priority"  # the subresource of appwrappers a priority is granted on
SLOPE = "slope"

# A tree's name is the value of a QuotaSubtree's `tree` label: only a label key that is
# also a valid label value can name one.
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")


@dataclass(frozen=True)
class Grant:
    """One thing an AppWrapper claims, and the RBAC grant that allows it."""

    field: str  # where the AppWrapper claims it: "metadata.labels.quota_context"
    what: str  # "quota node gold of tree quota_context", "priority 1000"
    resource: Resource
    name: str  # the grant's resourceName
    subresource: str = ""

    def denial(self, user: str, namespace: str) -> str:
        """What is missing, in the words of an RBAC rule that grants it."""
        group = self.resource.api_version.rpartition("/")[0]
        resource = "/".join(filter(None, (self.resource.plural, self.subresource)))
        return (f"{self.field}: {user} may not use {self.what} in namespace {namespace}: no "
                f"RBAC grant of verb {USE} on {resource} (apiGroup {group}), resourceName "
                f"{self.name!r}")


def may_name_tree(key: str) -> bool:
    return bool(_LABEL_VALUE.match(key))


def needed(labels: Mapping[str, str], trees: Collection[str], priority: object,
           slope: object) -> tuple[Grant, ...]:
    """The grants an AppWrapper with these labels, ``spec.priority`` and
    ``spec.priorityslope`` needs, given the names of the quota trees. Values that are not
    numbers need none (the spec's validation refuses them)."""
    grants = [Grant(f"metadata.labels.{tree}", f"quota node {node} of tree {tree}",
                    QUOTA_SUBTREES, f"{tree}:{node}")
              for tree, node in sorted(labels.items())
              if tree in trees and node != DEFAULT_NODE]
    if _positive(priority):
        grants.append(Grant("spec.priority", f"priority {priority}", APPWRAPPERS,
                            str(priority), PRIORITY))
    if _positive(slope):
        grants.append(Grant("spec.priorityslope", f"priority slope {slope}", APPWRAPPERS,
                            SLOPE, PRIORITY))
    return tuple(grants)


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def claims(obj: Mapping[str, Any]) -> tuple[Mapping[str, str], object, object]:
    """An AppWrapper object's labels, ``spec.priority`` and ``spec.priorityslope``."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    spec = obj.get("spec") or {}
    return labels, spec.get("priority"), spec.get("priorityslope")


async def tree_names(kube: Kube) -> frozenset[str]:
    """The names of the quota trees, from the QuotaSubtrees; none when their CRD is not
    installed. Raises :class:`ApiError` when the API server cannot answer."""
    try:
        subtrees = await kube.list(QUOTA_SUBTREES)
    except ApiError as e:
        if e.status == 404:
            return frozenset()
        raise
    return frozenset(str(tree) for s in subtrees
                     if (tree := ((s.get("metadata") or {}).get("labels") or {}).get(TREE_LABEL)))


async def denials(access: Access, user: UserInfo, namespace: str,
                  grants: Sequence[Grant]) -> list[str]:
    """One line per grant ``user`` does not hold in ``namespace``. Raises
    :class:`ApiError` when the API server cannot answer."""
    answers = await asyncio.gather(*(access.may(user, USE, g.resource, namespace, g.name,
                                                g.subresource) for g in grants))
    return [g.denial(user.username, namespace)
            for g, allowed in zip(grants, answers, strict=True) if not allowed]


__all__ = [
    "PRIORITY",
    "QUOTA_SUBTREES",
    "SLOPE",
    "USE",
    "Grant",
    "claims",
    "denials",
    "may_name_tree",
    "needed",
    "tree_names",
]
