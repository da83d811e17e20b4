"""Nodes and QuotaSubtrees into memory: what there is to place on, and how it is shared.

A node's heartbeat changes nothing the fit looks at and wakes nobody; a node that goes
takes the capacity held on it with it, so the gangs holding room there must hold it
elsewhere.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from dispatcher.cluster import node_from_object
from dispatcher.cluster.autopilot import Autopilot
from dispatcher.controller.pods.pod_intake import strand
from dispatcher.controller.record.memory import Memory
from dispatcher.controller.record.tracked import ACTIVE

log = logging.getLogger("dispatcher")


class NodeIntake:
    def __init__(self, memory: Memory, autopilot: Autopilot) -> None:
        self.memory = memory
        self.autopilot = autopilot  # node health labels that withhold a resource

    def on_node(self, event: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name"))
        state = self.memory.state
        if event == "DELETED":
            if name not in state.nodes:
                return
            self._gone(name)
        else:
            try:
                node = node_from_object(obj, self.autopilot)
            except Exception as e:  # one node's error costs that node, never the watch
                log.warning("node %s could not be read (%s: %s): nothing is placed on it "
                            "until it can", name, type(e).__name__, str(e)[:300])
                if name not in state.nodes:
                    return
                self._gone(name)
            else:
                if state.nodes.get(name) == node:
                    return  # a heartbeat: nothing the fit looks at has changed
                state.upsert_node(node)
                if node.evicting:
                    self._judge_pods_on(name)
        self.memory.empty_answers = type(self.memory.empty_answers)()
        self.memory.attention.touch_all()
        self.memory.wake.set()

    def _gone(self, name: str) -> None:
        """A node left out: capacity held on it holds nothing, so the gangs whose pods
        will be placed elsewhere must hold their room there."""
        state = self.memory.state
        state.remove_node(name)
        for owner, planned in state.reservations().items():
            t = self.memory.tracked.get(owner)
            if t is not None and any(p.node == name for p in planned):
                self.memory.hold_again(t)
                t.room.room_lost = True
        for claimed, on, _ in self.memory.lifted.values():
            strand(self.memory, claimed, on)

    def _judge_pods_on(self, node: str) -> None:
        """The gangs with a pod on `node` are judged at once (Autopilot flagged it)."""
        for pod in self.memory.state.pods():
            t = self.memory.tracked.get((pod.namespace, pod.appwrapper or ""))
            if pod.node == node and t is not None and t.phase in ACTIVE:
                t.timers.check_at = 0.0

    def relisted(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """A complete listing of nodes: those not in it any more are gone."""
        listed = list(objs)
        present = {str((o.get("metadata") or {}).get("name")) for o in listed}
        for name in [n for n in self.memory.state.nodes if n not in present]:
            self.on_node("DELETED", {"metadata": {"name": name}})
        for o in listed:
            self.on_node("ADDED", o)

    # --- QuotaSubtrees ------------------------------------------------------------------

    def on_quota(self, event: str, obj: Mapping[str, Any]) -> None:
        if self.memory.sharing.on_subtree(event, obj):
            self.memory.wake.set()

    def relisted_quotas(self, objs: Iterable[Mapping[str, Any]]) -> None:
        self.memory.sharing.relisted(list(objs))
