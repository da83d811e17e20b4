"""The labels only a manager writes: who may set, change or remove them (admission_review.py).

`workload.codeflare.dev/cluster` names the worker cluster a manager sent an AppWrapper to;
`workload.codeflare.dev/manager-uid` marks, in a worker, a manager's copy. A tenant who sets
the first sends its wrapper past the manager's queue order, fit and quota checks; one who
removes the second hides a copy from the worker's fence against a lost manager. So only the
manager's own accounts may set, change or remove them: in the manager cluster the service
account `dispatcher-manager` (deploy/components/manager), in a worker the account whose
kubeconfig the manager holds, `dispatcher-manager-access` (deploy/examples/worker-access.yaml),
both in the dispatcher's namespace; `--manager-user` names others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dispatcher.api.labels import CLUSTER_LABEL, MANAGER_UID_LABEL

MANAGER_LABELS = (CLUSTER_LABEL, MANAGER_UID_LABEL)
#: The manager's service accounts, in the dispatcher's namespace (deploy/).
MANAGER_ACCOUNTS = ("dispatcher-manager", "dispatcher-manager-access")


def default_managers(namespace: str) -> frozenset[str]:
    return frozenset(f"system:serviceaccount:{namespace}:{name}" for name in MANAGER_ACCOUNTS)


def _labels(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    labels = ((obj or {}).get("metadata") or {}).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def touched(obj: Mapping[str, Any], old: Mapping[str, Any] | None) -> list[str]:
    """The manager's labels `obj` sets, changes or removes compared with `old` (None: a
    CREATE, where any of them is set)."""
    new, before = _labels(obj), _labels(old)
    return [k for k in MANAGER_LABELS if new.get(k) != before.get(k)]


def refusal(obj: Mapping[str, Any], old: Mapping[str, Any] | None, username: str,
            managers: Iterable[str]) -> str | None:
    """Why `username` may not write `obj` (over `old`), if it touches a manager's label
    and is not one of `managers`."""
    labels = touched(obj, old)
    if not labels or username in managers:
        return None
    what = "set" if old is None or labels[0] not in _labels(old) else (
        "removed" if labels[0] not in _labels(obj) else "changed")
    return (f"metadata.labels[{labels[0]}]: set only by the dispatcher's manager (which "
            f"names the worker cluster it sends an AppWrapper to, and marks its copies "
            f"there), not by {username}; it cannot be {what}: "
            + ("leave it out of the AppWrapper" if old is None else
               "keep the labels as they are"))
