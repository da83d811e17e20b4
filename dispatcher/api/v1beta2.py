"""The AppWrapper API's second version, ``workload.codeflare.dev/v1beta2``, as pydantic models.

This is the version codeflare's AppWrapper controller and codeflare-sdk write: the wrapped
objects are ``spec.components[].template``, each with optional declared ``podSets``
(``replicas`` and the ``path`` of a pod template inside the template), ``podSetInfos`` (what
to add to those pod templates) and ``annotations``; ``spec.suspend`` holds a wrapper back;
``status`` tells a ``phase`` and Kubernetes-style conditions, one per type.

The dispatcher acts on v1beta1 (:mod:`dispatcher.api.models`): the API server stores
AppWrappers as v1beta1 and converts between the versions through the dispatcher's
conversion webhook (:mod:`dispatcher.api.conversion`). :func:`parse_appwrapper_v1beta2`
checks a v1beta2 wrapper as written, and says every problem in v1beta2 terms.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field, StrictBool, ValidationError

from dispatcher.api.models import (
    API_GROUP,
    APPWRAPPER_KIND,
    InvalidSpec,
    ObjectMeta,
    StringMap,
    Time,
    _describe,
    _format_error,
    _Model,
    _template_problems,
    namespace_of,
)

API_VERSION_V1BETA2 = "v1beta2"
APPWRAPPER_API_VERSION_V1BETA2 = f"{API_GROUP}/{API_VERSION_V1BETA2}"

# The fewest and most pod sets one v1beta2 AppWrapper may have (its webhook's limits:
# Kueue admits a workload of at most 8 pod sets).
MIN_POD_SETS = 1
MAX_POD_SETS = 8


class Phase(StrEnum):
    """``status.phase`` of a v1beta2 AppWrapper."""

    Empty = ""
    Suspended = "Suspended"
    Resuming = "Resuming"
    Running = "Running"
    Suspending = "Suspending"
    Resetting = "Resetting"
    Succeeded = "Succeeded"
    Failed = "Failed"
    Terminating = "Terminating"


class V1beta2Condition(StrEnum):
    """The condition types of a v1beta2 AppWrapper."""

    QuotaReserved = "QuotaReserved"
    ResourcesDeployed = "ResourcesDeployed"
    PodsReady = "PodsReady"
    Unhealthy = "Unhealthy"
    DeletingResources = "DeletingResources"


class PodSetV2(_Model):
    """``replicas`` pods from the pod template at ``path`` inside the component's template
    (``template.spec.template``); no replicas: one pod."""

    model_config = ConfigDict(extra="forbid")

    path: str
    replicas: int | None = Field(default=None, ge=0)
    annotations: StringMap = Field(default_factory=dict)


class SchedulingGate(_Model):
    model_config = ConfigDict(extra="forbid")

    name: str


class PodSetInfo(_Model):
    """What to add to the pod template of the pod set at the same position."""

    model_config = ConfigDict(extra="forbid")

    annotations: StringMap = Field(default_factory=dict)
    labels: StringMap = Field(default_factory=dict)
    nodeSelector: StringMap = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    schedulingGates: list[SchedulingGate] = Field(default_factory=list)


class Component(_Model):
    model_config = ConfigDict(extra="forbid")

    template: dict[str, Any]
    podSets: list[PodSetV2] = Field(default_factory=list)
    podSetInfos: list[PodSetInfo] = Field(default_factory=list)
    annotations: StringMap = Field(default_factory=dict)


class AppWrapperSpecV2(_Model):
    model_config = ConfigDict(extra="forbid")

    components: list[Component]
    suspend: StrictBool = False
    managedBy: str | None = None


class MetaCondition(_Model):
    """A ``metav1.Condition``: one per type, its time to the second."""

    model_config = ConfigDict(extra="allow")

    type: str
    status: str
    reason: str
    message: str = ""
    lastTransitionTime: Time
    observedGeneration: int | None = Field(default=None, ge=0)


class ComponentStatus(_Model):
    model_config = ConfigDict(extra="allow")

    name: str
    kind: str
    apiVersion: str
    podSets: list[PodSetV2] = Field(default_factory=list)
    conditions: list[dict[str, Any]] = Field(default_factory=list)


class AppWrapperStatusV2(_Model):
    model_config = ConfigDict(extra="allow")

    phase: str = ""
    resettingCount: int = Field(default=0, ge=0)
    conditions: list[MetaCondition] = Field(default_factory=list)
    componentStatus: list[ComponentStatus] = Field(default_factory=list)
    # The dispatcher's, as v1beta1 has them, for the same printer columns.
    requestedGPUs: int | None = Field(default=None, ge=0)
    queuePosition: int | None = Field(default=None, ge=1)
    estimatedStart: Time | None = None
    message: str | None = None
    # What a dispatcher records to decide what runs where, as v1beta1 has it.
    workerCluster: str | None = None
    managerUid: str | None = None


class AppWrapperV2(_Model):
    model_config = ConfigDict(extra="allow")

    apiVersion: str = APPWRAPPER_API_VERSION_V1BETA2
    kind: str = APPWRAPPER_KIND
    metadata: ObjectMeta
    spec: AppWrapperSpecV2
    status: AppWrapperStatusV2 = Field(default_factory=AppWrapperStatusV2)


def parse_appwrapper_v1beta2(obj: Mapping[str, Any]) -> AppWrapperV2:
    """Validate ``obj`` as a v1beta2 AppWrapper; :class:`InvalidSpec` lists every problem.

    The checks that need no knowledge of the wrapped kinds: at least one component; each
    template names its apiVersion, kind and name, lives in the wrapper's namespace and is
    no AppWrapper. Pod sets (declared or inferred, 1 to 8) are the kinds' to check
    (:func:`dispatcher.kinds.declared.component_pod_sets`).
    """
    if not isinstance(obj, Mapping):
        raise InvalidSpec([f"an AppWrapper must be a mapping, got {_describe(obj)}"])
    problems: list[str] = []
    api_version = obj.get("apiVersion")
    if api_version is not None and api_version != APPWRAPPER_API_VERSION_V1BETA2:
        problems.append(f"apiVersion: must be {APPWRAPPER_API_VERSION_V1BETA2}, got "
                        f"{_describe(api_version)}")
    parsed: AppWrapperV2 | None = None
    try:
        parsed = AppWrapperV2.model_validate(dict(obj))
    except ValidationError as exc:
        problems.extend(_format_error(err) for err in exc.errors())
    problems.extend(_component_problems(obj))
    if problems:
        raise InvalidSpec(problems)
    assert parsed is not None
    return parsed


def _component_problems(obj: Mapping[str, Any]) -> list[str]:
    namespace = namespace_of(obj)
    spec = obj.get("spec")
    components = spec.get("components") if isinstance(spec, Mapping) else None
    if not isinstance(components, list):
        return []
    if not components:
        return ["spec.components is empty: wrap at least one object"]
    problems: list[str] = []
    for index, component in enumerate(components):
        template = component.get("template") if isinstance(component, Mapping) else None
        if isinstance(template, Mapping):
            problems.extend(_template_problems(f"spec.components[{index}].template",
                                               template, namespace))
    return problems
