"""The `dispatcher` command: plan (what-if), run, queue, simulate, webhook; and the
`kubectl appwrapper` plugin (`kubectl-appwrapper` on the PATH)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatcher.queue.policy import PolicyError

if TYPE_CHECKING:
    from dispatcher.controller.kube.client import Kube
    from dispatcher.controller.metrics.prometheus import PrometheusObserver
    from dispatcher.controller.pods.pod_pinning import PodPinning
    from dispatcher.controller.webhook.server import WebhookOptions, WebhookServer

EXIT_CLUSTER = 1
EXIT_INPUT = 2
#: --policy's help: the built-in policies (dispatcher/policies), or a file.
POLICY_HELP = ("fifo, priority, backfill, priority-preemption, reserve, or a policy YAML "
               "file (default fifo)")


def _now(text: str | None) -> float:
    if text is None:
        return time.time()
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _plan_time(text: str | None) -> float | None:
    """`--now` as a time, or None once said why it is not one (parsed on its own, so that
    no other error is taken for a bad --now)."""
    try:
        return _now(text)
    except ValueError as e:
        print(f"dispatcher plan: --now: {e} (expected ISO 8601, e.g. 2024-05-01T12:00:00Z)",
              file=sys.stderr)
        return None


def _cmd_plan(args: argparse.Namespace) -> int:
    from dispatcher import plan
    from dispatcher.config import ConfigError, load_config
    from dispatcher.policy_files import load_policy

    live = args.live or args.filename
    if live and (not (args.live and args.filename) or args.cluster or args.appwrappers):
        print("dispatcher plan: --live takes the AppWrappers to try with -f (and no --cluster "
              "or other files)", file=sys.stderr)
        return EXIT_INPUT
    if not live and (not args.cluster or not args.appwrappers):
        print("dispatcher plan: give --cluster CLUSTER.yaml and AppWrapper files, or --live "
              "-f APPWRAPPER.yaml to ask the live cluster", file=sys.stderr)
        return EXIT_INPUT
    if not live:
        from dispatcher import fleet_plan

        named = [fleet_plan.named_snapshot(c) for c in args.cluster]
        if any(named):
            return _plan_fleet(args, named)
    # The kubectl plugin's plan is live only: it takes no worker clusters.
    if getattr(args, "worker_labels", None):
        print("dispatcher plan: --worker-labels goes with --cluster NAME=FILE (worker "
              "clusters)", file=sys.stderr)
        return EXIT_INPUT
    now = _plan_time(args.now)
    if now is None:
        return EXIT_INPUT
    try:
        policy = load_policy(args.policy)
        config = load_config(args.config)
        subtrees: list[Mapping[str, Any]] = []
        state = plan.load_cluster([Path(p) for p in args.cluster or ()], subtrees)
        loaded = plan.load_appwrappers([Path(p) for p in args.appwrappers], now,
                                       config.allowed_kinds)
    except (plan.InputError, PolicyError, ConfigError) as e:
        print(f"dispatcher plan: {e}", file=sys.stderr)
        return EXIT_INPUT
    if live:
        from dispatcher import whatif

        return whatif.command(policy, args.fit, args.filename, args.kubeconfig, args.context,
                              args.output, now, sys.stdout, sys.stderr, config.allowed_kinds,
                              config.topology_levels)
    result = plan.plan(state, loaded.queued, policy, args.fit, now, loaded.admitted,
                       [*subtrees, *loaded.subtrees], config.topology_levels,
                       specs=loaded.specs, name_all=True)
    render = plan.to_json if args.output == "json" else plan.to_table
    print(render(result, policy, args.fit, loaded.warnings))
    if result.decisions and all(d.decision == "invalid" for d in result.decisions):
        count = len(result.decisions)
        which = "the AppWrapper is" if count == 1 else f"all {count} AppWrappers are"
        print(f"dispatcher plan: {which} invalid: nothing can be dispatched (the "
              "messages above say why)", file=sys.stderr)
        return EXIT_INPUT
    return 0


def _plan_fleet(args: argparse.Namespace, named: list[tuple[str, Path] | None]) -> int:
    """`plan --cluster NAME=FILE ...`: the worker cluster a manager would send each to."""
    from dispatcher import fleet_plan, plan
    from dispatcher.config import ConfigError, load_config

    snapshots = [n for n in named if n is not None]
    if len(snapshots) != len(named):
        print("dispatcher plan: name every --cluster (NAME=FILE, one worker cluster each) "
              "or none (one cluster)", file=sys.stderr)
        return EXIT_INPUT
    now = _plan_time(args.now)
    if now is None:
        return EXIT_INPUT
    try:
        config = load_config(args.config)
        workers = fleet_plan.load_workers(snapshots,
                                          fleet_plan.worker_labels(args.worker_labels), now)
        loaded = plan.load_appwrappers([Path(p) for p in args.appwrappers], now,
                                       config.allowed_kinds)
    except (plan.InputError, ConfigError) as e:
        print(f"dispatcher plan: {e}", file=sys.stderr)
        return EXIT_INPUT
    sent = fleet_plan.plan_fleet(workers, loaded, now, args.fit, config.topology_levels)
    print(fleet_plan.to_json(sent) if args.output == "json"
          else fleet_plan.to_table(sent, workers))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from dispatcher.config import ConfigError, load_config
    from dispatcher.controller.kube.kubeconfig import KubeconfigError
    from dispatcher.controller.kube.logs import configure as configure_logging
    from dispatcher.controller.kube.startup import Late, Stopped, stop_on_signals, within
    from dispatcher.controller.loop.estimate_round import EstimateSettings
    from dispatcher.controller.operator import EXIT_NOT_STARTED, Settings, operate
    from dispatcher.controller.webhook.server import own_namespace
    from dispatcher.eta import DurationRule, Limits
    from dispatcher.lifecycle import Timing
    from dispatcher.policy_files import load_policy

    if args.manager:
        return _run_manager(args)
    try:
        policy = load_policy(args.policy)
        config = load_config(args.config)
    except (PolicyError, ConfigError) as e:
        print(f"dispatcher run: {e}", file=sys.stderr)
        return EXIT_INPUT
    configure_logging(args.log_format, args.verbose, quiet=("aiohttp", "kubernetes_asyncio"))
    problems = []
    for flag, port in (("--metrics-port", args.metrics_port),
                       ("--webhook-port", args.webhook_port)):
        if not 0 <= port <= 65535:
            problems.append(f"{flag} {port} is not a port (0-65535)")
    for flag in ("admission_grace", "failure_grace", "requeue_floor", "requeue_cap",
                 "resync_seconds", "kube_qps", "estimate_interval", "startup_deadline"):
        if getattr(args, flag) < 0:
            problems.append(f"--{flag.replace('_', '-')} must be ≥ 0")
    for flag in ("default_duration", "estimate_horizon"):
        if not getattr(args, flag) > 0:
            problems.append(f"--{flag.replace('_', '-')} must be a number of seconds above 0")
    if args.kube_burst < 1:
        problems.append("--kube-burst must be ≥ 1")
    if problems:
        for p in problems:
            print(f"dispatcher run: {p}", file=sys.stderr)
        return EXIT_INPUT
    timing = Timing(admission_grace=args.admission_grace, failure_grace=args.failure_grace,
                    requeue_floor=args.requeue_floor, requeue_cap=args.requeue_cap,
                    fault_tolerance=config.fault_tolerance, autopilot=config.node_health)
    estimates = EstimateSettings(interval=args.estimate_interval,
                                 rule=DurationRule(default_seconds=args.default_duration),
                                 limits=Limits(horizon_seconds=args.estimate_horizon))
    settings = Settings(
        policy=policy, fit=args.fit, kubeconfig=args.kubeconfig,
        metrics_port=args.metrics_port, metrics_host=args.metrics_host, timing=timing,
        qps=args.kube_qps, burst=args.kube_burst, resync_seconds=args.resync_seconds,
        leader_election=args.leader_elect,
        lease_namespace=args.lease_namespace or own_namespace(),
        lease_name=args.lease_name or "dispatcher", allowed_kinds=config.allowed_kinds,
        require_creator=args.require_creator, estimates=estimates, pin_pods=args.pin_pods,
        topology=config.topology_levels, leave_kueue_labelled=args.leave_kueue_labelled,
        pod_webhook=bool(args.webhook_port) and args.pin_pods,
        startup_deadline=args.startup_deadline)
    if args.metrics_port and args.webhook_port:
        from dispatcher.controller.metrics.prometheus import PrometheusObserver

        # The webhook's requests are measured too.
        settings.observer = PrometheusObserver(topology_levels=config.topology.levels)
    logging.getLogger("dispatcher").info("kinds AppWrappers may wrap: %s",
                                         config.describe())
    if config.topology.levels:
        logging.getLogger("dispatcher").info("topology levels: %s",
                                             ", ".join(config.topology.levels))
    if args.metrics_auth == "kubernetes":
        from dispatcher.controller.access.bearer import TokenReviewAuth
        from dispatcher.controller.kube.client import Kube
        from dispatcher.controller.metrics.server import MetricsServer

        MetricsServer.default_auth = TokenReviewAuth(lambda: Kube.connect(args.kubeconfig))

    async def run() -> int:
        # The webhook shares the event loop with the controller; of its state, only the
        # pod webhook reads it (holds a pod's room as it is created, pod_pinning.py).
        stop = stop_on_signals()
        webhook = None
        try:
            operator = None
            if args.webhook_port:
                from dispatcher.controller.operator import Operator
                from dispatcher.controller.pods.pod_pinning import PodPinning

                operator = Operator(settings)
                pods = PodPinning(operator.pins) if args.pin_pods else None
                webhook = await within(
                    _start_webhook(args, args.webhook_port, pods, settings.observer), stop,
                    args.startup_deadline)
            return await operate(settings, stop, operator)
        except Stopped:
            return 0
        except Late:  # the webhook's log lines said why
            print(f"dispatcher run: the webhook not started after {args.startup_deadline:g}"
                  " s (--startup-deadline); giving up", file=sys.stderr)
            return EXIT_NOT_STARTED
        finally:
            if webhook is not None:
                server, kube = webhook
                await server.stop()
                await kube.close()

    try:
        return asyncio.run(run())
    except KubeconfigError as e:
        print(f"dispatcher run: {e}", file=sys.stderr)
        return EXIT_INPUT
    except OSError as e:  # a port taken, a certificate directory not readable
        print(f"dispatcher run: {e}", file=sys.stderr)
        return EXIT_CLUSTER


def _run_manager(args: argparse.Namespace) -> int:
    import asyncio

    from dispatcher.config import ConfigError, load_config
    from dispatcher.controller.kube.kubeconfig import KubeconfigError
    from dispatcher.controller.kube.lease import LEASE_SECONDS
    from dispatcher.controller.kube.logs import configure as configure_logging
    from dispatcher.controller.kube.startup import stop_on_signals
    from dispatcher.controller.manager.passes import ManagerSettings
    from dispatcher.controller.manager.service import manage
    from dispatcher.controller.webhook.server import own_namespace
    from dispatcher.fleet.fence import check_grace, handover_warning

    try:
        check_grace(args.worker_grace)
    except ValueError as e:
        print(f"dispatcher run: {e}", file=sys.stderr)
        return EXIT_INPUT
    if args.worker_start_seconds < 0:
        print(f"dispatcher run: --worker-start-seconds must be 0 (never) or more, got "
              f"{args.worker_start_seconds:g}", file=sys.stderr)
        return EXIT_INPUT
    warning = handover_warning(args.worker_grace, LEASE_SECONDS) if args.leader_elect else None
    if warning:
        print(f"dispatcher run: warning: {warning}", file=sys.stderr)
    configure_logging(args.log_format, args.verbose, quiet=("aiohttp", "kubernetes_asyncio"))
    if not 0 <= args.metrics_port <= 65535:
        print(f"dispatcher run: --metrics-port {args.metrics_port} is not a port (0-65535)",
              file=sys.stderr)
        return EXIT_INPUT
    try:
        config = load_config(args.config)
    except ConfigError as e:
        print(f"dispatcher run: {e}", file=sys.stderr)
        return EXIT_INPUT
    settings = ManagerSettings(kubeconfig=args.kubeconfig, grace=args.worker_grace,
                               metrics_port=args.metrics_port, metrics_host=args.metrics_host,
                               fit=args.fit, topology=config.topology_levels,
                               leave_kueue_labelled=args.leave_kueue_labelled,
                               start_within=args.worker_start_seconds,
                               leader_election=args.leader_elect,
                               lease_namespace=args.lease_namespace or own_namespace(),
                               lease_name=args.lease_name or "dispatcher-manager-leader")

    async def run() -> int:
        auth = None
        if args.metrics_auth == "kubernetes":
            from dispatcher.controller.access.bearer import TokenReviewAuth
            from dispatcher.controller.kube.client import Kube

            auth = TokenReviewAuth(lambda: Kube.connect(args.kubeconfig))
        return await manage(settings, stop_on_signals(), auth)

    try:
        return asyncio.run(run())
    except KubeconfigError as e:
        print(f"dispatcher run: {e}", file=sys.stderr)
        return EXIT_INPUT


async def _start_webhook(args: argparse.Namespace, port: int, pods: PodPinning | None,
                         observer: PrometheusObserver | None = None
                         ) -> tuple[WebhookServer, Kube]:
    import dataclasses

    from dispatcher.controller.kube.client import Kube
    from dispatcher.controller.webhook.server import PODS_CONFIGURATION, make_server, start_serving

    metrics = None if observer is None else observer.requests
    kube = await Kube.connect(args.kubeconfig, observer=metrics)
    options = _webhook_options(args, port)
    if pods is not None:
        options = dataclasses.replace(options, pods_configuration=PODS_CONFIGURATION)
    server = make_server(kube, options, pods, metrics)
    try:
        await start_serving(kube, server)
    except BaseException:
        await kube.close()
        raise
    return server, kube


def _webhook_options(args: argparse.Namespace, port: int) -> WebhookOptions:
    """The webhook's options; raises ConfigError for a bad --config."""
    from dispatcher.config import load_config
    from dispatcher.controller.webhook.server import WebhookOptions, own_namespace

    config = load_config(args.config)
    return WebhookOptions(
        port=port, host=args.webhook_host, namespace=args.namespace or own_namespace(),
        service=args.webhook_service, secret=args.webhook_secret,
        configuration=args.webhook_configuration or None,
        cert_dir=Path(args.webhook_cert_dir) if args.webhook_cert_dir else None,
        cert_hosts=tuple(args.webhook_cert_host or ()),
        manager_users=tuple(args.manager_user or ()),
        allowed_kinds=config.allowed_kinds, topology=config.topology_levels,
        faults=config.fault_tolerance)


