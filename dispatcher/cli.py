"""The `dispatcher` command: plan (what-if), and more to come."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from dispatcher.queue.policy import PolicyError

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
        state = plan.load_cluster([Path(p) for p in args.cluster])
        wrappers = plan.load_appwrappers([Path(p) for p in args.appwrappers], now)
    except (plan.InputError, PolicyError) as e:
        print(f"dispatcher plan: {e}", file=sys.stderr)
        return EXIT_INPUT
    except ValueError as e:  # a --now that is not a date
        print(f"dispatcher plan: --now: {e}", file=sys.stderr)
        return EXIT_INPUT
    decisions = plan.plan(state, wrappers, policy, args.fit, now)
    render = plan.to_json if args.output == "json" else plan.to_table
    print(render(decisions, policy, args.fit))
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
    asyncio.run(operate(policy, args.fit, args.kubeconfig, args.liveness))
    return 0


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
    r.add_argument("-v", "--verbose", action="store_true")
    r.set_defaults(func=_cmd_run)

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


if __name__ == "__main__":
    sys.exit(main())
