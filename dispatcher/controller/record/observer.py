"""What the dispatcher reports as it works: the hooks metrics implement."""

from __future__ import annotations

from typing import Any


class Observer:
    """What the dispatcher reports as it works; metrics subclass it. Every method is
    called on the event loop and must not block."""

    def cycle(self, seconds: float, queued: int, decisions: int) -> None: ...
    def dispatched(self, waited_seconds: float) -> None: ...
    def requeued(self, reason: str) -> None: ...
    def reset(self, reason: str) -> None:
        """A v1beta2 gang reset (its objects torn down and created again)."""

    def failed(self, reason: str) -> None: ...
    def completed(self) -> None: ...
    def preempted(self, reason: str) -> None:
        """A gang torn down for another: reason "priority" or "reclaim" (quota)."""

    def start_estimate_error(self, estimate: str, seconds: float) -> None:
        """A wrapper started `seconds` away from its estimate ("initial" or "shown")."""

    def placed_in_topology(self, level: str, one_domain: bool) -> None:
        """A dispatched gang's pod sets that asked for a domain of `level` (a configured
        level) landed in one domain of it, or were spread (a preferred level)."""

    # The dispatcher (runtime.Dispatcher) is read, not typed here: this module is below
    # it, and each observer reads what it shows.
    def snapshot(self, dispatcher: Any) -> None:
        """After each cycle: gauges (states, queue, capacity) read from the dispatcher."""
