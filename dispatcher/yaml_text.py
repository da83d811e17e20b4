"""A user's file read as text (:func:`read`), and YAML read from it with PyYAML's errors
naming that file.

Every file the commands read (AppWrappers, cluster snapshots, policies, configurations,
traces, topologies, quotas) is read by :func:`read`: as UTF-8 whatever the locale, and a
file that is not UTF-8 text is an OSError (:class:`NotText`) saying where its first bad
byte is, caught where each reader catches a file it cannot read; so every command names
the file and the offset alike.

Given a string, PyYAML says ``in "<unicode string>", line 3``; given a stream with a
name, it says that name. Every reader of a user's file goes through here. PyYAML reads
nesting recursively: a document nested about a thousand levels deep exhausts Python's
stack, which is said as a YAML error (:class:`TooDeep`) like any other bad input.
"""

from __future__ import annotations

import io
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml


class NotText(OSError):
    """A file that is not UTF-8 text; the message says where its first bad byte is."""

    def __init__(self, error: UnicodeDecodeError) -> None:
        bad = error.object[error.start:error.start + 1]
        message = (f"not UTF-8 text: byte 0x{bad.hex()} at offset {error.start} (a binary "
                   "file, or text in another encoding: save it as UTF-8, e.g. with "
                   "iconv -f LATIN1 -t UTF-8)")
        super().__init__(message)
        self.strerror = message
        self.offset = error.start

    def __str__(self) -> str:
        return str(self.strerror)


def read(path: Path | Traversable) -> str:
    """The text of the file `path`, UTF-8 whatever the locale; raises OSError (NotText
    for bytes that are not UTF-8)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NotText(e) from None


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
