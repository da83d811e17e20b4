"""Trace replay: what would a policy do to a cluster? Jobs of a trace go through the
same admission core as the controller, on a modelled cluster of GPU nodes.

- `traces`: CSV GPU traces and YAML lists of AppWrappers -> `TraceJob`s
- `engine`: the discrete-event loop around `dispatcher.admission.admit`
- `report`: utilisation, queueing delay, fragmentation, partial gangs, starvation
"""

from dispatcher.simulate.engine import JobRun, Run, Simulation, gpu_nodes, simulate
from dispatcher.simulate.report import Summary, summarise, to_dict, to_json, to_table
from dispatcher.simulate.traces import Trace, TraceError, TraceJob, read_trace

__all__ = [
    "JobRun",
    "Run",
    "Simulation",
    "Summary",
    "Trace",
    "TraceError",
    "TraceJob",
    "gpu_nodes",
    "read_trace",
    "simulate",
    "summarise",
    "to_dict",
    "to_json",
    "to_table",
]
