"""Where the API client's configuration comes from, and what to do when it is not there.

As kubectl: `--kubeconfig FILE`, else the files $KUBECONFIG lists, else ~/.kube/config;
in a pod with none of those, the pod's ServiceAccount (in-cluster). kubernetes_asyncio
says "Invalid kube-config file. Expected key current-context" for a file that does not
exist; here every such case is one line naming the file and what to do.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes_asyncio import client, config

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
DEFAULT_KUBECONFIG = Path("~/.kube/config")
WHAT_TO_DO = ("pass --kubeconfig FILE, set KUBECONFIG, or run in a pod with a "
              "ServiceAccount (in-cluster)")


class KubeconfigError(Exception):
    """No usable configuration; the message says which file and what to do."""


@dataclass(frozen=True)
class Connection:
    configuration: client.Configuration
    namespace: str  # the context's (or the pod's) namespace; "default" when it names none


def in_cluster(kubeconfig: str | None, context: str | None,
               environ: Mapping[str, str]) -> bool:
    return kubeconfig is None and context is None \
        and "KUBERNETES_SERVICE_HOST" in environ and not environ.get("KUBECONFIG")


def kubeconfig_files(kubeconfig: str | None, environ: Mapping[str, str]) -> list[Path]:
    """The files to read, in kubectl's order; raises KubeconfigError when none exists."""
    if kubeconfig is not None:
        path = Path(kubeconfig).expanduser()
        if not path.is_file():
            problem = "is not a file" if path.is_dir() else "does not exist"
            raise KubeconfigError(f"kubeconfig {kubeconfig} {problem}: pass the path of "
                                  "a kubeconfig file (kubectl config view --raw > FILE)")
        return [path]
    listed = environ.get("KUBECONFIG", "")
    if listed:
        paths = [Path(p).expanduser() for p in listed.split(os.pathsep) if p]
        where = f"$KUBECONFIG ({listed})"
    else:
        paths = [DEFAULT_KUBECONFIG.expanduser()]
        where = str(paths[0])
    found = [p for p in paths if p.is_file()]
    if not found:
        raise KubeconfigError(f"no kubeconfig: {where} does not exist; {WHAT_TO_DO}")
    return found


async def load(kubeconfig: str | None = None, context: str | None = None,
               persist: bool = False, environ: Mapping[str, str] | None = None
               ) -> Connection:
    """The configuration to reach the API server with; raises KubeconfigError.
    `persist`: write refreshed credentials (an expired OIDC token) back to the file."""
    env = os.environ if environ is None else environ
    conf = client.Configuration()
    if in_cluster(kubeconfig, context, env):
        try:
            config.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
        except config.ConfigException as e:
            raise KubeconfigError(f"in-cluster configuration: {str(e).rstrip('.')}; "
                                  f"{WHAT_TO_DO}") from None
        namespace = SA_NAMESPACE_FILE.read_text().strip() if SA_NAMESPACE_FILE.is_file() \
            else ""
        return Connection(conf, namespace or "default")
    files = kubeconfig_files(kubeconfig, env)
    named = ", ".join(str(f) for f in files)
    try:
        loader = await config.load_kube_config(
            config_file=os.pathsep.join(str(f) for f in files), context=context,
            client_configuration=conf, persist_config=persist)
    except config.ConfigException as e:
        raise KubeconfigError(f"kubeconfig {named}: {_reason(str(e), context)}") from None
    except (OSError, yaml.YAMLError) as e:
        raise KubeconfigError(f"kubeconfig {named}: cannot read it: {e}") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise KubeconfigError(f"kubeconfig {named}: not a kubeconfig (expected clusters, "
                              "users, contexts and a current-context)") from None
    current = loader.current_context or {}
    namespace = (current.get("context") or {}).get("namespace") or "default"
    return Connection(conf, str(namespace))


def _reason(text: str, context: str | None) -> str:
    text = text.removeprefix("Invalid kube-config file. ")
    if "current-context" in text and context is None:
        return ("it sets no current-context: choose one with kubectl config use-context "
                "NAME")
    return text