def _cmd_webhook(args: argparse.Namespace) -> int:
    import asyncio

    from dispatcher.config import ConfigError
    from dispatcher.controller.kube.kubeconfig import KubeconfigError
    from dispatcher.controller.kube.logs import configure as configure_logging
    from dispatcher.controller.webhook.server import serve

    configure_logging(args.log_format, args.verbose)
    if not 1 <= args.webhook_port <= 65535:
        print(f"dispatcher webhook: --port {args.webhook_port} is not a port (1-65535)",
              file=sys.stderr)
        return EXIT_INPUT
    try:
        options = _webhook_options(args, args.webhook_port)
    except ConfigError as e:
        print(f"dispatcher webhook: {e}", file=sys.stderr)
        return EXIT_INPUT
    try:
        asyncio.run(serve(options, args.kubeconfig))
    except KubeconfigError as e:
        print(f"dispatcher webhook: {e}", file=sys.stderr)
        return EXIT_INPUT
    except (OSError, RuntimeError) as e:
        print(f"dispatcher webhook: {e}", file=sys.stderr)
        return EXIT_CLUSTER
    return 0


def add_webhook_arguments(p: argparse.ArgumentParser, prefix: str) -> None:
    """The webhook's options; `prefix` is "--webhook-" inside `run`, "--" on its own."""
    p.add_argument(f"{prefix}host", dest="webhook_host", default="0.0.0.0",
                   metavar="ADDRESS", help="the address to serve the webhook on "
                   "(default 0.0.0.0)")
    p.add_argument(f"{prefix}cert-dir", dest="webhook_cert_dir", metavar="DIR",
                   help="serve tls.crt and tls.key from DIR (cert-manager); the CA bundle "
                   "is then not patched. Default: certificates made by the dispatcher and "
                   "kept in a Secret of its namespace")
    p.add_argument(f"{prefix}cert-host", dest="webhook_cert_host", action="append",
                   metavar="NAME", help="another DNS name or IP address the certificate "
                   "must be valid for, e.g. 127.0.0.1 (repeatable)")
    p.add_argument(f"{prefix}service", dest="webhook_service", default="dispatcher-webhook",
                   metavar="NAME", help="the Service kube-apiserver calls the webhook "
                   "through; the certificate names it (default dispatcher-webhook)")
    p.add_argument(f"{prefix}secret", dest="webhook_secret",
                   default="dispatcher-webhook-cert", metavar="NAME",
                   help="the Secret holding the certificates (default "
                   "dispatcher-webhook-cert)")
    p.add_argument("--manager-user", dest="manager_user", action="append", metavar="USER",
                   help="a user who may set, change or remove the manager's labels "
                   "(workload.codeflare.dev/cluster, workload.codeflare.dev/manager-uid) "
                   "on AppWrappers (repeatable). Default: the service accounts "
                   "dispatcher-manager and dispatcher-manager-access of the dispatcher's "
                   "namespace")
    p.add_argument(f"{prefix}configuration", dest="webhook_configuration",
                   default="dispatcher-appwrappers", metavar="NAME",
                   help="the Mutating/ValidatingWebhookConfiguration to patch the CA "
                   "bundle into (default dispatcher-appwrappers; '' patches none)")


