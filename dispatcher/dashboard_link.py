"""`kubectl appwrapper dashboard`: port-forward to the controller's metrics Service and give
the dashboard's address, the user's token in its fragment (which browsers never send, so no
server or proxy logs it)."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import webbrowser
from urllib.parse import quote

EXIT_FAILED = 1
FORWARDING = "Forwarding from 127.0.0.1:"


class LinkError(Exception):
    """What went wrong, in words that say what to do."""


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser], prog: str) -> None:
    d = sub.add_parser(
        "dashboard", help="open the dispatcher's web dashboard",
        description="Port-forward to the dispatcher's metrics Service and print the "
        "dashboard's address, with your token in the fragment (never sent to a server). "
        "Runs until interrupted (Ctrl-C).")
    d.add_argument("-n", "--namespace", default="dispatcher-system",
                   help="the dispatcher's namespace (default dispatcher-system)")
    d.add_argument("--service", default="dispatcher-metrics",
                   help="its metrics Service (default dispatcher-metrics)")
    d.add_argument("--port", type=int, default=0,
                   help="the local port (default: any free one)")
    d.add_argument("--token", help="the bearer token to use (default: the kubeconfig "
                   "user's token, else one made for --service-account)")
    d.add_argument("--service-account", metavar="NAME",
                   help="make a token for this service account (`kubectl create token`)")
    d.add_argument("--service-account-namespace", metavar="NS",
                   help="its namespace (default: the context's)")
    d.add_argument("--open", action="store_true", help="open the address in a browser")
    d.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config")
    d.add_argument("--context", help="the kubeconfig context to use (default: current)")
    d.set_defaults(func=run, prog=f"{prog} dashboard")


def _kubectl(args: argparse.Namespace) -> list[str]:
    from dispatcher.controller.kube.kubeconfig import (
        KubeconfigError,
        in_cluster,
        kubeconfig_files,
    )

    # As the other verbs say it: kubectl's own words for a missing kubeconfig would be
    # taken below for a missing Service.
    if not in_cluster(args.kubeconfig, args.context, os.environ):
        try:
            kubeconfig_files(args.kubeconfig, os.environ)
        except KubeconfigError as e:
            raise LinkError(str(e)) from None
    found = shutil.which("kubectl")
    if found is None:
        raise LinkError("kubectl is not on the PATH: install it "
                        "(https://kubernetes.io/docs/tasks/tools/) and try again")
    command = [found]
    if args.kubeconfig:
        command += ["--kubeconfig", args.kubeconfig]
    if args.context:
        command += ["--context", args.context]
    return command


def _ask(kubectl: list[str], *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*kubectl, *words], capture_output=True, text=True, check=False)


def service_port(kubectl: list[str], namespace: str, service: str) -> int:
    done = _ask(kubectl, "get", "service", service, "-n", namespace, "-o",
                "jsonpath={.spec.ports[?(@.name==\"metrics\")].port}")
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()[-1:] or ["no answer"]
        raise LinkError(f"no Service {service} in namespace {namespace} ({said[0]}): is "
                        "the dispatcher installed there? --namespace and --service name "
                        "another")
    text = done.stdout.strip().split()
    if not text or not text[0].isdigit():
        raise LinkError(f"Service {service} in namespace {namespace} has no port named "
                        "'metrics': is it the dispatcher's metrics Service?")
    return int(text[0])


def token(kubectl: list[str], args: argparse.Namespace) -> str:
    if args.token:
        return str(args.token)
    if not args.service_account:
        mine = _ask(kubectl, "config", "view", "--minify", "--raw", "-o",
                    "jsonpath={.users[0].user.token}")
        if mine.returncode == 0 and mine.stdout.strip():
            return mine.stdout.strip()
        raise LinkError("your kubeconfig user has no token: pass --token, or "
                        "--service-account NAME to make one for a service account")
    words = ["create", "token", args.service_account]
    if args.service_account_namespace:
        words += ["-n", args.service_account_namespace]
    made = _ask(kubectl, *words)
    if made.returncode != 0 or not made.stdout.strip():
        said = made.stderr.strip().splitlines()[-1:] or ["no token"]
        raise LinkError(f"could not make a token for service account "
                        f"{args.service_account} ({said[0]})")
    return made.stdout.strip()


def address(local_port: int, bearer: str) -> str:
    return f"http://127.0.0.1:{local_port}/dashboard/#token={quote(bearer, safe='')}"


def forward(kubectl: list[str], args: argparse.Namespace, port: int,
            bearer: str) -> int:
    """Start `kubectl port-forward`, print the address once it listens, then wait."""
    process = subprocess.Popen(
        [*kubectl, "port-forward", "-n", args.namespace, f"service/{args.service}",
         f"{args.port or ''}:{port}"], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    shown = False
    try:
        for line in process.stdout:  # drained to the end, so kubectl never blocks on it
            if not shown and line.startswith(FORWARDING):
                shown = True
                local = int(line[len(FORWARDING):].split()[0])
                url = address(local, bearer)
                print(f"The dashboard: {url}\n(Ctrl-C stops the port-forward)", flush=True)
                if args.open:
                    webbrowser.open(url)
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        return process.wait()


def run(args: argparse.Namespace) -> int:
    try:
        kubectl = _kubectl(args)
        port = service_port(kubectl, args.namespace, args.service)
        bearer = token(kubectl, args)
    except LinkError as e:
        print(f"{args.prog}: {e}", file=sys.stderr)
        return EXIT_FAILED
    code = forward(kubectl, args, port, bearer)
    if code != 0:
        print(f"{args.prog}: kubectl port-forward stopped (exit {code})", file=sys.stderr)
    return code
