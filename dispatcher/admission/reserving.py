"""Backfill around reservations (a policy that reserves, dispatcher.queue.reservation):
where a wrapper behind a reserved head may dispatch without delaying it."""

from __future__ import annotations

from collections.abc import Sequence

from dispatcher.fit.capacity import Capacity
from dispatcher.fit.gang import Placement, Placer, Shortfall
from dispatcher.queue.queue import QueuedWrapper
from dispatcher.queue.reservation import (
    BACKFILLED,
    Reservation,
    Reservations,
    clock_time,
    node_list,
)


def around(w: QueuedWrapper, placed: list[Placement], active: Sequence[Reservation],
            reservations: Reservations, capacity: Capacity,
            fit_gang: Placer,
            now: float, kept_out: dict[tuple[object, ...], str]
            ) -> tuple[list[Placement], str] | str:
    """Where `w`, which fits now as `placed`, may dispatch without delaying a reservation
    of `active`, and the words for it; or why it waits.

    It keeps its placement if that touches no reserved node it would still run on when
    the reservation starts; else it is placed again with those nodes left out."""
    nodes = {p.node for p in placed if p.node is not None}
    outlasted = reservations.outlasted(w.key, now, active)
    if not any(r.nodes & nodes for r in outlasted):
        before = [r for r in reservations.ended_before(w.key, now, active) if r.nodes & nodes]
        if not before:
            return placed, ""
        first = min(before, key=lambda r: r.at)
        return placed, (f"{BACKFILLED}expected to end before the reservation of {first.name} "
                        f"at {clock_time(first.at, now)}")
    for p in placed:
        if p.node is not None:
            capacity.give(p.node, p.request)
    kept = reserved_nodes(w, active, reservations, now)
    hidden = [(n, {r: v for r, v in capacity.free_of(n).items() if v > 0})
              for n in sorted(kept) if n in capacity.nodes]
    for n, free in hidden:
        capacity.take(n, free)
    again = fit_gang(w.gang, capacity)
    for n, free in hidden:
        capacity.give(n, free)
    # The reservation it was placed onto first (under reserveFirst, not always the head's).
    first = min((r for r in outlasted if r.nodes & nodes), key=lambda r: r.at)
    if isinstance(again, Shortfall):
        refused = (f"fits now only on nodes reserved for {first.name}, which is to start at "
                   f"{clock_time(first.at, now)} on {node_list(first.nodes)}, and is "
                   f"expected to run past that")
        kept_out[(w.gang_key, kept)] = refused
        return refused
    return again, f"{BACKFILLED}beside the nodes reserved for {first.name}"


def reserved_nodes(w: QueuedWrapper, active: Sequence[Reservation],
                    reservations: Reservations, now: float) -> frozenset[str]:
    """The reserved nodes `w`, started now, would still run on when they are needed."""
    return frozenset().union(*(r.nodes for r in reservations.outlasted(w.key, now, active)))
