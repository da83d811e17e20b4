"""Sharing the cluster between teams: what admit() needs beyond the queue.

- The quota trees: QuotaSubtree objects (quota.codeflare.dev, watched when the CRD is
  installed) assembled into a forest, rebuilt only when one of them changes;
- the admitted wrappers (dispatched or running), as the records the core counts quota
  for and chooses preemption victims from, with what each holds now;
- the holds: room kept for a preemptor while its victims' pods terminate, so that
  nobody else takes it. A hold lives in memory only: after a restart the preemptor
  simply competes again.

The decisions themselves (who fits its quota, who borrows, who is preempted) are the
core's (dispatcher.quota, dispatcher.preemption); this module only feeds and keeps them.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Mapping, Sequence
from dataclasses import replace
from typing import Any

from dispatcher.admission import Decision, admitted_record
from dispatcher.cluster import ClusterState, PlannedPod
from dispatcher.preemption import AdmittedWrapper, Hold, quota_ledger
from dispatcher.quota import QuotaForest, QuotaLedger

from .tracked import Key, Tracked

log = logging.getLogger("dispatcher")


class Sharing:
    def __init__(self) -> None:
        self.subtrees: dict[Key, Mapping[str, Any]] = {}
        self.holds: dict[Key, Hold] = {}
        # Victims being torn down, and who preempts them (for the message).
        self.preempting: dict[Key, tuple[Key, bool]] = {}
        self.ledger: QuotaLedger | None = None  # after the last cycle, for metrics
        self._forest: QuotaForest | None = None
        self._reported: tuple[str, ...] = ()

    # --- QuotaSubtrees (intake) --------------------------------------------------------

    def on_subtree(self, event: str, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name")))
        before = self.subtrees.get(key)
        if event == "DELETED":
            self.subtrees.pop(key, None)
        else:
            self.subtrees[key] = obj
        changed = before is None or event == "DELETED" or \
            before.get("spec") != obj.get("spec") or \
            (before.get("metadata") or {}).get("labels") != meta.get("labels")
        if changed:
            self._forest = None
        return changed

    def relisted(self, objects: Sequence[Mapping[str, Any]]) -> None:
        present = {((o.get("metadata") or {}).get("namespace") or "",
                    str((o.get("metadata") or {}).get("name"))) for o in objects}
        for key in [k for k in self.subtrees if k not in present]:
            del self.subtrees[key]
            self._forest = None
        for o in objects:
            self.on_subtree("ADDED", o)

    def forest(self) -> QuotaForest | None:
        """The quota trees, or None when there are none (quotas off)."""
        if not self.subtrees:
            return None
        if self._forest is None:
            self._forest = QuotaForest.from_objects(list(self.subtrees.values()))
            problems = tuple(self._forest.problems)
            if problems != self._reported:
                for p in problems:
                    log.warning("QuotaSubtree: %s", p)
                self._reported = problems
        return self._forest

    # --- admitted wrappers and holds ---------------------------------------------------

    def admitted(self, tracked: Mapping[Key, Tracked], state: ClusterState,
                 rigid: Container[Key] = ()) -> list[AdmittedWrapper]:
        """The admitted wrappers as the core counts them; an elastic one named in `rigid`
        at its recorded size, as if it were not elastic: it is neither grown nor shrunk."""
        out = []
        for t in tracked.values():
            if t.phase not in ("dispatching", "dispatched", "running") or t.queued is None:
                continue
            q = t.queued
            pods = [(p.name, PlannedPod(p.node, p.request)) for p in state.bound_pods_of(t.key)
                    ] if q.elastic else []
            record = admitted_record(
                q, t.status.systempriority or float(q.priority), state.holdings(t.key),
                t.dispatched_at, t.preempted, t.status.elasticPods, pods)
            out.append(replace(record, elastic=None) if t.key in rigid else record)
        return out

    def ledger_for(self, forest: QuotaForest | None,
                   admitted: list[AdmittedWrapper]) -> QuotaLedger | None:
        return quota_ledger(forest, admitted, self.holds) if forest is not None else None

    def hold(self, t: Tracked, d: Decision, now: float) -> None:
        assert t.queued is not None
        self.holds[t.key] = Hold(
            tuple(PlannedPod(p.node, p.request) for p in d.placements if p.node is not None),
            t.queued.labels, d.effective_priority, d.preempts, now,
            tuple(s.key for s in d.shrinks))
        for victim in d.preempts:
            self.preempting[victim] = (t.key, victim in d.reclaims)

    def release(self, key: Key) -> Hold | None:
        return self.holds.pop(key, None)
