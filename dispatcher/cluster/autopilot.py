"""Node health as Autopilot reports it: node labels that flag a resource of the node.

Autopilot (IBM's GPU health checker) labels a node ``autopilot.ibm.com/gpuhealth=EVICT``
(or ``TESTING``, ``WARN``) when its GPUs are unhealthy. Codeflare's AppWrapper controller
reads those labels as taints of one resource: ``resourceTaints`` maps a resource to the
labels (key and value) that flag it, each with an effect. On a node so flagged:

- NoSchedule or NoExecute: no new pod asking for that resource goes there (its free
  amount of the resource is none: ``Node.withheld``);
- NoExecute: a gang written as v1beta2 with a pod there asking for it is reset, and runs
  again elsewhere (``Node.evicting``);
- PreferNoSchedule: a preference the dispatcher does not rank nodes by.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"


@dataclass(frozen=True)
class ResourceTaint:
    """A node label `key`=`value` that flags a resource with `effect`."""

    key: str
    value: str
    effect: str


def _codeflare_defaults() -> dict[str, tuple[ResourceTaint, ...]]:
    health = "autopilot.ibm.com/gpuhealth"
    return {"nvidia.com/gpu": (ResourceTaint(health, "WARN", "PreferNoSchedule"),
                               ResourceTaint(health, "TESTING", NO_SCHEDULE),
                               ResourceTaint(health, "EVICT", NO_EXECUTE))}


@dataclass(frozen=True)
class Autopilot:
    """The installation's node health rules (codeflare's ``autopilot`` settings)."""

    resource_taints: Mapping[str, tuple[ResourceTaint, ...]] = field(
        default_factory=_codeflare_defaults)
    avoid: bool = True  # injectAntiAffinities: no new pod on a flagged resource
    migrate: bool = True  # monitorNodes: v1beta2 gangs on a NoExecute resource reset

    def flagged(self, labels: Mapping[str, str], effects: Iterable[str]) -> frozenset[str]:
        """The resources a node with `labels` has flagged with one of `effects`."""
        wanted = set(effects)
        return frozenset(resource for resource, taints in self.resource_taints.items()
                         if any(t.effect in wanted and labels.get(t.key) == t.value
                                for t in taints))

    def withheld(self, labels: Mapping[str, str]) -> frozenset[str]:
        return self.flagged(labels, (NO_SCHEDULE, NO_EXECUTE)) if self.avoid else frozenset()

    def evicting(self, labels: Mapping[str, str]) -> frozenset[str]:
        return self.flagged(labels, (NO_EXECUTE,)) if self.migrate else frozenset()


DEFAULT_AUTOPILOT = Autopilot()
NO_AUTOPILOT = Autopilot(resource_taints={}, avoid=False, migrate=False)


def uses(request: Mapping[str, int], resources: Iterable[str]) -> bool:
    """Whether a pod asking `request` uses any of `resources`."""
    return any(request.get(r, 0) > 0 for r in resources)
