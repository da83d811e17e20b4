"""Has a wrapped object finished, and how? Read from the object's own status.

Each kind reports the end of its work differently; an object with no notion of an end
(a RayCluster, a Deployment, a Service) answers None and never completes its AppWrapper
on its own. MCAD's `completionstatus` (comma-separated condition types that mean done)
takes precedence for any kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

Outcome = Literal["succeeded", "failed", "running"]

_KUBEFLOW_GROUP = "kubeflow.org"
# Condition types that mean success / failure, per (group, kind); "*" for any kind.
_CONDITIONS: dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]] = {
    ("batch", "Job"): (("Complete",), ("Failed",)),
    ("jobset.x-k8s.io", "JobSet"): (("Completed",), ("Failed",)),
    (_KUBEFLOW_GROUP, "*"): (("Succeeded",), ("Failed",)),
}


def _true_conditions(status: Mapping[str, Any]) -> set[str]:
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return set()
    return {
        str(c.get("type")) for c in conditions
        if isinstance(c, Mapping) and str(c.get("status", "")).lower() == "true"
    }


def item_outcome(obj: Mapping[str, Any], completionstatus: str | None = None) -> Outcome | None:
    """"succeeded", "failed", "running" (not finished yet), or None (never finishes)."""
    api_version = str(obj.get("apiVersion", ""))
    group = api_version.rpartition("/")[0]
    kind = str(obj.get("kind", ""))
    raw = obj.get("status")
    status: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    true = _true_conditions(status)
    if completionstatus:
        done = {t.strip() for t in completionstatus.split(",") if t.strip()}
        if "Failed" in true and "Failed" not in done:
            return "failed"
        return "succeeded" if true & done else "running"
    if (group, kind) == ("", "Pod"):
        phase = status.get("phase")
        if phase == "Succeeded":
            return "succeeded"
        return "failed" if phase == "Failed" else "running"
    if (group, kind) == ("ray.io", "RayJob"):
        deployment = str(status.get("jobDeploymentStatus", ""))
        job = str(status.get("jobStatus", ""))
        if deployment == "Failed" or job in ("FAILED", "STOPPED"):
            return "failed"
        if deployment == "Complete" or job == "SUCCEEDED":
            return "succeeded"
        return "running"
    rules = _CONDITIONS.get((group, kind)) or _CONDITIONS.get((group, "*"))
    if rules is None:
        return None
    succeeded, failed = rules
    if true & set(failed):
        return "failed"
    if true & set(succeeded):
        return "succeeded"
    return "running"


def deciding_items(items: Sequence[tuple[Mapping[str, Any], str | None]]) -> tuple[int, ...]:
    """The items whose outcome completes their AppWrapper, given (template, completionstatus)
    per item. As in MCAD, when any item declares `completionstatus`, those items decide and
    the others (a server beside a job) do not; otherwise every item whose kind can finish."""
    declared = tuple(i for i, (_, status) in enumerate(items) if status)
    if declared:
        return declared
    return tuple(i for i, (template, status) in enumerate(items)
                 if item_outcome(template, status) is not None)


def wrapper_outcome(outcomes: Sequence[Outcome | None]) -> Outcome | None:
    """The AppWrapper's: failed if any item failed, succeeded when every item that can
    finish has succeeded, None when none of its items can finish."""
    known = [o for o in outcomes if o is not None]
    if not known:
        return None
    if "failed" in known:
        return "failed"
    return "succeeded" if all(o == "succeeded" for o in known) else "running"
