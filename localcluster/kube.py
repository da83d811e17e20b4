"""A thin kubectl runner bound to one kubeconfig (used by the CLI and the test fixtures)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class KubectlError(RuntimeError):
    def __init__(self, args: Sequence[str], returncode: int, stdout: str, stderr: str):
        self.args_ = list(args)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(
            f"kubectl {' '.join(args)} failed (exit {returncode}): {stderr.strip() or stdout}"
        )


class Kubectl:
    """Runs the cluster's own kubectl binary against ``kubeconfig``."""

    def __init__(self, binary: Path | str, kubeconfig: Path | str,
                 namespace: str | None = None):
        self.binary = str(binary)
        self.kubeconfig = str(kubeconfig)
        self.namespace = namespace

    def in_namespace(self, namespace: str | None) -> Kubectl:
        return Kubectl(self.binary, self.kubeconfig, namespace)

    def command(self, *args: str) -> list[str]:
        cmd = [self.binary, "--kubeconfig", self.kubeconfig]
        if self.namespace and not any(a in ("-n", "--namespace", "-A", "--all-namespaces")
                                      or a.startswith("--namespace=") for a in args):
            cmd += ["-n", self.namespace]
        return [*cmd, *args]

    def run(self, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self.command(*args), input=input, capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise KubectlError(args, proc.returncode, proc.stdout, proc.stderr)
        return proc

    def __call__(self, *args: str, input: str | None = None, check: bool = True,
                 timeout: float = 120) -> str:
        """Run ``kubectl args...`` and return its stdout; raises KubectlError on failure."""
        return self.run(*args, input=input, check=check, timeout=timeout).stdout

    def json(self, *args: str) -> Any:
        """``kubectl get ... -o json`` (pass the ``get`` arguments)."""
        return json.loads(self("get", *args, "-o", "json"))

    def items(self, *args: str) -> list[dict[str, Any]]:
        data = self.json(*args)
        items: list[dict[str, Any]] = data.get("items", [data])
        return items

    def apply(self, manifest: str | dict[str, Any] | Sequence[dict[str, Any]],
              *extra: str, server_side: bool = False) -> str:
        """Apply YAML text or object(s)."""
        if isinstance(manifest, str):
            text = manifest
        elif isinstance(manifest, dict):
            text = yaml.safe_dump(manifest)
        else:
            text = yaml.safe_dump_all(list(manifest))
        args = ["apply", "-f", "-", *extra]
        if server_side:
            args += ["--server-side", "--force-conflicts"]
        return self(*args, input=text)

    def create(self, manifest: str | dict[str, Any]) -> str:
        text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
        return self("create", "-f", "-", input=text)


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str,
             interval: float = 0.25) -> T:
    """Poll ``predicate`` until it returns something truthy; TimeoutError says ``what``."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except (KubectlError, subprocess.TimeoutExpired) as exc:
            last_exc = exc
        if time.monotonic() > deadline:
            extra = f" (last error: {last_exc})" if last_exc else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{extra}")
        time.sleep(interval)


def answers(url: str) -> bool:
    """True if ``url`` answers 200 within two seconds: a local process's health probe."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False
