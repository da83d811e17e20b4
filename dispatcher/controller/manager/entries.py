"""The manager's wrappers as the core reads them (queue entries and cluster selectors),
parsed once per version of each: a pass over thousands of wrappers parses only those that
changed since the last."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dispatcher.admission import first_seen_of, queued_from_appwrapper
from dispatcher.api.models import InvalidSpec, parse_appwrapper
from dispatcher.fleet import CLUSTER_SELECTOR_ANNOTATION, SelectorError, parse_selector
from dispatcher.queue.queue import QueuedWrapper

#: A wrapper read: its entry and selector, or why it cannot be read.
Read = tuple[QueuedWrapper, dict[str, str]] | str


class Entries:
    def __init__(self) -> None:
        self._read: dict[str, tuple[str, Read]] = {}  # uid -> (resourceVersion, read)

    def read(self, obj: Mapping[str, Any], now: float) -> Read:
        """The wrapper's queue entry and cluster selector, or the error that says what to
        fix in it."""
        meta = obj["metadata"]
        uid, version = str(meta.get("uid", "")), str(meta.get("resourceVersion", ""))
        known = self._read.get(uid)
        if known is not None and known[0] == version and version:
            return known[1]
        result: Read
        try:
            aw = parse_appwrapper(obj)
            selector = parse_selector((meta.get("annotations") or {}).get(
                CLUSTER_SELECTOR_ANNOTATION, ""))
            result = (queued_from_appwrapper(aw, first_seen_of(aw, now)), selector)
        except (InvalidSpec, SelectorError) as e:
            result = str(e)
        self._read[uid] = (version, result)
        return result

    def keep_only(self, uids: Iterable[str]) -> None:
        """Forget the wrappers not listed any more."""
        keep = set(uids)
        self._read = {u: r for u, r in self._read.items() if u in keep}
