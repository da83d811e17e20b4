"""The AppWrapper API (``workload.codeflare.dev/v1beta1``) as pydantic models.

The field names and JSON spellings are MCAD's, so AppWrappers written for MCAD parse
unchanged (including its odd capitalisation: ``GenericItems``, ``Succeeded``).
``crds/appwrappers.workload.codeflare.dev.yaml`` is the same schema for the API server;
``tests/unit/test_api.py`` fails when the two drift apart.

:func:`parse_appwrapper` is the entry point for untrusted input: it turns every problem
with an AppWrapper into one line of an :class:`InvalidSpec` message, written in the
user's YAML terms (``spec.resources.GenericItems[1].replicas: must be ≥ 0, got -2``).
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    model_validator,
)

from dispatcher.api.messages import cap_problems
from dispatcher.api.names import (
    APPWRAPPER_NAME,
    DNS1123_LABEL,
    GENERATED_SUFFIX,
    item_name_rule,
    name_problem,
)

API_GROUP = "workload.codeflare.dev"
API_VERSION = "v1beta1"
APPWRAPPER_API_VERSION = f"{API_GROUP}/{API_VERSION}"
APPWRAPPER_KIND = "AppWrapper"

# The most objects one AppWrapper may wrap. Every item may cost the admission webhook a
# lookup and a SubjectAccessReview, and a gang is a few objects (MCAD's own examples wrap
# at most three), its size being in their replicas.
MAX_ITEMS = 1000

# MCAD's first releases served AppWrappers from this group; such manifests must be
# moved to workload.codeflare.dev before they can be applied here.
LEGACY_API_GROUP = "mcad.ibm.com"

# A Kubernetes quantity without a sign (requests and limits are never negative).
# The CRD carries the same pattern; the drift test checks that they agree.
QUANTITY_PATTERN = (
    r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)


# --- field types -------------------------------------------------------------------


def _as_utc(value: datetime) -> datetime:
    """Timestamps without a zone are taken as UTC, so all of them compare."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


# Cached: a wrapper's status is serialised at every write and every check for a change
# to write, with the same few condition times each time.
@functools.lru_cache(maxsize=8192)
def _format_micro(value: datetime) -> str:
    """metav1.MicroTime's wire format: RFC 3339 with exactly six fractional digits."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@functools.lru_cache(maxsize=8192)
def _format_time(value: datetime) -> str:
    """metav1.Time's wire format: RFC 3339 to the second."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


Time = Annotated[
    datetime,
    AfterValidator(_as_utc),
    PlainSerializer(_format_time, return_type=str, when_used="json"),
]
"""A ``metav1.Time`` (second precision on the wire); naive values are taken as UTC."""

MicroTime = Annotated[
    datetime,
    AfterValidator(_as_utc),
    PlainSerializer(_format_micro, return_type=str, when_used="json"),
]
"""A ``metav1.MicroTime`` (microsecond precision on the wire); naive values are UTC."""


def _check_quantity(value: Any) -> Any:
    # Runs before the union is tried, so a bad value gives one message, not one per member.
    if isinstance(value, bool):
        raise ValueError(f"must be a quantity such as 2, 500m or 8Gi, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"must not be negative, got {value!r}")
        return value
    if isinstance(value, str):
        if not _QUANTITY_RE.fullmatch(value.strip()):
            raise ValueError(f"must be a quantity such as 2, 500m or 8Gi, got {value!r}")
        return value.strip()
    raise ValueError(f"must be a quantity such as 2, 500m or 8Gi, got {_describe(value)}")


Quantity = Annotated[str | int | float, BeforeValidator(_check_quantity)]
"""A resource quantity as written by users: ``"500m"``, ``"8Gi"``, ``2`` or ``0.5``."""

NonNegativeInt = Annotated[int, Field(ge=0)]


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: v for k, v in value.items() if v is not None}
    return value


StringMap = Annotated[dict[str, str], BeforeValidator(_drop_nulls)]
"""Labels, annotations, a node selector: an entry whose value is null is absent."""

ResourceMap = Annotated[dict[str, Quantity], BeforeValidator(_drop_nulls)]
"""Requests or limits: a resource whose quantity is null is not asked for."""


