"""A peer controller (Kueue, codeflare's AppWrapper controller) run as a local process beside
a cluster: its log in the cluster's logs, its pid file among the operators' (so the
cluster's ``down`` stops it), and an HTTP probe that says it is ready."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from .cluster import Cluster, ClusterError
from .kube import answers, wait_for
from .procs import spawn


class PeerProcess:
    def __init__(self, cluster: Cluster, name: str, what: str) -> None:
        """`name`: its log and pid file; `what`: how errors name it."""
        self.cluster = cluster
        self.name = name
        self.what = what
        self.log = cluster.logs / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, argv: Sequence[str], probe: str, cwd: Path,
              env: Mapping[str, str] | None = None, timeout: float = 180) -> None:
        """Run `argv` and wait until `probe` (a URL) answers 200."""
        self.proc = spawn(argv, self.log, self._pid_file, cwd, env)
        wait_for(lambda: self._ready(probe), timeout, f"{self.what}'s {probe} (log {self.log})")

    def _ready(self, probe: str) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise ClusterError(f"{self.what} exited ({self.proc.returncode}); log {self.log}:\n"
                               + self.log.read_text(errors="replace")[-3000:])
        return answers(probe)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._pid_file.unlink(missing_ok=True)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def _pid_file(self) -> Path:
        return self.cluster.pids / f"{self.name}.pid"
