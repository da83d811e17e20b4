"""Room made for a wrapper that does not fit: admitted elastic gangs shrunk, else whole
gangs preempted (dispatcher.elastic, dispatcher.preemption). The preemptor's room is
then held as it will be until it dispatches."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from dispatcher.cluster.state import PlannedPod
from dispatcher.elastic import Shrink, ShrinkRound, demand_at, shrink_search
from dispatcher.fit.capacity import Capacity
from dispatcher.fit.gang import Placer
from dispatcher.fit.rules import Fit
from dispatcher.fit.topology import Topology
from dispatcher.preemption import AdmittedWrapper, Preemption, PreemptionSearch, take_hold
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import QueuedWrapper, WrapperKey
from dispatcher.quota import QuotaCheck, QuotaConsumer, QuotaLedger

from .decision import PREEMPTING, CycleStats, Decision, placed_message


class MakingRoom:
    def __init__(self, capacity: Capacity, policy: Policy, now: float, fit: Fit,
                 ledger: QuotaLedger | None, admitted: Sequence[AdmittedWrapper],
                 placer: Placer, stats: CycleStats, topology: Topology | None = None,
                 name_all: bool = False) -> None:
        """`topology`: victims of a gang that requires a domain are found in one domain
        (per-node fit with topology levels only). `name_all`: name the victims in other
        namespaces too (for a reader of the whole snapshot, as offline plan's)."""
        self.name_all = name_all
        self.capacity = capacity
        self.policy = policy
        self.now = now
        self.fit: Fit = fit
        self.ledger = ledger
        self.placer = placer
        self.stats = stats
        # Elastic gangs that may shrink (per-node fit only: scale-ins place pods).
        self.pool = [a for a in admitted if a.elastic is not None] if fit == "per-node" else []
        self.shrinking = ShrinkRound()  # the cycle's scale-ins (bounded work, who shrank)
        self.search = (PreemptionSearch(policy, now, admitted, ledger, placer, topology)
                       if policy.preemption != "never" and admitted else None)

    def _reader(self, w: QueuedWrapper) -> str | None:
        """Who reads `w`'s message: its namespace's readers, or (None) everyone's."""
        return None if self.name_all else w.namespace

    @property
    def gone(self) -> set[WrapperKey]:
        """The admitted wrappers this cycle preempted or scaled in."""
        return self.shrinking.scaled | (self.search.gone if self.search is not None else set())

    def make_room(self, w: QueuedWrapper, prio: float) -> Decision | None:
        """`w`'s decision to wait for elastic gangs to shrink, else for whole gangs to be
        preempted; None when neither makes it fit."""
        shrunk = self._try_shrink(w, prio)
        if shrunk is not None:
            return shrunk
        if self.search is None:
            return None
        found = self.search.search(w, self.capacity)
        return self._preempt(w, found, prio) if found is not None else None

    def _try_shrink(self, w: QueuedWrapper, prio: float) -> Decision | None:
        if not self.pool or not self.shrinking.may_search(w, prio):
            return None
        found = shrink_search(w, prio, self.capacity, self.pool, self.policy, self.now,
                              self.ledger, gone=self.gone, placer=self.placer)
        if found is None:
            self.shrinking.failed(w, prio)
            return None
        self.shrinking.scaled.update(s.key for s in found.scales)
        return self._shrink(w, found, prio)

    def _shrink(self, w: QueuedWrapper, found: Shrink, prio: float) -> Decision:
        """Record a scale-in for `w`: its room is held as it will be until it dispatches,
        and the wrappers scaled in count at their new size."""
        take_hold(self.capacity, [PlannedPod(p.node, p.request) for p in found.placements
                                  if p.node is not None])
        placed = QuotaCheck()
        if self.ledger is not None:
            by_key = {a.key: a for a in self.pool}
            for s in found.scales:
                old = self.ledger.remove(s.key)
                e = by_key[s.key].elastic
                if old is not None and e is not None:
                    self.ledger.add(dataclasses.replace(
                        old, demand=demand_at(e.gang, e.sets, s.after)), force=True)
            placed = self.ledger.add(consumer(w, prio, self.now), force=True)
        self.stats.preemptions += 1
        message = found.message(placed_message(found.placements, "per-node"),
                                self._reader(w))
        if placed.placements:
            message += "; " + placed.describe()
        return Decision(w.namespace, w.name, "preempt", PREEMPTING, message, found.placements,
                        effective_priority=prio, quota=placed.placements,
                        shrinks=found.scales)

    def _preempt(self, w: QueuedWrapper, found: Preemption, prio: float) -> Decision:
        """Record a preemption: the victims are gone for the rest of the cycle, and the
        preemptor's room is held as it will be in the cycles until it dispatches."""
        assert self.search is not None
        for v in found.victims:
            self.search.gone.add(v.key)
            if self.ledger is not None:
                self.ledger.remove(v.key)
        placements = found.placements
        if self.fit == "aggregate":
            self.capacity.take_total({r: min(v, max(self.capacity.free_total.get(r, 0), 0))
                                      for r, v in w.demand.items()})
        else:
            take_hold(self.capacity, [PlannedPod(p.node, p.request) for p in placements
                                      if p.node is not None])
        placed = QuotaCheck()
        if self.ledger is not None:
            placed = self.ledger.add(consumer(w, prio, self.search.now), force=True)
        self.stats.preemptions += 1
        self.stats.victims += len(found.victims)
        message = found.message(placed_message(placements, self.fit), self._reader(w))
        if placed.placements:
            message += "; " + placed.describe()
        return Decision(w.namespace, w.name, "preempt", PREEMPTING, message, placements,
                        effective_priority=prio, preempts=found.keys,
                        reclaims=tuple(k for k in found.keys if k in found.reclaimed),
                        quota=placed.placements)


def consumer(w: QueuedWrapper, priority: float, now: float) -> QuotaConsumer:
    """`w` as the quota ledger counts it."""
    return QuotaConsumer(w.key, w.labels, w.demand, priority, now)