class _Model(BaseModel):
    """Every AppWrapper model: a field sent as null is the field left out.

    The API server drops nulls of non-nullable fields before it stores an object, and
    clients send them: MCAD's Go client writes ``limits: null`` for a custompodresources
    entry without limits, and YAML's ``labels:`` with nothing after it is a null. One
    rule for every model, so no field is ever refused for a null the API server would
    have taken. (The wrapped object, ``generictemplate``, is not a model: it keeps its
    nulls, and the kinds read them as absent.)
    """

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        return _drop_nulls(data)


# --- metadata ----------------------------------------------------------------------


class ObjectMeta(_Model):
    """The parts of ``metav1.ObjectMeta`` the dispatcher reads; the rest is ignored."""

    model_config = ConfigDict(extra="ignore")

    name: str
    namespace: str = "default"
    uid: str = ""
    creationTimestamp: Time | None = None
    labels: StringMap = Field(default_factory=dict)
    annotations: StringMap = Field(default_factory=dict)
    resourceVersion: str = ""
    generation: int = 0
    deletionTimestamp: Time | None = None


# --- spec --------------------------------------------------------------------------


class CustomPodResource(_Model):
    """``replicas`` pods, each requesting ``requests`` (MCAD's custompodresources[])."""

    model_config = ConfigDict(extra="allow")

    replicas: int = Field(default=1, ge=0)
    requests: ResourceMap = Field(default_factory=dict)
    limits: ResourceMap = Field(default_factory=dict)


class GenericItem(_Model):
    """One wrapped object and what MCAD lets users say about it."""

    model_config = ConfigDict(extra="allow")

    generictemplate: dict[str, Any]
    replicas: int | None = Field(default=None, ge=0)
    minavailable: int | None = Field(default=None, ge=0)
    allocated: int | None = Field(default=None, ge=0)
    priority: int | None = None
    priorityslope: float | None = None
    custompodresources: list[CustomPodResource] = Field(default_factory=list)
    completionstatus: str | None = None

    @property
    def completion_conditions(self) -> list[str]:
        """Condition types of the wrapped object that mean it is done ("Complete,Failed")."""
        if not self.completionstatus:
            return []
        return [part.strip() for part in self.completionstatus.split(",") if part.strip()]


GROWTH_TYPES = ("exponential", "linear", "none")
Growth = Literal["exponential", "linear", "none"]


class Requeuing(_Model):
    """When and how often a dispatched wrapper that does not run is torn down and requeued.

    ``growthType`` is kept as written: MCAD grows the wait only for ``exponential`` and
    ``linear`` and reads anything else as no growth, so any string is accepted and
    :attr:`growth` says what it means (``warnings()`` tells the user about the others).
    """

    model_config = ConfigDict(extra="allow")

    timeInSeconds: int = Field(default=300, ge=0)
    maxTimeInSeconds: int = Field(default=0, ge=0)  # 0: no cap
    growthType: str = "exponential"
    maxNumRequeuings: int = Field(default=0, ge=0)  # 0: no limit
    # MCAD keeps its own bookkeeping here; accepted so its AppWrappers parse.
    initialTimeInSeconds: int = Field(default=0, ge=0)
    numRequeuings: int = Field(default=0, ge=0)
    forcefulDeletionAfterSeconds: int = Field(default=0, ge=0)

    @property
    def growth(self) -> Growth:
        if self.growthType == "exponential":
            return "exponential"
        return "linear" if self.growthType == "linear" else "none"


class DispatchDuration(_Model):
    """Wall-clock limit on a dispatched wrapper, in seconds."""

    model_config = ConfigDict(extra="allow")

    limit: int | None = Field(default=None, ge=0)
    expected: int | None = Field(default=None, ge=0)
    overrun: bool = False


class SchedulingSpec(_Model):
    model_config = ConfigDict(extra="allow")

    minAvailable: int | None = Field(default=None, ge=0)  # None: every pod
    requeuing: Requeuing = Field(default_factory=Requeuing)
    dispatchDuration: DispatchDuration = Field(default_factory=DispatchDuration)
    nodeSelector: StringMap = Field(default_factory=dict)
    # Multi-cluster fields of MCAD: accepted, not acted on.
    clusterScheduling: dict[str, Any] | None = None
    dispatchingWindow: dict[str, Any] | None = None


