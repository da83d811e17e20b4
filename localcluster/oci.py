"""Reproducible OCI image archives, written without a container engine.

A layer is a gzipped tar of a directory tree: entries sorted by path, times clamped to a
fixed epoch, owners and modes as on disk (numeric, no names), gzip's own header time 0;
devices, sockets and pipes are left out (the runtime gives the container its /dev). The
archive is a tar of an OCI image layout (``oci-layout``, ``index.json``, ``blobs/sha256/``),
itself sorted and clamped, so the same trees and config give the same bytes, which
``skopeo copy oci-archive:...`` and ``ctr images import`` read.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import stat
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
CHUNK = 1 << 20
#: The machine's name for its architecture -> the OCI (Go) name.
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}


class UnknownArchitecture(RuntimeError):
    pass


def architecture() -> str:
    """This machine's architecture as image configs name it."""
    machine = platform.machine()
    if machine not in ARCHITECTURES:
        raise UnknownArchitecture(f"no image architecture known for this machine ({machine})")
    return ARCHITECTURES[machine]


@dataclass(frozen=True)
class Layer:
    """A layer's gzipped tar on disk, its digest and size, and its uncompressed digest
    (the config's diff_id)."""

    path: Path
    digest: str
    size: int
    diff_id: str


class _DigestingGzip(gzip.GzipFile):
    """gzip that also hashes what it is given: the uncompressed tar's digest."""

    def __init__(self, raw: BinaryIO) -> None:
        # No file name and time 0 in the header: the same tar gives the same bytes.
        super().__init__(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0)
        self.sha256 = hashlib.sha256()

    def write(self, data: Any) -> int:
        self.sha256.update(data)
        return super().write(data)


def file_digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
    return f"sha256:{sha.hexdigest()}"


def write_layer(root: Path, out: Path, *, epoch: int, under: str | None = None) -> Layer:
    """The tree at ``root`` as a layer at ``out``; with ``under`` (a path relative to root),
    only that folder, what it holds and the folders leading to it."""
    with out.open("wb") as raw, _DigestingGzip(raw) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            _add_tree(tar, root, entries(root, under), epoch)
        diff_id = f"sha256:{gz.sha256.hexdigest()}"  # the tar is whole once closed
    return Layer(out, file_digest(out), out.stat().st_size, diff_id)


def entries(root: Path, under: str | None = None) -> list[str]:
    """The paths a layer of ``root`` holds, relative to it, sorted (a folder before what
    it holds)."""
    start = root / under if under else root
    found = [str(p.relative_to(root)) for p in _walk(start)]
    if under:
        parts = Path(under).parts
        found += [str(Path(*parts[:n])) for n in range(1, len(parts) + 1)]
    return sorted(set(found))


def _walk(start: Path) -> Iterator[Path]:
    # Links to folders are listed among the folders but not followed.
    for folder, dirs, files in os.walk(start):
        for name in (*dirs, *files):
            yield Path(folder, name)


def _add_tree(tar: tarfile.TarFile, root: Path, names: Sequence[str], epoch: int) -> None:
    first_of_inode: dict[tuple[int, int], str] = {}
    for name in names:
        path = root / name
        st = path.lstat()
        info = tar_info(name, st, epoch)
        if info is None:
            continue
        if info.isreg() and st.st_nlink > 1:
            first = first_of_inode.setdefault((st.st_dev, st.st_ino), name)
            if first != name:  # a hard link to a file already in the layer
                info.type, info.linkname, info.size = tarfile.LNKTYPE, first, 0
        if info.isreg():
            with path.open("rb") as f:
                tar.addfile(info, f)
        else:
            if info.issym():
                info.linkname = os.readlink(path)
            tar.addfile(info)


def tar_info(name: str, st: os.stat_result, epoch: int) -> tarfile.TarInfo | None:
    """The entry of a file, folder or symbolic link; None for anything else."""
    kinds = {stat.S_IFREG: tarfile.REGTYPE, stat.S_IFDIR: tarfile.DIRTYPE,
             stat.S_IFLNK: tarfile.SYMTYPE}
    kind = kinds.get(stat.S_IFMT(st.st_mode))
    if kind is None:
        return None
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.uname = info.gname = ""
    info.mtime = min(int(st.st_mtime), epoch)
    info.size = st.st_size if kind == tarfile.REGTYPE else 0
    return info


def json_blob(document: dict[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def descriptor(media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": f"sha256:{hashlib.sha256(data).hexdigest()}",
            "size": len(data), **extra}


def layer_descriptor(layer: Layer) -> dict[str, Any]:
    return {"mediaType": LAYER_TYPE, "digest": layer.digest, "size": layer.size}


def write_archive(out: Path, config: dict[str, Any], layers: Sequence[Layer], *,
                  annotations: dict[str, str], epoch: int) -> str:
    """The OCI image layout of one image as a tar at ``out``: ``config`` (its rootfs
    diff_ids are filled in from ``layers``), a manifest of it and the layers, and an index
    naming the manifest with ``annotations``. Returns the manifest's digest."""
    config = {**config, "rootfs": {"type": "layers", "diff_ids": [x.diff_id for x in layers]}}
    config_data = json_blob(config)
    manifest_data = json_blob({
        "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
        "config": descriptor(CONFIG_TYPE, config_data),
        "layers": [layer_descriptor(x) for x in layers]})
    manifest = descriptor(MANIFEST_TYPE, manifest_data, annotations=annotations,
                          platform={"architecture": config["architecture"],
                                    "os": config["os"]})
    index_data = json_blob({"schemaVersion": 2, "mediaType": INDEX_TYPE,
                            "manifests": [manifest]})
    blobs: dict[str, bytes | Path] = {blob_name(config_data): config_data,
                                      blob_name(manifest_data): manifest_data}
    blobs.update({f"blobs/sha256/{x.digest.removeprefix('sha256:')}": x.path for x in layers})
    files: dict[str, bytes | Path] = {
        "oci-layout": json_blob({"imageLayoutVersion": "1.0.0"}), "index.json": index_data,
        **blobs}
    _write_layout_tar(out, files, epoch)
    return str(manifest["digest"])


def blob_name(data: bytes) -> str:
    return f"blobs/sha256/{hashlib.sha256(data).hexdigest()}"


def _write_layout_tar(out: Path, files: dict[str, bytes | Path], epoch: int) -> None:
    folders = {"blobs", "blobs/sha256"}
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted({*folders, *files}):
            info = tarfile.TarInfo(name)
            info.mtime = epoch
            if name in folders:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            info.mode = 0o644
            content = files[name]
            if isinstance(content, bytes):
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
            else:
                info.size = content.stat().st_size
                with content.open("rb") as f:
                    tar.addfile(info, f)
