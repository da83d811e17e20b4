"""What every kind module shares: the error, template references and field readers.

Wrapped objects reach the dispatcher without API validation or defaulting, so every
read here checks the shape and names the exact field when it is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Path = tuple[str | int, ...]


class InvalidItem(ValueError):
    """A wrapped object the dispatcher cannot count pods for; the message says what to fix."""


@dataclass(frozen=True)
class Template:
    """`count` pods from `template` (a PodTemplateSpec: metadata and spec).

    `path` is where the template sits in the wrapped object; None for a pod the object
    implies without spelling it out (a RayJob's default submitter).
    """

    name: str
    count: int
    path: Path | None
    template: object


Handler = Callable[[Mapping[str, Any]], list[Template]]


def path_text(path: Sequence[str | int]) -> str:
    """`("spec", "workerGroupSpecs", 0, "template")` -> `spec.workerGroupSpecs[0].template`."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _kind_of(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a map"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def child_map(parent: Mapping[str, Any], key: str, path: Path) -> Mapping[str, Any]:
    """`parent[key]` as a map; missing or null reads as empty."""
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidItem(f"{path_text((*path, key))} must be a map, not {_kind_of(value)}")
    return value


def child_list(parent: Mapping[str, Any], key: str, path: Path) -> list[Any]:
    """`parent[key]` as a list; missing or null reads as empty."""
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidItem(f"{path_text((*path, key))} must be a list, not {_kind_of(value)}")
    return value


def as_map(value: object, path: Path) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidItem(f"{path_text(path)} must be a map, not {_kind_of(value)}")
    return value


def optional_count(parent: Mapping[str, Any], key: str, path: Path) -> int | None:
    """A replica-like count: a whole number, 0 or more; None when missing."""
    value = parent.get(key)
    if value is None:
        return None
    where = path_text((*path, key))
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if isinstance(value, bool) or not whole:
        raise InvalidItem(f"{where} is {value!r}: it must be a whole number")
    if value < 0:
        raise InvalidItem(f"{where} is {value}: {key} must be 0 or more")
    return int(value)


def count(parent: Mapping[str, Any], key: str, path: Path, default: int) -> int:
    found = optional_count(parent, key, path)
    return default if found is None else found
