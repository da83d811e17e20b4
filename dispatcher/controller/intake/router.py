"""Intake: watch events and listings into memory. No API calls, no waiting.

Each kind has its own: nodes and QuotaSubtrees (node_intake.py), pods (pods/pod_intake.py),
AppWrappers (wrapper_intake.py; queue_gate.py: whether each goes into the queue, or is held,
failed or kept out being deleted). A listing (at start, after a watch gap, or the periodic
resync) is reconciled with memory: what is not in it any more is dropped, as if its
DELETED event had come.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from dispatcher.controller.pods.pod_intake import PodIntake
from dispatcher.controller.record.memory import Memory
from dispatcher.controller.record.tracked import Key, Tracked
from dispatcher.kinds.scope import DEFAULT_ALLOWED_KINDS, GroupKind
from dispatcher.lifecycle import DEFAULT_TIMING, Timing

from .node_intake import NodeIntake
from .queue_gate import QueueGate
from .wrapper_intake import WrapperIntake


class Intake:
    def __init__(self, memory: Memory, clock: Callable[[], float],
                 on_failed: Callable[[str], None] = lambda reason: None,
                 allowed_kinds: Collection[GroupKind] = DEFAULT_ALLOWED_KINDS,
                 leave_kueue_labelled: bool = False, timing: Timing = DEFAULT_TIMING) -> None:
        self.memory = memory
        # Dispatched wrappers to tear down and queue again (items edited, or a requeue
        # that a restart cut short).
        self.requeues_due: set[Key] = set()
        # Dispatched wrappers whose items were edited after admission: to requeue.
        self.edited: set[Key] = set()
        self.nodes = NodeIntake(memory, timing.autopilot)
        self.pods = PodIntake(memory, self.requeues_due)
        self.gate = QueueGate(memory, clock, on_failed)
        self.wrappers = WrapperIntake(memory, clock, self.gate, allowed_kinds,
                                      leave_kueue_labelled, timing, self.requeues_due,
                                      self.edited)

    def on_node(self, event: str, obj: Mapping[str, Any]) -> None:
        self.nodes.on_node(event, obj)

    def on_quota(self, event: str, obj: Mapping[str, Any]) -> None:
        self.nodes.on_quota(event, obj)

    def on_pod(self, event: str, obj: Mapping[str, Any]) -> None:
        self.pods.on_pod(event, obj)

    def proven(self, decided: Mapping[tuple[str, str], Key | None]) -> None:
        """Owner lookups finished (in the loop): count the pods now proven."""
        self.pods.proven(decided)

    def on_appwrapper(self, event: str, obj: Mapping[str, Any]) -> None:
        self.wrappers.on_appwrapper(event, obj)

    def queue_again(self, t: Tracked) -> None:
        self.wrappers.queue_again(t)

    def rehold(self, t: Tracked) -> bool:
        return self.gate.rehold(t)

    def take_warnings(self) -> list[tuple[Tracked, str]]:
        """What to post as Warning Events (once per new spec), taken out."""
        warnings, self.wrappers.warnings = self.wrappers.warnings, []
        return warnings

    def relisted(self, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """A complete listing of `kind` (Node, Pod, QuotaSubtree, AppWrapper): reconcile
        memory."""
        if kind == "Node":
            self.nodes.relisted(objects)
        elif kind == "Pod":
            self.pods.relisted(objects)
        elif kind == "QuotaSubtree":
            self.nodes.relisted_quotas(objects)
        elif kind == "AppWrapper":
            self.wrappers.relisted(objects)
        self.memory.attention.touch_all()
        self.memory.wake.set()
