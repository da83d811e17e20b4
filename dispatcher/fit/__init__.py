"""Gang placement: per node (default) and MCAD's aggregate rule."""

from dispatcher.fit.capacity import Capacity
from dispatcher.fit.gang import (
    FRAGMENTED,
    INSUFFICIENT,
    NEVER_FITS,
    NO_MATCHING_NODE,
    GangPodSet,
    Placement,
    Shortfall,
    demand,
    never_fits,
    never_fits_aggregate,
    place,
    place_aggregate,
)

__all__ = [
    "FRAGMENTED",
    "INSUFFICIENT",
    "NEVER_FITS",
    "NO_MATCHING_NODE",
    "Capacity",
    "GangPodSet",
    "Placement",
    "Shortfall",
    "demand",
    "never_fits",
    "never_fits_aggregate",
    "place",
    "place_aggregate",
]
