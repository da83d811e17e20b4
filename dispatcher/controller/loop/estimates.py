"""Start estimates in the controller: `status.estimatedStart` and the waiting message.

Every `EstimateSettings.interval` seconds at most (10 by default; longer when a round takes
long: never more than a fifth of the time), after an admission cycle, a round of estimates
starts: the queue, the admitted wrappers with what they hold and when each is expected to
finish, the free capacity, the quota trees and holds are taken from memory on the event
loop, and the replay (`dispatcher.eta.replay`) runs in a thread of its own -- never on
the event loop, never in the admission cycle's way. A round still running when the next is
due makes that one skipped.

Expected durations (`dispatcher.eta.durations`): what the wrapper declares, else the
median of the last completed wrappers of its namespace and shape, else
`--default-duration`. The history is fed from Completed AppWrappers as they are seen (their
Dispatched and Completed times), so a restart rebuilds it from the listing; it lives in
memory only, bounded.

Writes stay bounded while nothing changes. A new estimate is shown only when it moved by
at least `min_change_fraction` of the remaining wait and `min_change_seconds` from the one
shown (or when it changes kind: a start, none within the horizon...); at most
`max_writes` wrappers per round get a new one (the largest moves first; the rest wait for
the next round); and the estimate is a detail of the status (record/status.py): it goes out with
the next news or after the detail interval. `status.estimatedStart` is cleared in the
Dispatched write.

When a wrapper starts, the error of its estimates -- the initial one (the first made for
this wait) and the one its status showed -- is reported to the observer
(``dispatcher_start_estimate_error_seconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from dispatcher.admission import EmptyClusterAnswers, Fit, queued_from_appwrapper
from dispatcher.api.conditions import ConditionType, latest
from dispatcher.api.durations import (
    EXPECTED_DURATION_ANNOTATION,
)
from dispatcher.api.models import AppWrapper, InvalidSpec, parse_appwrapper
from dispatcher.cluster import PlannedPod
from dispatcher.controller.record.memory import Memory
from dispatcher.controller.record.status import StatusWriter
from dispatcher.controller.record.tracked import Key, Tracked, now_dt
from dispatcher.eta import (
    DurationHistory,
    Estimate,
    Forecast,
    RunningWrapper,
    shape_of,
)
from dispatcher.eta.text import describe, outcome_of
from dispatcher.fit import Capacity
from dispatcher.fit.topology import Topology
from dispatcher.kinds import InvalidItem
from dispatcher.queue import Policy

from .estimate_round import EstimateRound, EstimateSettings, Spec, replay_round

log = logging.getLogger("dispatcher")

# Pods of a wrapper that left (torn down, requeued, failed) are assumed gone this soon.
TERMINATING_SECONDS = 30.0
# Completions remembered by uid, so a relisting does not parse them all again.
KNOWN_COMPLETIONS = 65536
# A round may use at most this share of the time: the next waits 1/share of its length.
MAX_SHARE = 0.2
WAITING_TYPES = (ConditionType.Queueing, ConditionType.Backoff)


@dataclass(frozen=True)
class Shown:
    """What a wrapper's status says of its start (outcome, time, words)."""

    outcome: str
    at: float | None
    text: str


class ErrorObserver(Protocol):
    def start_estimate_error(self, estimate: str, seconds: float) -> None:
        """A wrapper started `seconds` away from its estimate ("initial" or "shown")."""


