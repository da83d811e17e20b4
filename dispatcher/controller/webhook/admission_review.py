"""What the admission webhook decides about an AppWrapper (no HTTP here: server.py serves it).

Mutating, on CREATE: the creator annotations (access/creator.py) are set to the user the API
server authenticated; whatever the user wrote there is overwritten.

Validating, on CREATE and UPDATE:

- the spec, by the same rules as the dispatcher's core (:func:`core_problems`), so a bad
  AppWrapper is refused at ``kubectl apply`` with the message its status would have shown;
- the creator annotations: on CREATE they must be the requester's, on UPDATE they must
  not change;
- every wrapped object: its kind must be served and namespaced, and the requester must
  be allowed to ``create`` its resource in the AppWrapper's namespace (checked on CREATE,
  and on an UPDATE that changes the items). Only the items of kinds the installation
  allows are looked up, and none of an AppWrapper of more than ``MAX_ITEMS``: the core
  refuses those without costing the API server anything;
- what the AppWrapper claims (access/grants.py): a label naming a quota node other than a
  tree's ``default``, a priority or a priority slope above 0 each need an RBAC grant
  (verb ``use``), checked on CREATE, and on an UPDATE that claims something new — for the
  editor and for the recorded creator, whose grants the dispatcher asks for;
- the manager's labels (manager_labels.py): only the manager's accounts may set, change or
  remove them, on CREATE and UPDATE (on an object being deleted too);
- ``spec.resources.GenericItems`` may change only while the AppWrapper waits in the
  queue: its latest condition is none yet, ``Init``, ``Queueing`` or ``Backoff``
  (:data:`EDITABLE`). From ``HeadOfLine``/``Dispatched`` on, what was checked is what gets
  created: ``Dispatched``, ``Running``, ``PreemptCandidate`` (being requeued: its objects
  are being deleted), ``Completed`` and ``Failed`` all refuse. A requeued AppWrapper is
  back in ``Queueing``, its objects deleted, and may be edited again. A wrapper written as
  v1beta2 keeps its components' templates and podSets from creation on, queued or not, as
  codeflare's webhook does (its podSetInfos follow the rule above).

- ``spec.managedBy`` (kept in the v1beta2 annotation) cannot change, as codeflare's;
- the v1beta2 fields kept in the ``workload.codeflare.dev/v1beta2`` annotation are
  reviewed as the spec they are (an unreadable one is refused);
- an AppWrapper deeper or bigger than the bounds (api/bounds.py) is refused first.

Other updates (other labels, annotations, finalizers, the garbage collector's) pass. On an
object being deleted only what deletion needs passes — finalizers removed — so deletion
never hangs on us and a wrapper kept alive by a finalizer cannot be edited unchecked.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from dispatcher.api.bounds import shape_problems
from dispatcher.api.conditions import ConditionType
from dispatcher.api.conversion import (
    V1BETA2_FIELDS_ANNOTATION,
    ConversionError,
    unconverted_problem,
    v1beta2_fields,
)
from dispatcher.api.fault_tolerance import DEFAULT_FAULT_TOLERANCE, PREFIX, FaultTolerance
from dispatcher.api.messages import cap_problems, problems_message
from dispatcher.api.models import API_GROUP, APPWRAPPER_KIND, MAX_ITEMS
from dispatcher.controller.access.creator import (
    CREATOR_ANNOTATIONS,
    Access,
    Item,
    UserInfo,
    wrapped_items,
)
from dispatcher.controller.access.grants import claims, denials, may_name_tree, needed, tree_names
from dispatcher.controller.kube.client import ApiError
from dispatcher.fit.topology import Topology
from dispatcher.kinds.scope import DEFAULT_ALLOWED_KINDS, GroupKind
from dispatcher.quota import DEFAULT_NODE
from dispatcher.review import review

from .manager_labels import default_managers, refusal

log = logging.getLogger("dispatcher.webhook")

# A refusal quotes every problem, up to this many characters (a 1 MB AppWrapper must
# not make a 1 MB message).
MAX_MESSAGE = 4096

EDITABLE = frozenset({"", ConditionType.Init.value, ConditionType.Queueing.value,
                      ConditionType.Backoff.value})


def core_problems(obj: Mapping[str, Any],
                  allowed: Collection[GroupKind] = DEFAULT_ALLOWED_KINDS) -> list[str]:
    """What the dispatcher's core finds wrong with the AppWrapper — the very review the
    controller and `dispatcher plan` run (dispatcher.review) — as a list of problems."""
    return review(obj, 0.0, allowed).problems


REASONS = {403: "Forbidden", 422: "Invalid", 500: "InternalError"}


@dataclass(frozen=True)
class ReviewAnswer:
    allowed: bool
    message: str = ""
    code: int = 200
    patch: list[dict[str, Any]] | None = None
    warnings: tuple[str, ...] = ()  # shown by kubectl as "Warning: ..."

    def response(self, uid: str) -> dict[str, Any]:
        out: dict[str, Any] = {"uid": uid, "allowed": self.allowed}
        if self.warnings:
            out["warnings"] = list(self.warnings)
        if not self.allowed:
            out["status"] = {"code": self.code, "message": self.message,
                             "reason": REASONS.get(self.code, "Invalid")}
        if self.patch:
            out["patchType"] = "JSONPatch"
            out["patch"] = base64.b64encode(json.dumps(self.patch).encode()).decode()
        return out


ALLOW = ReviewAnswer(True)


def capped(problems: list[str], limit: int = MAX_MESSAGE) -> str:
    """The problems, "; "-separated, in at most ``limit`` characters (the rest counted)."""
    return problems_message(cap_problems(problems, total=limit))


def latest_condition(obj: Mapping[str, Any]) -> str:
    status = obj.get("status") or {}
    conditions = status.get("conditions") or []
    if conditions and isinstance(conditions[-1], Mapping):
        return str(conditions[-1].get("type") or "")
    return str(status.get("queuejobstate") or "")


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _labels(obj: Mapping[str, Any]) -> Any:
    return (obj.get("metadata") or {}).get("labels")


def _items(obj: Mapping[str, Any]) -> Any:
    return ((obj.get("spec") or {}).get("resources") or {}).get("GenericItems")


def _components(obj: Mapping[str, Any]) -> object:
    """What a wrapper written as v1beta2 says of its components beside their templates."""
    try:
        return v1beta2_fields(_annotations(obj)).components
    except ConversionError:
        return _annotations(obj).get(V1BETA2_FIELDS_ANNOTATION)


def _v1beta2_sensitive(obj: Mapping[str, Any]) -> object:
    """For a wrapper written as v1beta2, what codeflare's webhook keeps from creation on:
    the templates and each component's podSets (None for any other wrapper)."""
    try:
        fields = v1beta2_fields(_annotations(obj))
    except ConversionError:
        return None
    if not fields.written_as_v1beta2:
        return None
    return _items(obj), [c.pod_sets for c in fields.components]


