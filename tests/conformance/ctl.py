"""Start, stop, kill and probe `dispatcher run` from the commands of the kuttl suites.

MCAD's suites install MCAD with helm and restart it by deleting its pod; the
conformance runner's own TestSuite and TestStep files call this script instead
(``$DISPATCHER_CTL start``, ``kill``, ...). It is a standalone script (kuttl runs it as a
plain command) that keeps its state in ``$CONFORMANCE_STATE``: the dispatcher's pid, the
port of its /healthz, and its log, one ``===== start N`` section per start.

    ctl.py start     start `dispatcher run` (quota trees are on whenever QuotaSubtrees
                     exist; preemption by the priority-preemption policy); return once
                     /healthz answers 200
    ctl.py stop      SIGTERM, then SIGKILL after 20 s (helm delete)
    ctl.py kill      SIGKILL: a crash, no last status write (the pod deletion)
    ctl.py restart   kill, then start
    ctl.py healthy   exit 0 when it runs and /healthz answers 200 (the install's assert)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
POLICY = "priority-preemption"
START_TIMEOUT = 90.0


def _state() -> Path:
    d = Path(os.environ["CONFORMANCE_STATE"])
    d.mkdir(parents=True, exist_ok=True)
    return d


def _read_int(name: str) -> int | None:
    try:
        return int((_state() / name).read_text().strip())
    except (OSError, ValueError):
        return None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _healthz() -> bool:
    port = _read_int("dispatcher.port")
    if port is None or not _alive(_read_int("dispatcher.pid")):
        return False
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def start() -> int:
    if _alive(_read_int("dispatcher.pid")):
        print("dispatcher already running", file=sys.stderr)
        return 1
    port = _free_port()
    starts = (_read_int("starts") or 0) + 1
    (_state() / "starts").write_text(f"{starts}\n")
    log = (_state() / "dispatcher.log").open("ab")
    log.write(f"\n===== start {starts}: policy {POLICY}, healthz port {port} =====\n".encode())
    log.flush()
    cmd = [os.environ.get("DISPATCHER_PYTHON", sys.executable), "-m", "dispatcher.cli", "run",
           "--kubeconfig", os.environ["KUBECONFIG"], "--policy", POLICY,
           "--metrics-port", str(port), "--metrics-host", "127.0.0.1", "-v"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    # Its own session and no pipe to kuttl: kuttl waits for this command's output to
    # close, and a restart must not take kuttl's process group down with it.
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=REPO, env=env, start_new_session=True)
    (_state() / "dispatcher.pid").write_text(f"{proc.pid}\n")
    (_state() / "dispatcher.port").write_text(f"{port}\n")
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            print(f"dispatcher exited with {proc.returncode}; log: "
                  f"{_state() / 'dispatcher.log'}", file=sys.stderr)
            return 1
        if _healthz():
            print(f"dispatcher started (pid {proc.pid}, start {starts})")
            return 0
        time.sleep(0.25)
    print(f"dispatcher not healthy after {START_TIMEOUT:.0f} s", file=sys.stderr)
    return 1


def _signal(sig: signal.Signals, wait: float) -> None:
    pid = _read_int("dispatcher.pid")
    if not _alive(pid):
        return
    assert pid is not None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + wait
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.1)


def main(argv: list[str]) -> int:
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "start":
        return start()
    if cmd == "stop":
        _signal(signal.SIGTERM, 20)
        return 0
    if cmd == "kill":
        _signal(signal.SIGKILL, 10)
        return 0
    if cmd == "restart":
        _signal(signal.SIGKILL, 10)
        return start()
    if cmd == "healthy":
        return 0 if _healthz() else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
