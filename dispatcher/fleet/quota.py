"""A worker cluster's quota as the manager counts it: the worker's QuotaSubtrees, with every
wrapper its own dispatcher counts against them (those admitted there), and the wrappers the
manager sent there that the worker has not admitted yet (it will: they were chosen because
they fit)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dispatcher.preemption import AdmittedWrapper, quota_ledger
from dispatcher.queue.queue import QueuedWrapper
from dispatcher.quota import QuotaForest, QuotaLedger

from .choice import charge


def worker_ledger(subtrees: Sequence[Mapping[str, Any]], admitted: Iterable[AdmittedWrapper],
                  sent: Iterable[QueuedWrapper], now: float) -> QuotaLedger | None:
    """The worker's quota ledger (None: it has no quota trees), counted as its dispatcher
    counts it (``preemption.quota_ledger``), then each wrapper `sent` there that it has not
    admitted yet."""
    forest = QuotaForest.from_objects(subtrees)
    if not forest:
        return None
    ledger = quota_ledger(forest, admitted)
    for w in sent:
        if w.key not in ledger:  # else its copy is admitted there, counted already
            charge(ledger, w, now, force=True)
    return ledger