class Estimates:
    def __init__(self, memory: Memory, writer: StatusWriter, clock: Callable[[], float],
                 policy: Policy, observer: ErrorObserver, fit: Fit, topology: Topology,
                 settings: EstimateSettings | None = None) -> None:
        """No `settings`: no estimates (`dispatcher run` passes its flags)."""
        self.memory = memory
        self.writer = writer
        self.clock = clock
        self.policy = policy
        self.observer = observer
        self.fit: Fit = fit
        self.topology = topology
        self.s = settings if settings is not None else EstimateSettings(interval=0.0)
        self.history = DurationHistory(self.s.history_per_shape)
        self.rounds = 0
        self.last_round_seconds = 0.0
        self.last: Forecast | None = None
        self.shown: dict[Key, Shown] = {}
        self.first: dict[Key, float] = {}  # the first start estimated for this wait
        self._bases: dict[Key, str] = {}  # the waiting message, without the estimate
        self._known: OrderedDict[str, None] = OrderedDict()
        # The latest annotations seen of wrappers that have (or had) the duration one.
        self._annotations: dict[Key, tuple[str, dict[str, str]]] = {}
        self._running: asyncio.Future[Forecast] | None = None
        self._next_at = 0.0  # the dispatcher's clock
        self._executor: ThreadPoolExecutor | None = None
        self._answers: tuple[EmptyClusterAnswers, EmptyClusterAnswers] | None = None

    # --- hooks of the admission loop (all on the event loop) ---------------------------

    def seen(self, obj: Mapping[str, Any]) -> None:
        """An AppWrapper from a watch event or a listing: its annotations (an edit of them
        alone leaves the spec the loop holds as it was), and a completed one feeds the
        history of durations."""
        if not self.s.enabled:
            return
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        annotations = meta.get("annotations") or {}
        key = (str(meta.get("namespace") or "default"), str(meta.get("name", "")))
        if EXPECTED_DURATION_ANNOTATION in annotations or key in self._annotations:
            self._annotations[key] = (uid, {str(k): str(v) for k, v in annotations.items()
                                            if v is not None})
        status = obj.get("status")
        if not isinstance(status, Mapping) or status.get("state") != "Completed":
            return
        if not uid or uid in self._known:
            return
        self._known[uid] = None
        while len(self._known) > KNOWN_COMPLETIONS:
            self._known.popitem(last=False)
        try:
            aw = parse_appwrapper(obj)
            queued = queued_from_appwrapper(aw, 0.0)
        except (InvalidSpec, InvalidItem):
            return
        ran = _ran(aw)
        if ran is not None and queued.invalid is None:
            self.history.record(aw.metadata.namespace, shape_of(queued.demand), ran[1] - ran[0],
                                ran[1], uid)

    def message(self, t: Tracked, text: str) -> str:
        """The waiting message `text` with the estimate shown for `t`."""
        self._bases[t.key] = text
        if t.key not in self.shown and self.s.enabled:
            adopted = _adopted(t, text)
            if adopted is not None:
                self.shown[t.key] = adopted
        return _with_estimate(text, self.shown.get(t.key))

    def dispatching(self, t: Tracked) -> None:
        """Goes into the Dispatched write: no estimate for a wrapper that starts."""
        t.status.estimatedStart = None

    def started(self, t: Tracked, now: float) -> None:
        """`t` was dispatched (durably): how far off were its estimates?"""
        first = self.first.pop(t.key, None)
        shown = self.shown.pop(t.key, None)
        self._bases.pop(t.key, None)
        if first is not None:
            self.observer.start_estimate_error("initial", abs(now - first))
        if shown is not None and shown.outcome == "start" and shown.at is not None:
            self.observer.start_estimate_error("shown", abs(now - shown.at))

    def cycle(self, now: float) -> None:
        """After an admission cycle: start a round if one is due and none is running."""
        if not self.s.enabled or self._running is not None or now < self._next_at:
            return
        job = self._inputs(now)
        if job is None:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="dispatcher-estimates")
        loop = asyncio.get_running_loop()
        self._running = loop.run_in_executor(self._executor, job)
        self._running.add_done_callback(self._done)

    async def wait(self) -> None:
        """Until the round under way, if any, has been applied (for tests and benches)."""
        running = self._running
        if running is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([running])
            await asyncio.sleep(0)  # its done-callback runs next

    async def stop(self) -> None:
        running = self._running
        if running is not None:
            running.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    # --- a round ------------------------------------------------------------------------

    def _inputs(self, now: float) -> functools.partial[Forecast] | None:
        """What a round needs, taken on the event loop (references to what memory holds
        now, and copies of what it changes in place); the rest is done in the round's
        thread (`replay_round`)."""
        r = self.taken(now)
        if r is None:
            self._prune()
            return None
        return functools.partial(replay_round, r, self.policy, self.fit, self.s, now,
                                 self._empty_answers(), self.topology)

    def taken(self, now: float, empty: bool = False) -> EstimateRound | None:
        """The queue, what runs and the rest a round (or reservations) needs, taken on the
        event loop; None when nothing is queued, unless `empty` (what runs is wanted)."""
        memory = self.memory
        queued = list(memory.queue.ordered(now))
        if not queued and not empty:
            return None
        specs = {w.key: self._spec(memory.tracked.get(w.key)) for w in queued}
        # One whose Dispatched write is under way starts now.
        admitted = [(record, t.queued, now if t.phase == "dispatching" else t.dispatched_at,
                     self._spec(t))
                    for record in memory.sharing.admitted(memory.tracked, memory.state)
                    if (t := memory.tracked[record.key]).queued is not None]
        # A teardown under way: the pods of a wrapper that left still hold their capacity.
        leaving = [RunningWrapper(key, tuple(PlannedPod(p.node, p.request)
                                             for p in memory.state.bound_pods_of(key)),
                                  now + TERMINATING_SECONDS)
                   for key in memory.state.owners()
                   if (gone := memory.tracked.get(key)) is not None
                   and gone.phase not in ("dispatching", "dispatched", "running")]
        return EstimateRound(queued, specs, admitted, leaving, Capacity.of(memory.state),
                      memory.sharing.forest(), dict(memory.sharing.holds), self.history.copy())

    def _spec(self, t: Tracked | None) -> Spec:
        """Where `t` may declare its duration: its spec, and newer annotations if seen."""
        if t is None or t.aw is None:
            return None
        newer = self._annotations.get(t.key)
        return t.aw, newer[1] if newer and newer[0] == t.uid else None

    def _empty_answers(self) -> EmptyClusterAnswers:
        # Not the admission loop's own: `never_fits` works on its empty capacity in place,
        # and the two run in different threads. Renewed when the nodes change (memory then
        # replaces its own).
        current = self.memory.empty_answers
        if self._answers is None or self._answers[0] is not current:
            self._answers = (current, EmptyClusterAnswers())
        return self._answers[1]

    def _done(self, future: asyncio.Future[Forecast]) -> None:
        self._running = None
        if future.cancelled():
            return
        error = future.exception()
        now = self.clock()
        self._next_at = now + self.s.interval
        if error is not None:
            log.error("start estimates failed: %r", error, exc_info=error)
            return
        result = future.result()
        self.rounds += 1
        self.last = result
        self.last_round_seconds = result.seconds
        self._next_at = now + max(self.s.interval, result.seconds / MAX_SHARE)
        self._apply(result, now)

    def _apply(self, result: Forecast, now: float) -> None:
        memory = self.memory
        moved: list[tuple[float, Key, Estimate]] = []
        for key, e in result.estimates.items():
            t = memory.tracked.get(key)
            if t is None or t.phase != "queued" or memory.queue.get(key) is not t.queued:
                continue
            if e.outcome == "start" and e.at is not None:
                self.first.setdefault(key, e.at)
            score = self._moved(self.shown.get(key), e, now)
            if score is not None:
                moved.append((score, key, e))
        moved.sort(key=lambda x: -x[0])
        for _, key, e in moved[:self.s.max_writes]:
            self.shown[key] = Shown(e.outcome, e.at, describe(e, now))
            self._show(memory.tracked[key], now)
        self._prune()
        log.debug("start estimates: %d estimated in %.2f s (%d cycles%s); %d changed, %d "
                  "shown anew", len(result.estimates), result.seconds, result.cycles,
                  f", stopped: {result.stopped}" if result.stopped else "", len(moved),
                  min(len(moved), self.s.max_writes))

    def _moved(self, shown: Shown | None, e: Estimate, now: float) -> float | None:
        """None when the estimate `e` is too close to the one shown to be worth a write;
        else how much it moved (larger: shown first)."""
        if shown is None:
            return float("inf")
        if shown.outcome != e.outcome:
            return 1e9
        if e.at is None or e.outcome not in ("start", "budget"):
            return None
        if shown.at is None:
            return 1.0
        wait = max(e.at - now, 0.0)
        change = abs(e.at - shown.at)
        if change < max(self.s.min_change_seconds, self.s.min_change_fraction * wait):
            return None
        return change / max(wait, self.s.min_change_seconds)

    def _show(self, t: Tracked, now: float) -> None:
        """Put the estimate shown into `t`'s status; written as a detail (record/status.py)."""
        shown = self.shown[t.key]
        t.status.estimatedStart = now_dt(shown.at) \
            if shown.outcome == "start" and shown.at is not None else None
        base = self._bases.get(t.key)
        last = latest(t.status.conditions)
        if base is not None and last is not None and last.type in WAITING_TYPES:
            self.writer.begin(t, now).condition(last.type, last.reason,
                                                  _with_estimate(base, shown))
        self.writer.owe(t)

    def _prune(self) -> None:
        """Forget wrappers that no longer wait (one being dispatched: once it is)."""
        memory = self.memory
        for book in (self.shown, self.first, self._bases):
            for key in [k for k in book if (t := memory.tracked.get(k)) is None
                        or t.phase not in ("queued", "dispatching")]:
                del book[key]
        for key in [k for k in self._annotations if k not in memory.tracked]:
            del self._annotations[key]


