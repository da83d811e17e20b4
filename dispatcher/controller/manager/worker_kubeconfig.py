"""What a worker's kubeconfig may say: credentials held in it, nothing taken from outside.

The kubeconfig a WorkerCluster's Secret holds is loaded inside the manager. An `exec` or
`auth-provider` user would have the manager run a command (or a plugin) of the Secret's
writer; a `tokenFile`, `client-certificate`, `client-key` or `certificate-authority` path
would have it read a file of its own pod, its service account's token among them. So a
kubeconfig naming any of these is refused: whoever may edit that Secret may name a worker,
no more.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

#: In a user: what would make the manager run something or read one of its files.
USER_REFERENCES = ("exec", "auth-provider", "tokenFile", "client-certificate", "client-key")
#: In a cluster: a file to read.
CLUSTER_REFERENCES = ("certificate-authority",)
INSTEAD = ("put the credentials in the kubeconfig itself (token, client-certificate-data "
           "and client-key-data, certificate-authority-data): the manager runs no command "
           "and reads no file a worker's kubeconfig names")


def outside_references(kubeconfig: bytes) -> list[str]:
    """Each command or file the kubeconfig would have the manager use, as `users[NAME].KEY`
    (none for text that is no kubeconfig at all: the loader refuses that itself)."""
    try:
        config = yaml.safe_load(kubeconfig)
    except yaml.YAMLError:
        return []
    if not isinstance(config, Mapping):
        return []
    return [*_named(config, "users", "user", USER_REFERENCES),
            *_named(config, "clusters", "cluster", CLUSTER_REFERENCES)]


def _named(config: Mapping[str, Any], section: str, field: str,
           keys: tuple[str, ...]) -> list[str]:
    entries = config.get(section)
    if not isinstance(entries, list):
        return []
    found = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping):
            continue
        body = entry.get(field)
        name = str(entry.get("name", index))[:63]
        if isinstance(body, Mapping):
            found += [f"{section}[{name}].{key}" for key in keys if body.get(key) is not None]
    return found
