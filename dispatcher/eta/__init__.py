"""Start estimates: when will each waiting wrapper start?

`forecast` replays the live queue forward through the admission core (replay.py);
`DurationRule` and `DurationHistory` say how long each wrapper is expected to run
(durations.py); `describe` words an estimate for a status message (text.py). Pure: no
I/O; the controller (dispatcher.controller.loop.estimates) and the simulator's accuracy
measurement (dispatcher.simulate.accuracy) feed it.
"""

from dispatcher.eta.durations import (
    DurationHistory,
    DurationRule,
    Expected,
    Shape,
    shape_of,
)
from dispatcher.eta.replay import (
    Estimate,
    Forecast,
    Limits,
    Outcome,
    RunningWrapper,
    forecast,
)

__all__ = [
    "DurationHistory",
    "DurationRule",
    "Estimate",
    "Expected",
    "Forecast",
    "Limits",
    "Outcome",
    "RunningWrapper",
    "Shape",
    "forecast",
    "shape_of",
]
