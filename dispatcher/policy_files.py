"""Finding and reading policy files.

The built-in policies ship inside the package (dispatcher/policies/*.yaml, package
data), so an installed `dispatcher` finds them wherever it is installed; they are read
through importlib.resources. DISPATCHER_POLICIES_DIR points at another folder of
built-ins instead; any policy file can also be given by its path.
"""

from __future__ import annotations

import os
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path

import yaml

from dispatcher import yaml_text
from dispatcher.queue.policy import Policy, PolicyError, policy_from_mapping


def policies_dir() -> Traversable:
    env = os.environ.get("DISPATCHER_POLICIES_DIR")
    return Path(env) if env else files("dispatcher") / "policies"


def builtin_names() -> list[str]:
    folder = policies_dir()
    if not folder.is_dir():
        return []
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir()
                  if p.name.endswith(".yaml"))


def _looks_like_a_path(name_or_path: str) -> bool:
    return os.sep in name_or_path or "/" in name_or_path or \
        name_or_path.endswith((".yaml", ".yml"))


def load_policy(name_or_path: str) -> Policy:
    """A built-in policy by name (fifo, priority, backfill) or a policy YAML file."""
    path: Traversable = Path(name_or_path)
    if _looks_like_a_path(name_or_path):
        if not path.is_file():
            problem = "is not a file" if path.is_dir() else "does not exist"
            raise PolicyError(f"policy file {name_or_path} {problem}")
    else:
        path = policies_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            names = builtin_names()
            known = f"one of {', '.join(names)}" if names else (
                f"a built-in policy (none found in {policies_dir()}: a broken installation?)")
            raise PolicyError(
                f"unknown policy {name_or_path!r}: use {known} or the path of a policy YAML file"
            )
    try:
        data = yaml_text.load(yaml_text.read(path), str(path))
    except (OSError, yaml.YAMLError) as e:
        raise PolicyError(f"{path}: cannot read policy: {e}") from e
    if not isinstance(data, dict):
        raise PolicyError(f"{path}: a policy file holds one mapping")
    return policy_from_mapping(data, source=str(path))
