"""The pod sets of a v1beta2 AppWrapper's components: declared (``podSets``) or inferred.

A component may declare its pod sets, each ``replicas`` pods from the pod template at
``path`` inside the component (``template.spec.template``, ``template`` for a Pod). For
a kind the dispatcher knows, declared sets must be the ones it infers (as many, same
templates, same replicas: codeflare's webhook rule); a kind it does not know (a
LeaderWorkerSet) counts only what is declared, and declares nothing when it makes no
pods (a Service). ``podSetInfos`` add labels,
annotations, a node selector, tolerations and scheduling gates to the pod template of
the pod set at the same position, before its pods are counted and created.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dispatcher.api.conversion import ComponentFields
from dispatcher.api.v1beta2 import MAX_POD_SETS, MIN_POD_SETS
from dispatcher.kinds import group_kind, infer_pod_sets, pod_set_from_template, pod_template_paths
from dispatcher.kinds.base import InvalidItem, Path, path_text
from dispatcher.kinds.podset import PodSet
from dispatcher.kinds.registry import HANDLERS
from dispatcher.wording import counted

_STEP = re.compile(r"([A-Za-z_][A-Za-z0-9_-]*)((?:\[\d+\])*)")
_INDEX = re.compile(r"\[(\d+)\]")
_ROOT = "template"


def parse_path(text: object, where: str) -> Path:
    """``template.spec.workers[0].template`` -> ``("spec", "workers", 0, "template")``
    (the path inside the component's template)."""
    if not isinstance(text, str) or not text:
        raise InvalidItem(f"{where}.path: must be a path such as template.spec.template")
    steps: list[str | int] = []
    for part in text.split("."):
        match = _STEP.fullmatch(part)
        if match is None:
            raise InvalidItem(f"{where}.path: {text!r} is not a path such as "
                              "template.spec.template (names joined by dots, [n] for a "
                              "list entry)")
        steps.append(match.group(1))
        steps.extend(int(i) for i in _INDEX.findall(match.group(2)))
    if steps[0] != _ROOT:
        raise InvalidItem(f"{where}.path: {text!r} must start with {_ROOT}, the component's "
                          "template")
    return tuple(steps[1:])


def _resolve(obj: Mapping[str, Any], path: Path, text: str, where: str) -> Mapping[str, Any]:
    at: Any = obj
    for step in path:
        if isinstance(step, int):
            found = isinstance(at, list) and step < len(at)
            at = at[step] if found else None
        else:
            at = at.get(step) if isinstance(at, Mapping) else None
        if at is None:
            raise InvalidItem(f"{where}.path: {text!r} is not in the component's template")
    if not (isinstance(at, Mapping) and isinstance(at.get("spec"), Mapping)
            and isinstance(at["spec"].get("containers"), list)):
        raise InvalidItem(f"{where}.path: {text!r} is not a pod template (a mapping whose "
                          "spec lists containers)")
    return at


def declared_paths(fields: ComponentFields, where: str) -> list[Path]:
    return [parse_path(ps.get("path"), f"{where}.podSets[{j}]")
            for j, ps in enumerate(fields.pod_sets)]


def template_paths(obj: Mapping[str, Any], fields: ComponentFields,
                   where: str = "spec.components[i]") -> list[Path]:
    """The paths of the component's pod templates: declared, else inferred."""
    if fields.pod_sets:
        return declared_paths(fields, where)
    return [tuple(p) for p in pod_template_paths(obj)] if _known(obj) else []


def component_pod_sets(obj: Mapping[str, Any], fields: ComponentFields,
                       where: str) -> list[PodSet]:
    """The pod sets of a v1beta2 component (`obj` its template, podSetInfos applied)."""
    inferred = infer_pod_sets(obj) if _known(obj) else None
    if not fields.pod_sets:
        return inferred or []
    declared: list[PodSet] = []
    paths = declared_paths(fields, where)
    for j, (ps, path) in enumerate(zip(fields.pod_sets, paths, strict=True)):
        text = str(ps.get("path"))
        replicas = ps.get("replicas")
        count = 1 if replicas is None else replicas
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidItem(f"{where}.podSets[{j}].replicas: must be 0 or more, got "
                              f"{replicas!r}")
        template = _resolve(obj, path, text, f"{where}.podSets[{j}]")
        declared.append(pod_set_from_template(text, count, template, path=path_text(path)))
    if inferred is not None:
        _check_against(obj, [(p, s.count) for p, s in zip(paths, declared, strict=True)],
                       where)
    return declared


def _check_against(obj: Mapping[str, Any], declared: Sequence[tuple[Path, int]],
                   where: str) -> None:
    """For a kind the dispatcher knows, what is declared must be what it will create."""
    counts = {t.path: t.count for t in HANDLERS[group_kind(obj)](obj) if t.path is not None}
    if len(declared) != len(counts):
        # codeflare's webhook refuses it too: an undeclared template's pods would run
        # outside the room and the quota the declared ones were admitted with.
        listed = ", ".join(path_text((_ROOT, *p)) for p in counts) or "no path"
        raise InvalidItem(
            f"{where}.podSets: declares {counted(len(declared), 'pod set')}, but "
            f"{obj.get('kind')} has {counted(len(counts), 'pod template')} ({listed}): "
            "declare one pod set for each, or remove podSets to let them be counted")
    first: dict[Path, int] = {}
    for j, (path, count) in enumerate(declared):
        text = path_text((_ROOT, *path))
        if path in first:
            # As many pod sets as templates, one twice: another template is left out.
            raise InvalidItem(
                f"{where}.podSets[{j}].path: {text} is declared already (podSets"
                f"[{first[path]}]); declare each of {obj.get('kind')}'s pod templates once: "
                f"{', '.join(path_text((_ROOT, *p)) for p in counts)}")
        first[path] = j
        if path not in counts:
            raise InvalidItem(
                f"{where}.podSets[{j}].path: {obj.get('kind')} has no pod template at "
                f"{text}; its pod templates are at "
                f"{', '.join(path_text((_ROOT, *p)) for p in counts) or 'no path'}")
        if counts[path] != count:
            raise InvalidItem(
                f"{where}.podSets[{j}].replicas: is {count}, but {obj.get('kind')} will "
                f"create {counts[path]} pods from {text}: correct replicas, or remove "
                "podSets to let them be counted")


def _known(obj: Mapping[str, Any]) -> bool:
    return infer_pod_sets(obj) is not None


def pod_set_count_problems(total: int) -> list[str]:
    """A v1beta2 AppWrapper has 1 to 8 pod sets in all."""
    if MIN_POD_SETS <= total <= MAX_POD_SETS:
        return []
    if total < MIN_POD_SETS:
        return ["spec.components: no component creates pods: declare podSets (replicas "
                "and the path of the pod template) for a kind whose pods cannot be inferred"]
    return [f"spec.components: {total} pod sets, more than the {MAX_POD_SETS} an AppWrapper "
            "may have: split the components into several AppWrappers"]


def with_pod_set_infos(obj: Mapping[str, Any], paths: Sequence[Path],
                       fields: ComponentFields, where: str) -> dict[str, Any]:
    """A copy of `obj` with each podSetInfo added to the pod template at the same
    position; more infos than pod sets is refused."""
    out = copy.deepcopy(dict(obj))
    if len(fields.pod_set_infos) > len(paths):
        raise InvalidItem(f"{where}.podSetInfos: {len(fields.pod_set_infos)} entries for "
                          f"{len(paths)} pod sets: one entry per pod set, in their order")
    for info, path in zip(fields.pod_set_infos, paths, strict=False):
        template: Any = out
        for step in path:
            template = template[step]
        _apply(template, info)
    return out


def _apply(template: dict[str, Any], info: Mapping[str, Any]) -> None:
    meta = template.setdefault("metadata", {})
    spec = template.setdefault("spec", {})
    for key, holder, field in (("labels", meta, "labels"),
                               ("annotations", meta, "annotations"),
                               ("nodeSelector", spec, "nodeSelector")):
        if info.get(key):
            holder[field] = {**(holder.get(field) or {}), **copy.deepcopy(info[key])}
    for key in ("tolerations", "schedulingGates"):
        if info.get(key):
            spec[key] = [*(spec.get(key) or []), *copy.deepcopy(info[key])]


def component_view(obj: Mapping[str, Any], fields: ComponentFields,
                   where: str) -> tuple[dict[str, Any], list[PodSet]]:
    """A v1beta2 component's template with its podSetInfos applied, and its pod sets.
    Every InvalidItem raised names the component (`where`)."""
    try:
        paths = template_paths(obj, fields, where)
        template = with_pod_set_infos(obj, paths, fields, where)
        return template, component_pod_sets(template, fields, where)
    except InvalidItem as e:
        if str(e).startswith(where):
            raise
        raise InvalidItem(f"{where}.template: {e}") from None