class AppWrapperResources(_Model):
    model_config = ConfigDict(extra="allow")

    # MCAD's old list of items: its CRD still lists it and codeflare-sdk writes it empty;
    # never read (a wrapper with only Items is refused, see _semantic_problems).
    Items: list[dict[str, Any]] | None = None
    GenericItems: list[GenericItem] = Field(default_factory=list)


class AppWrapperSpec(_Model):
    model_config = ConfigDict(extra="allow")

    priority: int = 0
    priorityslope: float = 0.0
    resources: AppWrapperResources
    schedulingSpec: SchedulingSpec = Field(default_factory=SchedulingSpec)
    # MCAD fields kept so its AppWrappers round-trip; the dispatcher does not use them.
    service: dict[str, Any] | None = None
    selector: dict[str, Any] | None = None


# --- status ------------------------------------------------------------------------


class State(StrEnum):
    """``status.state``: MCAD's coarse life cycle of an AppWrapper."""

    Pending = "Pending"
    Running = "Running"
    # MCAD's: the items that decide completion (`completionstatus`) are done, and pods of
    # the others still run or wait.
    RunningHoldCompletion = "RunningHoldCompletion"
    Completed = "Completed"
    Failed = "Failed"
    Deleted = "Deleted"


class Condition(_Model):
    """One entry of ``status.conditions`` (MCAD's AppWrapperCondition)."""

    model_config = ConfigDict(extra="allow")

    type: str
    status: str = "True"
    reason: str = ""
    message: str = ""
    lastUpdateMicroTime: MicroTime | None = None
    lastTransitionMicroTime: MicroTime | None = None
    # The spec generation it was reached for (kubectl wait ignores one older than the spec).
    observedGeneration: int | None = Field(default=None, ge=0)


class WrappedItem(_Model):
    """An object the dispatcher creates for this AppWrapper: named at dispatch (so what
    was admitted can be removed even if the spec is edited later), its uid recorded once
    created — proof of ownership that a forged owner reference cannot give."""

    model_config = ConfigDict(extra="allow")

    apiVersion: str = ""
    kind: str
    name: str
    uid: str = ""  # "" until it is created


class QuotaPosition(_Model):
    """Where a waiting wrapper stands among the waiting wrappers of its quota node."""

    model_config = ConfigDict(extra="allow")

    tree: str
    node: str
    position: int = Field(ge=1)


class AppWrapperStatus(_Model):
    """MCAD's status fields, plus ``requestedGPUs`` and ``message`` for the printer columns."""

    model_config = ConfigDict(extra="allow")

    state: str = ""
    queuejobstate: str = ""  # the type of the latest condition
    systempriority: float = 0.0
    controllerfirsttimestamp: MicroTime | None = None
    pending: int = Field(default=0, ge=0)
    running: int = Field(default=0, ge=0)
    Succeeded: int = Field(default=0, ge=0)
    failed: int = Field(default=0, ge=0)
    numberOfRequeueings: int = Field(default=0, ge=0)
    requeueingTimeInSeconds: int = Field(default=0, ge=0)
    conditions: list[Condition] = Field(default_factory=list)
    requestedGPUs: int = Field(default=0, ge=0)
    message: str = ""  # the latest human-readable reason
    # The dispatcher's own bookkeeping: what it created, and a digest of the items it
    # admitted (an edit of the items after dispatch is noticed, even across restarts).
    wrappedItems: list[WrappedItem] = Field(default_factory=list)
    admittedDigest: str = ""
    # The AppWrappers ("namespace/name") it preempted to be admitted, written with its
    # dispatch: they may not preempt it back while it stays admitted, whoever leads then.
    preempted: list[str] = Field(default_factory=list)
    # An elastic gang's size: pods per elastic pod set, in the gang's order, as last
    # admitted or scaled (dispatcher.elastic); empty for a rigid one or before dispatch.
    elasticPods: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list)
    # While it waits: when the dispatcher estimates it will start (dispatcher.eta).
    estimatedStart: Time | None = None
    # While it waits: its place in the dispatcher's queue (1: considered first), under the
    # policy named, in the whole cluster and among the wrappers of its quota node in each
    # quota tree (controller/record/positions.py).
    queuePosition: int | None = Field(default=None, ge=1)
    queuePolicy: str | None = None
    quotaPositions: list[QuotaPosition] | None = None
    # In a worker cluster, a manager's copy: its manager's wrapper uid, as its label said
    # when the worker's dispatcher first took it in. Recorded where only the dispatcher
    # writes, so that the fence against a lost manager outlives the label's removal.
    managerUid: str | None = None
    # In a manager cluster: the worker cluster the manager sent it to, recorded before the
    # copy is made there. Where tenants may write labels (no webhook), only what the manager
    # recorded where they cannot says a wrapper is sent.
    workerCluster: str | None = None