def _fault_annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return {k: v for k, v in _annotations(obj).items() if k.startswith(PREFIX)}


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


class AppWrapperReview:
    """Decides AdmissionReview requests for AppWrappers."""

    def __init__(self, access: Access,
                 allowed_kinds: Collection[GroupKind] = DEFAULT_ALLOWED_KINDS,
                 topology: Topology | None = None,
                 faults: FaultTolerance = DEFAULT_FAULT_TOLERANCE,
                 managers: frozenset[str] = default_managers("dispatcher-system")) -> None:
        self.access = access
        self.managers = managers  # who may write the manager's labels (manager_labels.py)
        self.allowed_kinds = allowed_kinds
        self.topology = topology
        self.faults = faults  # the installation's fault-tolerance defaults and maximum

    @staticmethod
    def _ours(request: Mapping[str, Any]) -> bool:
        kind = request.get("kind") or {}
        return kind.get("group") == API_GROUP and kind.get("kind") == APPWRAPPER_KIND

    def mutate(self, request: Mapping[str, Any]) -> ReviewAnswer:
        if request.get("operation") != "CREATE" or not self._ours(request):
            return ALLOW
        obj = request.get("object") or {}
        want = UserInfo.from_request(request.get("userInfo") or {}).annotations()
        have = _annotations(obj)
        if not (obj.get("metadata") or {}).get("annotations"):
            return ReviewAnswer(True, patch=[{"op": "add", "path": "/metadata/annotations",
                                         "value": want}])
        patch = [{"op": "add", "path": f"/metadata/annotations/{_escape(k)}", "value": v}
                 for k, v in want.items() if have.get(k) != v]
        patch += [{"op": "remove", "path": f"/metadata/annotations/{_escape(k)}"}
                  for k in CREATOR_ANNOTATIONS if k in have and k not in want]
        return ReviewAnswer(True, patch=patch or None)

    async def validate(self, request: Mapping[str, Any]) -> ReviewAnswer:
        if not self._ours(request):
            return ALLOW
        operation = request.get("operation")
        obj: Mapping[str, Any] = request.get("object") or {}
        user = UserInfo.from_request(request.get("userInfo") or {})
        namespace = str(request.get("namespace") or
                        (obj.get("metadata") or {}).get("namespace") or "default")
        # The core reads the namespace from the object: make sure it is the request's.
        obj = {**obj, "metadata": {**(obj.get("metadata") or {}), "namespace": namespace}}
        too_big = shape_problems(obj)
        if too_big and not (obj.get("metadata") or {}).get("deletionTimestamp"):
            return ReviewAnswer(False, code=422, message=capped(too_big))
        old: Mapping[str, Any] = request.get("oldObject") or {}
        if operation in ("CREATE", "UPDATE"):
            labelled = refusal(obj, old if operation == "UPDATE" else None, user.username,
                               self.managers)
            if labelled is not None:
                return ReviewAnswer(False, code=403, message=labelled)
        if operation == "CREATE":
            mine = user.annotations()
            forged = [k for k in CREATOR_ANNOTATIONS if _annotations(obj).get(k) != mine.get(k)]
            creator = ([f"metadata.annotations[{forged[0]}]: the creator annotations are set "
                        "by the dispatcher's mutating webhook, which did not run; register "
                        "MutatingWebhookConfiguration dispatcher-appwrappers (deploy/)"]
                       if forged else [])
            return await self._judge(creator, obj, user, namespace, check_items=True)
        if operation != "UPDATE":
            return ALLOW
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            return _while_deleting(old, obj)
        shown = unconverted_problem(obj)
        if shown is not None:  # whatever else changed: it would replace the stored spec
            return ReviewAnswer(False, code=422, message=capped([shown]))
        refused = _refused_update(old, obj)
        if refused is not None:
            return refused
        items_changed = _items(old) != _items(obj) or _components(old) != _components(obj)
        spec_changed = old.get("spec") != obj.get("spec")
        # New fault-tolerance annotations are looked at for warnings (kubectl annotate);
        # the v1beta2 fields kept in an annotation are spec (podSets, suspend...).
        spec_changed |= _fault_annotations(old) != _fault_annotations(obj)
        spec_changed |= _stash(old) != _stash(obj)
        if items_changed or spec_changed or _labels(old) != _labels(obj):
            return await self._judge([], obj, user, namespace, check_items=items_changed,
                                     check_spec=spec_changed, old=old)
        return ALLOW

    def _checked(self, obj: Mapping[str, Any]) -> list[Item]:
        """The items to ask the API server about: those of kinds this installation
        allows, and none when there are more than an AppWrapper may have. The core
        refuses the others without a lookup, so a user cannot make one review cost
        thousands of API calls."""
        items = _items(obj)
        if isinstance(items, list) and len(items) > MAX_ITEMS:
            return []
        return [i for i in wrapped_items(obj) if i.group_kind in self.allowed_kinds]

    async def _judge(self, problems: list[str], obj: Mapping[str, Any], user: UserInfo,
                     namespace: str, check_items: bool, check_spec: bool = True,
                     old: Mapping[str, Any] | None = None) -> ReviewAnswer:
        checked = (review(obj, 0.0, self.allowed_kinds, topology=self.topology,
                          faults=self.faults) if check_spec else None)
        spec = checked.problems if checked is not None else []
        denied: list[str] = []
        if check_items:
            try:
                denied = await self.access.denials(user, namespace, self._checked(obj))
            except ApiError as e:
                return ReviewAnswer(False, code=500, message=capped([
                    f"could not check the wrapped objects against {user.username}'s "
                    f"permissions: {e}; try again"]))
        try:
            denied += await self._ungranted(user, namespace, obj, old)
        except ApiError as e:
            return ReviewAnswer(False, code=500, message=capped([
                f"could not check the quota node and priority against {user.username}'s "
                f"grants: {e}; try again"]))
        problems = [*problems, *spec, *denied]
        if not problems:
            return ReviewAnswer(True, warnings=tuple(checked.warnings) if checked else ())
        name = (obj.get("metadata") or {}).get("name") or "(unnamed)"
        log.info("refused AppWrapper %s/%s of %s: %s", namespace, name, user.username,
                 "; ".join(problems)[:1000])
        return ReviewAnswer(False, code=422 if spec else 403, message=capped(problems))

    async def _ungranted(self, user: UserInfo, namespace: str, obj: Mapping[str, Any],
                         old: Mapping[str, Any] | None) -> list[str]:
        """What ``obj`` claims (access/grants.py) that ``old`` did not, and that ``user`` — or,
        on an edit by someone else, the recorded creator, whose grants the dispatcher
        asks for — was not granted. The quota trees are looked up only when a label
        that may name one is new."""
        labels, priority, slope = claims(obj)
        old_labels, old_priority, old_slope = claims(old) if old is not None else ({}, 0, 0)
        changed = {k: v for k, v in labels.items()
                   if old_labels.get(k) != v and v != DEFAULT_NODE and may_name_tree(k)}
        trees = await tree_names(self.access.kube) if changed else frozenset()
        had = needed({}, trees, old_priority, old_slope)
        wanted = [g for g in needed(changed, trees, priority, slope) if g not in had]
        if not wanted:
            return []
        subjects = [user]
        creator = _recorded_creator(old) if old is not None else None
        if creator is not None and creator != user:
            subjects.append(creator)
        return [line for subject in subjects
                for line in await denials(self.access, subject, namespace, wanted)]


