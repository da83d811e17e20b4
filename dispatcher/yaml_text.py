"""YAML read from a file's text, with PyYAML's errors naming that file.

Given a string, PyYAML says ``in "<unicode string>", line 3``; given a stream with a
name, it says that name. Every reader of a user's file goes through here.
"""

from __future__ import annotations

import io
from typing import Any

import yaml


class _Named(io.StringIO):
    def __init__(self, text: str, name: str) -> None:
        super().__init__(text)
        self.name = name


def load(text: str, name: str) -> Any:
    """The one document of `text` (read from the file `name`)."""
    return yaml.safe_load(_Named(text, name))


def load_all(text: str, name: str) -> list[Any]:
    """Every document of `text` (read from the file `name`)."""
    return list(yaml.safe_load_all(_Named(text, name)))


def named(text: str, name: str) -> io.StringIO:
    """`text` as a stream that PyYAML names `name` in its errors (for a yaml.SafeLoader)."""
    return _Named(text, name)
