"""A worker cluster's quota from the manager's look at it: its QuotaSubtrees and
AppWrappers read as the worker's own dispatcher reads them (the records of those admitted
there, as `dispatcher run` and `plan` make them), and the manager's wrappers sent there
(dispatcher.fleet.worker_ledger counts them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dispatcher.admission import (
    admitted_records,
    first_seen_of,
    is_admitted,
    queued_from_appwrapper,
)
from dispatcher.api.models import AppWrapper, InvalidSpec, parse_appwrapper
from dispatcher.cluster import ClusterState
from dispatcher.fleet import worker_ledger
from dispatcher.quota import QuotaLedger


def worker_quota(subtrees: Sequence[Mapping[str, Any]], wrappers: Iterable[Mapping[str, Any]],
                 state: ClusterState, now: float,
                 sent: Iterable[Mapping[str, Any]] = ()) -> QuotaLedger | None:
    """The worker's quota ledger (None: it has no quota trees). `wrappers`: every
    AppWrapper in the worker; `state`: its nodes and pods; `sent`: the manager's wrappers
    sent there and not finished."""
    if not subtrees:
        return None
    admitted = admitted_records([aw for aw in _parsed(wrappers) if is_admitted(aw)], state,
                                now)
    entries = [queued_from_appwrapper(aw, first_seen_of(aw, now)) for aw in _parsed(sent)]
    return worker_ledger(subtrees, admitted, entries, now)


def _parsed(objs: Iterable[Mapping[str, Any]]) -> list[AppWrapper]:
    out = []
    for obj in objs:
        try:
            out.append(parse_appwrapper(obj))
        except InvalidSpec:
            continue  # its own dispatcher admits nothing it cannot read
    return out
