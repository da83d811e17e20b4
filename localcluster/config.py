"""Where things live: the build cache, the cluster's state, the wrapper modules."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
GO_DIR = PACKAGE_DIR / "go"
PROFILES_DIR = PACKAGE_DIR / "profiles"
STAGES_DIR = PACKAGE_DIR / "stages"

DEFAULT_CLUSTER_NAME = "dispatcher"
DEFAULT_PROFILE = "default"


def cache_dir() -> Path:
    """Built binaries, keyed by version: ``$DISPATCHER_CACHE`` or ``~/.cache/dispatcher``."""
    env = os.environ.get("DISPATCHER_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dispatcher"


def bin_root() -> Path:
    return cache_dir() / "bin"


def build_log_dir() -> Path:
    return cache_dir() / "logs"


def state_root() -> Path:
    """Running clusters' state (kwokctl's workdir): ``$DISPATCHER_STATE`` or cache/state."""
    env = os.environ.get("DISPATCHER_STATE")
    return Path(env).expanduser() if env else cache_dir() / "state"


def cluster_name() -> str:
    """``$DISPATCHER_CLUSTER``, or the default name when it is unset or empty (an empty name
    would make the cluster's state folder the folder of every cluster, which `down` removes)."""
    return os.environ.get("DISPATCHER_CLUSTER") or DEFAULT_CLUSTER_NAME


def cluster_dir(name: str | None = None) -> Path:
    """kwokctl keeps a cluster's certificates, kubeconfig, pids and logs here."""
    return state_root() / "clusters" / (name or cluster_name())


def logs_dir(name: str | None = None) -> Path:
    return cluster_dir(name) / "logs"


def kubeconfig_path(name: str | None = None) -> Path:
    return cluster_dir(name) / "kubeconfig.yaml"
