"""The wrapped objects as the dispatcher creates them.

Each object gets an owner reference to its AppWrapper (so deleting the AppWrapper lets
the garbage collector delete it) and the AppWrapper label, also on every pod template
inside it, so the AppWrapper's pods can be found and counted. Names are fixed before
creation — `generateName` becomes a name derived from the AppWrapper's uid — so that
creating the same item twice (after a restart, say) can never make a second copy.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from typing import Any

from dispatcher.api.labels import APPWRAPPER_LABEL
from dispatcher.api.models import API_GROUP, API_VERSION, AppWrapper
from dispatcher.kinds import pod_template_paths

MAX_LABEL_VALUE = 63


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


def prepared_items(aw: AppWrapper) -> list[dict[str, Any]]:
    """The objects to create for `aw`, in GenericItems order."""
    out: list[dict[str, Any]] = []
    for index, item in enumerate(aw.spec.resources.GenericItems):
        obj = copy.deepcopy(dict(item.generictemplate))
        meta = obj.setdefault("metadata", {})
        meta["namespace"] = aw.metadata.namespace
        if not meta.get("name"):
            meta["name"] = stable_name(str(meta.pop("generateName", "item-")), aw.metadata.uid,
                                       index)
        meta.pop("generateName", None)
        for field in ("uid", "resourceVersion", "creationTimestamp", "selfLink",
                      "managedFields"):
            meta.pop(field, None)
        meta.setdefault("labels", {})[APPWRAPPER_LABEL] = aw.metadata.name
        owners = [o for o in meta.get("ownerReferences", []) or []
                  if isinstance(o, Mapping) and o.get("uid") != aw.metadata.uid]
        meta["ownerReferences"] = [*owners, owner_reference(aw)]
        obj.pop("status", None)
        for path in pod_template_paths(obj):
            if not path:
                continue  # a Pod: its own labels are set above
            template = _at(obj, path)
            tmeta = template.setdefault("metadata", {})
            tmeta.setdefault("labels", {})[APPWRAPPER_LABEL] = aw.metadata.name
        out.append(obj)
    return out


def owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(r, Mapping) and r.get("uid") == uid for r in refs)