class AppWrapper(_Model):
    model_config = ConfigDict(extra="allow")

    apiVersion: str = APPWRAPPER_API_VERSION
    kind: str = APPWRAPPER_KIND
    metadata: ObjectMeta
    spec: AppWrapperSpec
    status: AppWrapperStatus = Field(default_factory=AppWrapperStatus)


# --- validation of untrusted input --------------------------------------------------


class InvalidSpec(ValueError):
    """An AppWrapper the dispatcher cannot act on. ``problems`` holds one line per fault,
    bounded (see :mod:`dispatcher.api.messages`: each line and their total are capped, the
    rest counted in a last line), so however they are joined the message stays small;
    ``str()`` is all of them, one per line, ready for a condition message or an Event.
    ``count`` is the number of problems found, shown or not."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.count = len(problems)
        self.problems: list[str] = cap_problems(problems)
        super().__init__("\n".join(self.problems))


def parse_appwrapper(obj: Mapping[str, Any]) -> AppWrapper:
    """Validate ``obj`` (a dict from the API server or a YAML file) as an AppWrapper.

    Raises :class:`InvalidSpec` listing every problem found: schema errors from the
    models, then checks that need no knowledge of the wrapped kinds (at least one item;
    each item names its apiVersion, kind and name; items live in the AppWrapper's
    namespace; no AppWrapper inside an AppWrapper; no two items with the same identity).
    """
    if not isinstance(obj, Mapping):
        raise InvalidSpec([f"an AppWrapper must be a mapping, got {_describe(obj)}"])
    problems = [*_identity_problems(obj), *_count_problems(obj)]
    parsed: AppWrapper | None = None
    try:
        parsed = AppWrapper.model_validate(dict(obj))
    except ValidationError as exc:
        problems.extend(_format_error(err) for err in exc.errors())
    problems.extend(_semantic_problems(obj))
    if problems:
        raise InvalidSpec(problems)
    assert parsed is not None
    return parsed


def _identity_problems(obj: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    api_version = obj.get("apiVersion")
    if api_version is not None and api_version != APPWRAPPER_API_VERSION:
        hint = ""
        if isinstance(api_version, str) and api_version.startswith(LEGACY_API_GROUP + "/"):
            hint = (
                f" (MCAD's old {LEGACY_API_GROUP} group: change apiVersion to "
                f"{APPWRAPPER_API_VERSION})"
            )
        problems.append(
            f"apiVersion: must be {APPWRAPPER_API_VERSION}, got {_describe(api_version)}{hint}"
        )
    kind = obj.get("kind")
    if kind is not None and kind != APPWRAPPER_KIND:
        problems.append(f"kind: must be {APPWRAPPER_KIND}, got {_describe(kind)}")
    return problems


def _count_problems(obj: Mapping[str, Any]) -> list[str]:
    spec = obj.get("spec")
    resources = spec.get("resources") if isinstance(spec, Mapping) else None
    items = resources.get("GenericItems") if isinstance(resources, Mapping) else None
    if not isinstance(items, list) or len(items) <= MAX_ITEMS:
        return []
    return [f"spec.resources.GenericItems: {len(items)} items, more than the {MAX_ITEMS} an "
            "AppWrapper may wrap: wrap fewer objects (a gang's size is in their replicas), "
            "or split them into several AppWrappers"]


def _misspelt(section: Mapping[str, Any], field: str, where: str) -> str:
    """ " (spec.resources.GenericItemz: did you mean GenericItems?)" when a key of
    `section` is a near miss for the missing `field`; else ""."""
    keys = [k for k in section if isinstance(k, str) and k != field]
    close = difflib.get_close_matches(field, keys, n=1, cutoff=0.75) or [
        k for k in keys if k.lower() == field.lower()]
    return f" ({where}.{close[0]}: did you mean {field}?)" if close else ""


def _semantic_problems(obj: Mapping[str, Any]) -> list[str]:
    """Checks on the raw input, each skipped where the schema already reported the part."""
    problems: list[str] = []
    metadata = obj.get("metadata")
    namespace = namespace_of(obj)
    if isinstance(metadata, Mapping):
        problems.extend(_appwrapper_name_problems(metadata))

    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return problems
    resources = spec.get("resources")
    if not isinstance(resources, Mapping):
        return problems
    items = resources.get("GenericItems")
    if items is None and resources.get("Items") is not None:
        problems.append(
            "spec.resources.Items: MCAD's old list of items, no longer part of v1beta1: "
            "move each entry's template to spec.resources.GenericItems[].generictemplate")
        return problems
    if items is None or (isinstance(items, list) and not items):
        problems.append("spec.resources.GenericItems is empty: wrap at least one object"
                        + _misspelt(resources, "GenericItems", "spec.resources"))
        return problems
    if not isinstance(items, list):
        return problems

    seen: dict[tuple[str, str, str], int] = {}
    for index, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue
        template = item.get("generictemplate")
        if not isinstance(template, Mapping):
            continue
        where = f"spec.resources.GenericItems[{index}].generictemplate"
        problems.extend(_template_problems(where, template, namespace))
        identity = _template_identity(template)
        if identity is not None:
            if identity in seen:
                _group, kind, name = identity
                problems.append(
                    f"{where}: {kind} {name!r} is also wrapped by "
                    f"spec.resources.GenericItems[{seen[identity]}]: "
                    "each wrapped object needs its own name"
                )
            else:
                seen[identity] = index
    return problems


def namespace_of(obj: Mapping[str, Any]) -> str:
    """The namespace an AppWrapper as written is in ("default" when it names none)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, Mapping) and isinstance(metadata.get("namespace"), str):
        return metadata["namespace"] or "default"
    return "default"


