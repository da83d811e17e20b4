"""Fields of an AppWrapper that the API does not have: a typo (``priorty:``) is otherwise
silently dropped. The API server prunes them from what it stores (the CRD's schema is
structural) and kubectl's field validation reports them at apply; `dispatcher plan` reads
files, so it says the same, as a warning.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator

from pydantic import BaseModel

from dispatcher.api.models import AppWrapper

# Written by the controller, not by users.
_NOT_WALKED = frozenset({"status"})


def unknown_fields(aw: AppWrapper) -> list[str]:
    """One warning per field of `aw`'s spec (or top level) its API does not have."""
    return [f"{path}: unknown field, ignored{_hint(name, known)}"
            for path, name, known in _walk(aw, "")]


def _walk(model: BaseModel, path: str) -> Iterator[tuple[str, str, list[str]]]:
    known = list(type(model).model_fields)
    for name in model.model_extra or {}:
        yield _join(path, name), name, known
    for name in known:
        if not path and name in _NOT_WALKED:
            continue
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from _walk(value, _join(path, name))
        elif isinstance(value, list):
            for index, entry in enumerate(value):
                if isinstance(entry, BaseModel):
                    yield from _walk(entry, f"{_join(path, name)}[{index}]")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _hint(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    if not close:
        close = [k for k in known if k.lower() == name.lower()]
    return f" (did you mean {close[0]}?)" if close else ""
