"""What a wrapped object will create, as pod sets.

Kinds are matched by (API group, kind), any version of the group. With
`custompodresources` the user's list wins (MCAD semantics); otherwise the pods are
inferred from the object, with the defaults the API server would have applied.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dispatcher.kinds.base import InvalidItem, Template, as_map, count, path_text
from dispatcher.kinds.podset import (
    NO_CONSTRAINTS,
    PodConstraints,
    PodSet,
    Requirement,
    Toleration,
    TopologyRequest,
)
from dispatcher.kinds.podspec import constraints_of, pod_set_from_template, topology_request
from dispatcher.kinds.registry import HANDLERS as _HANDLERS
from dispatcher.kinds.registry import KNOWN_KINDS, NO_POD_KINDS
from dispatcher.resources import PODS, ResourceSpecError, format_amount, is_extended, resource_list
from dispatcher.wording import counted

__all__ = [
    "APPWRAPPER_KINDS",
    "KNOWN_KINDS",
    "NO_POD_KINDS",
    "InvalidItem",
    "PodConstraints",
    "PodSet",
    "Requirement",
    "Toleration",
    "TopologyRequest",
    "constraints_of",
    "found_pod_template_paths",
    "group_kind",
    "infer_pod_sets",
    "item_pod_sets",
    "pod_set_from_template",
    "pod_template_paths",
    "topology_request",
]

APPWRAPPER_KINDS: frozenset[tuple[str, str]] = frozenset({
    ("workload.codeflare.dev", "AppWrapper"),
    ("mcad.ibm.com", "AppWrapper"),  # MCAD's original group
})


def group_kind(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(API group, kind) of an object; the core group is ""."""
    if not isinstance(obj, Mapping):
        raise InvalidItem("the wrapped object must be a map with apiVersion, kind and metadata")
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    missing = [f for f, v in (("apiVersion", api_version), ("kind", kind)) if not v]
    if missing:
        raise InvalidItem(
            f"the wrapped object has no {' and no '.join(missing)}: every object needs both, "
            "e.g. apiVersion: batch/v1 and kind: Job"
        )
    if not isinstance(api_version, str) or not isinstance(kind, str):
        raise InvalidItem("apiVersion and kind must be strings, e.g. apiVersion: batch/v1")
    group, _, version = api_version.rpartition("/")
    if not version or "/" in group:
        raise InvalidItem(
            f"apiVersion {api_version!r} is not group/version or version, e.g. batch/v1 or v1"
        )
    if (group, kind) in APPWRAPPER_KINDS:
        raise InvalidItem("an AppWrapper cannot wrap another AppWrapper: wrap its items directly")
    return group, kind


def _templates(obj: Mapping[str, Any]) -> list[Template] | None:
    handler = _HANDLERS.get(group_kind(obj))
    return None if handler is None else handler(obj)


def _pod_set(t: Template) -> PodSet:
    path = t.path or ()
    template = None if t.template is None else as_map(t.template, path)
    return pod_set_from_template(t.name, t.count, template, path=path_text(path))


def infer_pod_sets(obj: Mapping[str, Any]) -> list[PodSet] | None:
    """The pod sets `obj` will create: None for a kind the dispatcher does not know,
    [] for a known kind that creates no pods.

    One set per pod template, in the object's order (kubeflow replica types in
    case-insensitive alphabetical order), including sets of 0 pods (a suspended Ray
    worker group, an MPIJob without workers), so sets line up with templates.
    """
    templates = _templates(obj)
    return None if templates is None else [_pod_set(t) for t in templates]


def pod_template_paths(obj: Mapping[str, Any]) -> list[list[str | int]]:
    """JSON paths of every pod template in `obj` ([] for the object itself, a Pod).

    Only templates present in the object: a RayJob's default submitter pod has none.
    Unknown kinds have none. Raises InvalidItem as `infer_pod_sets` does.
    """
    templates = _templates(obj) or []
    return [
        list(t.path) for t in templates
        if t.path is not None and isinstance(t.template, Mapping)
    ]


def found_pod_template_paths(obj: Mapping[str, Any]) -> list[list[str | int]]:
    """JSON paths of every pod template inside an object of a kind the dispatcher does not
    know: each mapping below the top whose spec lists containers (what a v1beta2 podSets
    path must reach), the outermost only, in the object's order.

    Its kind's handler would say where they are; without one, these are labelled and gated
    as a known kind's are, so that its pods count for their gang, take its room, and are
    charged to its quota, whatever was declared: unseen, they would run in free room,
    outside every gang's quota."""
    found: list[list[str | int]] = []
    todo: list[tuple[Any, list[str | int]]] = [(obj, [])]
    while todo:
        at, path = todo.pop()
        children: list[tuple[str | int, Any]]
        if isinstance(at, Mapping):
            spec = at.get("spec")
            if path and isinstance(spec, Mapping) and isinstance(spec.get("containers"), list):
                found.append(path)
                continue
            children = [(str(k), v) for k, v in at.items()]
        elif isinstance(at, list):
            children = list(enumerate(at))
        else:
            continue
        todo.extend((v, [*path, k]) for k, v in reversed(children))
    return found


