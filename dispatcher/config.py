"""The installation's configuration file: which kinds AppWrappers may wrap, topology levels.

```yaml
# dispatcher-config.yaml
allowedKinds:
  defaults: true                 # start from DEFAULT_ALLOWED_KINDS (the guide's table)
  add: [RoleBinding.rbac.authorization.k8s.io, MyJob.example.com]
  remove: [Secret]
topology:                        # node labels, outermost first (docs/topology.md)
  levels: [cloud.provider.com/topology-block, cloud.provider.com/topology-rack]
faultTolerance:                  # v1beta2 wrappers' defaults (docs/guide/v1beta2.md)
  retryPausePeriod: 90s
  gracePeriodMaximum: 24h        # no annotation may ask for more
autopilot:                       # node health labels (docs/guide/v1beta2.md), codeflare's form
  resourceTaints:
    nvidia.com/gpu:
    - {key: autopilot.ibm.com/gpuhealth, value: EVICT, effect: NoExecute}
```

Kinds are written ``Kind.group`` (``Kind`` alone for the core group). Read once at
start by `dispatcher run` / the webhook / `dispatcher plan --config`; a file with an
unknown field, a malformed kind or a cluster-scoped kind is refused with a message that
names the file and the field. Without a file, the defaults apply.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from dispatcher import yaml_text
from dispatcher.api.fault_tolerance import DEFAULT_FAULT_TOLERANCE, FaultTolerance, go_duration
from dispatcher.cluster.autopilot import DEFAULT_AUTOPILOT, Autopilot, ResourceTaint
from dispatcher.fit.topology import Topology
from dispatcher.kinds.scope import (
    CLUSTER_SCOPED_KINDS,
    DEFAULT_ALLOWED_KINDS,
    GroupKind,
    kind_name,
    parse_kind_name,
)


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message says where and why."""


class AllowedKinds(BaseModel):
    model_config = ConfigDict(extra="forbid")

    defaults: bool = True
    add: list[str] = Field(default_factory=list)
    remove: list[str] = Field(default_factory=list)

    @field_validator("add", "remove")
    @classmethod
    def _kinds(cls, names: list[str]) -> list[str]:
        for name in names:
            parse_kind_name(name)
        return names

    @field_validator("add")
    @classmethod
    def _namespaced(cls, names: list[str]) -> list[str]:
        scoped = [n for n in names if parse_kind_name(n) in CLUSTER_SCOPED_KINDS]
        if scoped:
            raise ValueError(
                f"{', '.join(scoped)}: cluster-scoped, and an AppWrapper creates objects only "
                "in its own namespace; such kinds are never allowed")
        return names

    def resolve(self) -> frozenset[GroupKind]:
        base = DEFAULT_ALLOWED_KINDS if self.defaults else frozenset()
        added = {parse_kind_name(n) for n in self.add}
        removed = {parse_kind_name(n) for n in self.remove}
        return frozenset((base | added) - removed)


