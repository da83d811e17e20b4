"""YAML read from a file's text, with PyYAML's errors naming that file.

Given a string, PyYAML says ``in "<unicode string>", line 3``; given a stream with a
name, it says that name. Every reader of a user's file goes through here. PyYAML reads
nesting recursively: a document nested about a thousand levels deep exhausts Python's
stack, which is said as a YAML error (:class:`TooDeep`) like any other bad input.
"""

from __future__ import annotations

import io
from typing import Any

import yaml


class _Named(io.StringIO):
    def __init__(self, text: str, name: str) -> None:
        super().__init__(text)
        self.name = name


class TooDeep(yaml.YAMLError):
    def __init__(self) -> None:
        super().__init__("nested too deep to be read (no Kubernetes object nests more than "
                         "a few dozen levels): flatten it")


def load(text: str, name: str) -> Any:
    """The one document of `text` (read from the file `name`)."""
    try:
        return yaml.safe_load(_Named(text, name))
    except RecursionError:
        raise TooDeep() from None


def load_all(text: str, name: str) -> list[Any]:
    """Every document of `text` (read from the file `name`)."""
    try:
        return list(yaml.safe_load_all(_Named(text, name)))
    except RecursionError:
        raise TooDeep() from None


def named(text: str, name: str) -> io.StringIO:
    """`text` as a stream that PyYAML names `name` in its errors (for a yaml.SafeLoader)."""
    return _Named(text, name)
