"""`dispatcher plan`: what would the dispatcher do with these AppWrappers on this cluster?

Reads Nodes and Pods (what `kubectl get nodes,pods -A -o yaml` prints) and AppWrapper
manifests, runs one admission cycle of the same core the controller uses, and reports
every decision in the order the policy considered it, with the warnings the controller
would post as Events.

QuotaSubtrees may come in any of the files (`kubectl get quotasubtrees -A -o yaml`). An
AppWrapper whose status says it is dispatched or running is admitted, not queued: it
counts against its quota, holds the pods the cluster files show for it, and a policy
with preemption may tear it down. A Completed or Failed one is left out.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from dispatcher import yaml_text
from dispatcher.admission import (
    FINISHED_STATES,
    NO_TOPOLOGY,
    Decision,
    Fit,
    admit,
    admitted_from_appwrapper,
    admitted_records,
    first_seen_of,
    is_admitted,
    queued_from_appwrapper,
)
from dispatcher.api.durations import DeclaredDuration, declared_duration
from dispatcher.api.models import AppWrapper
from dispatcher.cluster import ClusterState, bound_pod_from_object, node_from_object
from dispatcher.elastic import Scale
from dispatcher.eta import DurationRule, RunningWrapper, shape_of
from dispatcher.eta.reserve import reservations as plan_reservations
from dispatcher.fit.capacity import Capacity
from dispatcher.fit.topology import Topology
from dispatcher.kinds.scope import DEFAULT_ALLOWED_KINDS, GroupKind
from dispatcher.preemption import AdmittedWrapper, quota_ledger
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import AdmissionQueue, QueuedWrapper, WrapperKey
from dispatcher.queue.reservation import Reservations
from dispatcher.quota import QUOTA_KIND, QuotaForest, QuotaLedger, QuotaPlacement
from dispatcher.resources import (
    QuantityError,
    amount_number,
    format_amount,
    format_resources,
    resource_order,
)
from dispatcher.review import review
from dispatcher.wording import printable

LIST_KINDS = frozenset({"List", "NodeList", "PodList", "AppWrapperList"})


#: What a --cluster file should be, said when it is empty.
CLUSTER_FILE = "a cluster snapshot (kubectl get nodes,pods -A -o yaml > FILE)"


class InputError(Exception):
    """A file that cannot be used at all; the message names the file and document."""


@dataclass(frozen=True)
class Document:
    where: str  # "cluster.yaml, document 2, item 5"
    obj: Mapping[str, Any]


def read_documents(path: Path) -> Iterator[Document]:
    try:
        text = yaml_text.read(path)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {e.strerror or e}") from e
    try:
        docs = yaml_text.load_all(text, str(path))
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


def load_cluster(paths: Sequence[Path],
                 subtrees: list[Mapping[str, Any]] | None = None) -> ClusterState:
    """Nodes and Pods; QuotaSubtrees go to `subtrees` (an error without it)."""
    return cluster_from_documents(
        (d for path in paths for d in read_some_documents(path, CLUSTER_FILE)), subtrees)


def cluster_from_documents(docs: Iterable[Document],
                           subtrees: list[Mapping[str, Any]] | None = None) -> ClusterState:
    """`load_cluster` of documents read (or listed) already."""
    state = ClusterState()
    pods: list[Document] = []
    for doc in docs:
        kind = doc.obj.get("kind")
        if kind == QUOTA_KIND and subtrees is not None:
            subtrees.append(doc.obj)
        elif kind == "Node":
            try:
                state.upsert_node(node_from_object(doc.obj))
            except (KeyError, QuantityError, ValueError, TypeError) as e:
                raise InputError(f"{doc.where}: not a usable Node: {e}") from e
        elif kind == "Pod":
            pods.append(doc)
        else:
            raise InputError(
                f"{doc.where}: a cluster file holds Nodes, Pods and QuotaSubtrees (or "
                f"Lists of them), not {kind or 'an object without kind'}"
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
    """What the AppWrapper files hold: the queue, the admitted wrappers, QuotaSubtrees,
    and the warnings of each AppWrapper (by namespace and name)."""

    queued: list[QueuedWrapper] = field(default_factory=list)
    admitted: list[AppWrapper] = field(default_factory=list)
    subtrees: list[Mapping[str, Any]] = field(default_factory=list)
    warnings: dict[WrapperKey, list[str]] = field(default_factory=dict)
    # The valid queued ones as parsed (what they declare of their duration, for one).
    specs: dict[WrapperKey, AppWrapper] = field(default_factory=dict)


def load_appwrappers(paths: Sequence[Path], now: float,
                     allowed: Collection[GroupKind] = DEFAULT_ALLOWED_KINDS) -> Loaded:
    """Every AppWrapper document, valid or not; invalid ones carry their reason. Items of
    kinds not in `allowed` (or cluster-scoped) make their AppWrapper invalid."""
    return appwrappers_from_documents(
        (d for path in paths for d in read_some_documents(path)), now, allowed)


def read_some_documents(path: Path, what: str = "the file of the AppWrappers to plan"
                        ) -> list[Document]:
    """`read_documents`; a file with none (empty, or only comments) is an InputError naming
    `what` it should be: a plan of nothing (or on a cluster of nothing) would look like a
    plan that found nothing to say (or that nothing fits)."""
    docs = list(read_documents(path))
    if not docs:
        raise InputError(f"{path}: no document in it (the file is empty): give {what}")
    return docs


def appwrappers_from_documents(docs: Iterable[Document], now: float,
                               allowed: Collection[GroupKind] = DEFAULT_ALLOWED_KINDS,
                               warn: bool = True) -> Loaded:
    """`load_appwrappers` of documents read (or listed) already; without `warn`, none
    gets warnings."""
    loaded = Loaded()
    wrappers = loaded.queued
    seen: dict[tuple[str, str], str] = {}
    index = 0
    for doc in docs:
        if doc.obj.get("kind") == QUOTA_KIND:
            loaded.subtrees.append(doc.obj)
            continue
        if doc.obj.get("kind") != "AppWrapper":
            raise InputError(
                f"{doc.where}: expected an AppWrapper or a QuotaSubtree, got "
                f"{doc.obj.get('kind') or 'no kind'}"
            )
        index += 1
        # Without a creation time a wrapper counts as just submitted, in read order.
        default_seen = now + index * 1e-6
        meta = doc.obj.get("metadata") or {}
        ns = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or f"<unnamed {index}>")
        checked = review(doc.obj, default_seen, allowed, warn=warn)
        aw = checked.appwrapper
        if aw is not None and _finished(aw):
            continue
        loaded.warnings.setdefault((ns, name), checked.warnings)
        wrapper = checked.queued or QueuedWrapper(ns, name, f"~{index}", default_seen,
                                                  invalid=checked.message)
        if aw is not None and checked.queued is not None and is_admitted(aw) \
                and wrapper.key not in seen:
            seen[wrapper.key] = doc.where
            loaded.admitted.append(aw)
            continue
        if not wrapper.uid:
            wrapper = replace(wrapper, uid=f"~{index:08d}")
        if wrapper.key in seen:
            wrapper = QueuedWrapper(
                ns, name, f"~{index:08d}", wrapper.first_seen,
                invalid=f"duplicate AppWrapper {ns}/{name}: also in {seen[wrapper.key]}",
            )
        else:
            seen[wrapper.key] = doc.where
            if aw is not None:
                loaded.specs[wrapper.key] = aw
        wrappers.append(wrapper)
    return loaded


def _finished(aw: AppWrapper) -> bool:
    return bool({aw.status.state, aw.status.queuejobstate} & FINISHED_STATES)


@dataclass
class PlanResult:
    decisions: list[Decision]
    admitted: list[AdmittedWrapper]
    ledger: QuotaLedger | None  # quota usage after the decisions (None: no quota trees)
    problems: list[str]  # QuotaSubtrees that could not be used, one line each
    # Where each admitted wrapper sat in the quota trees before the decisions.
    admitted_quota: dict[WrapperKey, tuple[QuotaPlacement, ...]] = field(default_factory=dict)
    # Elastic gangs admitted before, grown (or, in `preempt` decisions, shrunk) now.
    scaling: list[Scale] = field(default_factory=list)

    @property
    def preempted(self) -> set[WrapperKey]:
        return {k for d in self.decisions for k in d.preempts}


def plan(state: ClusterState, wrappers: Sequence[QueuedWrapper], policy: Policy,
         fit: Fit, now: float, admitted: Sequence[AppWrapper] = (),
         subtrees: Sequence[Mapping[str, Any]] = (),
         topology: Topology = NO_TOPOLOGY,
         reservations: Reservations | None = None,
         specs: Mapping[WrapperKey, AppWrapper] | None = None,
         name_all: bool = False) -> PlanResult:
    """One admission cycle. Under a policy that reserves, the head's reservation is
    planned (unless given) with the durations the wrappers declare (`specs`), else the
    default. `name_all`: messages name the wrappers of every namespace (offline, where
    the user gave the whole snapshot), not only of the wrapper's own."""
    queue = AdmissionQueue(policy)
    duplicates: list[QueuedWrapper] = []
    for w in wrappers:
        if w.key in queue:
            duplicates.append(w)
        else:
            queue.put(w)
    records = admitted_records(admitted, state, now)
    forest = QuotaForest.from_objects(subtrees)
    ledger = quota_ledger(forest, records) if forest else None
    before = {a.key: ledger.placements(a.key) for a in records} if ledger is not None else {}
    scaling: list[Scale] = []
    if policy.reserve and reservations is None:
        rule = DurationRule()
        reservations = plan_reservations(
            queue.ordered(now), running_wrappers(admitted, state, rule, now),
            Capacity.of(state), policy, now, expected_durations(wrappers, specs or {}, rule),
            fit=fit, topology=topology)
    decisions = admit([*queue.ordered(now), *duplicates], Capacity.of(state), policy, now, fit,
                      quota=ledger, admitted=records, scaling=scaling, topology=topology,
                      reservations=reservations, name_all=name_all)
    return PlanResult(decisions, records, ledger, list(forest.problems), before, scaling)