def _adopted(t: Tracked, text: str) -> Shown | None:
    """The estimate `t`'s status already shows after `text`, written before a restart:
    taken as shown, so that a restart rewrites no status whose estimate holds."""
    last = latest(t.status.conditions)
    if last is None or last.type not in WAITING_TYPES \
            or not last.message.startswith(text + "; "):
        return None
    words = last.message[len(text) + 2:]
    outcome = outcome_of(words)
    at = t.status.estimatedStart.timestamp() if t.status.estimatedStart is not None else None
    if outcome is None or (outcome == "start") != (at is not None):
        return None
    return Shown(outcome, at, words)


def _with_estimate(text: str, shown: Shown | None) -> str:
    if shown is None or not shown.text:
        return text
    return f"{text}; {shown.text}"


def _ran(aw: AppWrapper) -> tuple[float, float] | None:
    """When its last run was dispatched and when it completed."""
    dispatched = completed = None
    for c in aw.status.conditions:
        if c.type == ConditionType.Dispatched and c.lastTransitionMicroTime is not None:
            dispatched = c.lastTransitionMicroTime.timestamp()
        elif c.type == ConditionType.Completed and c.lastTransitionMicroTime is not None:
            completed = c.lastTransitionMicroTime.timestamp()
    if dispatched is None or completed is None or completed < dispatched:
        return None
    return dispatched, completed