def _recorded_creator(obj: Mapping[str, Any]) -> UserInfo | None:
    try:
        return UserInfo.from_annotations(_annotations(obj))
    except ValueError:
        return None


def _stash(obj: Mapping[str, Any]) -> object:
    return _annotations(obj).get(V1BETA2_FIELDS_ANNOTATION)


def _managed_by(obj: Mapping[str, Any]) -> object:
    """spec.managedBy; for an unreadable annotation, the annotation (whose review says
    what is wrong with it)."""
    try:
        return v1beta2_fields(_annotations(obj)).managed_by
    except ConversionError:
        return _stash(obj)


def _refused_update(old: Mapping[str, Any], obj: Mapping[str, Any]) -> ReviewAnswer | None:
    """What no update may do, whoever asks: change the creator annotations, the
    controller a wrapper names (spec.managedBy, immutable as codeflare's), the templates
    of a wrapper written as v1beta2, or the items of a wrapper past the queue."""
    changed = [k for k in CREATOR_ANNOTATIONS
               if _annotations(old).get(k) != _annotations(obj).get(k)]
    if changed:
        return ReviewAnswer(False, code=403, message=(
            f"metadata.annotations[{changed[0]}]: records who created this AppWrapper "
            "and cannot be changed; keep the annotations as they are (kubectl apply and "
            "kubectl edit do; kubectl replace with a file without them does not)"))
    new_managed_by = _managed_by(obj)
    if new_managed_by != _managed_by(old) and new_managed_by != _stash(obj):
        return ReviewAnswer(False, code=403, message=(
            "spec.managedBy cannot change once the AppWrapper exists (as codeflare's); "
            "delete the AppWrapper and apply it with the managedBy it should have"))
    items_changed = _items(old) != _items(obj) or _components(old) != _components(obj)
    if items_changed and _v1beta2_sensitive(old) != _v1beta2_sensitive(obj):
        return ReviewAnswer(False, code=403, message=(
            "spec.components: the templates and podSets of an AppWrapper written as "
            "v1beta2 cannot change; delete the AppWrapper and apply the new one"))
    state = latest_condition(old)
    if items_changed and state not in EDITABLE:
        return ReviewAnswer(False, code=403, message=(
            f"spec.resources.GenericItems cannot change once the AppWrapper is past "
            f"the queue (its latest condition is {state}), nor in v1beta2 "
            "spec.components (templates, podSets and podSetInfos): what was "
            "checked is what the dispatcher creates; delete the AppWrapper and "
            "apply the new one"))
    return None


