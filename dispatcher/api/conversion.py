"""Conversion between the two versions of the AppWrapper API, both ways, without loss.

The API server stores AppWrappers as v1beta1 and asks the dispatcher's conversion webhook
for the other version when a client reads or writes v1beta2. What both versions say maps
field to field: v1beta1's ``spec.resources.GenericItems[i].generictemplate`` is v1beta2's
``spec.components[i].template``. What only one version can say travels in one annotation
on the other version's form, a JSON document the conversion back reads and removes:

- ``workload.codeflare.dev/v1beta1`` on a v1beta2 form: MCAD's priority, schedulingSpec,
  the items' replicas, custompodresources, completionstatus…, and the v1beta1 status.
- ``workload.codeflare.dev/v1beta2`` on a v1beta1 form: ``suspend``, ``managedBy``, the
  components' podSets, podSetInfos and annotations, and the v1beta2 status.

A wrapper written in one version always carries the annotation in the other version's
form, so the annotation also says which version it was written in: the dispatcher gives a
wrapper written as v1beta2 codeflare's semantics (declared pod sets, podSetInfos,
``suspend``). A wrapper converted to the other version and back is the wrapper it was
(the tests check it for any wrapper). The dispatcher reads the v1beta2 fields of a stored wrapper
with :func:`v1beta2_fields`.

The status a reader of the other version sees is worked out from the stored one (a
v1beta1 ``state: Running`` is a v1beta2 ``phase: Running`` with QuotaReserved,
ResourcesDeployed and PodsReady true), unless the annotation holds a status written in
that version for exactly the stored status, which is then shown as it was written.

What a dispatcher records in status to decide what runs where (:data:`RECORDED_FIELDS`: the
worker a manager sent the wrapper to, a worker's record of a manager's copy) is in both
versions' statuses as it is, and is always taken from the status being converted, never
from the annotation: a client that writes the wrapper as v1beta2 sends the annotation back
as it likes, while the API server keeps the stored status (a status is written through
``/status`` only, by whoever may).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dispatcher.api.conditions import Reason
from dispatcher.api.models import APPWRAPPER_API_VERSION, InvalidSpec
from dispatcher.api.v1beta2 import (
    APPWRAPPER_API_VERSION_V1BETA2,
    Phase,
    V1beta2Condition,
    parse_appwrapper_v1beta2,
)

V1BETA1_FIELDS_ANNOTATION = "workload.codeflare.dev/v1beta1"
V1BETA2_FIELDS_ANNOTATION = "workload.codeflare.dev/v1beta2"
# On a v1beta2 form that is not the stored wrapper (conversion_review.py): why it is not.
UNCONVERTED_ANNOTATION = "workload.codeflare.dev/unconverted"

VERSIONS = (APPWRAPPER_API_VERSION, APPWRAPPER_API_VERSION_V1BETA2)

_ITEMS = "GenericItems"
_TEMPLATE_V1 = "generictemplate"
_TEMPLATE_V2 = "template"
# Set in a stash when the object had no annotations at all before the stash was added.
_BARE = "bare"
# Set in the v1beta1 stash of a wrapper written as v1beta2 that has v1beta1 fields all the
# same (the API server defaults spec.priority), so that the way back still marks it so.
_WRITTEN_AS_V1BETA2 = "writtenAsV1beta2"


class ConversionError(ValueError):
    """An object that cannot be converted; the message says what is wrong with it."""


def convert(obj: Mapping[str, Any], desired: str) -> dict[str, Any]:
    """``obj`` (either version) in the ``desired`` apiVersion."""
    if desired not in VERSIONS:
        raise ConversionError(f"cannot convert an AppWrapper to {desired!r}: this dispatcher "
                              f"serves {' and '.join(VERSIONS)}")
    current = obj.get("apiVersion")
    if current == desired:
        return copy.deepcopy(dict(obj))
    if current == APPWRAPPER_API_VERSION:
        return to_v1beta2(obj)
    if current == APPWRAPPER_API_VERSION_V1BETA2:
        return to_v1beta1(obj)
    raise ConversionError(f"cannot convert an AppWrapper of apiVersion {current!r}: this "
                          f"dispatcher serves {' and '.join(VERSIONS)}")


def stored_form(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """`obj` as the API server stores it, in v1beta1 terms: a v1beta2 wrapper (a file
    given to ``dispatcher plan`` or ``simulate``) is checked as written — its problems said
    in v1beta2 terms (InvalidSpec) — and converted; any other object is `obj`."""
    if not isinstance(obj, Mapping) or obj.get("apiVersion") != APPWRAPPER_API_VERSION_V1BETA2:
        return obj
    parse_appwrapper_v1beta2(obj)
    try:
        return to_v1beta1(obj)
    except ConversionError as e:
        raise InvalidSpec([str(e)]) from e


# --- v1beta1 -> v1beta2 -------------------------------------------------------------


def to_v1beta2(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A v1beta1 AppWrapper in v1beta2 terms."""
    source = copy.deepcopy(dict(obj))
    metadata, stashed = _take_stash(source, V1BETA2_FIELDS_ANNOTATION)
    back = stashed or {}
    spec = _mapping(source.get("spec"), "spec")
    resources = _mapping(spec.get("resources"), "spec.resources")
    items = _list(resources.get(_ITEMS, []), "spec.resources.GenericItems")

    components, kept_items = _move_templates(
        items, back.get("components") or [], _TEMPLATE_V1, _TEMPLATE_V2,
        "spec.resources.GenericItems")

    new_spec: dict[str, Any] = {"components": components}
    new_spec.update({k: back[k] for k in ("suspend", "managedBy") if k in back})
    stash: dict[str, Any] = {}
    spec_rest = {k: v for k, v in spec.items() if k != "resources"}
    resources_rest = {k: v for k, v in resources.items() if k != _ITEMS}
    if spec_rest:
        stash["spec"] = spec_rest
    if resources_rest:
        stash["resources"] = resources_rest
    if any(kept_items):
        stash["items"] = kept_items
    if _ITEMS not in resources:
        stash["noItems"] = True
    result = _other_fields(source, APPWRAPPER_API_VERSION_V1BETA2, metadata)
    result["spec"] = new_spec
    _move_status(source, result, back, stash,
                 lambda status: v1beta2_status(status, metadata, new_spec), v1beta1_status)
    _recorded_from(source, result)
    if stash and stashed is not None:
        stash[_WRITTEN_AS_V1BETA2] = True
    _put_stash(result, V1BETA1_FIELDS_ANNOTATION, stash, stashed)
    return result


