"""The small images a real node needs besides the dispatcher's, built here since no registry
is reachable, each cached by what goes into it:

- ``pause``: every pod's sandbox. Kubernetes' own ``build/pause/linux/pause.c`` from the
  pinned module, compiled static, alone in a one-layer image.
- ``busybox``: Debian's static busybox and its applets: the shell the training operator's
  PyTorchJob init container runs (it waits for the master's name in DNS), and codeflare's
  end-to-end suite's ``quay.io/project-codeflare/busybox`` (the same tool box, imported
  under that name too).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from . import build, config, oci

#: Kubernetes' pause image of this release (build/pause/Makefile's TAG).
PAUSE_TAG = "3.10.1"
PAUSE = f"localhost/pause:{PAUSE_TAG}"
BUSYBOX_TAG = "1.35"
BUSYBOX = f"localhost/busybox:{BUSYBOX_TAG}"
#: What codeflare's end-to-end suite runs its pods with.
CODEFLARE_BUSYBOX = "quay.io/project-codeflare/busybox:1.36"
#: A fixed date (1 Jan 2024) for the layers' times: the same inputs give the same archive.
EPOCH = 1704067200
#: The user of Kubernetes' own pause image: nobody needs root to wait for signals.
PAUSE_USER = "65535:65535"
BUSYBOX_BINARY = Path("/bin/busybox")


class NodeImageError(RuntimeError):
    pass


def pause() -> Path:
    """The pause image's OCI archive, built once per source and compiler."""
    source = _pause_source()
    key = _key(source.read_bytes(), _compiler_version().encode())
    return _cached(f"pause-{PAUSE_TAG}-{key}", lambda root: _compile_pause(source, root),
                   PAUSE, {"Entrypoint": ["/pause"], "User": PAUSE_USER})


def busybox() -> Path:
    """Debian's busybox-static as an image: /bin/busybox and a link per applet."""
    if not is_static(BUSYBOX_BINARY):
        raise NodeImageError("the real node's busybox image is Debian's static busybox: "
                             "apt-get install -y busybox-static")
    key = _key(BUSYBOX_BINARY.read_bytes())
    return _cached(f"busybox-{BUSYBOX_TAG}-{key}", _install_busybox, BUSYBOX,
                   {"Entrypoint": ["/bin/sh"], "Env": ["PATH=/bin"]})


def _key(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:12]


def _cached(stem: str, fill: Callable[[Path], None], name: str,
            settings: dict[str, object]) -> Path:
    out = config.cache_dir() / "images" / f"{stem}.oci.tar"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        root = Path(tmp) / "rootfs"
        root.mkdir()
        fill(root)
        layer = oci.write_layer(root, Path(tmp) / "layer.tar.gz", epoch=EPOCH)
        image_config = {"architecture": oci.architecture(), "os": "linux",
                        "config": settings}
        partial = Path(tmp) / "image.oci.tar"
        oci.write_archive(partial, image_config, [layer], epoch=EPOCH, annotations={
            "org.opencontainers.image.ref.name": name.rpartition(":")[2],
            "io.containerd.image.name": name})
        partial.rename(out)
    return out


def _pause_source() -> Path:
    kubernetes = build.module_dirs("kubernetes")["k8s.io/kubernetes"]
    return Path(kubernetes) / "build" / "pause" / "linux" / "pause.c"


def _compiler_version() -> str:
    if shutil.which("gcc") is None:
        raise NodeImageError("the real node's pause image is compiled with gcc: "
                             "apt-get install -y gcc libc6-dev")
    return subprocess.run(["gcc", "--version"], capture_output=True, text=True,
                          check=True).stdout.splitlines()[0]


def _compile_pause(source: Path, root: Path) -> None:
    done = subprocess.run(["gcc", "-Os", "-static", "-Wall", "-Werror",
                           f"-DVERSION=v{PAUSE_TAG}", "-o", str(root / "pause"), str(source)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NodeImageError(f"compiling {source} failed (static linking needs libc6-dev):"
                             f"\n{done.stderr.strip()}")


def is_static(binary: Path) -> bool:
    return binary.is_file() and b"ld-linux" not in binary.read_bytes()[:4096 * 4]


def _install_busybox(root: Path) -> None:
    (root / "bin").mkdir()
    (root / "tmp").mkdir(mode=0o1777)
    os.chmod(root / "tmp", 0o1777)
    shutil.copy2(BUSYBOX_BINARY, root / "bin" / "busybox")
    applets = subprocess.run([str(BUSYBOX_BINARY), "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