def add_log_arguments(p: argparse.ArgumentParser) -> None:
    from dispatcher.controller.kube.logs import FORMATS

    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--log-format", choices=FORMATS, default=FORMATS[0],
                   help="text lines (default), or one JSON object a line: time, level, "
                   "logger, message, exception")


def _cmd_queue(args: argparse.Namespace) -> int:
    import asyncio

    from dispatcher import visibility

    prog = getattr(args, "prog", "dispatcher queue")
    if args.policy is not None:
        print(f"{prog}: --policy is ignored: the order shown is the running dispatcher's "
              "own, as it publishes it in status.queuePosition", file=sys.stderr)
    try:
        listing = asyncio.run(visibility.fetch(args.kubeconfig, args.context, args.namespace,
                                               args.all_namespaces))
    except visibility.ClusterError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_CLUSTER
    rows = visibility.pending_queue(listing.objects, time.time())
    if listing.namespace is not None:
        rows = [r for r in rows if r.namespace == listing.namespace]
    render = visibility.to_json if args.output == "json" else visibility.to_table
    print(render(rows, listing.scope, listing.namespace))
    return 0


def add_queue_arguments(q: argparse.ArgumentParser) -> None:
    q.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    q.add_argument("--context", help="the kubeconfig context to use (default: current)")
    where = q.add_mutually_exclusive_group()
    where.add_argument("-n", "--namespace",
                       help="show this namespace's AppWrappers (default: the context's)")
    where.add_argument("-A", "--all-namespaces", action="store_true",
                       help="show the AppWrappers of every namespace")
    q.add_argument("--policy", help=argparse.SUPPRESS)  # the dispatcher says which now
    q.add_argument("-o", "--output", choices=("table", "json"), default="table")


