"""One admission cycle: each wrapper, in the policy's order, goes through the same steps
— valid? behind a head? its quota? a place for every pod? room made for it? — and the
first step that decides it returns its decision. Dispatches take their capacity before
the next wrapper is considered."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from dispatcher.elastic import Scale, at_minimum
from dispatcher.fit.capacity import Capacity
from dispatcher.fit.elastic import describe, lowest
from dispatcher.fit.gang import Placement, Shortfall
from dispatcher.fit.rules import NO_TOPOLOGY, Fit, fit_rules
from dispatcher.fit.topology import Topology
from dispatcher.preemption import AdmittedWrapper, Hold, Taken, apply_holds, give_hold
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import QueuedWrapper, WrapperKey
from dispatcher.queue.reservation import Reservation, Reservations
from dispatcher.quota import QuotaCheck, QuotaLedger
from dispatcher.wording import span

from .decision import (
    AWAITING_PREEMPTION,
    BEHIND_HEAD,
    DISPATCH,
    INVALID,
    NOT_DECIDED,
    QUOTA_EXCEEDED,
    UNKNOWN_QUOTA,
    WAITS_FOR_RESERVATION,
    CycleStats,
    Decision,
    EmptyClusterAnswers,
    behind_head,
    past_guard,
    placed_message,
    with_notes,
)
from .growth import grow_elastic
from .making_room import MakingRoom, consumer
from .reserving import around, reserved_nodes

Key = tuple[object, ...]  # a gang shape (QueuedWrapper.gang_key), or one with more


def admit(
    ordered: Iterable[QueuedWrapper],
    capacity: Capacity,
    policy: Policy,
    now: float,
    fit: Fit = "per-node",
    stats: CycleStats | None = None,
    empty_answers: EmptyClusterAnswers | None = None,
    *,
    quota: QuotaLedger | None = None,
    admitted: Sequence[AdmittedWrapper] = (),
    holds: Mapping[WrapperKey, Hold] | None = None,
    scaling: list[Scale] | None = None,
    topology: Topology | None = None,
    reservations: Reservations | None = None,
    name_all: bool = False,
) -> list[Decision]:
    """Decide every wrapper of `ordered`; dispatches take capacity from `capacity`.

    `empty_answers` may be kept by the caller across cycles only while the nodes are
    unchanged, and only for one fit rule.

    Quotas and preemption (all optional; without them nothing changes):
    `quota` is the usage of the quota trees by the admitted and held wrappers
    (``preemption.quota_ledger``); each wrapper must then fit its quota before its pods
    are placed, and each dispatch adds to the usage, so the caller sees it afterwards.
    `admitted` are the dispatched and running wrappers, which a policy with preemption
    may tear down. `holds` is the room kept for preemptors until they dispatch.

    Elastic gangs (dispatcher.elastic) are admitted at their minimum and grown in the
    same cycle by what is left; pass `scaling` to have the admitted ones grown too (their
    scale-outs are appended to it). Scale-ins come as `preempt` decisions' `shrinks`.

    `topology`: the installation's topology levels (fit.topology). A pod set asking for a
    level it lacks is invalid; one asking for a domain is placed in one (per-node fit;
    the aggregate rule places no pod and so ignores the requests).
    `reservations` (under a policy that reserves, see dispatcher.queue.reservation): once
    a reserved head waits, a wrapper behind it dispatches only where it does not delay
    that reservation; else it waits with WAITS_FOR_RESERVATION.
    `name_all`: a preemption's message names its victims in other namespaces too (for
    `dispatcher plan` over files the user gave); else they are counted, as a status is
    read by the preemptor's namespace.
    """
    cycle = Cycle(capacity, policy, now, fit, stats or CycleStats(),
                  empty_answers or EmptyClusterAnswers(), quota, admitted, holds or {},
                  topology or NO_TOPOLOGY, reservations, name_all)
    for w in ordered:
        try:
            cycle.decide(w)
        except Exception as e:  # one wrapper's error costs that wrapper, not the cycle
            cycle.undecided(w, e)
    return cycle.finish(scaling)


class Cycle:
    """What one cycle has decided and remembers while it goes down the queue."""

    def __init__(self, capacity: Capacity, policy: Policy, now: float, fit: Fit,
                 stats: CycleStats, answers: EmptyClusterAnswers, quota: QuotaLedger | None,
                 admitted: Sequence[AdmittedWrapper], holds: Mapping[WrapperKey, Hold],
                 topology: Topology, reservations: Reservations | None,
                 name_all: bool = False) -> None:
        self.capacity = capacity
        self.policy = policy
        self.now = now
        self.fit: Fit = fit
        self.stats = stats
        self.answers = answers
        self.topology = topology
        self.reservations = reservations
        self.fit_gang, self.hopeless_gang = fit_rules(fit, topology)
        live, self.expired = _live_holds(holds, admitted, policy, now, quota)
        self.held = apply_holds(capacity, live)
        self.ledger = quota if quota is not None and quota.active else None
        self.room = MakingRoom(capacity, policy, now, fit, self.ledger, admitted,
                               self.fit_gang, stats,
                               topology if fit == "per-node" and topology.levels else None,
                               name_all)
        # Capacity only shrinks during a cycle, so a gang shape that did not fit once will
        # not fit later in the same cycle: remember the answer. Quota may free up when room
        # is made, so its answers are remembered only until then.
        self.failed: dict[Key, Shortfall] = {}
        self.quota_failed: dict[Key, QuotaCheck] = {}
        self.blocking: QueuedWrapper | None = None
        # Quota nodes a waiting wrapper holds the line at, for the wrappers under them only.
        self.quota_blocks: dict[tuple[str, str], QueuedWrapper] = {}
        self.head_seen = False
        self.said: tuple[QueuedWrapper, str] | None = None  # the blocking head, its words
        self.decisions: list[Decision] = []
        self.seen: dict[WrapperKey, QueuedWrapper] = {}
        # The reservations kept from backfill: all of them from the first reserved wrapper
        # on, but for those whose wrapper dispatched.
        self.active: list[Reservation] = []
        # Gang shapes that fit nowhere but on reserved nodes, by the nodes left out: that
        # answer too holds for the rest of the cycle.
        self.kept_out: dict[Key, str] = {}

    # --- the steps ----------------------------------------------------------------------

    def decide(self, queued: QueuedWrapper) -> None:
        self.stats.considered += 1
        self.seen[queued.key] = queued
        if (not self.active and self.reservations is not None
                and self.reservations.of(queued.key) is not None):
            # From the first reserved wrapper on, every reservation is kept from backfill
            # (those before it dispatch as the reservations were planned).
            self.active = list(self.reservations.held)
        w = at_minimum(queued)
        prio = w.effective_priority(self.now)
        own_hold = self.held.get(w.key) if self.held else None
        decision = (self._invalid(w, prio)
                    or (None if own_hold is not None else self._behind(w, prio)))
        if decision is None:
            in_quota = self._in_quota(w, prio, own_hold)
            if isinstance(in_quota, Decision):
                decision = in_quota
            else:
                decision = self._placed(w, prio, own_hold, in_quota)
        self.decisions.append(decision)

    def undecided(self, w: QueuedWrapper, error: Exception) -> None:
        """`w` could not be decided: it waits, saying why, and holds nobody's line. What
        the steps took for it before they raised stays taken this cycle (less room for
        the others, never more)."""
        self.decisions.append(Decision(
            *w.key, "wait", NOT_DECIDED,
            f"the dispatcher could not decide about it ({type(error).__name__}: "
            f"{str(error)[:300]}); it is tried again at every cycle, and the wrappers "
            "behind it go on without it: report it with the dispatcher's log"))

    def _invalid(self, w: QueuedWrapper, prio: float) -> Decision | None:
        invalid = w.invalid
        if invalid is None and w.asks_topology:
            invalid = self.topology.problem(w.gang)
        if invalid is None:
            return None
        return Decision(w.namespace, w.name, "invalid", INVALID, invalid,
                        effective_priority=prio)

    def _behind(self, w: QueuedWrapper, prio: float) -> Decision | None:
        """Waits behind a head that holds the line, or behind one that waits for room in
        a quota node `w` counts against. (A wrapper holding room passes any head: the
        room was given to it already.)"""
        blocking = self.blocking
        if blocking is not None:
            # The head's own decision says why it waits; repeating that here would rewrite
            # every queued wrapper's status whenever the head's reason changes. The same
            # words for everyone behind it: written once.
            if self.said is None or self.said[0] is not blocking:
                self.said = (blocking, behind_head(blocking.key, self.policy))
            return Decision(w.namespace, w.name, "wait", BEHIND_HEAD, self.said[1],
                            effective_priority=prio)
        if self.ledger is None or not self.quota_blocks:
            return None
        behind = _behind_quota(self.ledger, w, self.quota_blocks)
        if behind is None:
            return None
        (tree, node), first = behind
        return Decision(w.namespace, w.name, "wait", BEHIND_HEAD,
                        f"waiting behind {first.namespace}/{first.name}, which waits for room "
                        f"in quota {node} (tree {tree}) ({self.policy.name} policy)"
                        f"{past_guard(self.policy)}",
                        effective_priority=prio)

    def _in_quota(self, w: QueuedWrapper, prio: float, own_hold: Taken | None
                  ) -> QuotaCheck | Decision | None:
        """Where `w` fits its quota trees (None: no quota); else its decision: room made
        for it, or a wait that may hold the line for those under the full node."""
        ledger = self.ledger
        if ledger is None:
            return None
        # A held wrapper is counted already, for its hold: not twice.
        mine = ledger.remove(w.key) if own_hold is not None else None
        # Without its hold counted, the quota answers of others are not its answer.
        in_quota = (ledger.check(w.labels, w.demand) if mine is not None
                    else _quota_check(ledger, w, self.quota_failed))
        if in_quota.fits:
            return in_quota
        if mine is not None:
            ledger.add(mine, force=True)
        if own_hold is None and not in_quota.unknown:
            made = self._make_room(w, prio)
            if made is not None:  # a borrower gives back quota (and room) it owes
                return made
        reason = UNKNOWN_QUOTA if in_quota.unknown else QUOTA_EXCEEDED
        # Short of quota it holds the line, as a head short of capacity does, but only for
        # the wrappers that count against the node that is full for it: its team's when
        # its own quota is full, everyone's when the root is.
        blocks_here = bool(in_quota.full) and blocks(self.policy, w, self.now)
        holds_all = blocks_here and any(ledger.forest.trees[t].root.name == n
                                        for t, n in in_quota.full)
        decision = Decision(w.namespace, w.name, "wait", reason,
                            with_notes(in_quota.message, in_quota),
                            head_of_line=holds_all and not self.head_seen,
                            effective_priority=prio, quota=in_quota.placements)
        if holds_all:
            self.head_seen = True
            self._block(w)
        elif blocks_here:
            self.quota_blocks.update(dict.fromkeys(in_quota.full, w))
        return decision

    def _placed(self, w: QueuedWrapper, prio: float, own_hold: Taken | None,
                in_quota: QuotaCheck | None) -> Decision:
        """A dispatch if every pod gets a place; else room made for it, or why it waits."""
        key = w.gang_key
        shortfall = None if own_hold is not None else self.failed.get(key)
        if shortfall is None:
            placed = self._place(w, prio, own_hold, in_quota)
            if isinstance(placed, Decision):
                return placed
            shortfall = placed
        else:
            self.stats.cache_hits += 1
        if self.ledger is not None and own_hold is not None:
            self.ledger.add(consumer(w, prio, self.now), force=True)  # still held: counted
        hopeless = self._hopeless(w)
        if hopeless is not None:
            return Decision(w.namespace, w.name, "wait", hopeless.reason, hopeless.message,
                            effective_priority=prio)
        if own_hold is None:
            made = self._make_room(w, prio)
            if made is not None:
                return made
        return self._waits_for_capacity(w, prio, own_hold, in_quota, shortfall)

    def _place(self, w: QueuedWrapper, prio: float, own_hold: Taken | None,
               in_quota: QuotaCheck | None) -> Decision | Shortfall:
        """Its dispatch, or a wait for a reservation, or why its pods do not fit."""
        self.stats.fit_checks += 1
        capacity = self.capacity
        if own_hold is not None:
            give_hold(capacity, own_hold)
        reserving = bool(self.active) and self.reservations is not None
        if reserving and own_hold is None:
            refused = self._kept_out(w)
            if refused is not None:
                return Decision(w.namespace, w.name, "wait", WAITS_FOR_RESERVATION, refused,
                                effective_priority=prio)
        result = self.fit_gang(w.gang, capacity)
        note = ""
        if reserving and not isinstance(result, Shortfall):
            assert self.reservations is not None
            beside = around(w, result, self.active, self.reservations, capacity,
                            self.fit_gang, self.now, self.kept_out)
            if isinstance(beside, str):
                return Decision(w.namespace, w.name, "wait", WAITS_FOR_RESERVATION, beside,
                                effective_priority=prio)
            result, note = beside
            note = self._backfill_limit(note)
        if not isinstance(result, Shortfall):
            return self._dispatch(w, prio, result, note, in_quota)
        if own_hold is not None:
            for node, part in own_hold:
                capacity.take(node, part)
        else:
            self.failed[w.gang_key] = result
        return result

    def _backfill_limit(self, note: str) -> str:
        """A backfill's words name the policy's backfillLimitSeconds, if any: what ends it
        should it overrun the time it was expected to take."""
        limit = self.policy.backfill_limit_seconds
        if not note or limit is None:
            return note
        ending = ("torn down and queued again" if self.policy.backfill_limit_action ==
                  "requeue" else "failed")
        return (f"{note}; {ending} if still running {span(limit)} after dispatch (the "
                f"policy's backfillLimitSeconds)")

    def _kept_out(self, w: QueuedWrapper) -> str | None:
        """Why its shape already failed to fit off the nodes it would have to leave to a
        reservation, in this cycle."""
        assert self.reservations is not None
        nodes = reserved_nodes(w, self.active, self.reservations, self.now)
        return self.kept_out.get((w.gang_key, nodes))

    def _dispatch(self, w: QueuedWrapper, prio: float, placed: list[Placement], note: str,
                  in_quota: QuotaCheck | None) -> Decision:
        self.stats.dispatched += 1
        if self.active:  # a reserved wrapper that dispatches needs its reservation no more
            self.active = [r for r in self.active if r.key != w.key]
        quota_text = ""
        if self.ledger is not None and in_quota is not None:
            self.ledger.add(consumer(w, prio, self.now))
            quota_text = in_quota.describe()
        message = "; ".join(filter(None, (note, placed_message(placed, self.fit), quota_text,
                                          _minimum_message(w))))
        return Decision(w.namespace, w.name, "dispatch", DISPATCH,
                        with_notes(message, in_quota), tuple(placed), effective_priority=prio,
                        quota=in_quota.placements if in_quota is not None else (),
                        elastic=lowest(w.elastic))

    def _hopeless(self, w: QueuedWrapper) -> Shortfall | None:
        """Why it could not fit even the empty cluster, if so (remembered per shape)."""
        never = self.answers.never
        key = w.gang_key
        if key not in never:
            if self.answers.empty is None:
                self.answers.empty = Capacity.empty(self.capacity.nodes.values())
            never[key] = self.hopeless_gang(w.gang, self.answers.empty)
        return never[key]

    def _make_room(self, w: QueuedWrapper, prio: float) -> Decision | None:
        made = self.room.make_room(w, prio)
        if made is not None:
            self.quota_failed.clear()  # quota freed: its answers are stale
        return made

    def _waits_for_capacity(self, w: QueuedWrapper, prio: float, own_hold: Taken | None,
                            in_quota: QuotaCheck | None, shortfall: Shortfall) -> Decision:
        reason, message = shortfall.reason, shortfall.message
        if own_hold is not None:
            reason = AWAITING_PREEMPTION
            message = ("the capacity freed by preemption is held for it until the preempted "
                       "pods are gone: " + message)
        mine = self.reservations.of(w.key) if self.reservations is not None else None
        if mine is not None:
            message = f"{mine.describe(self.now)}; {message}"
        decision = Decision(w.namespace, w.name, "wait", reason, message,
                            head_of_line=not self.head_seen, effective_priority=prio,
                            quota=in_quota.placements if in_quota is not None else ())
        self.head_seen = True
        if blocks(self.policy, w, self.now):
            self._block(w)
        return decision

    def _block(self, w: QueuedWrapper) -> None:
        self.blocking = w
        self.stats.blocked_by = w.key

    # --- the end ------------------------------------------------------------------------

    def finish(self, scaling: list[Scale] | None) -> list[Decision]:
        """The decisions, elastic gangs grown by what is left, and the holds given up
        said."""
        decisions = self.decisions
        if self.fit == "per-node":
            grow_elastic(decisions, self.seen, self.room.pool if scaling is not None else [],
                         self.room.gone, self.capacity, self.policy, self.ledger, scaling,
                         self.topology)
        if self.expired:
            expired = self.expired
            decisions = [dataclasses.replace(d, message=f"gave up the room held for it: "
                                             f"{expired[d.key]}; {d.message}")
                         if d.key in expired and d.decision != "dispatch" else d
                         for d in decisions]
        return decisions


def blocks(policy: Policy, w: QueuedWrapper, now: float) -> bool:
    """Whether `w`, waiting at `now`, holds the line for the wrappers behind it."""
    if not policy.backfill:
        return True
    guard = policy.max_head_wait_seconds
    return guard is not None and now - w.first_seen > guard


def _live_holds(holds: Mapping[WrapperKey, Hold], admitted: Sequence[AdmittedWrapper],
                policy: Policy, now: float, quota: QuotaLedger | None
                ) -> tuple[dict[WrapperKey, Hold], dict[WrapperKey, str]]:
    """The holds still alive, and why each of the others was given up: older than
    `policy.max_hold_seconds`, or waiting for a wrapper to scale in that is admitted as
    not elastic now (its resize was refused). Their room and the quota counted for them
    are everyone's again, and their owners compete as any queued wrapper: a victim that
    never goes, or never shrinks, would otherwise hold the room, and the line, for ever."""
    rigid = {a.key for a in admitted if a.elastic is None}
    expired: dict[WrapperKey, str] = {}
    for key, hold in holds.items():
        stuck = next((k for k in hold.shrinks if k in rigid), None)
        if stuck is not None:
            expired[key] = f"{stuck[0]}/{stuck[1]} cannot be scaled in now"
        elif now - hold.since >= policy.max_hold_seconds:
            expired[key] = (f"what it waited for was not gone after "
                            f"{span(policy.max_hold_seconds)}")
    if quota is not None:
        for key in expired:
            quota.remove(key)
    return {k: h for k, h in holds.items() if k not in expired}, expired


def _minimum_message(w: QueuedWrapper) -> str:
    if not w.elastic:
        return ""
    return f"admitted at its minimum, {describe(w.elastic, lowest(w.elastic))}"


def _behind_quota(ledger: QuotaLedger, w: QueuedWrapper,
                  blocks: Mapping[tuple[str, str], QueuedWrapper]
                  ) -> tuple[tuple[str, str], QueuedWrapper] | None:
    """The blocked quota node on `w`'s paths, and the wrapper waiting there, if any."""
    res = ledger.forest.resolve(w.labels)
    for tree, leaf in res.leaves:
        t = ledger.forest.trees[tree]
        for x in t.nodes[leaf].path:
            spot = (tree, t.order[x].name)
            first = blocks.get(spot)
            if first is not None:
                return spot, first
    return None


def _quota_check(ledger: QuotaLedger, w: QueuedWrapper,
                 failed: dict[Key, QuotaCheck]) -> QuotaCheck:
    memo = (w.labels, w.gang_key)
    known = failed.get(memo)
    if known is not None:
        return known
    check = ledger.check(w.labels, w.demand)
    if not check.fits:
        failed[memo] = check
    return check
