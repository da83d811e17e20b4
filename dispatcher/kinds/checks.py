"""Checks of a parsed AppWrapper that need the kinds: what it may wrap, what looks wrong.

`check_kinds` refuses items of kinds the installation does not create (problems: the
AppWrapper is invalid). `warnings` notes what is accepted, as MCAD would, but is likely
not what the user meant (the controller posts each as a warning Event; `dispatcher
plan` prints them). Both are bounded like every message (dispatcher.api.messages).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from dispatcher.api.durations import declared_duration
from dispatcher.api.messages import cap_problems
from dispatcher.api.models import GROWTH_TYPES, AppWrapper, GenericItem
from dispatcher.api.names import GENERATED_SUFFIX, MAX_LABEL_VALUE
from dispatcher.api.unknown_fields import unknown_fields
from dispatcher.kinds import InvalidItem, PodSet, group_kind, infer_pod_sets, item_pod_sets
from dispatcher.kinds.scope import CLUSTER_SCOPED_KINDS, GroupKind, kind_name
from dispatcher.resources import PODS, format_resources
from dispatcher.wording import counted

# How many allowed kinds a refusal lists before "…".
_SHOWN_KINDS = 8


def check_kinds(
    aw: AppWrapper,
    allowed: Collection[GroupKind],
    cluster_scoped: Collection[GroupKind] = CLUSTER_SCOPED_KINDS,
) -> list[str]:
    """One problem per item whose kind is cluster-scoped or not in `allowed`.

    `cluster_scoped` defaults to the well-known kinds; a caller that can ask the API
    server (discovery) passes those plus what it learnt. Cluster-scoped kinds are refused
    even when `allowed` lists them. Items whose kind cannot be read are left to the
    other checks, which already report them.
    """
    problems: list[str] = []
    for index, item in enumerate(aw.spec.resources.GenericItems):
        try:
            gk = group_kind(item.generictemplate)
        except InvalidItem:
            continue
        where = f"spec.resources.GenericItems[{index}]"
        what = f"{gk[1]} {_item_name(item.generictemplate)}"
        if gk in cluster_scoped:
            problems.append(
                f"{where}: {what} is cluster-scoped ({kind_name(gk)}); an AppWrapper creates "
                "objects only in its own namespace: remove the item and have a cluster "
                "administrator create it")
        elif gk not in allowed:
            problems.append(
                f"{where}: {what} is of a kind this dispatcher does not create "
                f"({kind_name(gk)}; it creates {_listed(allowed)}): remove the item, or ask "
                f"the administrator to add {kind_name(gk)} to allowedKinds.add in the "
                "dispatcher's configuration")
    return cap_problems(problems)


def warnings(aw: AppWrapper) -> list[str]:
    """What the dispatcher accepts, as MCAD does, but the user should hear about."""
    found = unknown_fields(aw)
    growth = aw.spec.schedulingSpec.requeuing.growthType
    if growth not in GROWTH_TYPES:
        found.append(
            f"spec.schedulingSpec.requeuing.growthType: {growth!r} is not exponential, linear "
            "or none; the wait before a requeue will not grow (as in MCAD, which reads any "
            "other value as no growth)")
    for index, item in enumerate(aw.spec.resources.GenericItems):
        where = f"spec.resources.GenericItems[{index}]"
        found.extend(_declared_pods(where, item))
        found.extend(_long_name(where, item.generictemplate))
    duration = declared_duration(aw)
    if duration.problem is not None:
        found.append(duration.problem)
    return cap_problems(found, noun="warning")


def _declared_pods(where: str, item: GenericItem) -> list[str]:
    """custompodresources saying a number of pods other than the object will create."""
    if not item.custompodresources:
        return []
    try:
        inferred = infer_pod_sets(item.generictemplate)
        item_pod_sets(item.generictemplate, [c.model_dump() for c in item.custompodresources])
    except InvalidItem:
        return []  # refused: the problem says it
    if inferred is None:
        return []  # a kind the dispatcher cannot count: the declaration is all there is
    declared = sum(c.replicas for c in item.custompodresources)
    real = sum(s.count for s in inferred)
    if declared == real:
        return _declared_shapes(where, item, inferred)
    sets = [s for s in inferred if s.count]
    detail = f" ({' + '.join(f'{s.name} {s.count}' for s in sets)})" if len(sets) > 1 else ""
    template = item.generictemplate
    return [
        f"{where}.custompodresources: declares {counted(declared, 'pod')}, but "
        f"{template.get('kind')} {_item_name(template)} will create {counted(real, 'pod')}"
        f"{detail}; the dispatcher reserves "
        f"room for the {declared} declared, as MCAD does, and charges the quota what the pods "
        "really take: correct custompodresources, or remove it to let the dispatcher count "
        "the pods"
    ]


def pods_made(aw: AppWrapper) -> tuple[int, bool]:
    """How many pods the wrapped objects make: what the dispatcher infers from each,
    what custompodresources declares for a kind it cannot count; and whether it counted
    every one (False: one is of a kind it cannot count, a LeaderWorkerSet, whose pods only
    its declaration says)."""
    total, countable = 0, True
    for item in aw.spec.resources.GenericItems:
        try:
            inferred = infer_pod_sets(item.generictemplate)
        except InvalidItem:
            inferred = None
        if inferred is None:
            total += sum(c.replicas for c in item.custompodresources)
            countable = False
        else:
            total += sum(s.count for s in inferred)
    return total, countable


def _declared_shapes(where: str, item: GenericItem, inferred: Sequence[PodSet]) -> list[str]:
    """custompodresources declaring as many pods as the object will create, but pods that
    ask other amounts."""
    try:
        custom = item_pod_sets(item.generictemplate,
                               [c.model_dump() for c in item.custompodresources])
    except InvalidItem:
        return []
    if _requests(custom) == _requests(inferred):
        return []
    template = item.generictemplate
    return [
        f"{where}.custompodresources: declares {_shapes(custom)}, but {template.get('kind')} "
        f"{_item_name(template)} will create {_shapes(inferred, named=True)}; the dispatcher "
        "admits and holds what is declared, and a pod takes its gang's held room on a node "
        "by amount: one that asks more than its gang holds on any node must wait for free room, "
        "and the quota is charged what the pods really take. "
        "Correct custompodresources, or remove it to let the dispatcher count the pods"
    ]


def _requests(sets: Sequence[PodSet]) -> list[list[tuple[str, int]]]:
    return sorted(sorted((r, v) for r, v in s.request.items() if r != PODS and v)
                  for s in sets for _ in range(s.count))


def _shapes(sets: Sequence[PodSet], named: bool = False) -> str:
    return " + ".join(f"{s.name + ' ' if named else ''}{s.count} x "
                      f"({format_resources({**s.request, PODS: 0})})" for s in sets if s.count)


def _long_name(where: str, template: Mapping[str, Any]) -> list[str]:
    meta = template.get("metadata")
    if not isinstance(meta, Mapping):
        return []
    name, generate = meta.get("name"), meta.get("generateName")
    length = len(name) if isinstance(name, str) and name else (
        len(generate) + GENERATED_SUFFIX if isinstance(generate, str) and generate else 0)
    if length <= MAX_LABEL_VALUE:
        return []
    return [
        f"{where}.generictemplate.metadata: the name has {length} characters, more than a "
        f"label value's {MAX_LABEL_VALUE}: the object is created without MCAD's label "
        "resourceName (tools that select MCAD's objects by it will not find it)"
    ]


def _item_name(template: Mapping[str, Any]) -> str:
    meta = template.get("metadata")
    if isinstance(meta, Mapping):
        if isinstance(meta.get("name"), str) and meta["name"]:
            return repr(meta["name"])
        if isinstance(meta.get("generateName"), str) and meta["generateName"]:
            return repr(meta["generateName"] + "…")
    return "(unnamed)"


def _listed(kinds: Collection[GroupKind]) -> str:
    names = sorted(kind_name(gk) for gk in kinds)
    if not names:
        return "no kind at all"
    shown = ", ".join(names[:_SHOWN_KINDS])
    return shown + (f" and {len(names) - _SHOWN_KINDS} more" if len(names) > _SHOWN_KINDS else "")
