"""Reading job traces: GPU cluster CSV traces and YAML lists of AppWrappers.

Two formats, chosen by the file's extension (``.csv``, else YAML):

CSV, the ITP traces' columns ``job_id, submission_time, duration, num_gpu`` (a header
line naming them, in any order; other columns are ignored). Times are seconds. A job
of N GPUs becomes a gang of ceil(N/G) pods of min(N, G) GPUs each, G being the GPUs of
one node (8 in the ITP clusters), so a job of 12 GPUs on 8-GPU nodes takes 2 pods of 8:
the gang is rounded up to whole pods and the trace says how many jobs were. A job of 0
GPUs is one pod that requests no GPU. Trace pods request only GPUs (and a pod slot).

YAML, a list of jobs (in one document, or one per document, or in ``kind: List``
items), each either an entry::

    - submitTime: 0          # seconds from the start of the trace
      duration: 3600         # seconds it runs once all its pods are placed
      appwrapper: {apiVersion: workload.codeflare.dev/v1beta1, kind: AppWrapper, ...}

or an AppWrapper that carries the two numbers as annotations::

    metadata:
      annotations:
        simulate.workload.codeflare.dev/submit-time: "120"
        simulate.workload.codeflare.dev/duration: "1800"

The AppWrapper goes through the same parsing and pod-set inference as the controller
(``parse_appwrapper``, ``queued_from_appwrapper``), so its gang is exactly the one the
dispatcher would see, and its ``spec.priority`` / ``priorityslope`` apply.

Every problem is an error naming the file and line: a simulation of half a trace
answers nothing.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from dispatcher import yaml_text
from dispatcher.admission import queued_from_appwrapper
from dispatcher.api.conversion import stored_form
from dispatcher.api.models import InvalidSpec, parse_appwrapper
from dispatcher.fit.gang import GangPodSet, demand
from dispatcher.kinds import InvalidItem
from dispatcher.kinds.podset import PodSet
from dispatcher.queue.queue import QueuedWrapper
from dispatcher.resources import PODS
from dispatcher.wording import counted

GPU = "nvidia.com/gpu"
CSV_COLUMNS = ("job_id", "submission_time", "duration", "num_gpu")
CSV_NAMESPACE = "trace"
ANNOTATION_PREFIX = "simulate.workload.codeflare.dev/"
SUBMIT_ANNOTATION = ANNOTATION_PREFIX + "submit-time"
DURATION_ANNOTATION = ANNOTATION_PREFIX + "duration"
ENTRY_FIELDS = frozenset({"submitTime", "duration", "appwrapper"})


class TraceError(Exception):
    """A trace that cannot be simulated; the message starts with ``file:line:``."""


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace: the queue entry the dispatcher would see, and when and how
    long it runs. ``wrapper.first_seen`` is the submit time."""

    wrapper: QueuedWrapper
    submit: float
    duration: float
    where: str  # "file:line"
    team: str = ""  # set by a team rule (simulate.teams) for traces without teams

    @property
    def name(self) -> str:
        w = self.wrapper
        return w.name if w.namespace == CSV_NAMESPACE else f"{w.namespace}/{w.name}"

    @property
    def gpus(self) -> int:
        return demand(self.wrapper.gang).get(GPU, 0)

    @property
    def pods(self) -> int:
        return sum(g.pod_set.count for g in self.wrapper.gang)


@dataclass(frozen=True)
class Trace:
    jobs: tuple[TraceJob, ...]
    source: str
    notes: tuple[str, ...] = field(default=())


def read_trace(path: Path, gpus_per_node: int = 8, limit: int | None = None) -> Trace:
    """The jobs of a CSV or YAML trace, in file order (the first `limit` if given)."""
    try:
        text = yaml_text.read(path)
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from e
    if path.suffix.lower() == ".csv":
        return read_csv(text, str(path), gpus_per_node, limit)
    return read_yaml(text, str(path), limit)


# --- CSV ---------------------------------------------------------------------------