class TopologyLevels(BaseModel):
    """The topology levels, node labels outermost first; also read from Kueue's
    ``Topology`` object (``spec.levels[].nodeLabel``) pasted as it is."""

    model_config = ConfigDict(extra="forbid")

    levels: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _kueue(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("kind") == "Topology":
            spec = data.get("spec")
            levels = spec.get("levels") if isinstance(spec, dict) else None
            if not isinstance(levels, list):
                raise ValueError("a Kueue Topology needs spec.levels: [{nodeLabel: ...}, ...]")
            return {"levels": levels}
        return data

    @field_validator("levels", mode="before")
    @classmethod
    def _labels(cls, levels: Any) -> Any:
        if not isinstance(levels, list):
            return levels
        out = [level.get("nodeLabel") if isinstance(level, dict) else level
               for level in levels]
        labels = [x for x in out if isinstance(x, str) and x]
        if len(labels) < len(out):
            bad = [repr(x) for x in out if not isinstance(x, str) or not x]
            raise ValueError(f"{', '.join(bad)}: a level is a node label, e.g. "
                             "cloud.provider.com/topology-rack (or {nodeLabel: ...})")
        twice = sorted({x for x in labels if labels.count(x) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)}: listed twice; list each level once")
        return labels


# faultTolerance's fields, each a Go duration but retryLimit, and FaultTolerance's.
_FAULT_TOLERANCE_FIELDS = {
    "admissionGracePeriod": "admission_grace", "warmupGracePeriod": "warmup_grace",
    "failureGracePeriod": "failure_grace", "retryPausePeriod": "retry_pause",
    "deletionOnFailureGracePeriod": "deletion_on_failure_grace",
    "forcefulDeletionGracePeriod": "forceful_deletion_grace", "successTTL": "success_ttl",
    "gracePeriodMaximum": "grace_period_maximum",
}


class FaultToleranceConfig(BaseModel):
    """The defaults of the fault-tolerance annotations of v1beta2 wrappers, and the
    maximum any grace period may be (codeflare's names)."""

    model_config = ConfigDict(extra="forbid")

    admissionGracePeriod: str | None = None
    warmupGracePeriod: str | None = None
    failureGracePeriod: str | None = None
    retryPausePeriod: str | None = None
    deletionOnFailureGracePeriod: str | None = None
    forcefulDeletionGracePeriod: str | None = None
    successTTL: str | None = None
    gracePeriodMaximum: str | None = None
    retryLimit: int | None = Field(default=None, ge=0)

    @field_validator(*_FAULT_TOLERANCE_FIELDS)
    @classmethod
    def _duration(cls, text: str | None) -> str | None:
        seconds = None if text is None else go_duration(text)
        if text is not None and (seconds is None or seconds < 0):
            raise ValueError(f"{text!r} is not a duration ≥ 0 such as 90s, 5m or 1h30m")
        return text

    def resolve(self) -> FaultTolerance:
        values: dict[str, Any] = {
            setting: go_duration(text)
            for name, setting in _FAULT_TOLERANCE_FIELDS.items()
            if (text := getattr(self, name)) is not None}
        if self.retryLimit is not None:
            values["retry_limit"] = self.retryLimit
        return dataclasses.replace(DEFAULT_FAULT_TOLERANCE, **values)


class NodeLabelTaint(BaseModel):
    """A node label `key`=`value` that flags a resource, with the effect of a taint."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["NoSchedule", "NoExecute", "PreferNoSchedule"]


class AutopilotConfig(BaseModel):
    """Codeflare's `autopilot` settings: which node labels flag which resource unhealthy
    (its defaults without `resourceTaints`). `preferNoScheduleWeight` is accepted (a
    file written for codeflare's controller is read as it is) and not used."""

    model_config = ConfigDict(extra="forbid")

    injectAntiAffinities: bool = True
    monitorNodes: bool = True
    resourceTaints: dict[str, list[NodeLabelTaint]] | None = None
    preferNoScheduleWeight: int | None = None

    def resolve(self) -> Autopilot:
        taints = DEFAULT_AUTOPILOT.resource_taints if self.resourceTaints is None else {
            resource: tuple(ResourceTaint(t.key, t.value, t.effect) for t in listed)
            for resource, listed in self.resourceTaints.items()}
        return Autopilot(resource_taints=taints, avoid=self.injectAntiAffinities,
                         migrate=self.monitorNodes)


class DispatcherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    allowedKinds: AllowedKinds = Field(default_factory=AllowedKinds)
    topology: TopologyLevels = Field(default_factory=TopologyLevels)
    faultTolerance: FaultToleranceConfig = Field(default_factory=FaultToleranceConfig)
    autopilot: AutopilotConfig = Field(default_factory=AutopilotConfig)

    @property
    def node_health(self) -> Autopilot:
        """Which node labels flag a resource unhealthy, and what that does."""
        return self.autopilot.resolve()

    @property
    def fault_tolerance(self) -> FaultTolerance:
        """The installation's defaults for v1beta2 wrappers' fault tolerance."""
        return self.faultTolerance.resolve()

    @property
    def topology_levels(self) -> Topology:
        """The topology levels for admission (none: no topology-aware placement)."""
        return Topology(tuple(self.topology.levels))

    @property
    def allowed_kinds(self) -> frozenset[GroupKind]:
        """The (API group, kind) pairs AppWrappers may wrap: pass to check_kinds."""
        return self.allowedKinds.resolve()

    def describe(self) -> str:
        """The allowed kinds, one line, for a log at start."""
        return ", ".join(sorted(kind_name(gk) for gk in self.allowed_kinds))


def load_config(path: str | Path | None) -> DispatcherConfig:
    """The configuration in `path` (YAML), or the defaults when `path` is None."""
    if path is None:
        return DispatcherConfig()
    try:
        text = yaml_text.read(Path(path))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the configuration: {e.strerror or e}") from e
    try:
        data = yaml_text.load(text, str(path))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
    if data is None:
        return DispatcherConfig()
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a configuration is one mapping, e.g. allowedKinds: {{...}}")
    try:
        return DispatcherConfig.model_validate(data)
    except ValidationError as e:
        lines = [f"{'.'.join(str(p) for p in err['loc'])}: {_text(err)}" for err in e.errors()]
        raise ConfigError(f"{path}: " + "; ".join(lines)) from None


def _text(err: ErrorDetails) -> str:
    if err["type"] == "extra_forbidden":
        return ("unknown field (a configuration has allowedKinds: {defaults, add, remove}, "
                "topology: {levels: [node labels, outermost first]} and faultTolerance: "
                f"{{{', '.join([*_FAULT_TOLERANCE_FIELDS, 'retryLimit'])}}}, autopilot: "
                "{injectAntiAffinities, monitorNodes, resourceTaints, "
                "preferNoScheduleWeight})")
    if err["type"] == "value_error" and "ctx" in err:
        return str(err["ctx"]["error"])
    return err["msg"]
