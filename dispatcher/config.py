"""The installation's configuration file: which kinds AppWrappers may wrap.

```yaml
# dispatcher-config.yaml
allowedKinds:
  defaults: true                 # start from DEFAULT_ALLOWED_KINDS (the guide's table)
  add: [RoleBinding.rbac.authorization.k8s.io, MyJob.example.com]
  remove: [Secret]
```

Kinds are written ``Kind.group`` (``Kind`` alone for the core group). Read once at
start by `dispatcher run` / the webhook / `dispatcher plan --config`; a file with an
unknown field, a malformed kind or a cluster-scoped kind is refused with a message that
names the file and the field. Without a file, the defaults apply.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import ErrorDetails

from dispatcher import yaml_text
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


class DispatcherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    allowedKinds: AllowedKinds = Field(default_factory=AllowedKinds)

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
        text = Path(path).read_text()
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
        return "unknown field (a configuration has allowedKinds: {defaults, add, remove})"
    if err["type"] == "value_error" and "ctx" in err:
        return str(err["ctx"]["error"])
    return err["msg"]