def _appwrapper_name_problems(metadata: Mapping[str, Any]) -> list[str]:
    problems = []
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if isinstance(name, str):
        problem = name_problem(name, APPWRAPPER_NAME, "an AppWrapper name")
        if problem:
            problems.append(f"metadata.name: {problem}")
    if isinstance(namespace, str) and namespace:
        problem = name_problem(namespace, DNS1123_LABEL, "a namespace name")
        if problem:
            problems.append(f"metadata.namespace: {problem}")
    return problems


def _item_name_problems(where: str, template: Mapping[str, Any],
                        metadata: Mapping[str, Any]) -> list[str]:
    api_version, kind = template.get("apiVersion"), template.get("kind")
    if not (isinstance(api_version, str) and isinstance(kind, str)):
        return []
    rule = item_name_rule(api_version.rpartition("/")[0], kind, template)
    what = f"a {kind} name"
    name, generate = metadata.get("name"), metadata.get("generateName")
    problem = None
    if _nonempty_str(name):
        problem = name_problem(str(name), rule, what)
        field = "name"
    elif _nonempty_str(generate):
        # The name will be the prefix and GENERATED_SUFFIX lower-case letters or digits.
        problem = name_problem(str(generate) + "0" * GENERATED_SUFFIX, rule, what,
                               suggest=False)
        field = "generateName"
        if problem:
            problem = f"(+ {GENERATED_SUFFIX} generated characters) {problem}"
    if not problem:
        return []
    return [f"{where}.metadata.{field}: {problem}; the API server would refuse this object"]