def expected_durations(queued: Sequence[QueuedWrapper], specs: Mapping[WrapperKey, AppWrapper],
                       rule: DurationRule) -> dict[WrapperKey, float]:
    """How long each queued wrapper is expected to run: what it declares, else the
    default (a plan has no history of completed wrappers)."""
    return {w.key: rule.expected(declared_duration(specs[w.key]) if w.key in specs
                                 else DeclaredDuration(), w.namespace,
                                 shape_of(w.demand)).seconds for w in queued}


def running_wrappers(admitted: Sequence[AppWrapper], state: ClusterState, rule: DurationRule,
                     now: float) -> list[RunningWrapper]:
    """The admitted wrappers, each to end when its expected duration says."""
    out = []
    for aw in admitted:
        key = (aw.metadata.namespace, aw.metadata.name)
        record = admitted_from_appwrapper(aw, state.holdings(key), now)
        gang = queued_from_appwrapper(aw, first_seen_of(aw, now))
        shape = shape_of(gang.demand)
        expected = rule.expected(declared_duration(aw), aw.metadata.namespace, shape)
        left = rule.remaining(expected, now - record.dispatched_at, aw.metadata.namespace,
                              shape)
        out.append(RunningWrapper(key, record.holdings, now + left, record, gang,
                                  expected.seconds))
    return out


