"""The wrapped objects as the dispatcher creates them.

Each object gets an owner reference to its AppWrapper (so deleting the AppWrapper lets
the garbage collector delete it) and the AppWrapper label, also on every pod template
inside it, so the AppWrapper's pods can be found and counted; MCAD's two labels go
beside it. Names are fixed before creation — `generateName` becomes a name derived from
the AppWrapper's uid — so that creating the same item twice (after a restart, say) can
never make a second copy.

What the user wrote is not trusted with ownership: owner references in the template
(which could make another AppWrapper adopt the object, or its pods) are dropped, and
the fields the API server sets itself (uid, resourceVersion, status…) are removed.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
from collections.abc import Mapping
from typing import Any

from dispatcher.api.conversion import ComponentFields, ConversionError, v1beta2_fields
from dispatcher.api.labels import (
    APPWRAPPER_LABEL,
    MCAD_APPWRAPPER_LABEL,
    MCAD_RESOURCE_NAME_LABEL,
)
from dispatcher.api.models import API_GROUP, API_VERSION, AppWrapper
from dispatcher.api.names import MAX_LABEL_VALUE, is_label_value
from dispatcher.kinds import (
    InvalidItem,
    found_pod_template_paths,
    infer_pod_sets,
    pod_template_paths,
)
from dispatcher.kinds.declared import template_paths, with_pod_set_infos

__all__ = ["MAX_LABEL_VALUE", "owned_by", "owner_reference", "prepared_items", "stable_name"]

# Set by the API server, never by whoever creates the object.
_SERVER_FIELDS = ("uid", "resourceVersion", "creationTimestamp", "selfLink", "managedFields",
                  "generation", "deletionTimestamp", "deletionGracePeriodSeconds")


def owner_reference(aw: AppWrapper) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "AppWrapper",
        "name": aw.metadata.name,
        "uid": aw.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def stable_name(generate_name: str, uid: str, index: int) -> str:
    suffix = hashlib.sha256(f"{uid}/{index}".encode()).hexdigest()[:5]
    return f"{generate_name}{suffix}"


def _at(obj: Any, path: list[str | int]) -> Any:
    for step in path:
        obj = obj[step]
    return obj


def _labels(aw: AppWrapper, item_name: str) -> dict[str, str]:
    labels = {APPWRAPPER_LABEL: aw.metadata.name, MCAD_APPWRAPPER_LABEL: aw.metadata.name}
    # A name longer than a label value allows (a subdomain may have 253 characters) would
    # make the API server refuse the object: go without that label (warnings() says so).
    if is_label_value(item_name):
        labels[MCAD_RESOURCE_NAME_LABEL] = item_name
    return labels


def _metadata(holder: dict[str, Any]) -> dict[str, Any]:
    meta = holder.get("metadata")
    if not isinstance(meta, dict):
        meta = holder["metadata"] = {}
    return meta


def _set_labels(meta: dict[str, Any], labels: Mapping[str, str]) -> None:
    current = meta.get("labels")
    meta["labels"] = {**(current if isinstance(current, Mapping) else {}), **labels}


def prepared_items(aw: AppWrapper) -> list[dict[str, Any]]:
    """The objects to create for `aw`, in GenericItems order."""
    out: list[dict[str, Any]] = []
    for index, item in enumerate(aw.spec.resources.GenericItems):
        obj = _with_pod_set_infos(aw, index, copy.deepcopy(dict(item.generictemplate)))
        meta = _metadata(obj)
        meta["namespace"] = aw.metadata.namespace
        if not meta.get("name"):
            meta["name"] = stable_name(str(meta.get("generateName") or "item-"),
                                       aw.metadata.uid, index)
        meta.pop("generateName", None)
        for field in _SERVER_FIELDS:
            meta.pop(field, None)
        labels = _labels(aw, str(meta["name"]))
        _set_labels(meta, labels)
        meta["ownerReferences"] = [owner_reference(aw)]
        obj.pop("status", None)
        for path in pod_paths(aw, index, obj):
            if not path:
                continue  # a Pod: its own metadata is set above
            tmeta = _metadata(_at(obj, path))
            _set_labels(tmeta, labels)
            # Controllers ignore a template's owners, but some operators copy the template's
            # metadata into the pod: the pod's owner is whoever creates it, nobody else.
            tmeta.pop("ownerReferences", None)
        out.append(obj)
    return out


# Pods of wrapped objects are made with this scheduling gate: kube-scheduler leaves them
# alone until the dispatcher lets each onto the node it holds room on (pods/placement.py).
PLACEMENT_GATE = "dispatcher.codeflare.dev/placement"


def ours(gate: object) -> bool:
    """Whether a schedulingGates entry is the placement gate."""
    return isinstance(gate, Mapping) and gate.get("name") == PLACEMENT_GATE


def _component(aw: AppWrapper, index: int) -> ComponentFields | None:
    """The v1beta2 fields of item `index` of a wrapper written as v1beta2, else None."""
    try:
        fields = v1beta2_fields(aw.metadata.annotations)
    except ConversionError:
        return None  # the queue found the wrapper invalid: it is never created
    return fields.component(index) if fields.written_as_v1beta2 else None


def pod_paths(aw: AppWrapper, index: int, obj: Mapping[str, Any]) -> list[list[str | int]]:
    """Where the pod templates of item `index` (`obj`) are: declared podSets of a v1beta2
    component, else those of its kind; of a kind the dispatcher does not know, every pod
    template found in it as well (a declaration need not name them all, and custompodresources
    names none)."""
    component = _component(aw, index)
    paths: list[list[str | int]] | None = None
    if component is not None:
        with contextlib.suppress(InvalidItem):
            paths = [list(p) for p in template_paths(obj, component)]
    if paths is None:
        paths = pod_template_paths(obj)
    if infer_pod_sets(obj) is None:
        paths += [p for p in found_pod_template_paths(obj) if p not in paths]
    return paths


def _with_pod_set_infos(aw: AppWrapper, index: int, obj: dict[str, Any]) -> dict[str, Any]:
    component = _component(aw, index)
    if component is None or not component.pod_set_infos:
        return obj
    try:
        paths = template_paths(obj, component)
        return with_pod_set_infos(obj, paths, component, f"spec.components[{index}]")
    except InvalidItem:
        return obj  # refused by the queue already: never created


def gate_pods(obj: dict[str, Any], paths: list[list[str | int]] | None = None) -> None:
    """Add the placement gate to every pod template of `obj` (to `obj` itself if a Pod)
    whose node choice the dispatcher's fit can make and kube-scheduler would carry out.

    A template that names its node (spec.nodeName) is left ungated: its pods are never
    scheduled, they go to that node as they are made, which is where the fit planned
    them (the only node it lets them use). The API server refuses a pod with both a node
    name and a scheduling gate, so gated, none would ever be made."""
    for path in pod_template_paths(obj) if paths is None else paths:
        template = _at(obj, path) if path else obj
        spec = template.get("spec")
        if not isinstance(spec, dict) or spec.get("nodeName") or _beyond_fit(spec):
            continue
        gates = spec.get("schedulingGates")
        if not isinstance(gates, list):
            gates = spec["schedulingGates"] = []
        if not any(ours(g) for g in gates):
            gates.append({"name": PLACEMENT_GATE})


def _beyond_fit(spec: Mapping[str, Any]) -> bool:
    """Rules the fit does not model — required pod (anti-)affinity, hard topology spread,
    host ports, volume claims (their topology): pinned by a plan that ignores them, such a
    pod could be held to a node it may not use. Its pods are left to kube-scheduler."""
    affinity = spec.get("affinity")
    for kind in ("podAffinity", "podAntiAffinity"):
        rules = affinity.get(kind) if isinstance(affinity, Mapping) else None
        if isinstance(rules, Mapping) and rules.get(
                "requiredDuringSchedulingIgnoredDuringExecution"):
            return True
    spread = spec.get("topologySpreadConstraints") or []
    if any(isinstance(c, Mapping) and c.get("whenUnsatisfiable", "DoNotSchedule")
           == "DoNotSchedule" for c in spread):
        return True
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    if any(isinstance(port, Mapping) and port.get("hostPort")
           for c in containers if isinstance(c, Mapping) for port in c.get("ports") or []):
        return True
    return any(isinstance(v, Mapping) and ("persistentVolumeClaim" in v or "ephemeral" in v)
               for v in spec.get("volumes") or [])


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(r, Mapping) and r.get("uid") == uid for r in refs)