def _template_problems(where: str, template: Mapping[str, Any], namespace: str) -> list[str]:
    problems: list[str] = []
    missing: list[str] = []
    api_version = template.get("apiVersion")
    kind = template.get("kind")
    if not isinstance(api_version, str) or not api_version:
        missing.append("apiVersion")
    if not isinstance(kind, str) or not kind:
        missing.append("kind")
    metadata = template.get("metadata")
    if metadata is not None and not isinstance(metadata, Mapping):
        problems.append(f"{where}.metadata: must be a mapping, got {_describe(metadata)}")
        metadata = None
    metadata = metadata or {}
    if not _nonempty_str(metadata.get("name")) and not _nonempty_str(
        metadata.get("generateName")
    ):
        missing.append("metadata.name (or metadata.generateName)")
    if missing:
        problems.append(
            f"{where}: missing {_join_and(missing)}: a wrapped object must say what it is "
            "and what it is called"
        )
    else:
        problems.extend(_item_name_problems(where, template, metadata))

    item_namespace = metadata.get("namespace")
    if item_namespace not in (None, "") and item_namespace != namespace:
        problems.append(
            f"{where}.metadata.namespace: is {_describe(item_namespace)}, but a wrapped "
            f"object must be in the AppWrapper's namespace {namespace!r} "
            "(remove the field or set it to that namespace)"
        )

    if kind == APPWRAPPER_KIND and isinstance(api_version, str):
        group = api_version.rpartition("/")[0]
        if group in (API_GROUP, LEGACY_API_GROUP):
            problems.append(
                f"{where}: wraps an AppWrapper; AppWrappers cannot be nested, "
                "wrap its items directly instead"
            )
    return problems


def _template_identity(template: Mapping[str, Any]) -> tuple[str, str, str] | None:
    api_version = template.get("apiVersion")
    kind = template.get("kind")
    metadata = template.get("metadata")
    if not (isinstance(api_version, str) and isinstance(kind, str)):
        return None
    if not isinstance(metadata, Mapping) or not _nonempty_str(metadata.get("name")):
        return None  # generateName gives every copy its own name
    return api_version.rpartition("/")[0], kind, str(metadata["name"])


def _nonempty_str(value: object) -> bool:
    return isinstance(value, str) and bool(value)


def _join_and(words: Sequence[str]) -> str:
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


# --- pydantic errors in the user's terms --------------------------------------------

_SIMPLE_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def _format_path(loc: Sequence[int | str]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif _SIMPLE_KEY.match(part):
            path += f".{part}" if path else part
        else:
            path += f"[{part!r}]"
    return path or "(the AppWrapper)"


def _describe(value: object) -> str:
    """A short rendering of a user's value for a message; never dumps a whole object."""
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_MESSAGES: dict[str, str] = {
    "missing": "is required",
    "int_type": "must be an integer, got {input}",
    "int_parsing": "must be an integer, got {input}",
    "int_from_float": "must be a whole number, got {input}",
    "float_type": "must be a number, got {input}",
    "float_parsing": "must be a number, got {input}",
    "string_type": "must be a string, got {input}",
    "bool_type": "must be true or false, got {input}",
    "bool_parsing": "must be true or false, got {input}",
    "dict_type": "must be a mapping, got {input}",
    "model_type": "must be a mapping, got {input}",
    "model_attributes_type": "must be a mapping, got {input}",
    "list_type": "must be a list, got {input}",
    "datetime_type": "must be an RFC 3339 timestamp, got {input}",
    "datetime_parsing": "must be an RFC 3339 timestamp, got {input}",
    "datetime_from_date_parsing": "must be an RFC 3339 timestamp, got {input}",
    "greater_than_equal": "must be ≥ {ge}, got {input}",
    "greater_than": "must be > {gt}, got {input}",
    "less_than_equal": "must be ≤ {le}, got {input}",
    "literal_error": "must be one of {expected}, got {input}",
}


def _format_error(err: Mapping[str, Any]) -> str:
    path = _format_path(err.get("loc", ()))
    kind = str(err.get("type", ""))
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    if kind == "value_error" and "error" in ctx:
        return f"{path}: {ctx['error']}"
    template = _MESSAGES.get(kind)
    if template is None:
        msg = str(err.get("msg", "is invalid"))
        return f"{path}: {msg[:1].lower()}{msg[1:]}"
    fields = {key: str(value) for key, value in ctx.items()}
    fields["input"] = _describe(err.get("input"))
    try:
        return f"{path}: {template.format(**fields)}"
    except KeyError:
        return f"{path}: {err.get('msg', 'is invalid')}"