def _quota_json(placements: Sequence[QuotaPlacement]) -> list[dict[str, Any]]:
    return [{"tree": q.tree, "leaf": q.leaf, "node": q.node, "borrows": q.borrows}
            for q in placements]


Warnings = Mapping[WrapperKey, Sequence[str]]


def to_json(result: PlanResult, policy: Policy, fit: Fit,
            warned: Warnings | None = None) -> str:
    out = []
    for d in result.decisions:
        entry: dict[str, Any] = {
            "namespace": d.namespace, "name": d.name, "decision": d.decision,
            "reason": d.reason, "message": d.message,
            "warnings": list((warned or {}).get((d.namespace, d.name), ())),
        }
        if d.decision in ("dispatch", "preempt"):
            entry["placements"] = [
                {"item": p.item, "podSet": p.pod_set, "pod": p.pod, "node": p.node}
                for p in d.placements
            ]
        if d.decision == "preempt":
            entry["preempts"] = [f"{ns}/{n}" for ns, n in d.preempts]
            entry["reclaims"] = [f"{ns}/{n}" for ns, n in d.reclaims]
            if d.shrinks:
                entry["scalesIn"] = [_scale_json(x) for x in d.shrinks]
        if d.elastic:
            entry["elasticPods"] = list(d.elastic)
        if result.ledger is not None:
            entry["quota"] = _quota_json(d.quota)
        out.append(entry)
    doc: dict[str, Any] = {"policy": policy.name, "fit": fit, "decisions": out}
    if result.scaling:
        doc["scaling"] = [_scale_json(x) for x in result.scaling]
    ledger = result.ledger
    if ledger is not None or result.problems:
        doc["admitted"] = [
            {"namespace": a.namespace, "name": a.name, "preempted": a.key in result.preempted,
             "quota": _quota_json(result.admitted_quota.get(a.key, ()))}
            for a in result.admitted]
        doc["quota"] = {"problems": result.problems, "nodes": [
            {"tree": u.tree, "name": u.name, "parent": u.parent, "hardLimit": u.hard,
             "nominal": u.nominal, "used": u.used, "borrowed": u.borrowed}
            for u in (ledger.usage() if ledger is not None else [])]}
    return json.dumps(doc, indent=2)


