"""Processes the local cluster starts: started with a log and a pid file, alive or not,
ours or not, and their logs' ends."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


def spawn(argv: Sequence[str], log: Path, pid_file: Path, cwd: Path,
          env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start `argv` in a session of its own (a signal to the caller's group does not reach
    it: ``down`` stops it by its pid file), its output appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as fh:
        proc = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd,
                                env=None if env is None else dict(env))
    # Digits only: kwokctl reads its components' pid files with Go's strconv.Atoi, which
    # refuses a newline, and takes a component whose file it cannot read for stopped:
    # `kwokctl start cluster` then started a second kube-apiserver over the first.
    pid_file.write_text(str(proc.pid))
    return proc


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours counts as dead.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def runs_in(pid: int, directory: Path) -> bool:
    """True if ``pid`` is alive and its command line mentions ``directory``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return alive(pid) and str(directory).encode() in cmdline


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