QUEUE_DESCRIPTION = (
    "List the AppWrappers waiting for dispatch (status.state Pending or not set), in the "
    "order the running dispatcher considers them, with what they request and why they "
    "wait. Positions and reasons are the dispatcher's own, as it publishes them in each "
    "AppWrapper's status; positions count the whole cluster's queue.")


def _cmd_simulate(args: argparse.Namespace) -> int:
    from dispatcher.simulate import command

    return command.run(args)


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    from dispatcher import version

    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")


LIVE_HELP = ("ask the live cluster (through the kubeconfig, read only) what would happen to "
             "the AppWrappers of -f if submitted now: when and where they would start, whom "
             "they would preempt, which quota they would borrow, what they would delay")


def add_plan_arguments(p: argparse.ArgumentParser, live: str) -> None:
    """The arguments of `plan` but --live and the files of a snapshot; `live` begins the
    help of those that only --live takes ("" where every plan is live)."""
    p.add_argument("-f", "--filename", action="append", metavar="APPWRAPPER.yaml",
                   required=not live, help=f"{live}the AppWrappers to try (repeatable)")
    p.add_argument("--kubeconfig", help=f"{live}default $KUBECONFIG, ~/.kube/config, "
                   "in-cluster")
    p.add_argument("--context", help=f"{live}the kubeconfig context (default: current)")
    p.add_argument("--policy", default="fifo",
                   help=POLICY_HELP)
    p.add_argument("--fit", choices=("per-node", "aggregate"), default="per-node")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    p.add_argument("--now", help="the time to plan at (ISO 8601; default: now)")
    p.add_argument("--config", metavar="CONFIG.yaml",
                   help="the installation's configuration (allowedKinds); default: the "
                   "built-in allowed kinds")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dispatcher", description="Gang-scheduling queue dispatcher for AppWrappers."
    )
    add_version_argument(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "plan",
        help="what would be dispatched now, and why the rest waits",
        description="Run one admission cycle over AppWrapper manifests against a cluster "
        "snapshot (kubectl get nodes,pods -A -o yaml) and print every decision.",
    )
    p.add_argument("--cluster", action="append", metavar="CLUSTER.yaml",
                   help="Nodes and Pods as YAML documents or Lists (repeatable); or "
                   "NAME=CLUSTER.yaml, one per worker cluster: which worker a manager "
                   "(dispatcher run --manager) would send each AppWrapper to, or why none "
                   "can")
    p.add_argument("--worker-labels", action="append", default=[],
                   metavar="NAME=KEY=VALUE,...",
                   help="with --cluster NAME=FILE: the labels of worker NAME, for the "
                   "AppWrappers' workload.codeflare.dev/cluster-selector (repeatable)")
    p.add_argument("--live", action="store_true", help=LIVE_HELP)
    add_plan_arguments(p, "with --live: ")
    p.add_argument("appwrappers", nargs="*", metavar="APPWRAPPERS.yaml")
    p.set_defaults(func=_cmd_plan)

    r = sub.add_parser(
        "run",
        help="run the dispatcher against a cluster",
        description="Queue AppWrappers and create their objects only when every pod fits.",
    )
    r.add_argument("--kubeconfig", help="default: in-cluster config, else $KUBECONFIG")
    r.add_argument("--manager", action="store_true",
                   help="manage worker clusters (WorkerCluster objects): send each AppWrapper "
                   "to a worker where its whole gang fits now, and mirror its status back")
    r.add_argument("--worker-grace", type=float, default=60.0, metavar="SECONDS",
                   help="with --manager: how long a worker may not answer before its "
                   "AppWrappers are requeued (default 60, at least 45); a worker cut off "
                   "from the manager stops them after half of it")
    r.add_argument("--worker-start-seconds", type=float, default=300.0, metavar="SECONDS",
                   help="with --manager: how long a copy may wait in its worker without "
                   "starting before it is taken back and tried in another worker first "
                   "(default 300; 0: never)")
    r.add_argument("--policy", default="fifo",
                   help=POLICY_HELP)
    r.add_argument("--fit", choices=("per-node", "aggregate"), default="per-node")
    r.add_argument("--metrics-port", type=int, default=8080, metavar="PORT",
                   help="serve Prometheus metrics on /metrics and health on /healthz "
                   "(default 8080; 0: serve nothing)")
    r.add_argument("--metrics-host", default="0.0.0.0", metavar="ADDRESS",
                   help="the address to serve metrics on (default 0.0.0.0; 127.0.0.1 keeps "
                   "them inside the pod)")
    r.add_argument("--metrics-auth", choices=("none", "kubernetes"), default="none",
                   help="kubernetes: /metrics answers only bearer tokens of users allowed "
                   "to get /metrics (TokenReview + SubjectAccessReview); default none")
    r.add_argument("--webhook-port", type=int, default=0, metavar="PORT",
                   help="also serve the AppWrapper admission webhook (HTTPS) on PORT "
                   "(default 0: not here; `dispatcher webhook` serves it on its own), and "
                   "the pod webhook that pins a gang's pods as they are created (with "
                   "--pin-pods, and the MutatingWebhookConfiguration dispatcher-pods)")
    r.add_argument("--namespace", help="the dispatcher's namespace, for the webhook's "
                   "Secret (default: $POD_NAMESPACE, the pod's, else dispatcher-system)")
    add_webhook_arguments(r, "--webhook-")
    r.add_argument("--config", metavar="CONFIG.yaml",
                   help="the installation's configuration (allowedKinds, topology.levels: "
                   "with --manager, the levels a gang's rack is sought by in each worker); "
                   "default: the built-in list of kinds")
    r.add_argument("--require-creator", action="store_true",
                   help="fail, at dispatch, AppWrappers with no creator recorded by the "
                   "webhook (set it once the webhook is installed: deploy/ does); a "
                   "recorded creator's rights are re-checked at dispatch either way")
    r.add_argument("--leave-kueue-labelled", action="store_true",
                   help="leave AppWrappers labelled kueue.x-k8s.io/queue-name to Kueue "
                   "(default: the dispatcher queues them too, as every AppWrapper whose "
                   "spec.managedBy names no other controller)")
    r.add_argument("--pin-pods", action=argparse.BooleanOptionalAction, default=True,
                   help="create wrapped pods behind a scheduling gate and let each onto "
                   "the node the dispatcher holds room on, so that kube-scheduler cannot "
                   "bind one gang's pod into room promised to another (default on; one "
                   "PATCH per pod)")
    ha = r.add_argument_group("high availability")
    ha.add_argument("--leader-elect", action="store_true",
                    help="run as one of several replicas: only the holder of a "
                    "coordination.k8s.io Lease dispatches (deploy/ runs 2)")
    ha.add_argument("--lease-namespace",
                    help="namespace of the Lease (default: $POD_NAMESPACE, the pod's, else "
                    "dispatcher-system)")
    ha.add_argument("--lease-name", help="(default dispatcher; with --manager, "
                    "dispatcher-manager-leader)")
    api = r.add_argument_group("API server")
    # As Kueue's: the API server protects itself (priority and fairness, 429 with
    # Retry-After, which the client waits out); a client pace below it only slows admission.
    api.add_argument("--kube-qps", type=float, default=1000.0,
                     help="requests per second to the API server, on average (default "
                     "1000; 0: unpaced)")
    api.add_argument("--kube-burst", type=int, default=1000,
                     help="requests allowed at once above the average (default 1000)")
    api.add_argument("--startup-deadline", type=float, default=0.0, metavar="SECONDS",
                     help="exit (status 4) when start-up has not finished after this long: "
                     "the API server unreachable, its certificate not trusted, the "
                     "credentials refused, a grant missing (default 0: retry for as long "
                     "as it takes, as a controller in a pod should, saying why in the log "
                     "and on /healthz)")
    api.add_argument("--resync-seconds", type=float, default=600.0,
                     help="list everything again this often, as a backstop to the "
                     "watches (default 600; 0: never)")
    life = r.add_argument_group("dispatched AppWrappers (per AppWrapper: annotations "
                                "workload.codeflare.dev/admissionGracePeriodSeconds and "
                                "workload.codeflare.dev/failureGracePeriodSeconds)")
    life.add_argument("--admission-grace", type=float, default=60.0, metavar="SECONDS",
                      help="requeue a dispatched gang that has no pod at all after this "
                      "long (default 60; 0: wait for requeuing.timeInSeconds)")
    life.add_argument("--failure-grace", type=float, default=60.0, metavar="SECONDS",
                      help="requeue a running gang that stays below minAvailable pods "
                      "this long (default 60)")
    life.add_argument("--requeue-floor", type=float, default=30.0, metavar="SECONDS",
                      help="the least time a gang gets to start, whatever "
                      "requeuing.timeInSeconds says (default 30)")
    life.add_argument("--requeue-cap", type=float, default=3600.0, metavar="SECONDS",
                      help="the most time a gang gets to start when "
                      "requeuing.maxTimeInSeconds is not set (default 3600)")
    eta = r.add_argument_group("start estimates (status.estimatedStart; per AppWrapper: "
                               "schedulingSpec.dispatchDuration.expected or the annotation "
                               "workload.codeflare.dev/expectedDurationSeconds)")
    eta.add_argument("--estimate-interval", type=float, default=10.0, metavar="SECONDS",
                     help="estimate every waiting AppWrapper's start at most this often "
                     "(default 10; 0: no estimates)")
    eta.add_argument("--default-duration", type=float, default=3600.0, metavar="SECONDS",
                     help="how long an AppWrapper runs when it does not say and no similar "
                     "one has completed yet (default 3600)")
    eta.add_argument("--estimate-horizon", type=float, default=7 * 86400.0, metavar="SECONDS",
                     help="look this far ahead; later starts are not estimated "
                     "(default 604800: 7 days)")
    add_log_arguments(r)
    r.set_defaults(func=_cmd_run)

    q = sub.add_parser("queue", help="the AppWrappers waiting for dispatch, in order",
                       description=QUEUE_DESCRIPTION)
    add_queue_arguments(q)
    q.set_defaults(func=_cmd_queue)

    w = sub.add_parser(
        "webhook", help="serve the AppWrapper admission webhook",
        description="Serve the admission webhook kube-apiserver calls for AppWrappers: it "
        "records the creator, refuses invalid AppWrappers, items their creator may not "
        "create, cluster-scoped items and edits of dispatched items (docs/operations.md, "
        "\"Trust model\").")
    w.add_argument("--kubeconfig", help="default: in-cluster config, else $KUBECONFIG")
    w.add_argument("--port", dest="webhook_port", type=int, default=9443, metavar="PORT",
                   help="the HTTPS port (default 9443)")
    w.add_argument("--namespace", help="the dispatcher's namespace, for the Secret "
                   "(default: $POD_NAMESPACE, the pod's, else dispatcher-system)")
    w.add_argument("--config", metavar="CONFIG.yaml",
                   help="the installation's configuration (allowedKinds), as given to "
                   "dispatcher run; default: the built-in list of kinds")
    add_webhook_arguments(w, "--")
    add_log_arguments(w)
    w.set_defaults(func=_cmd_webhook)

    from dispatcher import actions

    actions.add_commands(sub, "dispatcher")  # hold, release, cancel, why

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
    """`kubectl appwrapper queue ...` (and plan, hold, ...): kubectl runs
    `kubectl-appwrapper` from the PATH with the arguments after `appwrapper`."""
    parser = argparse.ArgumentParser(
        prog="kubectl appwrapper", description="AppWrappers and the dispatcher's queue.")
    add_version_argument(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    q = sub.add_parser("queue", help="the AppWrappers waiting for dispatch, in order",
                       description=QUEUE_DESCRIPTION)
    add_queue_arguments(q)
    q.set_defaults(func=_cmd_queue, prog="kubectl appwrapper queue")
    p = sub.add_parser("plan", help="what if I submit this? (-f wrapper.yaml)",
                       description=LIVE_HELP[0].upper() + LIVE_HELP[1:] + ". Nothing is "
                       "created or changed.")
    add_plan_arguments(p, "")
    p.set_defaults(func=_cmd_plan, live=True, cluster=None, appwrappers=[])
    from dispatcher import actions

    actions.add_commands(sub, "kubectl appwrapper")  # hold, release, cancel, why
    from dispatcher import dashboard_link

    dashboard_link.add_command(sub, "kubectl appwrapper")
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
