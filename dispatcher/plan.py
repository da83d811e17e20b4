"""`dispatcher plan`: what would the dispatcher do with these AppWrappers on this cluster?

Reads Nodes and Pods (what `kubectl get nodes,pods -A -o yaml` prints) and AppWrapper
manifests, runs one admission cycle of the same core the controller uses, and reports
every decision in the order the policy considered it, with the warnings the controller
would post as Events.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from dispatcher.admission import Decision, Fit, admit
from dispatcher.cluster import ClusterState, bound_pod_from_object, node_from_object
from dispatcher.fit.capacity import Capacity
from dispatcher.kinds.scope import DEFAULT_ALLOWED_KINDS, GroupKind
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import AdmissionQueue, QueuedWrapper, WrapperKey
from dispatcher.resources import QuantityError
from dispatcher.review import review

LIST_KINDS = frozenset({"List", "NodeList", "PodList", "AppWrapperList"})


class InputError(Exception):
    """A file that cannot be used at all; the message names the file and document."""


@dataclass(frozen=True)
class Document:
    where: str  # "cluster.yaml, document 2, item 5"
    obj: Mapping[str, Any]


def read_documents(path: Path) -> Iterator[Document]:
    try:
        text = path.read_text()
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from e
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        raise InputError(f"{path}: not valid YAML: {e}") from e
    for i, doc in enumerate(docs, start=1):
        if doc is None:
            continue
        where = f"{path}, document {i}"
        if not isinstance(doc, dict):
            raise InputError(f"{where}: expected a Kubernetes object, got {type(doc).__name__}")
        if doc.get("kind") in LIST_KINDS:
            for j, item in enumerate(doc.get("items") or [], start=1):
                if not isinstance(item, dict):
                    raise InputError(f"{where}, item {j}: expected a Kubernetes object")
                yield Document(f"{where}, item {j}", item)
        else:
            yield Document(where, doc)


def load_cluster(paths: Sequence[Path]) -> ClusterState:
    state = ClusterState()
    pods: list[Document] = []
    for path in paths:
        for doc in read_documents(path):
            kind = doc.obj.get("kind")
            if kind == "Node":
                try:
                    state.upsert_node(node_from_object(doc.obj))
                except (KeyError, QuantityError, ValueError, TypeError) as e:
                    raise InputError(f"{doc.where}: not a usable Node: {e}") from e
            elif kind == "Pod":
                pods.append(doc)
            else:
                raise InputError(
                    f"{doc.where}: a cluster file holds Nodes and Pods (or Lists of them), "
                    f"not {kind or 'an object without kind'}"
                )
    for doc in pods:
        try:
            pod = bound_pod_from_object(doc.obj)
        except (KeyError, QuantityError, ValueError, TypeError) as e:
            raise InputError(f"{doc.where}: not a usable Pod: {e}") from e
        if pod is not None and pod.node in state.nodes:
            state.upsert_pod(pod.key, pod)
    return state


@dataclass
class Loaded:
    """The AppWrappers read, in order, and the warnings of each (by namespace and name)."""

    wrappers: list[QueuedWrapper] = field(default_factory=list)
    warnings: dict[WrapperKey, list[str]] = field(default_factory=dict)


def load_appwrappers(paths: Sequence[Path], now: float,
                     allowed: Collection[GroupKind] = DEFAULT_ALLOWED_KINDS) -> Loaded:
    """Every AppWrapper document, valid or not; invalid ones carry their reason. Items of
    kinds not in `allowed` (or cluster-scoped) make their AppWrapper invalid."""
    loaded = Loaded()
    wrappers = loaded.wrappers
    seen: dict[tuple[str, str], str] = {}
    index = 0
    for path in paths:
        for doc in read_documents(path):
            if doc.obj.get("kind") != "AppWrapper":
                raise InputError(
                    f"{doc.where}: expected an AppWrapper, got {doc.obj.get('kind') or 'no kind'}"
                )
            index += 1
            # Without a creation time a wrapper counts as just submitted, in read order.
            default_seen = now + index * 1e-6
            meta = doc.obj.get("metadata") or {}
            ns = str(meta.get("namespace") or "default")
            name = str(meta.get("name") or f"<unnamed {index}>")
            checked = review(doc.obj, default_seen, allowed)
            loaded.warnings.setdefault((ns, name), checked.warnings)
            wrapper = checked.queued or QueuedWrapper(ns, name, f"~{index}", default_seen,
                                                      invalid=checked.message)
            if not wrapper.uid:
                wrapper = replace(wrapper, uid=f"~{index:08d}")
            if wrapper.key in seen:
                wrapper = QueuedWrapper(
                    ns, name, f"~{index:08d}", wrapper.first_seen,
                    invalid=f"duplicate AppWrapper {ns}/{name}: also in {seen[wrapper.key]}",
                )
            else:
                seen[wrapper.key] = doc.where
            wrappers.append(wrapper)
    return loaded


def plan(state: ClusterState, wrappers: Sequence[QueuedWrapper], policy: Policy,
         fit: Fit, now: float) -> list[Decision]:
    queue = AdmissionQueue(policy)
    duplicates: list[QueuedWrapper] = []
    for w in wrappers:
        if w.key in queue:
            duplicates.append(w)
        else:
            queue.put(w)
    return admit([*queue.ordered(now), *duplicates], Capacity.of(state), policy, now, fit)


Warnings = Mapping[WrapperKey, Sequence[str]]


def to_json(decisions: Sequence[Decision], policy: Policy, fit: Fit,
            warned: Warnings | None = None) -> str:
    out = []
    for d in decisions:
        entry: dict[str, Any] = {
            "namespace": d.namespace, "name": d.name, "decision": d.decision,
            "reason": d.reason, "message": d.message,
            "warnings": list((warned or {}).get((d.namespace, d.name), ())),
        }
        if d.decision == "dispatch":
            entry["placements"] = [
                {"item": p.item, "podSet": p.pod_set, "pod": p.pod, "node": p.node}
                for p in d.placements
            ]
        out.append(entry)
    return json.dumps({"policy": policy.name, "fit": fit, "decisions": out}, indent=2)


def to_table(decisions: Sequence[Decision], policy: Policy, fit: Fit,
             warned: Warnings | None = None) -> str:
    rows = [("#", "APPWRAPPER", "DECISION", "REASON", "MESSAGE")]
    for i, d in enumerate(decisions, start=1):
        mark = " (head)" if d.head_of_line else ""
        notes = "".join(f"; warning: {w}" for w in (warned or {}).get((d.namespace, d.name), ()))
        rows.append((str(i), f"{d.namespace}/{d.name}", d.decision + mark, d.reason,
                     d.message + notes))
    widths = [max(len(r[c]) for r in rows) for c in range(4)]
    lines = [f"policy {policy.name}, {fit} fit: "
             f"{sum(d.decision == 'dispatch' for d in decisions)} dispatch, "
             f"{sum(d.decision == 'wait' for d in decisions)} wait, "
             f"{sum(d.decision == 'invalid' for d in decisions)} invalid"]
    for r in rows:
        lines.append("  ".join(r[c].ljust(widths[c]) for c in range(4)) + "  " + r[4])
    return "\n".join(lines)