# Set by the API server on its own; a finalizer is what deletion waits for.
_DELETION_METADATA = frozenset({"finalizers", "managedFields", "resourceVersion",
                                "generation", "deletionTimestamp",
                                "deletionGracePeriodSeconds"})


def _while_deleting(old: Mapping[str, Any], obj: Mapping[str, Any]) -> ReviewAnswer:
    """An update of a wrapper being deleted: only what deletion needs passes (a finalizer
    removed). Anything else would be an edit no check looks at — the creator, a priority,
    a quota label on a wrapper kept alive by its own finalizer."""
    def rest(o: Mapping[str, Any]) -> tuple[object, object]:
        meta = o.get("metadata") or {}
        return ({k: v for k, v in o.items() if k not in ("metadata", "status")},
                {k: v for k, v in meta.items() if k not in _DELETION_METADATA})

    try:
        same = rest(old) == rest(obj)
    except RecursionError:
        same = False
    kept = set((old.get("metadata") or {}).get("finalizers") or ())
    added = [f for f in (obj.get("metadata") or {}).get("finalizers") or () if f not in kept]
    if same and not added:
        return ALLOW
    return ReviewAnswer(False, code=403, message=(
        "the AppWrapper is being deleted: only its finalizers may be removed; nothing "
        "else of it can change"))
