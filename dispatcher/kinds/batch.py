"""batch/v1 Job and JobSet (group jobset.x-k8s.io, any version)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatcher.kinds.base import (
    Handler,
    Path,
    Template,
    as_map,
    child_list,
    child_map,
    count,
    optional_count,
)


def job_pods(spec: Mapping[str, Any], path: Path) -> int:
    """Pods a Job runs at once: min(parallelism, completions), parallelism defaulting
    to 1 and completions to parallelism (a work-queue Job runs `parallelism` pods)."""
    parallelism = count(spec, "parallelism", path, 1)
    completions = optional_count(spec, "completions", path)
    return parallelism if completions is None else min(parallelism, completions)


def job(obj: Mapping[str, Any]) -> list[Template]:
    spec = child_map(obj, "spec", ())
    return [Template("pod", job_pods(spec, ("spec",)), ("spec", "template"), spec.get("template"))]


def job_set(obj: Mapping[str, Any]) -> list[Template]:
    """One pod set per replicated job: replicas (default 1) x that Job's pods."""
    spec = child_map(obj, "spec", ())
    out: list[Template] = []
    for i, raw in enumerate(child_list(spec, "replicatedJobs", ("spec",))):
        rpath: Path = ("spec", "replicatedJobs", i)
        rjob = as_map(raw, rpath)
        replicas = count(rjob, "replicas", rpath, 1)
        job_template = child_map(rjob, "template", rpath)
        job_spec = child_map(job_template, "spec", (*rpath, "template"))
        pods = replicas * job_pods(job_spec, (*rpath, "template", "spec"))
        name = str(rjob.get("name") or f"replicatedJobs[{i}]")
        out.append(Template(
            name, pods, (*rpath, "template", "spec", "template"), job_spec.get("template")
        ))
    return out


HANDLERS: dict[tuple[str, str], Handler] = {
    ("batch", "Job"): job,
    ("jobset.x-k8s.io", "JobSet"): job_set,
}
