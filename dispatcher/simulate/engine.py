"""The event loop: a trace replayed through the admission core on a modelled cluster.

The cluster is `nodes` identical nodes of G GPUs, with CPU and memory set so large
(100,000 cores, 1 PiB) that only GPUs and the kubelet's 110-pod limit ever bind.

Events are job arrivals and job completions. After each batch of events at a time t
(completions first, then arrivals) the simulator runs one admission cycle of the real
core, `dispatcher.admission.admit`, over the queue in the policy's order; each dispatch
starts its job, whose completion is scheduled at t + duration and gives the capacity
back. Nothing of the admission logic is repeated here.

Per-node fit: the capacity the core places gangs on is the cluster itself, so every
dispatched pod has its node and the job starts at once.

Aggregate fit (MCAD's rule): the core only checks the gang's total against the cluster's
total free capacity (allocatable minus the demand of dispatched, unfinished gangs), so
the simulator then binds the pods the way a scheduler would, each to a node with room
(the core's best-fit placement, one pod set or pod at a time). Pods that no node can
hold stay pending and are retried whenever capacity frees, in dispatch order; the gang
holds the GPUs of its bound pods idle and starts only when its last pod binds — the
partial gang that per-node fit exists to avoid. Gangs that never complete their pods
(nothing left to free capacity) are reported as deadlocked.

Jobs that would not fit even on the empty cluster (under the chosen fit) are set aside
at arrival with the core's own reason and reported; in the queue they would wait for
ever without holding anyone up, so leaving them out changes no decision.

Quotas and preemption: with quota trees the core checks every job against its quota
(the simulator keeps one usage ledger for the whole run: a dispatch adds to it, a
completion gives back, and borrowers move back to their leaf once room frees). Under a
policy with preemption (per-node fit only) a `preempt` decision tears its victims down at
once -- their GPUs free, the work they did is lost (counted as preempted GPU-hours) and
they requeue where they were -- and the preemptor's room is held for it; another cycle
runs at the same instant, in which it dispatches.

Elastic gangs (per-node fit): a job whose wrapper has elastic pod sets is admitted at its
minimum, grown and shrunk by the core's decisions (``dispatcher.elastic``); a scale-out's
pods bind at once, a scale-in's go at once. Its work is its duration at its declared
size, done at a speed proportional to its pods (linear scaling: half the pods, half the
speed), so every change of size moves its completion.

Fragmentation (per-node fit): a job that waits for capacity while the cluster's total
free capacity, after the dispatches before it in the same cycle, covers its whole
demand — the aggregate rule would have admitted it — is delayed by fragmentation for
as long as that holds, cycle to cycle.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from dispatcher.admission import (
    AWAITING_PREEMPTION,
    BEHIND_HEAD,
    NO_TOPOLOGY,
    QUOTA_EXCEEDED,
    UNKNOWN_QUOTA,
    CycleStats,
    Decision,
    EmptyClusterAnswers,
    Fit,
    admit,
    behind_head,
    fit_rules,
)
from dispatcher.cluster.model import DEFAULT_MAX_PODS, Node
from dispatcher.cluster.state import PlannedPod
from dispatcher.elastic import Scale
from dispatcher.eta.replay import RunningWrapper
from dispatcher.eta.reserve import reservations
from dispatcher.fit.capacity import Capacity
from dispatcher.fit.elastic import ElasticNow, lowest, room_to_grow, sized
from dispatcher.fit.gang import (
    NEVER_FITS,
    GangPodSet,
    Placement,
    Shortfall,
    demand,
    place,
)
from dispatcher.fit.topology import Topology
from dispatcher.kinds.podset import TopologyRequest
from dispatcher.preemption import AdmittedWrapper, Hold
from dispatcher.queue.policy import Policy
from dispatcher.queue.queue import AdmissionQueue, QueuedWrapper, WrapperKey
from dispatcher.queue.reservation import Reservations
from dispatcher.quota import QuotaForest, QuotaLedger
from dispatcher.resources import PODS
from dispatcher.simulate.backfill_limit import AT_LIMIT, BackfillLimits
from dispatcher.simulate.reserving import Durations, PredictedDurations
from dispatcher.simulate.traces import GPU, TraceJob

# Waits that are not for capacity: fragmentation does not explain them.
NOT_FRAGMENTATION = frozenset({BEHIND_HEAD, NEVER_FITS, QUOTA_EXCEEDED, UNKNOWN_QUOTA,
                               AWAITING_PREEMPTION})

NODE_CPU_MILLI = 100_000 * 1000  # 100,000 cores: never the binding resource
NODE_MEMORY = 1 << 50  # 1 PiB

# (jobs arrived, jobs in the trace, seconds since the first submission)
Progress = Callable[[int, int, float], None]
# Called after every batch of events, once its cycles have run: (time, the simulation).
Observe = Callable[[float, "Simulation"], None]


def gpu_nodes(count: int, gpus_per_node: int) -> list[Node]:
    """`count` identical nodes where only GPUs (and the pod limit) can run out."""
    width = len(str(max(count - 1, 0)))
    return [
        Node(f"node-{i:0{width}d}", {GPU: gpus_per_node, "cpu": NODE_CPU_MILLI,
                                     "memory": NODE_MEMORY, PODS: DEFAULT_MAX_PODS})
        for i in range(count)
    ]


BLOCK = "cloud.provider.com/topology-block"
RACK = "cloud.provider.com/topology-rack"


@dataclass(frozen=True)
class Layout:
    """Simulated nodes in topology domains: the levels their labels name, and `level`,
    the one whose domains the report counts (and ``requiring_rack`` asks for)."""

    nodes: tuple[Node, ...]
    topology: Topology
    level: str


def racked_nodes(count: int, gpus_per_node: int, blocks: int, racks: int) -> Layout:
    """`gpu_nodes` spread evenly over `blocks` x `racks` (racks per block) racks, in order:
    node i is in rack i * blocks * racks // count (the racks differ by a node at most)."""
    domains = blocks * racks
    return Layout(tuple(replace(n, labels={BLOCK: f"b{r // racks}", RACK: f"r{r}"})
                        for i, n in enumerate(gpu_nodes(count, gpus_per_node))
                        for r in (i * domains // count,)), Topology((BLOCK, RACK)), RACK)


def requiring_rack(jobs: Sequence[TraceJob], fraction: float,
                   level: str = RACK) -> list[TraceJob]:
    """`jobs` with `fraction` of those of 2 pods or more (spread evenly over the trace)
    requiring one domain of `level` for the whole gang, as Kueue's annotation on the
    AppWrapper asks."""
    out: list[TraceJob] = []
    k = 0
    ask = TopologyRequest(level, True, whole_gang=True)
    for j in jobs:
        if j.pods >= 2:
            if int((k + 1) * fraction) > int(k * fraction):
                gang = tuple(GangPodSet(g.item, replace(g.pod_set, topology=ask))
                             for g in j.wrapper.gang)
                j = replace(j, wrapper=replace(j.wrapper, gang=gang))
            k += 1
        out.append(j)
    return out


@dataclass(frozen=True)
class Bound:
    """Pods of one pod set bound to one node (what a completion gives back)."""

    node: str
    request: Mapping[str, int]
    count: int


@dataclass
class JobRun:
    """What happened to one job of the trace."""

    job: TraceJob
    gpus: int
    dispatched: float | None = None
    started: float | None = None
    finished: float | None = None
    never_fits: str | None = None  # why it could not fit even on the empty cluster
    fragmented_seconds: float = 0.0  # waited while the aggregate rule would admit it
    partial: bool = False  # dispatched, but some pods found no node (aggregate fit)
    bound_at_dispatch: int = 0  # pods that found a node when it was dispatched
    held_gpu_seconds: float = 0.0  # GPUs of bound pods held idle before the start
    bound: list[Bound] = field(default_factory=list)
    bound_per_set: list[int] = field(default_factory=list)
    running_since: float | None = None  # the current run (a preempted job starts over)
    preemptions: int = 0  # times it was torn down to let another job fit
    lost_gpu_seconds: float = 0.0  # GPU-seconds of work thrown away by those
    gpu_seconds: float = 0.0  # GPU-seconds it ran, lost work included
    borrowing: bool = False  # its current run borrows quota
    borrowed_gpu_seconds: float = 0.0
    # Elastic jobs: pods per elastic set now, and what is left of the work, in seconds at
    # the declared size, as of `segment_since` (when its GPUs last changed).
    counts: tuple[int, ...] = ()
    now_gpus: int = 0  # GPUs of its bound pods while it runs
    segment_since: float = 0.0
    work_left: float = 0.0
    scale_outs: int = 0
    scale_ins: int = 0
    bound_pods_before: int = 0  # its pods during the segment that ends at the next change
    racks: int = 0  # racks its pods got at its first dispatch (with a topology; else 0)
    # The core's reason and words for its last wait (what `plan` would say), and the
    # cycle that said them.
    waiting: tuple[str, str] | None = None
    waited_in: int = 0
    # The policy's backfill limit: runs it stopped, the GPU-seconds they had run (lost),
    # and whether it ended the job (backfillLimitAction fail) rather than requeued it.
    limit_stops: int = 0
    limit_lost_gpu_seconds: float = 0.0
    ended_at_limit: bool = False

    @property
    def wait(self) -> float | None:
        return None if self.started is None else self.started - self.job.submit

    @property
    def bound_pods(self) -> int:
        return sum(b.count for b in self.bound)


@dataclass
class Run:
    """A finished simulation: every job's story and the cluster over time."""

    jobs: list[JobRun]
    nodes: int
    gpus_per_node: int
    policy: Policy
    fit: Fit
    start: float  # first submission
    end: float  # last event
    # One sample after every batch of events: time, GPUs of running jobs, GPUs held by
    # partial gangs (bound pods of gangs not started), jobs in the queue, dispatched
    # jobs whose pods are not all bound (aggregate fit).
    times: list[float] = field(default_factory=list)
    busy: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    queued: list[int] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    events: int = 0
    cycles: int = 0
    wall_seconds: float = 0.0
    trees: tuple[str, ...] = ()  # quota trees, by name
    team_quota: dict[str, int] = field(default_factory=dict)  # leaf -> its GPUs (first tree)
    preemptions: int = 0
    racked: bool = False  # the nodes carry a topology (domains of `level` are counted)
    level: str = RACK

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def _fits_total(need: Mapping[str, int], free: Mapping[str, int]) -> bool:
    return all(v <= free.get(r, 0) for r, v in need.items())


class Simulation:
    def __init__(self, jobs: Sequence[TraceJob], nodes: Sequence[Node], policy: Policy,
                 fit: Fit = "per-node", gpus_per_node: int = 8,
                 cycle_interval: float | None = None,
                 progress: Progress | None = None, skip_behind_head: bool = True,
                 forest: QuotaForest | None = None, observe: Observe | None = None,
                 topology: Topology = NO_TOPOLOGY, counted: str | None = None,
                 durations: Durations | None = None) -> None:
        """`counted`: a level of `topology` whose domains each gang's pods get are
        counted (`JobRun.racks`). A reserving policy plans with `durations` (predicted
        ones unless given)."""
        if policy.preemption != "never" and fit != "per-node":
            raise ValueError(f"policy {policy.name} preempts: simulate it with per-node fit")
        if policy.reserve and fit != "per-node":
            raise ValueError(f"policy {policy.name} reserves nodes: simulate it with per-node "
                             "fit")
        # What a reserving policy plans with (predicted durations unless given).
        self.durations = durations if durations is not None else PredictedDurations()
        self.policy = policy
        self.forest = forest if forest else None
        self.ledger = QuotaLedger(forest) if forest else None
        self.holds: dict[WrapperKey, Hold] = {}
        self._preempted_for: dict[int, tuple[WrapperKey, ...]] = {}
        self._left_ledger = False  # a completion since the ledger was last rebalanced
        # Stop feeding the cycle once a head blocks: every wrapper behind it would only
        # get a BEHIND_HEAD wait. Same decisions, and long queues cost nothing per cycle.
        self.skip_behind_head = skip_behind_head
        self._cycles = 0
        self._blocked_by: WrapperKey | None = None  # the last cycle's blocking head
        self.fit: Fit = fit
        self.nodes = list(nodes)
        self.cycle_interval = cycle_interval
        self.progress = progress
        self.observe = observe
        self.gpus_per_node = gpus_per_node
        # The cluster: free capacity per node. Under per-node fit the core places gangs
        # on it directly; under the aggregate rule it sees `view`, whose totals only move.
        self.cluster = Capacity.empty(self.nodes)
        self.view = self.cluster if fit == "per-node" else Capacity.empty(self.nodes)
        # The modelled nodes never change: one set of empty-cluster answers serves the
        # arrival check and every admission cycle of the run.
        self._answers = EmptyClusterAnswers()
        self._answers.empty = self._empty = Capacity.empty(self.nodes)
        self.topology = topology
        self._hopeless_of = fit_rules(fit, topology)[1]
        self._counted = counted
        outer = topology.levels[:topology.levels.index(counted) + 1] if counted else ()
        # Each node's domain of the counted level: the path of labels down to it.
        self._rack = {n.name: tuple(n.labels.get(x) for x in outer)
                      for n in self.nodes} if counted else {}
        self._never = self._answers.never
        # Allocatable minus the demand of dispatched, unfinished gangs (MCAD's view).
        self._free_total: dict[str, int] = {}
        for n in self.nodes:
            for r, v in n.allocatable.items():
                self._free_total[r] = self._free_total.get(r, 0) + v
        self.queue = AdmissionQueue(policy)
        self.limits = BackfillLimits(policy)
        self.runs = [JobRun(j, j.gpus) for j in jobs]
        # What each job holds (or asks for, queued): elastic ones at their current size.
        self._demand = [demand(sized(j.wrapper.gang, j.wrapper.elastic,
                                     lowest(j.wrapper.elastic))) for j in jobs]
        self.elastic = fit == "per-node" and any(j.wrapper.elastic for j in jobs)
        self._stretchy: set[int] = set()  # running elastic jobs
        self._index: dict[WrapperKey, int] = {j.wrapper.key: i for i, j in enumerate(jobs)}
        self._completions: list[tuple[float, int, int]] = []  # time, job, its run number
        self._run_number = [0] * len(jobs)
        self._pending: list[int] = []  # partial gangs (aggregate fit), in dispatch order
        self._fragmented: dict[int, float] = {}  # job -> since when (per-node fit)
        self._busy = 0
        self._held = 0
        self._held_since: dict[int, float] = {}

    # --- the loop ---------------------------------------------------------------------

    def run(self) -> Run:
        wall = time.perf_counter()
        jobs = [r.job for r in self.runs]
        order = sorted(range(len(jobs)), key=lambda i: (jobs[i].submit, i))
        start = jobs[order[0]].submit if jobs else 0.0
        result = Run(self.runs, len(self.nodes), self.gpus_per_node, self.policy, self.fit,
                     start, start)
        result.racked = bool(self._rack)
        result.level = self._counted or RACK
        if self.forest is not None:
            result.trees = tuple(self.forest.trees)
            first = next(iter(self.forest.trees.values()))
            result.team_quota = {n.name: n.quota.get(GPU, 0) for n in first.order
                                 if n.is_leaf}
        arrived = 0
        last_cycle = start
        t = start
        loops = 0
        while True:
            nexts: list[float] = []
            if arrived < len(order):
                nexts.append(jobs[order[arrived]].submit)
            if self._completions:
                nexts.append(self._completions[0][0])
            if self.cycle_interval and len(self.queue) and nexts:
                # Periodic cycles only while something is still to come: a queue that
                # nothing can drain any more (a deadlock of partial gangs) ends the run.
                nexts.append(max(last_cycle + self.cycle_interval, t))
            if not nexts:
                break
            t = min(nexts)
            changed = False
            while self._completions and self._completions[0][0] <= t:
                _, i, number = heapq.heappop(self._completions)
                if number == AT_LIMIT:
                    changed = self._at_limit(i, t) or changed
                    continue
                if number != self._run_number[i]:
                    continue  # the run it ended was preempted
                self._finish(i, t)
                result.events += 1
                changed = True
            if changed and self._pending:
                self._bind_pending(t)
            while arrived < len(order) and jobs[order[arrived]].submit <= t:
                changed = self._arrive(order[arrived]) or changed
                arrived += 1
                result.events += 1
            tick = bool(self.cycle_interval) and t >= last_cycle + (self.cycle_interval or 0)
            if (changed or tick) and (len(self.queue) or (changed and self._may_grow())):
                # After a preemption the victims are gone at once: cycle again now, and the
                # preemptor dispatches into the room held for it.
                for _ in range(4):
                    result.cycles += 1
                    preempted = self._cycle(t)
                    result.preemptions += preempted
                    if not preempted or not len(self.queue):
                        break
                last_cycle = t
            if self.observe is not None:
                self.observe(t, self)
            result.times.append(t)
            result.busy.append(self._busy)
            result.held.append(self._held)
            result.queued.append(len(self.queue))
            result.pending.append(len(self._pending))
            loops += 1
            if self.progress is not None and loops % 256 == 0:
                self.progress(arrived, len(order), t - start)
        if self.progress is not None:
            self.progress(arrived, len(order), t - start)
        result.end = t
        for i, since in self._fragmented.items():
            self.runs[i].fragmented_seconds += t - since
        for i, since in self._held_since.items():
            self.runs[i].held_gpu_seconds += self._held_gpus(i) * (t - since)
        self._explain_skipped()
        result.wall_seconds = time.perf_counter() - wall
        return result

    def _explain_skipped(self) -> None:
        """Jobs still waiting that the last cycle left out behind its blocking head
        (skip_behind_head) wait behind it, in the core's words."""
        head = self._blocked_by
        if head is None:
            return
        for r in self.runs:
            if r.started is None and r.dispatched is None and r.waited_in != self._cycles:
                r.waiting = (BEHIND_HEAD, behind_head(head, self.policy))

    # --- events -----------------------------------------------------------------------

    def _arrive(self, i: int) -> bool:
        w = self.runs[i].job.wrapper
        key = w.gang_key
        if key not in self._never:
            self._never[key] = self._hopeless_of(w.gang, self._empty)
        hopeless = self._never[key]
        if hopeless is not None:
            self.runs[i].never_fits = hopeless.message
            return False
        self.queue.put(w)
        return True

    def _cycle(self, t: float) -> int:
        """One admission cycle at `t`; the number of preemptions it decided."""
        stats = CycleStats()

        def ordered() -> Iterator[QueuedWrapper]:
            # Behind a blocking head every wrapper waits with BEHIND_HEAD: nothing to learn,
            # but for a preemptor, which passes any head into the room held for it.
            for w in self.queue.ordered(t):
                if self.skip_behind_head and stats.blocked_by is not None:
                    if not self.holds:
                        return
                    if w.key not in self.holds:
                        continue
                yield w

        if self.ledger is not None and self._left_ledger:
            self.ledger.rebalance()
            self._left_ledger = False
        # Held room and a preemptor's new hold are taken for one cycle only: with either,
        # the cycle works on a copy and only its dispatches are taken from the cluster.
        preempting = self.policy.preemption != "never"
        cap = self.view.copy() if preempting or self.holds or self.elastic else self.view
        scaling: list[Scale] | None = [] if self.elastic else None
        decisions = admit(ordered(), cap, self.policy, t, self.fit, stats,
                          empty_answers=self._answers, quota=self.ledger,
                          admitted=self.admitted() if preempting or self.elastic else (),
                          holds=self.holds, scaling=scaling, topology=self.topology,
                          reservations=self._reservations(t) if self.policy.reserve else None)
        if cap is not self.view:
            for d in decisions:
                if d.decision == "dispatch":
                    for p in d.placements:
                        assert p.node is not None  # preemption is per-node fit only
                        self.view.take(p.node, p.request)
        self._cycles += 1
        self._blocked_by = stats.blocked_by
        free = dict(self._free_total)
        fragmented: set[int] = set()
        for d in decisions:
            i = self._index[(d.namespace, d.name)]
            if d.decision in ("wait", "invalid"):
                self.runs[i].waiting = (d.reason, d.message)
                self.runs[i].waited_in = self._cycles
            if d.decision == "dispatch":
                self._dispatch(i, d, t)
                for r, v in self._demand[i].items():
                    free[r] = free.get(r, 0) - v
            elif d.decision == "preempt":
                self._preempt(i, d, t)
            elif d.key in self.holds and d.reason != AWAITING_PREEMPTION:
                # It no longer waits for its held room: the room, and the quota counted
                # for it, go back.
                del self.holds[d.key]
                if self.ledger is not None:
                    self.ledger.remove(d.key)
            if (self.fit == "per-node" and d.decision == "wait"
                    and d.reason not in NOT_FRAGMENTATION
                    and _fits_total(self._demand[i], free)):
                fragmented.add(i)
        for s in scaling or ():
            self._scale(s, t)
        for i in list(self._fragmented):
            if i not in fragmented:
                self.runs[i].fragmented_seconds += t - self._fragmented.pop(i)
        for i in fragmented:
            self._fragmented.setdefault(i, t)
        return stats.preemptions

    def _reservations(self, t: float) -> Reservations:
        """This cycle's reservations, planned with `self.durations`."""
        queued = self.queue.ordered(t)
        expected = {w.key: self.durations.expected(self.runs[self._index[w.key]].job)
                    for w in queued}
        running = [RunningWrapper(run.job.wrapper.key,
                                  tuple(PlannedPod(b.node, b.request) for b in run.bound
                                        for _ in range(b.count)),
                                  t + self.durations.left(run.job, run.running_since, t))
                   for run in self.runs if run.running_since is not None]
        return reservations(queued, running, self.view, self.policy, t, expected,
                            fit=self.fit, holds=self.holds, empty_answers=self._answers,
                            topology=self.topology)

    def admitted(self) -> list[AdmittedWrapper]:
        """The running jobs as the core's admitted records (candidates for preemption)."""
        out: list[AdmittedWrapper] = []
        for i, run in enumerate(self.runs):
            if run.running_since is None:
                continue
            w = run.job.wrapper
            holdings = tuple(PlannedPod(b.node, b.request) for b in run.bound
                             for _ in range(b.count))
            out.append(AdmittedWrapper(
                w.namespace, w.name, w.uid, float(w.priority), self._demand[i], holdings,
                run.running_since, w.labels, self._preempted_for.get(i, ()),
                self._elastic_now(run) if w.elastic else None))
        return out

    def _may_grow(self) -> bool:
        """Whether a running elastic job is below its maximum: freed capacity may be
        its to grow into, even with nothing queued."""
        return any(room_to_grow(self.runs[i].job.wrapper.elastic, self.runs[i].counts)
                   for i in self._stretchy)

    @staticmethod
    def _elastic_now(run: JobRun) -> ElasticNow:
        """A running elastic job as the core sees it; the pods bound last go first."""
        w = run.job.wrapper
        pods = [PlannedPod(b.node, b.request) for b in reversed(run.bound)
                for _ in range(b.count)]
        removable = tuple(tuple(p for p in pods if p.request == w.gang[s.position].pod_set.request)
                          for s in w.elastic)
        return ElasticNow(w.elastic, run.counts, w.gang, w.first_seen, removable)

    def _scale(self, s: Scale, t: float) -> None:
        """An elastic job grows (its new pods bind at once) or shrinks (the pods named go
        at once); its completion moves with its speed."""
        i = self._index[s.key]
        run = self.runs[i]
        if run.running_since is None:
            return
        if s.out:
            run.scale_outs += 1
            for p in s.placements:
                assert p.node is not None
                self.view.take(p.node, p.request)
            run.bound.extend(_group(s.placements))
        else:
            run.scale_ins += 1
            for pod in s.removed:
                _unbind(run.bound, pod)
                self.cluster.give(pod.node, pod.request)
        run.counts = s.after
        for r, v in self._demand[i].items():
            self._free_total[r] = self._free_total.get(r, 0) + v
        self._demand[i] = demand(sized(run.job.wrapper.gang, run.job.wrapper.elastic, s.after))
        for r, v in self._demand[i].items():
            self._free_total[r] = self._free_total.get(r, 0) - v
        self._resize(i, t)

    def _preempt(self, i: int, d: Decision, t: float) -> None:
        """Tear the victims down (their pods go at once) and hold the room for job i."""
        for key in d.preempts:
            j = self._index[key]
            run = self.runs[j]
            assert run.running_since is not None
            ran = t - run.running_since
            run.preemptions += 1
            run.lost_gpu_seconds += run.gpus * ran
            self._stop(j, t)
            self._run_number[j] += 1  # its completion no longer comes
            for r, v in self._demand[j].items():
                self._free_total[r] = self._free_total.get(r, 0) + v
            self.queue.put(run.job.wrapper)
        for s in d.shrinks:
            self._scale(s, t)
        w = self.runs[i].job.wrapper
        self.holds[w.key] = Hold(
            tuple(PlannedPod(p.node, p.request) for p in d.placements if p.node is not None),
            w.labels, d.effective_priority, d.preempts, t)

    def _dispatch(self, i: int, d: Decision, t: float) -> None:
        run = self.runs[i]
        w = run.job.wrapper
        self.queue.remove(w.key)
        hold = self.holds.pop(w.key, None)
        if hold is not None:
            self._preempted_for[i] = hold.preempted
        run.borrowing = any(q.borrows for q in d.quota)
        if run.dispatched is None:
            run.dispatched = t
        if d.elastic:
            run.counts = d.elastic
            self._demand[i] = demand(sized(w.gang, w.elastic, d.elastic))
        for r, v in self._demand[i].items():
            self._free_total[r] = self._free_total.get(r, 0) - v
        limit_at = self.limits.dispatched(i, d.message, t, run.gpu_seconds)
        if limit_at is not None:
            heapq.heappush(self._completions, (limit_at, i, AT_LIMIT))
        if self.fit == "per-node":
            run.bound = _group(d.placements)
            if self._rack and not run.racks:
                run.racks = len({self._rack.get(p.node or "") for p in d.placements})
            self._start(i, t)
            return
        run.bound_per_set = [0] * len(w.gang)
        complete = self._bind(i)
        run.bound_at_dispatch = run.bound_pods
        if complete:
            self._start(i, t)
        else:
            run.partial = True
            self._pending.append(i)
            self._held_since[i] = t
            self._held += self._held_gpus(i)

    def _start(self, i: int, t: float) -> None:
        run = self.runs[i]
        if run.started is None:
            run.started = t
        run.running_since = run.segment_since = t
        if not run.job.wrapper.elastic:
            run.now_gpus = run.gpus
            self._busy += run.gpus
            heapq.heappush(self._completions, (t + run.job.duration, i, self._run_number[i]))
            return
        run.work_left = run.job.duration  # a preempted job starts over
        self._stretchy.add(i)
        run.now_gpus = 0
        self._resize(i, t)

    def _resize(self, i: int, t: float) -> None:
        """An elastic job's GPUs changed at `t` (or it started): account the work done
        at the old size and schedule its completion at the new one."""
        run = self.runs[i]
        full = sum(g.pod_set.count for g in run.job.wrapper.gang)
        if run.now_gpus:
            run.work_left -= (t - run.segment_since) * run.bound_pods_before / full
            self._account(run, t)
        gpus = sum(b.request.get(GPU, 0) * b.count for b in run.bound)
        self._busy += gpus - run.now_gpus
        run.now_gpus = gpus
        run.bound_pods_before = run.bound_pods
        run.segment_since = t
        self._run_number[i] += 1  # the completion scheduled at the old speed is void
        speed = run.bound_pods / full
        heapq.heappush(self._completions, (t + max(run.work_left, 0.0) / speed, i,
                                           self._run_number[i]))

    @staticmethod
    def _account(run: JobRun, t: float) -> None:
        ran = run.now_gpus * (t - run.segment_since)
        run.gpu_seconds += ran
        if run.borrowing:
            run.borrowed_gpu_seconds += ran

    def _stop(self, i: int, t: float) -> None:
        """Job i stops running (completed or preempted): its GPUs go back."""
        run = self.runs[i]
        assert run.running_since is not None
        self._account(run, t)
        run.running_since = None
        self._busy -= run.now_gpus
        run.now_gpus = 0
        self._stretchy.discard(i)
        self.limits.ended(i)
        for b in run.bound:
            self.cluster.give(b.node, b.request, b.count)
        self._preempted_for.pop(i, None)
        if self.ledger is not None:
            self.ledger.remove(run.job.wrapper.key)
            self._left_ledger = True

    def _at_limit(self, i: int, t: float) -> bool:
        """Job i's backfill limit falls at `t`, while it runs: it ends, or is queued again
        to start over (the policy's backfillLimitAction), as the controller does."""
        deadline = self.limits.due(i, t)
        run = self.runs[i]
        if deadline is None or run.running_since is None:
            return False
        self._stop(i, t)
        self._run_number[i] += 1  # its completion no longer comes
        run.limit_stops += 1
        run.limit_lost_gpu_seconds += run.gpu_seconds - deadline.gpu_seconds_before
        for r, v in self._demand[i].items():
            self._free_total[r] = self._free_total.get(r, 0) + v
        if self.limits.action == "requeue":
            self.queue.put(run.job.wrapper)
        else:
            run.finished = t
            run.ended_at_limit = True
        return True

    def _finish(self, i: int, t: float) -> None:
        run = self.runs[i]
        run.finished = t
        if run.running_since is not None:
            self.durations.finished(run.job, t - run.running_since, t)
        self._stop(i, t)
        need = self._demand[i]
        for r, v in need.items():
            self._free_total[r] = self._free_total.get(r, 0) + v
        if self.view is not self.cluster:
            self.view.take_total({r: -v for r, v in need.items()})

    # --- binding pods under the aggregate rule -------------------------------------------

    def _held_gpus(self, i: int) -> int:
        return sum(b.request.get(GPU, 0) * b.count for b in self.runs[i].bound)

    def _bind(self, i: int) -> bool:
        """Bind as many of the gang's unbound pods as the cluster holds; all bound?"""
        run = self.runs[i]
        complete = True
        for k, g in enumerate(run.job.wrapper.gang):
            left = g.pod_set.count - run.bound_per_set[k]
            if left <= 0:
                continue
            placed = self._place_pods(g, left)
            run.bound.extend(_group(placed))
            run.bound_per_set[k] += len(placed)
            complete = complete and len(placed) == left
        return complete

    def _place_pods(self, g: GangPodSet, count: int) -> list[Placement]:
        """Up to `count` pods of the set, all at once if they fit, else one by one."""
        result = place((GangPodSet(g.item, replace(g.pod_set, count=count)),), self.cluster)
        if not isinstance(result, Shortfall):
            return result
        one = (GangPodSet(g.item, replace(g.pod_set, count=1)),)
        placed: list[Placement] = []
        for _ in range(count - 1):  # `count` pods did not fit: at most count - 1 will
            single = place(one, self.cluster)
            if isinstance(single, Shortfall):
                break
            placed.extend(single)
        return placed

    def _bind_pending(self, t: float) -> None:
        still: list[int] = []
        for i in self._pending:
            before = self._held_gpus(i)
            done = self._bind(i)
            after = self._held_gpus(i)
            run = self.runs[i]
            run.held_gpu_seconds += before * (t - self._held_since[i])
            self._held_since[i] = t
            self._held += after - before
            if done:
                del self._held_since[i]
                self._held -= after
                self._start(i, t)
            else:
                still.append(i)
        self._pending = still


def _group(placements: Sequence[Placement]) -> list[Bound]:
    """Placements as (node, request, count), consecutive pods of a set on a node merged."""
    out: list[Bound] = []
    for p in placements:
        assert p.node is not None
        last = out[-1] if out else None
        if last is not None and last.node == p.node and last.request == p.request:
            out[-1] = Bound(p.node, p.request, last.count + 1)
        else:
            out.append(Bound(p.node, p.request, 1))
    return out


def _unbind(bound: list[Bound], pod: PlannedPod) -> None:
    """One pod of `bound` on `pod.node` of its request goes (the last such entry)."""
    for k in reversed(range(len(bound))):
        b = bound[k]
        if b.node == pod.node and b.request == pod.request:
            if b.count == 1:
                del bound[k]
            else:
                bound[k] = Bound(b.node, b.request, b.count - 1)
            return


def simulate(jobs: Sequence[TraceJob], nodes: int, gpus_per_node: int, policy: Policy,
             fit: Fit = "per-node", cycle_interval: float | None = None,
             progress: Progress | None = None, forest: QuotaForest | None = None,
             observe: Observe | None = None, layout: Layout | None = None,
             durations: Durations | None = None) -> Run:
    """Replay `jobs` on `nodes` nodes of `gpus_per_node` GPUs under `policy` and `fit`,
    with the quota trees of `forest` if given; `observe` sees every step. `layout`: the
    nodes in topology domains (`racked_nodes`, or read from a file) instead. A reserving
    policy plans with `durations` (predicted ones unless given)."""
    if layout is None:
        return Simulation(jobs, gpu_nodes(nodes, gpus_per_node), policy, fit, gpus_per_node,
                          cycle_interval, progress, forest=forest, observe=observe,
                          durations=durations).run()
    return Simulation(jobs, layout.nodes, policy, fit, gpus_per_node, cycle_interval,
                      progress, forest=forest, observe=observe, topology=layout.topology,
                      counted=layout.level, durations=durations).run()
