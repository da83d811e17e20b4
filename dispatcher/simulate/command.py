"""`dispatcher simulate`: the command's flags turned into a run and its report."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import yaml

from dispatcher import yaml_text
from dispatcher.policy_files import load_policy
from dispatcher.queue.policy import PolicyError
from dispatcher.quota import QuotaForest, is_quota_subtree
from dispatcher.simulate import clusters, elastic
from dispatcher.simulate.accuracy import (
    ACCURACY_HEADER,
    MODES,
    Probe,
    accuracy_cells,
    accuracy_dict,
    compare,
    render,
)
from dispatcher.simulate.engine import Layout, racked_nodes, requiring_rack, simulate
from dispatcher.simulate.layout import read_layout
from dispatcher.simulate.plot import PlotError, check_available, plot
from dispatcher.simulate.progress import ProgressBar
from dispatcher.simulate.report import summarise, to_dict, to_table
from dispatcher.simulate.reserving import DURATION_MODES, durations_for
from dispatcher.simulate.teams import TeamRule, assign, parse_teams
from dispatcher.simulate.traces import TraceError, read_trace
from dispatcher.wording import counted

EXIT_INPUT = 2

DESCRIPTION = """\
Replay a job trace through the dispatcher's admission core on a modelled cluster of
identical GPU nodes and report GPU utilisation, queueing delay (overall and by gang
size), makespan, jobs delayed by fragmentation, partial gangs and the longest wait.

Trace formats (by extension):
  .csv   job_id,submission_time,duration,num_gpu (seconds), as in the ITP traces; a job
         of N GPUs is a gang of ceil(N/G) pods of min(N, G) GPUs, G = --gpus-per-node
  .yaml  a list of {submitTime, duration, appwrapper} entries, or AppWrappers annotated
         simulate.workload.codeflare.dev/submit-time and .../duration (seconds); pod
         sets are inferred as the controller does

Teams, quotas and preemption:
  --quota FILE       QuotaSubtrees (YAML); every job is checked against its quota leaf
  --teams RULE       CSV traces: assign jobs to teams by a hash of their id, with weights,
                     e.g. team-a=2,team-b=1,team-c=1; the team is the job's leaf in every
                     quota tree. YAML traces label their AppWrappers themselves.
  --high-priority F  CSV traces: give the fraction F of the jobs (by hash) priority 10
  --policy priority-preemption  lets high-priority jobs preempt (per-node fit)

Elastic gangs:
  --elastic          replay the trace twice, rigid and elastic (a job of N GPUs may run on
                     ceil(N/2) of them, in whole pods; work scales linearly with its pods),
                     and print waits and utilisation side by side (per-node fit). YAML
                     traces' elastic AppWrappers are elastic in every run.

Topology:
  --topology 8x40    the nodes in 8 blocks x 40 racks; or --topology FILE: the nodes and
                     levels of a topology file (a `topology:` section as in the
                     configuration file, and `nodes:` with their labels)
  --require-rack F   the fraction F of the gangs of 2+ pods require one rack; the trace is
                     replayed without too, and the report says what requiring it costs

Start estimates:
  --eta N            at N moments spread over the submissions, estimate every queued
                     job's start as the controller does (durations known exactly, and
                     learnt from the jobs completed so far) and report how far off that
                     was from the start the simulation then gave it (per-node fit)
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, metavar="FILE",
                   help="a CSV trace or a YAML list of AppWrappers (see above)")
    p.add_argument("--nodes", type=int, metavar="N",
                   help="nodes in the cluster (required, unless a --topology file lists them)")
    p.add_argument("--gpus-per-node", type=int, default=8, metavar="G",
                   help="GPUs per node (default 8)")
    p.add_argument("--policy", default="fifo",
                   help="fifo, priority, backfill, priority-preemption, reserve, or a "
                   "policy YAML file (default fifo)")
    p.add_argument("--fit", choices=("per-node", "aggregate"), default="per-node")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw utilisation and queue length over time (needs matplotlib)")
    p.add_argument("--limit", type=int, metavar="N", help="only the first N jobs of the trace")
    p.add_argument("--cycle-interval", type=float, metavar="SECONDS",
                   help="also run an admission cycle every SECONDS while jobs wait (for "
                        "dynamic priorities); default: only after arrivals and completions")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar on stderr (default: only when stderr is a terminal)")
    p.add_argument("--quota", metavar="FILE.yaml",
                   help="QuotaSubtrees: jobs are admitted within their quota (see above)")
    p.add_argument("--teams", metavar="RULE",
                   help="CSV traces: assign jobs to teams, e.g. team-a=2,team-b=1")
    p.add_argument("--high-priority", type=float, default=0.0, metavar="FRACTION",
                   help="CSV traces: the fraction of jobs (0-1) given priority 10")
    p.add_argument("--eta", type=int, metavar="N",
                   help="measure start estimates at N moments (see above)")
    p.add_argument("--topology", metavar="BLOCKSxRACKS|FILE",
                   help="spread the nodes over BLOCKS x RACKS racks (e.g. 8x40), labelled "
                        "with their block and rack, or take the nodes and levels of a "
                        "topology file (see docs/topology.md): the report counts the gangs "
                        "in one rack")
    p.add_argument("--require-rack", type=float, default=0.0, metavar="FRACTION",
                   help="with --topology: this fraction of the jobs of 2 pods or more "
                        "require one rack (Kueue's podset-required-topology); the trace is "
                        "also replayed without, to show what requiring it costs")
    p.add_argument("--elastic", action="store_true",
                   help="compare the trace rigid and elastic (see above)")
    p.add_argument("--durations", choices=DURATION_MODES, default="predicted",
                   help="what a reserving policy (backfill: reserve) plans with: durations "
                        "predicted as the controller does (median of completed jobs of the "
                        "same shape, else 1 h), or each job's real one (default: predicted)")
    p.add_argument("--clusters", type=int, metavar="N",
                   help="split the --nodes into N equal clusters and compare one manager's "
                        "choice of cluster with round-robin and with N independent queues "
                        "(first come first served, per-node fit)")


