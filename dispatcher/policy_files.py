"""Finding and reading policy files (the built-ins live in the repository's policies/)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from dispatcher.queue.policy import Policy, PolicyError, policy_from_mapping


def policies_dir() -> Path:
    env = os.environ.get("DISPATCHER_POLICIES_DIR")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "policies"


def builtin_names() -> list[str]:
    return sorted(p.stem for p in policies_dir().glob("*.yaml"))


def load_policy(name_or_path: str) -> Policy:
    """A built-in policy by name (fifo, priority, backfill) or a policy YAML file."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = policies_dir() / f"{name_or_path}.yaml"
        if not path.exists():
            raise PolicyError(
                f"unknown policy {name_or_path!r}: use one of {', '.join(builtin_names())} "
                "or the path of a policy YAML file"
            )
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise PolicyError(f"{path}: cannot read policy: {e}") from e
    if not isinstance(data, dict):
        raise PolicyError(f"{path}: a policy file holds one mapping")
    return policy_from_mapping(data, source=str(path))
