"""localcluster/oci.py: layers and OCI image archives that a container runtime can read and
that are the same bytes for the same trees."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from localcluster import oci

EPOCH = 1_700_000_000
CONFIG = {"architecture": "amd64", "os": "linux", "config": {"User": "65532:65532"}}
NAMES = {"org.opencontainers.image.ref.name": "1.0", "io.containerd.image.name": "x/y:1.0"}


def sha256(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Folders, files old and new, an executable, links of both kinds and a pipe."""
    root = tmp_path / "tree"
    (root / "opt" / "app" / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "etc" / "old").write_text("old")
    os.utime(root / "etc" / "old", (EPOCH - 100, EPOCH - 100))
    (root / "opt" / "app" / "bin" / "run").write_text("#!/bin/sh\n")
    (root / "opt" / "app" / "bin" / "run").chmod(0o755)
    (root / "opt" / "app" / "data").write_bytes(b"x" * 5000)
    os.link(root / "opt" / "app" / "data", root / "opt" / "app" / "same")
    (root / "opt" / "app" / "link").symlink_to("bin/run")
    (root / "opt" / "app-b").mkdir()  # sorts between opt/app and opt/app/...
    os.mkfifo(root / "etc" / "pipe")
    return root


def members(layer: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(layer, "r:gz") as tar:
        return tar.getmembers()


def test_a_layer_holds_the_tree_sorted_with_times_clamped(tree: Path, tmp_path: Path) -> None:
    layer = oci.write_layer(tree, tmp_path / "layer.tar.gz", epoch=EPOCH)
    found = members(layer.path)
    names = [m.name for m in found]
    assert names == sorted(names)
    assert names == ["etc", "etc/old", "opt", "opt/app", "opt/app-b", "opt/app/bin",
                     "opt/app/bin/run", "opt/app/data", "opt/app/link", "opt/app/same"]
    by_name = {m.name: m for m in found}
    assert by_name["etc/old"].mtime == EPOCH - 100  # older than the epoch: kept
    assert {m.mtime for n, m in by_name.items() if n != "etc/old"} == {EPOCH}
    assert by_name["opt/app/bin/run"].mode == 0o755
    assert by_name["opt/app/link"].issym() and by_name["opt/app/link"].linkname == "bin/run"
    assert by_name["opt/app/same"].islnk() and by_name["opt/app/same"].linkname == "opt/app/data"
    st = (tree / "etc" / "old").stat()
    assert {(m.uid, m.gid, m.uname, m.gname) for m in found} == {(st.st_uid, st.st_gid, "", "")}


def test_a_layer_s_digests_and_size_are_its_own(tree: Path, tmp_path: Path) -> None:
    layer = oci.write_layer(tree, tmp_path / "layer.tar.gz", epoch=EPOCH)
    data = layer.path.read_bytes()
    assert layer.digest == sha256(data) and layer.size == len(data)
    assert layer.diff_id == sha256(gzip.decompress(data))
    assert data[4:8] == b"\0\0\0\0"  # gzip's header time


def test_a_layer_of_a_folder_holds_it_and_the_folders_leading_to_it(tree: Path,
                                                                     tmp_path: Path) -> None:
    layer = oci.write_layer(tree, tmp_path / "layer.tar.gz", epoch=EPOCH, under="opt/app/bin")
    assert [m.name for m in members(layer.path)] == ["opt", "opt/app", "opt/app/bin",
                                                     "opt/app/bin/run"]


def test_the_same_tree_makes_the_same_layer_whenever_its_files_were_written(
        tree: Path, tmp_path: Path) -> None:
    first = oci.write_layer(tree, tmp_path / "1.tar.gz", epoch=EPOCH)
    os.utime(tree / "opt" / "app" / "data")  # now: after the epoch, clamped as before
    second = oci.write_layer(tree, tmp_path / "2.tar.gz", epoch=EPOCH)
    assert first.path.read_bytes() == second.path.read_bytes()


def read_archive(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: (tar.extractfile(m) or io.BytesIO()).read() for m in tar.getmembers()
                if m.isfile()}


def blob(files: dict[str, bytes], descriptor: dict[str, Any]) -> bytes:
    data = files["blobs/sha256/" + descriptor["digest"].removeprefix("sha256:")]
    assert sha256(data) == descriptor["digest"] and len(data) == descriptor["size"]
    return data


@pytest.fixture
def archive(tree: Path, tmp_path: Path) -> Path:
    base = oci.write_layer(tree, tmp_path / "base.tar.gz", epoch=EPOCH)
    app = oci.write_layer(tree, tmp_path / "app.tar.gz", epoch=EPOCH, under="opt/app")
    out = tmp_path / "image.oci.tar"
    oci.write_archive(out, CONFIG, [base, app], annotations=NAMES, epoch=EPOCH)
    return out


def test_the_archive_is_an_image_layout_whose_digests_and_sizes_match(archive: Path) -> None:
    files = read_archive(archive)
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(files["index.json"])
    assert index["schemaVersion"] == 2 and index["mediaType"] == oci.INDEX_TYPE
    (entry,) = index["manifests"]
    assert entry["mediaType"] == oci.MANIFEST_TYPE and entry["annotations"] == NAMES
    assert entry["platform"] == {"architecture": "amd64", "os": "linux"}
    manifest = json.loads(blob(files, entry))
    assert manifest["config"]["mediaType"] == oci.CONFIG_TYPE
    config = json.loads(blob(files, manifest["config"]))
    assert config["config"] == CONFIG["config"]
    layers = [blob(files, d) for d in manifest["layers"]]
    assert [d["mediaType"] for d in manifest["layers"]] == [oci.LAYER_TYPE] * 2
    assert config["rootfs"] == {"type": "layers",
                                "diff_ids": [sha256(gzip.decompress(x)) for x in layers]}
    assert len(files) == 2 + 4  # oci-layout, index.json; config, manifest, two layers


def test_the_archive_is_sorted_and_clamped(archive: Path) -> None:
    with tarfile.open(archive) as tar:
        found = tar.getmembers()
    assert [m.name for m in found] == sorted(m.name for m in found)
    assert [m.name for m in found][:2] == ["blobs", "blobs/sha256"]
    assert {m.mtime for m in found} == {EPOCH}
    assert {(m.uid, m.gid) for m in found} == {(0, 0)}


def test_writing_the_archive_twice_gives_the_same_bytes(archive: Path, tmp_path: Path) -> None:
    again = tmp_path / "again.oci.tar"
    base, app = tmp_path / "base.tar.gz", tmp_path / "app.tar.gz"
    layers = [oci.Layer(p, oci.file_digest(p), p.stat().st_size,
                        sha256(gzip.decompress(p.read_bytes()))) for p in (base, app)]
    oci.write_archive(again, CONFIG, layers, annotations=NAMES, epoch=EPOCH)
    assert again.read_bytes() == archive.read_bytes()