# --- v1beta2 -> v1beta1 -------------------------------------------------------------


def unconverted_problem(obj: Mapping[str, Any]) -> str | None:
    """Why `obj` may not be written: it is what a v1beta2 reader was shown of an AppWrapper
    that could not be converted, with no components; written, it would replace the stored
    spec. None for any other object."""
    metadata = obj.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping) or UNCONVERTED_ANNOTATION not in annotations:
        return None
    return (f"annotation {UNCONVERTED_ANNOTATION}: this is not the stored AppWrapper but what "
            f"could be shown of it as v1beta2 ({annotations[UNCONVERTED_ANNOTATION]}); edit it "
            "as v1beta1 (kubectl edit appwrappers.v1beta1.workload.codeflare.dev NAME), or "
            "delete it")


def to_v1beta1(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A v1beta2 AppWrapper in v1beta1 terms. What was shown of one that could not be
    converted (:data:`UNCONVERTED_ANNOTATION`) converts too, keeping that annotation: the
    API server converts it back when it deletes it through v1beta2 (a namespace being
    deleted), and a write of it is refused by review (:func:`unconverted_problem`)."""
    source = copy.deepcopy(dict(obj))
    metadata, stashed = _take_stash(source, V1BETA1_FIELDS_ANNOTATION)
    back = stashed or {}
    spec = _mapping(source.get("spec"), "spec")
    components = _list(spec.get("components", []), "spec.components")

    items, extras = _move_templates(components, back.get("items") or [], _TEMPLATE_V2,
                                    _TEMPLATE_V1, "spec.components")

    resources = dict(back.get("resources") or {})
    if not (back.get("noItems") and not items):
        resources[_ITEMS] = items
    new_spec = {**(back.get("spec") or {}), "resources": resources}
    stash: dict[str, Any] = {k: spec[k] for k in ("suspend", "managedBy") if k in spec}
    if any(extras):
        stash["components"] = extras
    result = _other_fields(source, APPWRAPPER_API_VERSION, metadata)
    result["spec"] = new_spec
    _move_status(source, result, back, stash, v1beta1_status,
                 lambda status: v1beta2_status(status, metadata, spec))
    _recorded_from(source, result)
    written_as_v1beta2 = stashed is None or back.get(_WRITTEN_AS_V1BETA2) is True
    _put_stash(result, V1BETA2_FIELDS_ANNOTATION, stash,
               None if written_as_v1beta2 else stashed)
    return result


def _move_templates(entries: list[Any], kept: list[Any], source_key: str, target_key: str,
                    where: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each entry as the other version's entry (its template under `target_key`, with what
    was `kept` of that version at the same position), and what else each entry says."""
    converted: list[dict[str, Any]] = []
    rests: list[dict[str, Any]] = []
    for i, raw in enumerate(entries):
        entry = _mapping(raw, f"{where}[{i}]")
        target = dict(kept[i]) if i < len(kept) and isinstance(kept[i], Mapping) else {}
        if source_key in entry:
            target[target_key] = entry[source_key]
        converted.append(target)
        rests.append({k: v for k, v in entry.items() if k != source_key})
    return converted, rests


def _other_fields(source: Mapping[str, Any], api_version: str,
                  metadata: dict[str, Any]) -> dict[str, Any]:
    """The object's fields neither version defines (kept as they are), in `api_version`."""
    result = {k: v for k, v in source.items() if k not in ("spec", "status", "metadata")}
    result["apiVersion"] = api_version
    if "metadata" in source:
        result["metadata"] = metadata
    return result


# --- the v1beta2 fields of a stored wrapper ------------------------------------------


@dataclass(frozen=True)
class ComponentFields:
    """What a v1beta2 component says beside its template."""

    pod_sets: tuple[Mapping[str, Any], ...] = ()
    pod_set_infos: tuple[Mapping[str, Any], ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class V1beta2Fields:
    """The v1beta2 fields of a wrapper stored as v1beta1 (none for an MCAD wrapper)."""

    written_as_v1beta2: bool = False
    suspend: bool = False
    managed_by: str | None = None
    components: tuple[ComponentFields, ...] = ()

    def component(self, index: int) -> ComponentFields:
        return self.components[index] if index < len(self.components) else ComponentFields()


def v1beta2_fields(annotations: Mapping[str, str]) -> V1beta2Fields:
    """The v1beta2 fields kept on a v1beta1 wrapper with these annotations.

    Raises ConversionError when the annotation is not what the conversion writes.
    """
    text = annotations.get(V1BETA2_FIELDS_ANNOTATION)
    if text is None:
        return V1beta2Fields()
    # Intake, holds, management, admission and item shaping all ask for the fields of the
    # same wrapper: its annotation is parsed once, not once by each.
    if isinstance(text, str) and len(text) <= _CACHED_TEXT_BYTES:
        return _cached_fields(text)
    return _fields(text)


_CACHED_TEXT_BYTES = 64 * 1024


@functools.lru_cache(maxsize=1024)
def _cached_fields(text: str) -> V1beta2Fields:
    return _fields(text)


def _fields(text: Any) -> V1beta2Fields:
    stash = _parse_stash(text, V1BETA2_FIELDS_ANNOTATION)
    components = [ComponentFields(_mappings(raw.get("podSets"), "podSets"),
                                  _mappings(raw.get("podSetInfos"), "podSetInfos"),
                                  _strings(raw.get("annotations")))
                  for raw in _mappings(stash.get("components"), "components")]
    managed_by = stash.get("managedBy")
    return V1beta2Fields(True, stash.get("suspend") is True,
                         managed_by if isinstance(managed_by, str) else None,
                         tuple(components))


def _mappings(value: Any, what: str) -> tuple[Mapping[str, Any], ...]:
    """A list of mappings from the annotation (absent: none); anything else is refused."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise ConversionError(f"annotation {V1BETA2_FIELDS_ANNOTATION}: {what} must be a "
                              "list of mappings")
    return tuple(value)


def _strings(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConversionError(f"annotation {V1BETA2_FIELDS_ANNOTATION}: a component's "
                              "annotations must map strings to strings")
    return dict(value)


# --- statuses, each worked out from the other ---------------------------------------

_ADMITTED = frozenset({"Dispatched", "Running", "RunningHoldCompletion"})
_REQUEUEING = frozenset({"PreemptCandidate", "Backoff"})


def v1beta2_status(status: Any, metadata: Mapping[str, Any],
                   spec: Mapping[str, Any]) -> dict[str, Any]:
    """What a v1beta1 status says, in v1beta2 terms (phase, conditions, components)."""
    if not isinstance(status, Mapping):
        return {}
    state = status.get("state") or ""
    latest = status.get("queuejobstate") or ""
    created = [w for w in status.get("wrappedItems") or [] if isinstance(w, Mapping)]
    deployed = any(w.get("uid") for w in created)
    # Codeflare's Running: every component created (its pods may still be starting).
    all_created = bool(created) and all(w.get("uid") for w in created)
    if metadata.get("deletionTimestamp") or state == "Deleted":
        phase = Phase.Terminating
    elif state == "Completed":
        phase = Phase.Succeeded
    elif state == "Failed":
        phase = Phase.Failed
    elif latest in _REQUEUEING and deployed:
        phase = Phase.Suspending
    elif latest == "Dispatched" and _reason(status) == Reason.Resetting:
        phase = Phase.Resetting
    elif latest == "Dispatched" and not all_created:
        # MCAD's state is Running from the dispatch on, before anything is created.
        phase = Phase.Resuming
    elif latest == "Dispatched" or state in ("Running", "RunningHoldCompletion"):
        phase = Phase.Running
    elif state or latest:
        phase = Phase.Suspended
    else:
        phase = Phase.Empty
    admitted = phase in (Phase.Resuming, Phase.Running, Phase.Suspending, Phase.Resetting)
    since = _last_time(status)
    message = str(status.get("message") or "")
    reason = _reason(status)
    conditions = [
        _condition(V1beta2Condition.QuotaReserved, admitted, reason, message, since),
        _condition(V1beta2Condition.ResourcesDeployed, deployed, reason, message, since),
        _condition(V1beta2Condition.PodsReady,
                   phase is Phase.Running and latest != "Dispatched", reason, message, since),
        _condition(V1beta2Condition.Unhealthy,
                   latest in _REQUEUEING or phase is Phase.Resetting, reason, message, since),
    ]
    if phase is Phase.Terminating:
        conditions.append(_condition(V1beta2Condition.DeletingResources, deployed, reason,
                                     message, since))
    out: dict[str, Any] = {"phase": str(phase),
                           "resettingCount": _count(status.get("numberOfRequeueings"))}
    out.update(_queue_fields(status))
    if phase is not Phase.Empty:
        out["conditions"] = conditions
    declared = [c.get("podSets") or [] if isinstance(c, Mapping) else []
                for c in spec.get("components") or []]
    if created:
        out["componentStatus"] = [
            {"name": str(w.get("name", "")), "kind": str(w.get("kind", "")),
             "apiVersion": str(w.get("apiVersion", "")),
             "podSets": declared[i] if i < len(declared) else []}
            for i, w in enumerate(created)]
    return out


_PHASE_STATE = {
    Phase.Running: "Running", Phase.Succeeded: "Completed", Phase.Failed: "Failed",
    Phase.Terminating: "Deleted", Phase.Suspended: "Pending", Phase.Resuming: "Pending",
    Phase.Suspending: "Pending", Phase.Resetting: "Pending",
}


def v1beta1_status(status: Any) -> dict[str, Any]:
    """What a v1beta2 status says, in v1beta1 terms (state and requeue count)."""
    if not isinstance(status, Mapping):
        return {}
    out: dict[str, Any] = {}
    phase = status.get("phase")
    if isinstance(phase, str) and phase in Phase.__members__:
        out["state"] = _PHASE_STATE.get(Phase(phase), "")
    if status.get("resettingCount"):
        out["numberOfRequeueings"] = _count(status["resettingCount"])
    out.update(_queue_fields(status))
    return out


#: The dispatcher's status fields both versions carry unchanged (the printer columns').
QUEUE_FIELDS = ("requestedGPUs", "queuePosition", "estimatedStart", "message")
#: What a dispatcher records in status to decide what runs where: both versions carry it
#: unchanged, taken from the status converted alone (`_recorded_from`).
RECORDED_FIELDS = ("workerCluster", "managerUid")


def _queue_fields(status: Mapping[str, Any]) -> dict[str, Any]:
    return {**{k: status[k] for k in QUEUE_FIELDS if status.get(k) not in (None, "")},
            **_recorded(status)}


def _recorded(status: Any) -> dict[str, Any]:
    if not isinstance(status, Mapping):
        return {}
    return {k: status[k] for k in RECORDED_FIELDS if status.get(k) is not None}


def _recorded_from(source: Mapping[str, Any], result: dict[str, Any]) -> None:
    """`result`'s recorded fields as `source`'s status has them, whatever status the
    annotation kept (a client's to write)."""
    shown = result.get("status")
    if not isinstance(shown, dict):
        return
    for key in RECORDED_FIELDS:
        shown.pop(key, None)
    shown.update(_recorded(source.get("status")))


def _condition(kind: V1beta2Condition, true: bool, reason: str, message: str,
               since: str) -> dict[str, Any]:
    return {"type": str(kind), "status": "True" if true else "False",
            "reason": reason, "message": message, "lastTransitionTime": since}


def _reason(status: Mapping[str, Any]) -> str:
    for condition in reversed(status.get("conditions") or []):
        if isinstance(condition, Mapping) and isinstance(condition.get("reason"), str) \
                and condition["reason"].isalnum():
            return str(condition["reason"])
    return str(status.get("state") or "Queued").replace(" ", "") or "Queued"


def _last_time(status: Mapping[str, Any]) -> str:
    """The latest v1beta1 condition's time, to the second (a metav1.Time)."""
    for condition in reversed(status.get("conditions") or []):
        if not isinstance(condition, Mapping):
            continue
        for key in ("lastTransitionMicroTime", "lastUpdateMicroTime"):
            value = condition.get(key)
            if isinstance(value, str) and value:
                return _seconds(value)
    stamp = status.get("controllerfirsttimestamp")
    return _seconds(stamp) if isinstance(stamp, str) and stamp else \
        "1970-01-01T00:00:00Z"


def _seconds(text: str) -> str:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return "1970-01-01T00:00:00Z"
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 \
        else 0


# --- the annotation -----------------------------------------------------------------


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _move_status(source: Mapping[str, Any], result: dict[str, Any], back: Mapping[str, Any],
                 stash: dict[str, Any], forth: Callable[[Any], dict[str, Any]],
                 backward: Callable[[Any], dict[str, Any]]) -> None:
    """`result`'s status: the one kept for `source`'s status if any, else worked out from it
    (`forth`); `source`'s status goes in `stash` unless working it out again from the result
    (`backward`) gives it back."""
    if "status" not in source:
        return
    status = source["status"]
    shown = _kept_status(back, status)
    if shown is None:
        shown = forth(status)
    result["status"] = shown
    if backward(shown) != status:
        stash.update(status=status, statusOf=_digest(shown))


def _kept_status(back: Mapping[str, Any], status: Any) -> Any | None:
    """The status kept from the other version, if it was kept for exactly this one."""
    if "status" in back and back.get("statusOf") == _digest(status):
        return back["status"]
    return None


def _take_stash(obj: dict[str, Any], key: str
                ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``obj``'s metadata without the annotation ``key``, and what the annotation held
    (None: no such annotation, the object was written in its own version)."""
    metadata = dict(_mapping(obj.get("metadata", {}), "metadata"))
    annotations = metadata.get("annotations")
    if not isinstance(annotations, Mapping) or key not in annotations:
        return metadata, None
    stash = _parse_stash(annotations[key], key)
    rest = {k: v for k, v in annotations.items() if k != key}
    if rest or not stash.get(_BARE):
        metadata["annotations"] = rest
    else:
        del metadata["annotations"]
    return metadata, stash


def _put_stash(obj: dict[str, Any], key: str, stash: dict[str, Any],
               back: Mapping[str, Any] | None) -> None:
    """Add the annotation `key` holding `stash`: always on an object written in the other
    version (`back` None), so the annotation says which version it was written in; on one
    converted back, only when it has something to keep."""
    if not stash and back is not None:
        return
    metadata = obj.setdefault("metadata", {})
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict):
        stash[_BARE] = True
        annotations = metadata["annotations"] = {}
    annotations[key] = json.dumps(stash, sort_keys=True, separators=(",", ":"))


def _parse_stash(text: Any, key: str) -> dict[str, Any]:
    try:
        stash = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        stash = None
    if not isinstance(stash, dict):
        raise ConversionError(f"annotation {key}: must be the JSON object the conversion "
                              "writes; remove the annotation")
    return stash


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConversionError(f"{where}: must be a mapping")
    return dict(value)


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise ConversionError(f"{where}: must be a list")
    return value