def _scale_json(s: Scale) -> dict[str, Any]:
    return {"namespace": s.namespace, "name": s.name, "reason": s.reason,
            "message": s.message, "before": list(s.before), "after": list(s.after),
            **({"removes": [n for names in s.removed_names for n in names]}
               if not s.out else {})}


def _quota_cell(placements: Sequence[QuotaPlacement]) -> str:
    def one(q: QuotaPlacement) -> str:
        if q.node is None:
            return f"{q.leaf} (no room)"
        return f"{q.leaf} borrowing from {q.node}" if q.borrows else q.leaf

    if len(placements) == 1:
        return one(placements[0])
    return "; ".join(f"{q.tree}: {one(q)}" for q in placements) or "-"


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows left-aligned in columns; the last column is not padded. Cells may quote what
    a tenant wrote: made printable before they are measured."""
    rows = [[printable(v) for v in r] for r in rows]
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]) - 1)]
    return ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)) + "  " + r[-1]
            for r in rows]


def to_table(result: PlanResult, policy: Policy, fit: Fit,
             warned: Warnings | None = None) -> str:
    decisions = result.decisions
    with_quota = result.ledger is not None
    header = ["#", "APPWRAPPER", "DECISION", "REASON", *(["QUOTA"] if with_quota else []),
              "MESSAGE"]
    rows = [header]
    for i, d in enumerate(decisions, start=1):
        mark = " (head)" if d.head_of_line else ""
        notes = "".join(f"; warning: {w}" for w in (warned or {}).get((d.namespace, d.name), ()))
        rows.append([str(i), f"{d.namespace}/{d.name}", d.decision + mark, d.reason,
                     *([_quota_cell(d.quota) or "-"] if with_quota else []),
                     d.message + notes])
    counts = [f"{sum(d.decision == 'dispatch' for d in decisions)} dispatch",
              *([f"{sum(d.decision == 'preempt' for d in decisions)} preempt"]
                if policy.preemption != "never" else []),
              f"{sum(d.decision == 'wait' for d in decisions)} wait",
              f"{sum(d.decision == 'invalid' for d in decisions)} invalid"]
    lines = [f"policy {policy.name}, {fit} fit: " + ", ".join(counts), *_columns(rows)]
    lines.extend(f"quota problem: {p}" for p in result.problems)
    shrinks = [x for d in decisions for x in d.shrinks]
    if result.scaling or shrinks:
        lines += ["", "elastic gangs admitted before this cycle:"]
        lines += [f"  {x.namespace}/{x.name}: {x.message}" for x in [*shrinks, *result.scaling]]
    if result.ledger is not None:
        lines.extend(_admitted_lines(result))
        lines.extend(_usage_lines(result.ledger))
    return "\n".join(printable(line) for line in lines)


def _admitted_lines(result: PlanResult) -> list[str]:
    if not result.admitted:
        return []
    parts = [f"{a.namespace}/{a.name} ({_quota_cell(result.admitted_quota.get(a.key, ()))}"
             + ("; preempted" if a.key in result.preempted else "") + ")"
             for a in result.admitted]
    return ["", f"admitted before this cycle ({len(parts)}): " + ", ".join(parts)]


def _usage_lines(ledger: QuotaLedger) -> list[str]:
    rows = [["TREE", "NODE", "HARD", "USED / NOMINAL", "BORROWED"]]
    last_tree = ""
    for u in ledger.usage():
        used = ", ".join(
            f"{amount_number(r, u.used.get(r, 0))}/{format_amount(r, u.nominal.get(r, 0))}"
            for r in sorted(set(u.nominal) | set(u.used), key=resource_order))
        rows.append([u.tree if u.tree != last_tree else "", "  " * u.depth + u.name,
                     "yes" if u.hard else "", used or "-",
                     format_resources(u.borrowed) if u.borrowed else "-"])
        last_tree = u.tree
    return ["", "quota usage after these decisions (used: wrappers at or under the node; "
            "borrowed: the part placed above it):", *_columns(rows)]