def _unknown_kind(obj: Mapping[str, Any], index: int | None) -> InvalidItem:
    item = f"spec.resources.GenericItems[{'i' if index is None else index}]"
    return InvalidItem(
        f"kind {obj.get('kind')} ({obj.get('apiVersion')}) is not one the dispatcher knows how "
        f"to count pods for: add {item}.custompodresources listing its pods' replicas and "
        "requests"
    )


def _custom_pod_set(i: int, entry: object, constraints: PodConstraints) -> PodSet:
    where = f"custompodresources[{i}]"
    if not isinstance(entry, Mapping):
        raise InvalidItem(f"{where} must be a map with replicas, requests and limits")
    replicas = count(entry, "replicas", (where,), 1)
    try:
        limits = resource_list(entry.get("limits"), f"{where}.limits")
        requests = resource_list(entry.get("requests"), f"{where}.requests")
    except ResourceSpecError as e:
        raise InvalidItem(str(e)) from None
    request = {**limits, **requests}  # a missing request is its limit, as for containers
    request[PODS] = request.get(PODS, 0) + 1
    return PodSet(f"custom/{i}", replicas, request, constraints)


def item_pod_sets(
    obj: Mapping[str, Any],
    custompodresources: Sequence[Mapping[str, Any]] | None,
    *,
    index: int | None = None,
) -> list[PodSet]:
    """The pod sets of one GenericItem: its custompodresources if any, else inferred.

    A custompodresources entry is `replicas` pods (missing: 1) each requesting
    `requests`, any missing resource defaulting to `limits`. Their node rules and topology
    request come from the object when it can say: pairwise when its kind is known and it
    has as many pod templates as there are entries, else from its only template, else none.
    `index` (the item's position) makes error messages point at the exact item.
    """
    if not custompodresources:
        inferred = infer_pod_sets(obj)
        if inferred is None:
            raise _unknown_kind(obj, index)
        return inferred
    inferred = infer_pod_sets(obj)
    templates = inferred or []
    rules: list[tuple[PodConstraints, TopologyRequest | None]]
    if len(templates) == len(custompodresources):
        rules = [(t.constraints, t.topology) for t in templates]
    elif len(templates) == 1:
        rules = [(templates[0].constraints, templates[0].topology)] * len(custompodresources)
    else:
        rules = [(NO_CONSTRAINTS, None)] * len(custompodresources)
    declared = [
        dataclasses.replace(_custom_pod_set(i, entry, c), topology=topology)
        for i, (entry, (c, topology)) in enumerate(zip(custompodresources, rules, strict=True))
    ]
    if inferred is not None:
        _check_extended(obj, declared, inferred)
    return declared


def _extended_totals(sets: Sequence[PodSet]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for s in sets:
        for name, amount in s.request.items():
            if is_extended(name) and amount * s.count:
                totals[name] = totals.get(name, 0) + amount * s.count
    return totals


def _check_extended(obj: Mapping[str, Any], declared: Sequence[PodSet],
                    inferred: Sequence[PodSet]) -> None:
    """custompodresources may not declare less of a GPU or other extended resource than the
    object's pods will ask: the gang is admitted, charged to its quota and held room for what
    is declared, and the rest would be taken from room and quota that are someone else's.
    (Less cpu or memory is left as MCAD accepts it: its own test AppWrappers declare so.)"""
    wanted, said = _extended_totals(inferred), _extended_totals(declared)
    short = sorted(name for name, amount in wanted.items() if said.get(name, 0) < amount)
    if not short:
        return
    pods = sum(s.count for s in inferred)
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    kind = f"{obj.get('kind')} {name}" if isinstance(name, str) and name else str(obj.get("kind"))
    gaps = "; ".join(
        f"declares {format_amount(name, said.get(name, 0))} in all, but {kind} will create "
        f"{counted(pods, 'pod')} asking {format_amount(name, wanted[name])} "
        "in all" for name in short)
    raise InvalidItem(f"custompodresources: {gaps}: correct custompodresources (replicas and "
                      "requests of every pod), or remove it to let the dispatcher count the pods")
