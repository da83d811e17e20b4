"""Run `dispatcher run` as a real process against the local cluster, for cluster tests.

A process (not a thread) so a test can kill it with SIGKILL at any moment and start a
new one, exactly as a crashed pod would be restarted. Its log is kept in the cluster's
log directory and quoted when a test fails waiting for it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from localcluster import Kubectl, wait_for
from localcluster.ports import free_port

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "appwrappers.workload.codeflare.dev.yaml"
QUOTA_CRD = REPO / "crds" / "quotasubtrees.quota.codeflare.dev.yaml"


def install_crd(kubectl: Kubectl) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    kubectl("wait", "--for=condition=Established", "--timeout=60s",
            "crd/appwrappers.workload.codeflare.dev")
    forget_discovery()


def forget_discovery() -> None:
    """kubectl caches which versions each API group serves (~/.kube/cache/discovery) and
    would go on asking for AppWrappers in v1beta2 once the CRD serves v1beta1 only (the
    server answers NotFound): forgotten whenever the CRD's versions change."""
    home = Path(os.environ.get("KUBECACHEDIR", Path.home() / ".kube" / "cache"))
    shutil.rmtree(home / "discovery", ignore_errors=True)


class DispatcherProcess:
    LOG = "dispatcher.log"
    READY = "dispatcher ready:"  # logged once it listed the cluster and started its loop

    def __init__(self, kubeconfig: Path, log_dir: Path, name: str | None = None) -> None:
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.name = name or self.LOG.removesuffix(".log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.policy = "fifo"
        self.starts = 0
        self.healthz_port: int | None = None  # of /healthz, when started with `healthz`

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"{self.name}.log"

    def start(self, policy: str | None = None, fit: str = "per-node",
              extra_args: Sequence[str] = (), wait: bool = True,
              healthz: bool = False) -> None:
        """Start `dispatcher run`; `extra_args` are added to its command line. Unless
        they name a --metrics-port or ask for `healthz` (/metrics and /healthz served on
        a free loopback port, `health()` reads it), none is served. With `wait`, return
        once it has listed the cluster and started its loop (with `healthz`: once it
        says it is synced, see `synced`)."""
        self.stop()
        if policy is not None:
            self.policy = policy
        self.starts += 1
        self.healthz_port = free_port() if healthz else None
        if self.healthz_port is not None:
            extra_args = [*extra_args, "--metrics-port", str(self.healthz_port),
                          "--metrics-host", "127.0.0.1"]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        log.write(f"\n===== start {self.starts}: policy {self.policy} =====\n".encode())
        log.flush()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dispatcher.cli", *self.arguments(fit, extra_args)],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        if wait:
            wait_for(self.ready, 60, f"{self.READY!r} in {self.log_path}")
            if healthz:
                self.wait_synced()

    def health(self) -> tuple[int, str]:
        """/healthz's status and text; (0, why) while it does not answer."""
        assert self.healthz_port is not None, "started without healthz"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.healthz_port}/healthz",
                                        timeout=5) as r:
                return r.status, r.read().decode().strip()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode().strip()
        except OSError as e:
            return 0, str(e)

    def synced(self) -> bool:
        """Leads, every watch is live and the admission loop cycles (/healthz "ok: ..."):
        what a fault must find before it lands on a dispatcher at work, not on one still
        starting. A standby answers 200 too, with "standby: ...". """
        status, text = self.health()
        return status == 200 and text.startswith("ok:")

    def wait_synced(self, timeout: float = 120) -> None:
        last: list[tuple[int, str]] = []

        def check() -> bool:
            self.ready()  # fails at once if it died
            last[:] = [self.health()]
            return last[0][0] == 200 and last[0][1].startswith("ok:")

        try:
            wait_for(check, timeout, f"{self.name}'s /healthz to say ok")
        except TimeoutError as e:
            raise TimeoutError(f"{e}; last answer: {last}\n{self.tail()}") from None

    def arguments(self, fit: str, extra_args: Sequence[str]) -> list[str]:
        return ["run", "--kubeconfig", str(self.kubeconfig), "--policy", self.policy,
                "--fit", fit, "-v",
                *([] if "--metrics-port" in extra_args else ["--metrics-port", "0"]),
                *extra_args]

    def this_run(self) -> str:
        """The log of the current start."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return text.split(f"===== start {self.starts}:")[-1]

    def leading(self) -> bool:
        """Listed the cluster and started its loop (with leader election: leads)."""
        return self.READY in self.this_run()

    def ready(self) -> bool:
        """`leading`; raises at once if the process exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"dispatcher exited with {self.proc.returncode}; "
                               f"log: {self.log_path}\n{self.tail()}")
        return self.leading()

    def kill(self) -> None:
        """SIGKILL: no cleanup, no last status write — a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def finish(self) -> None:
        """Stop it, after a test; a process that died by itself fails the test."""
        alive = self.alive()
        self.stop()
        if self.starts and not alive:
            raise AssertionError(f"{self.name} died during the test:\n"
                                 f"{self.tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


def wait_quiet(kubectl: Kubectl, timeout: float = 180) -> None:
    """Wait until no pod and no AppWrapper is left from earlier tests: pods hold GPUs,
    and so does a live gang whose pods went away (their replacements are owed them)."""
    def quiet() -> bool:
        pods = kubectl.items("pods", "-A", "-l", "workload.codeflare.dev/appwrapper")
        if pods:
            return False
        listed = kubectl.run("get", "appwrappers", "-A", "-o", "name", check=False)
        return listed.returncode != 0 or not listed.stdout.strip()

    wait_for(quiet, timeout, "pods of earlier tests' AppWrappers to be gone")
    time.sleep(0.2)