def gpu_gang(gpus: int, gpus_per_node: int) -> tuple[GangPodSet, ...]:
    """A job of `gpus` GPUs: ceil(gpus / G) pods of min(gpus, G) GPUs each."""
    if gpus <= 0:
        return (GangPodSet(0, PodSet("worker", 1, {PODS: 1})),)
    pods = -(-gpus // gpus_per_node)
    per_pod = min(gpus, gpus_per_node)
    return (GangPodSet(0, PodSet("worker", pods, {GPU: per_pod, PODS: 1})),)


def _number(text: str, column: str, where: str, *, whole: bool = False,
            minimum: float | None = None) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    ok = math.isfinite(value) and (minimum is None or value >= minimum)
    if ok and whole:
        ok = value == int(value)
    if not ok:
        kind = "a whole number" if whole else "a number of seconds"
        bound = f" ≥ {minimum:g}" if minimum is not None else ""
        raise TraceError(f"{where}: {column} must be {kind}{bound}, got {text!r}")
    return value


def read_csv(text: str, source: str, gpus_per_node: int = 8,
             limit: int | None = None) -> Trace:
    if gpus_per_node < 1:
        raise TraceError(f"{source}: GPUs per node must be at least 1, got {gpus_per_node}")
    reader = csv.reader(text.splitlines())
    header: list[str] | None = None
    for row in reader:
        if row and any(c.strip() for c in row):
            header = [c.strip().lower() for c in row]
            break
    if header is None:
        raise TraceError(f"{source}: empty file: expected a header line "
                         f"{','.join(CSV_COLUMNS)} and one job per line")
    missing = [c for c in CSV_COLUMNS if c not in header]
    if missing:
        raise TraceError(
            f"{source}:{reader.line_num}: the header lacks {', '.join(missing)}: expected "
            f"the columns {','.join(CSV_COLUMNS)}, got {','.join(header)}"
        )
    col = {c: header.index(c) for c in CSV_COLUMNS}
    jobs: list[TraceJob] = []
    seen: dict[str, str] = {}
    rounded = 0
    for row in reader:
        if limit is not None and len(jobs) >= limit:
            break
        if not row or not any(c.strip() for c in row):
            continue
        where = f"{source}:{reader.line_num}"
        if len(row) != len(header):
            raise TraceError(f"{where}: expected {len(header)} columns "
                             f"({','.join(header)}), got {len(row)}")
        job_id = row[col["job_id"]].strip()
        if not job_id:
            raise TraceError(f"{where}: job_id is empty")
        if job_id in seen:
            raise TraceError(f"{where}: duplicate job_id {job_id} (also at {seen[job_id]})")
        seen[job_id] = where
        submit = _number(row[col["submission_time"]].strip(), "submission_time", where)
        duration = _number(row[col["duration"]].strip(), "duration", where, minimum=0)
        gpus = int(_number(row[col["num_gpu"]].strip(), "num_gpu", where, whole=True,
                           minimum=0))
        gang = gpu_gang(gpus, gpus_per_node)
        if gpus > gpus_per_node and gpus % gpus_per_node:
            rounded += 1
        wrapper = QueuedWrapper(CSV_NAMESPACE, job_id, f"{len(jobs):09d}", submit, gang)
        jobs.append(TraceJob(wrapper, submit, duration, where))
    if not jobs:
        raise TraceError(f"{source}: no jobs: expected one job per line after the header")
    g = gpus_per_node
    notes = [f"a job of N GPUs is a gang of ceil(N/{g}) pods of min(N, {g}) GPUs"]
    if rounded:
        notes.append(f"{counted(rounded, 'job')} asked for more than {g} GPUs, not a multiple of "
                     f"{g}: rounded up to whole pods of {g} GPUs")
    return Trace(tuple(jobs), source, tuple(notes))


# --- YAML --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Entry:
    where: str
    obj: Any


def _entries(text: str, source: str) -> Iterator[_Entry]:
    """Each job entry with the line it starts on (lists and List kinds flattened)."""
    loader = yaml.SafeLoader(yaml_text.named(text, source))
    try:
        while loader.check_node():
            root = loader.get_node()
            if root is None:
                continue
            if isinstance(root, yaml.SequenceNode):
                nodes = list(root.value)
            elif isinstance(root, yaml.MappingNode) and _is_list_kind(root):
                nodes = _list_items(root)
            else:
                nodes = [root]
            for node in nodes:
                where = f"{source}:{node.start_mark.line + 1}"
                yield _Entry(where, loader.construct_document(node))
    except RecursionError:
        raise TraceError(f"{source}: not valid YAML: {yaml_text.TooDeep()}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise TraceError(f"{source}{line}: not valid YAML: {e}") from e
    finally:
        loader.dispose()


def _is_list_kind(node: yaml.MappingNode) -> bool:
    return any(isinstance(k, yaml.ScalarNode) and k.value == "kind"
               and isinstance(v, yaml.ScalarNode) and v.value == "List"
               for k, v in node.value)


def _list_items(node: yaml.MappingNode) -> list[yaml.Node]:
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == "items":
            if isinstance(v, yaml.SequenceNode):
                return list(v.value)
            return [v]
    return []


def _seconds(value: object, what: str, where: str, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TraceError(f"{where}: {what} must be a number of seconds, got {value!r}")
    return _number(str(value).strip(), what, where, minimum=minimum)


def _job_of(entry: _Entry, index: int) -> TraceJob:
    obj, where = entry.obj, entry.where
    if not isinstance(obj, Mapping):
        raise TraceError(f"{where}: expected an AppWrapper or a mapping with submitTime, "
                         f"duration and appwrapper, got {type(obj).__name__}")
    if "appwrapper" in obj:
        unknown = sorted(set(map(str, obj)) - ENTRY_FIELDS)
        if unknown:
            raise TraceError(f"{where}: unknown field(s) {', '.join(unknown)}: an entry has "
                             "submitTime, duration and appwrapper")
        for key in ("submitTime", "duration"):
            if key not in obj:
                raise TraceError(f"{where}: the entry has no {key}")
        submit = _seconds(obj["submitTime"], "submitTime", where)
        duration = _seconds(obj["duration"], "duration", where, minimum=0)
        manifest = obj["appwrapper"]
    elif obj.get("kind") == "AppWrapper":
        meta = obj.get("metadata")
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        annotations = annotations if isinstance(annotations, Mapping) else {}
        for key in (SUBMIT_ANNOTATION, DURATION_ANNOTATION):
            if key not in annotations:
                raise TraceError(
                    f"{where}: the AppWrapper has no annotation {key}: give it "
                    f"{SUBMIT_ANNOTATION} and {DURATION_ANNOTATION} (seconds), or wrap it "
                    "as {submitTime, duration, appwrapper}")
        submit = _seconds(annotations[SUBMIT_ANNOTATION], SUBMIT_ANNOTATION, where)
        duration = _seconds(annotations[DURATION_ANNOTATION], DURATION_ANNOTATION, where,
                            minimum=0)
        manifest = obj
    else:
        raise TraceError(f"{where}: expected an AppWrapper or a mapping with submitTime, "
                         f"duration and appwrapper, got kind {obj.get('kind')!r}")
    try:
        aw = parse_appwrapper(stored_form(manifest))
    except InvalidSpec as e:
        raise TraceError(f"{where}: invalid AppWrapper: " + "; ".join(e.problems)) from e
    try:
        wrapper = queued_from_appwrapper(aw, submit)
    except InvalidItem as e:  # queued_from_appwrapper reports these in .invalid
        raise TraceError(f"{where}: invalid AppWrapper: {e}") from e
    name = f"{wrapper.namespace}/{wrapper.name}"
    if wrapper.invalid is not None:
        raise TraceError(f"{where}: AppWrapper {name} is invalid: {wrapper.invalid}")
    # The uid only breaks ties between equal submit times: keep the file's order.
    return TraceJob(replace(wrapper, uid=f"{index:09d}"), submit, duration, where)


def read_yaml(text: str, source: str, limit: int | None = None) -> Trace:
    jobs: list[TraceJob] = []
    seen: dict[tuple[str, str], str] = {}
    for entry in _entries(text, source):
        if limit is not None and len(jobs) >= limit:
            break
        job = _job_of(entry, len(jobs))
        key = job.wrapper.key
        if key in seen:
            raise TraceError(f"{entry.where}: duplicate AppWrapper {job.name} "
                             f"(also at {seen[key]})")
        seen[key] = entry.where
        jobs.append(job)
    if not jobs:
        raise TraceError(f"{source}: no jobs: expected a list of AppWrappers (see "
                         "`dispatcher simulate --help`)")
    return Trace(tuple(jobs), source,
                 ("pod sets inferred from each AppWrapper as the controller does",))