def _check(args: argparse.Namespace) -> str | None:
    if args.nodes is None and (args.topology is None or _racks(args.topology) is not None):
        return "--nodes is required (or a --topology file, whose nodes are the cluster)"
    if args.nodes is not None and args.nodes < 1:
        return f"--nodes must be at least 1, got {args.nodes}"
    if args.gpus_per_node < 1:
        return f"--gpus-per-node must be at least 1, got {args.gpus_per_node}"
    if args.limit is not None and args.limit < 1:
        return f"--limit must be at least 1, got {args.limit}"
    if args.cycle_interval is not None and not args.cycle_interval > 0:
        return f"--cycle-interval must be a number of seconds above 0, got {args.cycle_interval}"
    if not 0 <= args.high_priority <= 1:
        return f"--high-priority must be a fraction between 0 and 1, got {args.high_priority}"
    if args.eta is not None and args.eta < 1:
        return f"--eta must be at least 1 moment, got {args.eta}"
    if args.eta is not None and args.fit != "per-node":
        return "--eta measures start estimates with --fit per-node only"
    if args.clusters is not None and (args.clusters < 1 or args.nodes % args.clusters):
        return (f"--clusters must divide --nodes ({args.nodes}) into equal clusters, "
                f"got {args.clusters}")
    if args.elastic and (args.fit != "per-node" or args.eta is not None or args.plot):
        return "--elastic compares with --fit per-node, without --eta or --plot"
    return _check_topology(args)


def _racks(text: str | None) -> tuple[int, int] | None:
    """BLOCKSxRACKS as numbers; None for anything else (a file's name)."""
    if text is None:
        return None
    blocks, x, racks = text.lower().partition("x")
    if not (x and blocks.isdigit() and racks.isdigit()):
        return None
    return int(blocks), int(racks)


def _check_topology(args: argparse.Namespace) -> str | None:
    if args.topology is None:
        racks = None
    elif (racks := _racks(args.topology)) is None:
        if not Path(args.topology).is_file():
            return (f"--topology {args.topology}: write BLOCKSxRACKS, e.g. 8x40, or the name "
                    "of a topology file (there is no such file)")
    elif not (racks[0] and racks[1]):
        return f"--topology {args.topology}: write BLOCKSxRACKS, e.g. 8x40 (both above 0)"
    if racks is not None and racks[0] * racks[1] > args.nodes:
        return (f"--topology {args.topology}: {racks[0] * racks[1]} racks for {args.nodes} "
                "nodes; every rack needs a node")
    if not 0 <= args.require_rack <= 1:
        return f"--require-rack must be a fraction between 0 and 1, got {args.require_rack}"
    if args.require_rack and (args.topology is None or args.fit != "per-node" or args.elastic):
        return "--require-rack needs --topology and --fit per-node, without --elastic"
    return None


def _layout(args: argparse.Namespace) -> Layout | None:
    """The nodes in topology domains that --topology asks for, if any."""
    if args.topology is None:
        return None
    racks = _racks(args.topology)
    if racks is None:
        return read_layout(Path(args.topology), args.gpus_per_node)
    return racked_nodes(args.nodes, args.gpus_per_node, *racks)


def load_forest(path: Path) -> QuotaForest:
    """The quota trees of a YAML file of QuotaSubtrees (or Lists of them)."""
    try:
        docs = yaml_text.load_all(yaml_text.read(path), str(path))
    except (OSError, yaml.YAMLError) as e:
        raise TraceError(f"{path}: cannot read QuotaSubtrees: {e}") from e
    objs: list[Mapping[str, Any]] = []
    for i, doc in enumerate(docs, start=1):
        items = doc.get("items") if isinstance(doc, Mapping) and doc.get("kind") == "List" else [
            doc]
        for obj in items or []:
            if obj is None:
                continue
            if not isinstance(obj, Mapping) or not is_quota_subtree(obj):
                raise TraceError(f"{path}, document {i}: expected QuotaSubtrees only")
            objs.append(obj)
    forest = QuotaForest.from_objects(objs)
    if forest.problems:
        raise TraceError(f"{path}: " + "; ".join(forest.problems))
    if not forest:
        raise TraceError(f"{path}: no QuotaSubtree in it")
    return forest


