"""Build the cluster's binaries from the pinned Go wrapper modules, once per version.

Each wrapper module under ``localcluster/go/<name>`` is built with one ``go build``
invocation into ``<cache>/bin/<name>-<version>-<key>/`` where ``key`` hashes everything that
changes the output (go.mod, go.sum, Go sources, Go version, flags). A directory with a
``.complete`` stamp is reused as is, so a second ``build`` takes well under a second.
Wrappers build two at a time, the longest (Kubernetes) first, and each prints its time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from . import config, versions
from .versions import WRAPPERS, Wrapper

STAMP = ".complete"


class BuildError(RuntimeError):
    pass


def _say(msg: str) -> None:
    print(f"[localcluster] {msg}", file=sys.stderr, flush=True)


def go_binary() -> str:
    go = shutil.which("go")
    if go is None:
        for candidate in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go"):
            if os.access(candidate, os.X_OK):
                return candidate
        raise BuildError(
            "the `go` command is not on PATH; install Go >= 1.26 (https://go.dev/dl/) "
            "to build the local cluster's binaries"
        )
    return go


def go_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CGO_ENABLED="0",
        GOTOOLCHAIN="local",
        GOWORK="off",
        GOFLAGS="-mod=readonly -buildvcs=false",
    )
    env.update(extra)
    return env


_go_version_cache: list[str] = []


def go_version() -> str:
    if not _go_version_cache:
        out = subprocess.run(
            [go_binary(), "env", "GOVERSION", "GOOS", "GOARCH"],
            check=True, capture_output=True, text=True, env=go_env(),
        ).stdout
        _go_version_cache.append(" ".join(out.split()))
    return _go_version_cache[0]


def wrapper_dir(w: Wrapper) -> Path:
    return config.GO_DIR / w.name


def _ldflags(w: Wrapper) -> str:
    return " ".join(["-s", "-w", *w.ldflags])


def build_key(w: Wrapper) -> str:
    h = hashlib.sha256()
    d = wrapper_dir(w)
    for f in sorted([*d.glob("go.mod"), *d.glob("go.sum"), *d.glob("*.go")]):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(go_version().encode())
    h.update(_ldflags(w).encode())
    h.update(" ".join(w.packages).encode())
    if w.tests:  # only then, as w.env below
        h.update(b"test -c " + " ".join(w.tests).encode())
    if w.env:  # only then, so the keys (and caches) of the other wrappers stay as they were
        h.update(json.dumps(w.env, sort_keys=True).encode())
    return h.hexdigest()[:12]


def bin_dir(w: Wrapper) -> Path:
    return config.bin_root() / f"{w.name}-{w.version}-{build_key(w)}"


# --------------------------------------------------------------------------- go.mod checks

_REQ_RE = re.compile(r"^\s*(?:require\s+)?(\S+)\s+(v\S+)(?:\s*//.*)?$")


def read_requires(gomod: Path) -> dict[str, str]:
    """Module -> version for every ``require`` line of a go.mod."""
    reqs: dict[str, str] = {}
    in_block = False
    for raw in gomod.read_text().splitlines():
        line = raw.strip()
        if line.startswith("require ("):
            in_block = True
            continue
        if in_block and line == ")":
            in_block = False
            continue
        if in_block or line.startswith("require "):
            m = _REQ_RE.match(line)
            if m:
                reqs[m.group(1)] = m.group(2)
    return reqs


def check_pins(w: Wrapper) -> None:
    gomod = wrapper_dir(w) / "go.mod"
    if not gomod.exists() or not (wrapper_dir(w) / "go.sum").exists():
        raise BuildError(f"{gomod} or its go.sum is missing; run `python -m localcluster pin`")
    reqs = read_requires(gomod)
    for mod, ver in w.requires.items():
        if reqs.get(mod) != ver:
            raise BuildError(
                f"{gomod} requires {mod} {reqs.get(mod)!r} but localcluster/versions.py pins "
                f"{ver}; run `python -m localcluster pin` and commit go.mod/go.sum"
            )


# --------------------------------------------------------------------------- building


@dataclass
class BuildResult:
    wrapper: str
    directory: Path
    seconds: float
    cached: bool


#: ``go build`` processes under way (builds run in threads): a failed build stops the others.
_running: set[subprocess.Popen[bytes]] = set()
_running_lock = threading.Lock()


def _stop_running() -> None:
    with _running_lock:
        for proc in _running:
            proc.terminate()


def _run_logged(cmd: list[str], cwd: Path, env: dict[str, str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as fh:
        fh.write(f"\n$ (cd {cwd} && {' '.join(cmd)})\n")
        fh.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)
        with _running_lock:
            _running.add(proc)
        try:
            proc.wait()
        finally:
            with _running_lock:
                _running.discard(proc)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-25:])
        raise BuildError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}); "
                         f"full log: {log}\n{tail}")


def build_wrapper(w: Wrapper, force: bool = False) -> BuildResult:
    check_pins(w)
    out = bin_dir(w)
    if not force and (out / STAMP).exists():
        return BuildResult(w.name, out, 0.0, True)
    start = time.monotonic()
    log = config.build_log_dir() / f"build-{w.name}.log"
    if log.exists():
        log.unlink()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    env = go_env(**w.env)
    if w.packages or w.tests:
        _say(f"building {w.name} {w.version} ({', '.join(w.binaries)}); log: {log}")
        flags = ["-trimpath", f"-ldflags={_ldflags(w)}", "-o", str(tmp) + os.sep]
        if w.packages:
            _run_logged([go_binary(), "build", *flags, *w.packages], wrapper_dir(w), env, log)
        if w.tests:
            _run_logged([go_binary(), "test", "-c", *flags, *w.tests], wrapper_dir(w), env,
                        log)
        missing = [b for b in w.binaries if not (tmp / b).exists()]
        if missing:
            raise BuildError(f"go build did not produce {missing} in {tmp}; log: {log}")
    else:
        _say(f"downloading {w.name} modules ({', '.join(w.requires)}); log: {log}")
    # Resolve (and download, hash-checked against go.sum) the module directories whose
    # files (CRDs, stages) the cluster uses, and record them next to the binaries.
    dirs = {mod: module_dir(w, mod, log) for mod in w.requires}
    (tmp / "modules.json").write_text(json.dumps(dirs, indent=2) + "\n")
    (tmp / STAMP).write_text(f"{w.name} {w.version} {go_version()}\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return BuildResult(w.name, out, time.monotonic() - start, False)


def module_dir(w: Wrapper, module: str, log: Path | None = None) -> str:
    """Directory of ``module`` (as the wrapper's go.sum pins it) in the Go module cache."""
    cmd = [go_binary(), "mod", "download", "-json", module]
    proc = subprocess.run(cmd, cwd=wrapper_dir(w), env=go_env(**w.env), capture_output=True,
                          text=True)
    if proc.returncode != 0:
        if log is not None:
            with log.open("a") as fh:
                fh.write(proc.stdout + proc.stderr)
        raise BuildError(f"`go mod download {module}` in {wrapper_dir(w)} failed: "
                         f"{proc.stdout.strip()} {proc.stderr.strip()}")
    info = json.loads(proc.stdout)
    if info.get("Error"):
        raise BuildError(f"go mod download {module}: {info['Error']}")
    return str(info["Dir"])


#: How many wrappers build at once. Each ``go build`` uses every core, but much of a build
#: is not parallel (linking, the compile of a large package at the end of a chain), so two
#: builds overlap well on the 2-core machines; more would only compete for memory.
PARALLEL_BUILDS = 2
#: Started first: the longest build, so it runs beside all the others rather than after them.
LONGEST = "kubernetes"


def build_all(names: Iterable[str] | None = None, force: bool = False,
              jobs: int = PARALLEL_BUILDS) -> list[BuildResult]:
    wanted = list(names) if names else list(versions.BUILD_ORDER)
    order = sorted(wanted, key=lambda n: n != LONGEST)
    results: dict[str, BuildResult] = {}
    total = time.monotonic()
    errors: list[BaseException] = []

    def one(name: str) -> BuildResult | None:
        if errors:
            return None  # fail fast: nothing more starts once a build failed
        try:
            return build_wrapper(WRAPPERS[name], force=force)
        except BaseException as exc:
            if not errors:  # the first failure stops the build under way beside it
                errors.append(exc)
                _stop_running()
            return None

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for done in as_completed([pool.submit(one, n) for n in order]):
            r = done.result()
            if r is None:
                continue
            results[r.wrapper] = r
            if r.cached:
                _say(f"{r.wrapper}: cached in {r.directory}")
            else:
                _say(f"{r.wrapper}: built in {r.seconds:.0f}s -> {r.directory}")
    if errors:
        raise errors[0]
    built = [results[n] for n in order if not results[n].cached]
    if built:
        each = ", ".join(f"{r.wrapper} {r.seconds:.0f}s" for r in built)
        _say(f"build finished in {time.monotonic() - total:.0f}s, {jobs} at a time ({each})")
    return [results[n] for n in wanted]


def installed(name: str) -> Path:
    """The built directory for wrapper ``name``; raises if it has not been built."""
    w = WRAPPERS[name]
    d = bin_dir(w)
    if not (d / STAMP).exists():
        raise BuildError(f"{name} {w.version} is not built (expected {d}); "
                         "run `python -m localcluster build` (or `make cluster-build`)")
    return d


def binary(wrapper: str, name: str | None = None) -> Path:
    return installed(wrapper) / (name or wrapper)


def module_dirs(wrapper: str) -> dict[str, str]:
    data: dict[str, str] = json.loads((installed(wrapper) / "modules.json").read_text())
    return data


# --------------------------------------------------------------------------- pinning


def _staging_modules(kubernetes_gomod: Path) -> list[str]:
    mods = []
    for line in kubernetes_gomod.read_text().splitlines():
        m = re.match(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/", line)
        if m:
            mods.append(m.group(1))
    return mods


def render_gomod(w: Wrapper) -> str:
    lines = [
        "// Generated by `python -m localcluster pin` from localcluster/versions.py;",
        "// go.sum pins the hash of every download. Edit versions.py, not this file.",
        f"module dispatcher.local/localcluster/{w.name}",
        "",
        f"go {w.go}",
        "",
        "require (",
        *(f"\t{m} {v}" for m, v in w.requires.items()),
        ")",
    ]
    tools = [p for p in w.packages if p != "."]
    if tools:
        lines += ["", "tool (", *(f"\t{p}" for p in tools), ")"]
    if w.replace_staging:
        env = go_env(GOFLAGS="-mod=mod")
        mod = next(iter(w.requires))
        info = subprocess.run(
            [go_binary(), "mod", "download", "-json", f"{mod}@{w.version}"],
            check=True, capture_output=True, text=True, env=env, cwd=config.GO_DIR,
        ).stdout
        staging = _staging_modules(Path(json.loads(info)["GoMod"]))
        sv = versions.staging_version(w.version)
        lines += [
            "",
            "// k8s.io/kubernetes points its staging modules at ./staging, which a module",
            "// download does not have: use their published releases instead.",
            "replace (", *(f"\t{s} => {s} {sv}" for s in staging), ")",
        ]
    return "\n".join(lines) + "\n"


def pin(names: Iterable[str] | None = None) -> None:
    """Regenerate go.mod/go.sum of the wrapper modules from versions.py.

    Downloads go through the module proxy; sum.golang.org is not consulted (it is not
    reachable from every build machine), so the committed go.sum is the trust anchor.
    """
    for name in names or versions.BUILD_ORDER:
        w = WRAPPERS[name]
        d = wrapper_dir(w)
        d.mkdir(parents=True, exist_ok=True)
        (d / "go.mod").write_text(render_gomod(w))
        (d / "go.sum").unlink(missing_ok=True)
        # The local toolchain: a fetched one (GOTOOLCHAIN) is verified against
        # sum.golang.org, which GOSUMDB=off forbids; resolving compiles nothing anyway.
        env = go_env(**{**w.env, "GOFLAGS": "-mod=mod", "GOSUMDB": "off",
                        "GOTOOLCHAIN": "local"})
        if w.packages or not w.tests:
            _say(f"go mod tidy in {d}")
            subprocess.run([go_binary(), "mod", "tidy"], cwd=d, check=True, env=env)
        if w.tests:
            # `go mod tidy` keeps what the wrapper's own packages need, not what a
            # dependency's tests import: `go get -t` adds those.
            _say(f"go get -t {' '.join(w.tests)} in {d}")
            subprocess.run([go_binary(), "get", "-t", *(f"{t}@{w.version}" for t in w.tests)],
                           cwd=d, check=True, env=env)
