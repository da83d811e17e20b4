"""One admission cycle of the controller: the queue decided off the event loop
(admission.admit), and each decision carried out — only for the very object it was made
for. A dispatch takes its capacity at once, writes Dispatched, then creates the items."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Collection, Mapping, Sequence

from dispatcher.admission import AWAITING_PREEMPTION, BEHIND_HEAD, Decision, Fit, admit, past_guard
from dispatcher.api.conditions import ConditionType, Reason
from dispatcher.api.messages import cap_problems, problems_message
from dispatcher.api.models import WrappedItem
from dispatcher.cluster.state import PlannedPod
from dispatcher.controller.access.creator import creator_denials
from dispatcher.controller.access.grant_screen import GrantScreen
from dispatcher.controller.intake.router import Intake
from dispatcher.controller.items.scaling import Scaling
from dispatcher.controller.items.shaping import prepared_items
from dispatcher.controller.kube.client import Kube
from dispatcher.controller.record.memory import Memory
from dispatcher.controller.record.observer import Observer
from dispatcher.controller.record.positions import clear_position
from dispatcher.controller.record.status import Change, StatusWriter, says, told_by_status_alone
from dispatcher.controller.record.tasks import Tasks
from dispatcher.controller.record.tracked import ACTIVE, Key, Tracked, items_digest
from dispatcher.elastic import Scale
from dispatcher.fit import Capacity
from dispatcher.fit.topology import Topology
from dispatcher.lifecycle import judge
from dispatcher.queue import Policy, QueuedWrapper

from .estimate_round import cycle_reservations
from .estimates import Estimates
from .stepping import Stepping
from .transitions import Transitions

# Why a wrapper waits whose creator was not granted its quota node or priority.
NOT_GRANTED = "NotGranted"


class Admitting:
    def __init__(self, memory: Memory, tasks: Tasks, transitions: Transitions,
                 stepping: Stepping, estimates: Estimates, grants: GrantScreen,
                 scaling: Scaling, writer: StatusWriter, intake: Intake, observer: Observer,
                 kube: Kube, policy: Policy, fit: Fit, topology: Topology,
                 require_creator: bool) -> None:
        self.memory = memory
        self.tasks = tasks
        self.transitions = transitions
        self.stepping = stepping
        self.estimates = estimates
        self.grants = grants
        self.scaling = scaling
        self.writer = writer
        self.intake = intake
        self.observer = observer
        self.kube = kube
        self.policy = policy
        self.fit: Fit = fit
        self.topology = topology
        self.require_creator = require_creator

    async def cycle(self, now: float) -> int:
        """Decide the queue and carry out each decision; how many were made."""
        memory = self.memory
        ordered = list(memory.queue.ordered(now))
        # An admitted elastic gang may grow with nothing queued.
        elastic = self.scaling.any_elastic(memory.tracked, memory.elastic)
        if not ordered and not elastic:
            return 0
        capacity = Capacity.of(memory.state)
        sharing = memory.sharing
        forest = sharing.forest()
        ordered = self._granted(ordered, now)
        admitted = sharing.admitted(memory.tracked, memory.state, self.scaling.rigid(now)) \
            if forest is not None or self.policy.preemption != "never" or elastic else []
        ledger = sharing.ledger_for(forest, admitted)
        loop = asyncio.get_running_loop()
        scales: list[Scale] = []
        held = None
        if self.policy.reserve:
            held = await loop.run_in_executor(None, functools.partial(
                cycle_reservations, self.estimates.taken(now), self.estimates.s, ordered,
                capacity, self.policy, now, self.fit, dict(sharing.holds), self.topology))
        decisions = await loop.run_in_executor(None, functools.partial(
            admit, ordered, capacity, self.policy, now, self.fit,
            empty_answers=memory.empty_answers, quota=ledger, admitted=admitted,
            holds=dict(sharing.holds), scaling=scales, topology=self.topology,
            reservations=held))
        sharing.ledger = ledger
        asked = {w.key: w for w in ordered}
        for d in decisions:
            self._carry_out(d, asked, now)
        self._scale(scales, now)
        return len(decisions)

    def _carry_out(self, d: Decision, asked: Mapping[Key, QueuedWrapper], now: float) -> None:
        key = (d.namespace, d.name)
        t = self.memory.tracked.get(key)
        # Acted on only for the very object it was made for: an edit, or a delete and
        # re-create of the same name, while the cycle ran voids the decision.
        if t is None or t.phase != "queued" or t.queued is not asked.get(key) \
                or self.memory.queue.get(key) is not t.queued:
            return
        if t.key in self.tasks.busy:
            if d.decision != "dispatch" or not t.writes.waiting_write or t.writes.sending:
                return  # its last step is still under way: decided again next cycle
            # Only a write of why it waited, not sent yet: the Dispatched write says more
            # (and waiting for it, behind the status writes of every queued wrapper, would
            # leave the head of the line undispatched on a free cluster).
            self.tasks.cancel(t.key)
        if d.decision == "dispatch":
            self._begin_dispatch(t, d, now)
        elif d.decision == "preempt":
            self._preempt(t, d, now)
        elif d.decision == "invalid":
            self.memory.sharing.release(key)
            self.tasks.spawn(t, self.transitions.fail(t, Reason.InvalidSpec, d.message, now,
                                                      teardown=False))
        else:
            if d.reason != AWAITING_PREEMPTION:
                self.memory.sharing.release(key)  # the room it held is everyone's again
            self.waiting(t, d, now)

    def _granted(self, ordered: Sequence[QueuedWrapper], now: float) -> list[QueuedWrapper]:
        """The wrappers whose creator holds the grants their quota labels and priority
        need (access/grant_screen.py); the others wait, saying which grant is missing, and give
        back any room held for them."""
        kept, refused = self.grants.screen(ordered, self._annotations, self._trees(), now)
        for key, message in refused.items():
            self.memory.sharing.release(key)
            self.waiting(self.memory.tracked[key],
                         Decision(*key, "wait", NOT_GRANTED, message), now)
        return kept

    def _annotations(self, key: Key) -> Mapping[str, str]:
        t = self.memory.tracked.get(key)
        return t.aw.metadata.annotations if t is not None and t.aw is not None else {}

    def _trees(self) -> Collection[str]:
        forest = self.memory.sharing.forest()
        return forest.trees.keys() if forest is not None else ()

    def _scale(self, scales: Sequence[Scale], now: float) -> None:
        """Scale-outs and scale-ins decided for admitted elastic gangs (items/scaling.py)."""
        for s in scales:
            t = self.memory.tracked.get(s.key)
            if t is not None and t.phase in ACTIVE \
                    and not self.tasks.spawn(t, self.scaling.scale(t, s, now)) and not s.out:
                self.scaling.defer(t, s, now)  # a preemptor's room waits for it

    def _preempt(self, t: Tracked, d: Decision, now: float) -> None:
        """Room is held for `t` at once; its victims are torn down (whole gangs) and
        requeued with `Preempted`; it dispatches once their pods are gone."""
        self.memory.sharing.hold(t, d, now)
        self.waiting(t, d, now)
        self._scale(d.shrinks, now)
        for k in d.preempts:
            victim = self.memory.tracked.get(k)
            if victim is not None:
                self.tasks.spawn(victim, self.stepping.step(victim, now))

    def waiting(self, t: Tracked, d: Decision, now: float) -> None:
        """Why it waits, written when that changed."""
        t.writes.decided_to_wait = True
        if d.reason == BEHIND_HEAD:
            # Not the head's name: it changes whenever the head does, and would rewrite
            # every queued wrapper's status (`dispatcher queue` shows the order).
            said = (ConditionType.Queueing, Reason.AwaitingHeadOfLine, self.estimates.message(
                t, f"waiting for the AppWrappers ahead of it ({self.policy.name} policy)"
                f"{past_guard(self.policy)}"))
        else:
            said = (ConditionType.Backoff, Reason.AppWrapperNotRunnable,
                    self.estimates.message(t, f"{d.reason}: {d.message}"))
        if says(t, *said):
            return  # most of a long queue, most cycles: no copy of its status to make
        change = self.writer.begin(t, now)
        if change.condition(*said):
            self.tasks.spawn(t, self._commit_wait(t, change, d.reason))

    async def _commit_wait(self, t: Tracked, change: Change, reason: str) -> None:
        # A new reason to wait is news; the same reason with other numbers can wait.
        t.writes.waiting_write = True
        try:
            if await self.transitions.commit(change, force=reason != t.writes.wait_reason):
                t.writes.wait_reason = reason
        finally:
            t.writes.waiting_write = False

    # --- a dispatch ---------------------------------------------------------------------

    def _begin_dispatch(self, t: Tracked, d: Decision, now: float) -> None:
        """The capacity is taken at once, before anything is written: the next cycle
        must not promise it again while the write is under way. Given back if the
        dispatch does not happen."""
        self.memory.queue.remove(t.key)
        planned = [PlannedPod(p.node, p.request) for p in d.placements if p.node is not None]
        self.memory.state.reserve(t.key, planned)
        t.phase = "dispatching"
        self.tasks.spawn(t, self._dispatch(t, d, now))

    def _undispatch(self, t: Tracked) -> None:
        if not self.memory.current(t) or t.phase != "dispatching":
            return
        self.memory.state.release(t.key)
        t.phase = "queued"
        self.intake.queue_again(t)

    async def _dispatch(self, t: Tracked, d: Decision, now: float) -> None:
        assert t.aw is not None and t.queued is not None
        try:
            await self._record_dispatch(t, d, now)
        except BaseException:
            self._undispatch(t)
            raise
        if t.phase != "dispatched":
            return
        self.observer.dispatched(now - t.first_seen)
        self._count_topology(t, d)
        self.estimates.started(t, now)
        await self.stepping.step(t, now)

    def _count_topology(self, t: Tracked, d: Decision) -> None:
        """Whether the pod sets that asked for a domain landed in one (metrics)."""
        if not self.topology.levels or t.queued is None:
            return
        nodes = self.memory.state.nodes
        for level, one in self.topology.landed(t.queued.gang, d.placements, {
                p.node: nodes[p.node].labels for p in d.placements
                if p.node is not None and p.node in nodes}):
            self.observer.placed_in_topology(level, one)

    async def _record_dispatch(self, t: Tracked, d: Decision, now: float) -> None:
        assert t.aw is not None and t.queued is not None
        # RBAC may have changed while it queued: its creator must still be allowed to
        # create every item, or nothing is created.
        denials = await creator_denials(self.kube, t.aw, require_creator=self.require_creator)
        if denials:
            await self.transitions.fail(t, Reason.ItemCreationFailure,
                                        problems_message(cap_problems(denials)), now,
                                        teardown=False)
            return
        if await self.grants.check(t.queued, t.aw.metadata.annotations, self._trees()):
            # A grant revoked since it was screened: it waits again, saying which.
            self.memory.sharing.release(t.key)
            self._undispatch(t)
            return
        preempted = _preempted_by(self.memory, t)
        change = self._dispatched_change(t, d, preempted, now)
        if not await self.transitions.commit(change):
            return
        # Durable: now memory follows.
        self.memory.sharing.release(t.key)
        t.mark_dispatched(now, preempted)

    def _dispatched_change(self, t: Tracked, d: Decision, preempted: tuple[Key, ...],
                           now: float) -> Change:
        """The status that makes the dispatch durable."""
        assert t.aw is not None
        change = self.writer.begin(t, now)
        change.condition(ConditionType.HeadOfLine, Reason.FrontOfQueue, "")
        change.condition(ConditionType.Dispatched, Reason.AppWrapperRunnable, d.message)
        t.status.state = "Running"
        if t.nothing_to_follow:
            # It runs once dispatched, said in the same write (a second PATCH once its
            # items exist would tell nothing new; their refusal fails it).
            self.stepping.say_running(
                t, judge(t.aw, t.counts(), 0, None, now, False, now).message, change)
            change.event = not told_by_status_alone(t)
        t.status.systempriority = d.effective_priority
        t.status.admittedDigest = items_digest(t.aw)
        # Durable with the dispatch: its victims may not preempt it back after a failover.
        t.status.preempted = [f"{ns}/{name}" for ns, name in preempted]
        # What will be created, by name: removable even if the spec is edited later.
        t.status.wrappedItems = [
            WrappedItem(apiVersion=o["apiVersion"], kind=o["kind"], name=o["metadata"]["name"])
            for o in prepared_items(t.aw)]
        self.estimates.dispatching(t)  # no estimate for a wrapper that starts
        clear_position(t.status)
        self.scaling.dispatching(t, d)  # an elastic gang's size admitted
        return change


def _preempted_by(memory: Memory, t: Tracked) -> tuple[Key, ...]:
    """The wrappers `t` preempted to make its room (none without a hold)."""
    hold = memory.sharing.holds.get(t.key)
    return tuple(hold.preempted) if hold is not None else ()