def _compare_clusters(trace: Any, args: argparse.Namespace, out: TextIO) -> int:
    per = args.nodes // args.clusters
    results = [clusters.simulate_clusters(trace.jobs, args.clusters, per, args.gpus_per_node, m)
               for m in clusters.MODES]
    left_out = clusters.never_fitting(trace.jobs, per, args.gpus_per_node)
    if args.output == "json":
        print(json.dumps({"clusters": args.clusters, "left_out": left_out,
                          "results": [r.__dict__ for r in results]}, indent=2), file=out)
    else:
        print(clusters.table(results, args.clusters, left_out), file=out)
    return 0


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr

    def fail(message: str) -> int:
        print(f"dispatcher simulate: {message}", file=err)
        return EXIT_INPUT

    problem = _check(args)
    if problem is not None:
        return fail(problem)
    try:
        policy = load_policy(args.policy)
        if policy.preemption != "never" and args.fit != "per-node":
            raise PolicyError(f"policy {policy.name} preempts: simulate it with --fit per-node")
        if policy.reserve and args.fit != "per-node":
            raise PolicyError(f"policy {policy.name} reserves nodes: simulate it with --fit "
                              "per-node")
        trace = read_trace(Path(args.trace), args.gpus_per_node, args.limit)
        forest = load_forest(Path(args.quota)) if args.quota else None
        if args.teams or args.high_priority:
            if not args.trace.lower().endswith(".csv"):
                raise TraceError("--teams and --high-priority apply to CSV traces; a YAML "
                                 "trace's AppWrappers carry their own labels and priorities")
            rule = TeamRule(parse_teams(args.teams) if args.teams else (("all", 1),),
                            args.high_priority)
            trace = assign(trace, rule, tuple(forest.trees) if forest else ())
        if args.plot:
            check_available()
        layout = _layout(args)
    except (PolicyError, TraceError, PlotError) as e:
        return fail(str(e))
    if args.clusters is not None:
        return _compare_clusters(trace, args, out)
    nodes = len(layout.nodes) if layout is not None else args.nodes
    if args.nodes is not None and nodes != args.nodes:
        return fail(f"--nodes {args.nodes}, but the topology file {args.topology} lists "
                    f"{nodes}: leave --nodes out, or give the file's count")
    if args.elastic:
        c = elastic.compare(trace, nodes, args.gpus_per_node, policy, forest)
        if args.output == "json":
            print(json.dumps(elastic.to_dict(c), indent=2), file=out)
        else:
            print(elastic.table(c, f"{Path(trace.source).name}: {nodes} x "
                                   f"{args.gpus_per_node} GPUs, {policy.name}"), file=out)
        return 0
    show = err.isatty() if args.progress is None else args.progress
    bar = ProgressBar(err) if show else None
    probe = None
    if args.eta is not None:
        submits = [j.submit for j in trace.jobs]
        probe = Probe(min(submits), max(submits), samples=args.eta)
    without = None
    if args.require_rack and layout is not None:
        # The same trace without the requirement: what requiring the domain costs.
        without = summarise(simulate(trace.jobs, nodes, args.gpus_per_node, policy, args.fit,
                                     args.cycle_interval, forest=forest, layout=layout), trace)
        trace = replace(trace, jobs=tuple(requiring_rack(trace.jobs, args.require_rack,
                                                         layout.level)))
    try:
        result = simulate(trace.jobs, nodes, args.gpus_per_node, policy, args.fit,
                          args.cycle_interval, bar, forest, observe=probe, layout=layout,
                          durations=durations_for(args.durations))
    finally:
        if bar is not None:
            bar.close()
    summary = summarise(result, trace)
    accuracy = [compare(probe, result.jobs, mode) for mode in MODES] if probe else []
    if args.output == "json":
        data = to_dict(summary, without)
        if probe is not None:
            data["startEstimates"] = [accuracy_dict(a) for a in accuracy]
        print(json.dumps(data, indent=2), file=out)
    else:
        print(to_table(summary, without), file=out)
        if probe is not None:
            print(f"\nstart estimates: every queued job's, at {counted(args.eta, 'moment')} "
                  "spread over "
                  "the submissions (samples: those with jobs queued), compared with its start "
                  "in this run:", file=out)
            print(render(ACCURACY_HEADER, [accuracy_cells(a) for a in accuracy]), file=out)
    if args.plot:
        title = (f"{Path(trace.source).name}: {nodes} x {args.gpus_per_node} GPUs, "
                 f"{policy.name}, {args.fit} fit")
        try:
            plot(result, Path(args.plot), title)
        except PlotError as e:
            return fail(str(e))
    return 0
