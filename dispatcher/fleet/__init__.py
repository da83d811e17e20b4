"""Several clusters, one queue: the manager's rules (pure).

choice: which worker cluster takes a gang now, or why none can.
copies: what the manager does with a wrapper it sent, from the copy its worker holds.
"""

from .choice import (
    CLUSTER_SELECTOR_ANNOTATION,
    Chosen,
    NoneFits,
    SelectorError,
    Worker,
    choose,
    dispatch,
    order,
    parse_selector,
    selects,
    take,
    unbound,
)

__all__ = [
    "CLUSTER_SELECTOR_ANNOTATION", "Chosen", "NoneFits", "SelectorError", "Worker", "choose",
    "dispatch", "order", "parse_selector", "selects", "take", "unbound",
]
