"""Several clusters, one queue: the manager's rules (pure).

choice: which worker cluster takes a gang now, or why none can.
quota: a worker's quota ledger, as its dispatcher counts it.
copies: what the manager does with a wrapper it sent, from the copy its worker holds.
"""

from .choice import (
    CLUSTER_SELECTOR_ANNOTATION,
    Chosen,
    NoneFits,
    SelectorError,
    Worker,
    charge,
    choose,
    dispatch,
    order,
    parse_selector,
    selects,
    take,
    unbound,
)
from .quota import worker_ledger

__all__ = [
    "CLUSTER_SELECTOR_ANNOTATION", "Chosen", "NoneFits", "SelectorError", "Worker", "charge",
    "choose", "dispatch", "order", "parse_selector", "selects", "take", "unbound",
    "worker_ledger",
]
