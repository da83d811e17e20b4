"""The `dispatcher` command: plan (what-if), run, queue, simulate; and the
`kubectl appwrapper` plugin (`kubectl-appwrapper` on the PATH)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from dispatcher.queue.policy import PolicyError

EXIT_CLUSTER = 1
EXIT_INPUT = 2


def _now(text: str | None) -> float:
    if text is None:
        return time.time()
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _cmd_plan(args: argparse.Namespace) -> int:
    from dispatcher import plan
    from dispatcher.policy_files import load_policy

    try:
        policy = load_policy(args.policy)
        now = _now(args.now)
        subtrees: list[Mapping[str, Any]] = []
        state = plan.load_cluster([Path(p) for p in args.cluster], subtrees)
        loaded = plan.load_appwrappers([Path(p) for p in args.appwrappers], now)
    except (plan.InputError, PolicyError) as e:
        print(f"dispatcher plan: {e}", file=sys.stderr)
        return EXIT_INPUT
    except ValueError as e:  # a --now that is not a date
        print(f"dispatcher plan: --now: {e}", file=sys.stderr)
        return EXIT_INPUT
    result = plan.plan(state, loaded.queued, policy, args.fit, now, loaded.admitted,
                       [*subtrees, *loaded.subtrees])
    render = plan.to_json if args.output == "json" else plan.to_table
    print(render(result, policy, args.fit))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from dispatcher.controller.operator import operate
    from dispatcher.policy_files import load_policy

    try:
        policy = load_policy(args.policy)
    except PolicyError as e:
        print(f"dispatcher run: {e}", file=sys.stderr)
        return EXIT_INPUT
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        logging.getLogger("kopf").setLevel(logging.WARNING)
    if not 0 <= args.metrics_port <= 65535:
        print(f"dispatcher run: --metrics-port {args.metrics_port} is not a port (0-65535)",
              file=sys.stderr)
        return EXIT_INPUT
    asyncio.run(operate(policy, args.fit, args.kubeconfig, args.liveness,
                        metrics_port=args.metrics_port, metrics_host=args.metrics_host))
    return 0


def _cmd_queue(args: argparse.Namespace) -> int:
    import asyncio

    from dispatcher import visibility
    from dispatcher.policy_files import load_policy

    prog = getattr(args, "prog", "dispatcher queue")
    try:
        policy = load_policy(args.policy)
    except PolicyError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_INPUT
    try:
        listing = asyncio.run(visibility.fetch(args.kubeconfig, args.context, args.namespace,
                                               args.all_namespaces))
    except visibility.ClusterError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_CLUSTER
    rows = visibility.pending_queue(listing.objects, policy, time.time())
    if listing.namespace is not None:
        rows = [r for r in rows if r.namespace == listing.namespace]
    render = visibility.to_json if args.output == "json" else visibility.to_table
    print(render(rows, policy, listing.scope, listing.namespace))
    return 0


def add_queue_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    q.add_argument("--context", help="the kubeconfig context to use (default: current)")
    where = q.add_mutually_exclusive_group()
    where.add_argument("-n", "--namespace",
                       help="show this namespace's AppWrappers (default: the context's)")
    where.add_argument("-A", "--all-namespaces", action="store_true",
                       help="show the AppWrappers of every namespace")
    q.add_argument("--policy", default="fifo",
                   help="the dispatcher's policy: fifo, priority, backfill or a policy YAML "
                   "file (default fifo); it decides the order shown")
    q.add_argument("-o", "--output", choices=("table", "json"), default="table")


QUEUE_DESCRIPTION = (
    "List the AppWrappers waiting for dispatch (status.state Pending or not set), in the "
    "order the dispatcher considers them, with what they request and why they wait. "
    "Positions count the whole cluster's queue, also with -n, when you may list "
    "AppWrappers in all namespaces.")


def _cmd_simulate(args: argparse.Namespace) -> int:
    from dispatcher.simulate import command

    return command.run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dispatcher", description="Gang-scheduling queue dispatcher for AppWrappers."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "plan",
        help="what would be dispatched now, and why the rest waits",
        description="Run one admission cycle over AppWrapper manifests against a cluster "
        "snapshot (kubectl get nodes,pods -A -o yaml) and print every decision.",
    )
    p.add_argument("--cluster", action="append", required=True, metavar="CLUSTER.yaml",
                   help="Nodes and Pods as YAML documents or Lists (repeatable)")
    p.add_argument("--policy", default="fifo",
                   help="fifo, priority, backfill, or a policy YAML file (default fifo)")
    p.add_argument("--fit", choices=("per-node", "aggregate"), default="per-node")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--now", help="the time to plan at (ISO 8601; default: now)")
    p.add_argument("appwrappers", nargs="+", metavar="APPWRAPPERS.yaml")
    p.set_defaults(func=_cmd_plan)

    r = sub.add_parser(
        "run",
        help="run the dispatcher against a cluster",
        description="Queue AppWrappers and create their objects only when every pod fits.",
    )
    r.add_argument("--kubeconfig", help="default: in-cluster config, else $KUBECONFIG")
    r.add_argument("--policy", default="fifo",
                   help="fifo, priority, backfill, or a policy YAML file (default fifo)")
    r.add_argument("--fit", choices=("per-node", "aggregate"), default="per-node")
    r.add_argument("--liveness", metavar="URL",
                   help="serve a liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    r.add_argument("--metrics-port", type=int, default=8080, metavar="PORT",
                   help="serve Prometheus metrics on /metrics and health on /healthz "
                   "(default 8080; 0: serve nothing)")
    r.add_argument("--metrics-host", default="0.0.0.0", metavar="ADDRESS",
                   help="the address to serve metrics on (default 0.0.0.0)")
    r.add_argument("-v", "--verbose", action="store_true")
    r.set_defaults(func=_cmd_run)

    q = sub.add_parser("queue", help="the AppWrappers waiting for dispatch, in order",
                       description=QUEUE_DESCRIPTION)
    add_queue_arguments(q)
    q.set_defaults(func=_cmd_queue)

    from dispatcher.simulate.command import DESCRIPTION, add_arguments

    s = sub.add_parser("simulate", help="replay a job trace through the admission core",
                       description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(s)
    s.set_defaults(func=_cmd_simulate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


def kubectl_plugin(argv: Sequence[str] | None = None) -> int:
    """`kubectl appwrapper queue ...`: kubectl runs `kubectl-appwrapper` from the PATH
    with the arguments after `appwrapper`."""
    parser = argparse.ArgumentParser(
        prog="kubectl appwrapper", description="AppWrappers and the dispatcher's queue.")
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("queue", help="the AppWrappers waiting for dispatch, in order",
                       description=QUEUE_DESCRIPTION)
    add_queue_arguments(q)
    q.set_defaults(func=_cmd_queue, prog="kubectl appwrapper queue")
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
