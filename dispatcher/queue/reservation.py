"""Reservations: the room a waiting head will start in, kept from long backfill.

Under a policy that reserves (``backfill: reserve``), the head of the line gets a
reservation: the moment and the nodes where the replay of expected durations
(dispatcher.eta) says it starts. A wrapper behind it may still pass it (backfill), but
only if it does not touch the reserved nodes or is expected to end before the
reservation starts; so with exact durations no backfill ever delays the head.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from dispatcher.queue.queue import WrapperKey

# How the message of a dispatch that passed a reserved head begins (the Dispatched
# condition keeps it: a backfill limit applies to that run).
BACKFILLED = "backfilled: "


def clock_time(at: float, now: float) -> str:
    """The time of day in UTC: to the second within the hour, with the date when it is
    not today."""
    when = datetime.fromtimestamp(at, UTC)
    if when.date() != datetime.fromtimestamp(now, UTC).date():
        return when.strftime("%Y-%m-%d %H:%M UTC")
    return when.strftime("%H:%M:%S UTC" if abs(at - now) < 3600 else "%H:%M UTC")


def node_list(nodes: Iterable[str], shown: int = 5) -> str:
    names = sorted(nodes)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


@dataclass(frozen=True)
class Reservation:
    """`key` is expected to start at `at` on `nodes`."""

    key: WrapperKey
    at: float
    nodes: frozenset[str]

    @property
    def name(self) -> str:
        return f"{self.key[0]}/{self.key[1]}"

    def describe(self, now: float) -> str:
        return f"reserved: starts at {clock_time(self.at, now)} on nodes {node_list(self.nodes)}"


@dataclass(frozen=True)
class Reservations:
    """The reservations of one admission cycle, and the expected duration of every
    queued wrapper (the same durations the reservations were replayed with). A wrapper
    without one is taken to run for ever: it never backfills onto reserved nodes."""

    held: tuple[Reservation, ...] = ()
    expected: Mapping[WrapperKey, float] = field(default_factory=dict)

    def of(self, key: WrapperKey) -> Reservation | None:
        return next((r for r in self.held if r.key == key), None)

    def ends_at(self, key: WrapperKey, now: float) -> float:
        return now + self.expected.get(key, float("inf"))

    def outlasted(self, key: WrapperKey, now: float,
                  active: Iterable[Reservation]) -> list[Reservation]:
        """The reservations of `active` that `key`, started now, would still run at."""
        end = self.ends_at(key, now)
        return [r for r in active if r.key != key and end > r.at]

    def ended_before(self, key: WrapperKey, now: float, active: Iterable[Reservation]
                     ) -> list[Reservation]:
        end = self.ends_at(key, now)
        return [r for r in active if r.key != key and end <= r.at]
