"""Every kind the dispatcher knows, by (API group, kind), and how to read its pods."""

from __future__ import annotations

from dispatcher.kinds import batch, core, kubeflow, ray
from dispatcher.kinds.base import Handler

HANDLERS: dict[tuple[str, str], Handler] = {
    **core.HANDLERS, **batch.HANDLERS, **kubeflow.HANDLERS, **ray.HANDLERS,
}

NO_POD_KINDS: frozenset[tuple[str, str]] = core.NO_POD_KINDS
KNOWN_KINDS: frozenset[tuple[str, str]] = frozenset(HANDLERS) - NO_POD_KINDS
