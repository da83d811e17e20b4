"""The fit rules: how a gang's pods are placed, and how "never fits" is answered."""

from __future__ import annotations

from typing import Literal

from dispatcher.fit.gang import (
    Hopeless,
    Placer,
    never_fits,
    never_fits_aggregate,
    place,
    place_aggregate,
)
from dispatcher.fit.topology import Topology

# per-node: every pod must get a node; aggregate: MCAD's rule, the gang's total against
# the cluster's free total.
Fit = Literal["per-node", "aggregate"]
NO_TOPOLOGY = Topology()


def fit_rules(fit: Fit, topology: Topology = NO_TOPOLOGY) -> tuple[Placer, Hopeless]:
    """How gangs are placed, and how "never fits" is answered, under `fit`: topology
    requests count under per-node fit only (the aggregate rule places no pod)."""
    if fit == "aggregate":
        return place_aggregate, never_fits_aggregate
    if topology.levels:
        return topology.place, topology.never_fits
    return place, never_fits
