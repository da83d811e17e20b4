"""`dispatcher plan --cluster NAME=FILE ...`: which worker cluster a manager would send each
AppWrapper to, from a snapshot of each worker, or why none can (each worker's best).

The same cycle as `dispatcher run --manager` (dispatcher.fleet.dispatch): queue order
(highest effective priority, then first come), best fit, each choice taking its room and
quota from its worker before the next wrapper's. A worker's file holds its Nodes and Pods,
its QuotaSubtrees, and may hold its AppWrappers: those admitted there count against its
quota as its dispatcher counts them; the others wait in its own queue and count for nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatcher.admission import admitted_records, is_admitted
from dispatcher.api.models import AppWrapper, InvalidSpec, parse_appwrapper
from dispatcher.fit import Capacity
from dispatcher.fit.rules import NO_TOPOLOGY, Fit
from dispatcher.fit.topology import Topology
from dispatcher.fleet import (
    CLUSTER_SELECTOR_ANNOTATION,
    Chosen,
    SelectorError,
    Worker,
    dispatch,
    parse_selector,
    worker_ledger,
)
from dispatcher.plan import (
    CLUSTER_FILE,
    InputError,
    Loaded,
    cluster_from_documents,
    read_some_documents,
)
from dispatcher.wording import printable

#: A worker cluster's name (a DNS label, as a WorkerCluster's).
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


@dataclass(frozen=True)
class Sent:
    namespace: str
    name: str
    cluster: str | None  # None: no worker can take it now
    message: str
    nodes: tuple[str, ...] = ()


def named_snapshot(text: str) -> tuple[str, Path] | None:
    """``NAME=FILE`` -> (NAME, FILE); None when `text` is a plain file (a single cluster)."""
    name, eq, path = text.partition("=")
    if not eq or not name or set(name) - _NAME_CHARS or Path(text).exists():
        return None
    return name, Path(path)


def worker_labels(texts: Sequence[str]) -> dict[str, dict[str, str]]:
    """``NAME=key=value,key2=value2`` (repeatable) -> the labels of each worker."""
    out: dict[str, dict[str, str]] = {}
    for text in texts:
        name, eq, terms = text.partition("=")
        if not eq or not name:
            raise InputError(f"--worker-labels {text!r}: write NAME=key=value,... "
                             "(e.g. eu-a100=region=eu,gpu=a100)")
        try:
            out.setdefault(name, {}).update(parse_selector(terms))
        except SelectorError as e:
            raise InputError(f"--worker-labels {text!r}: {e}") from e
    return out


def load_workers(snapshots: Sequence[tuple[str, Path]],
                 labels: Mapping[str, Mapping[str, str]], now: float) -> list[Worker]:
    names = [n for n, _ in snapshots]
    if len(set(names)) != len(names):
        raise InputError("--cluster: each worker cluster is named once (NAME=FILE); "
                         "give several files of one cluster as separate worker names")
    unknown = sorted(set(labels) - set(names))
    if unknown:
        raise InputError(f"--worker-labels names {', '.join(unknown)}, not given as "
                         "--cluster NAME=FILE")
    return [load_worker(name, path, labels.get(name, {}), now) for name, path in snapshots]


def load_worker(name: str, path: Path, labels: Mapping[str, str], now: float) -> Worker:
    """A worker from its snapshot: free room, and its quota with what its admitted
    AppWrappers use of it."""
    subtrees: list[Mapping[str, Any]] = []
    wrappers: list[AppWrapper] = []
    rest = []
    for doc in read_some_documents(path, CLUSTER_FILE):
        if doc.obj.get("kind") != "AppWrapper":
            rest.append(doc)
            continue
        try:
            wrappers.append(parse_appwrapper(doc.obj))
        except InvalidSpec as e:
            raise InputError(f"{doc.where}: not a usable AppWrapper: {e}") from e
    state = cluster_from_documents(rest, subtrees)
    admitted = admitted_records([aw for aw in wrappers if is_admitted(aw)], state, now)
    return Worker(name, Capacity.of(state), dict(labels),
                  worker_ledger(subtrees, admitted, (), now))


def plan_fleet(workers: Sequence[Worker], loaded: Loaded, now: float,
               fit: Fit = "per-node", topology: Topology = NO_TOPOLOGY) -> list[Sent]:
    selectors: dict[tuple[str, str], dict[str, str]] = {}
    refused: list[Sent] = []
    queue = []
    for w in loaded.queued:
        spec = loaded.specs.get(w.key)
        text = spec.metadata.annotations.get(CLUSTER_SELECTOR_ANNOTATION, "") if spec else ""
        try:
            selectors[w.key] = parse_selector(text or "")
        except SelectorError as e:
            refused.append(Sent(*w.key, None, str(e)))
            continue
        queue.append(w)
    out = []
    for w, answer in dispatch(queue, workers, now, selectors, fit, topology):
        if isinstance(answer, Chosen):
            nodes = tuple(sorted({p.node for p in answer.placements if p.node}))
            out.append(Sent(*w.key, answer.cluster, "fits whole now", nodes))
        else:
            out.append(Sent(*w.key, None, answer.message))
    return out + refused


def to_table(sent: Sequence[Sent], workers: Sequence[Worker]) -> str:
    going = sum(1 for s in sent if s.cluster)
    rows = [["#", "APPWRAPPER", "CLUSTER", "MESSAGE"]]
    for i, s in enumerate(sent, start=1):
        nodes = f" (nodes {', '.join(s.nodes)})" if s.nodes else ""
        rows.append([printable(c) for c in (str(i), f"{s.namespace}/{s.name}", s.cluster or "-",
                                            s.message + nodes)])
    widths = [max(len(r[c]) for r in rows) for c in range(3)]
    lines = [f"{len(workers)} worker clusters ({', '.join(w.name for w in workers)}): "
             f"{going} sent, {len(sent) - going} wait"]
    lines += ["  ".join([*(r[c].ljust(widths[c]) for c in range(3)), r[3]]).rstrip()
              for r in rows]
    return "\n".join(lines)


def to_json(sent: Sequence[Sent]) -> str:
    return json.dumps({"appwrappers": [
        {"namespace": s.namespace, "name": s.name, "cluster": s.cluster,
         "message": s.message, "nodes": list(s.nodes)} for s in sent]}, indent=2)
