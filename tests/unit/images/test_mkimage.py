"""hack/mkimage.py turns a rootfs directory into an OCI layout + docker-archive tarball."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import json
import os
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

MKIMAGE = Path(__file__).resolve().parents[3] / "hack" / "mkimage.py"
REF = "localhost/localcache/tiny:1.0"


@pytest.fixture(scope="module")
def mkimage() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("localcache_hack_mkimage", MKIMAGE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture
def rootfs(tmp_path: Path) -> Path:
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    hello = root / "bin" / "hello"
    hello.write_text("#!/bin/sh\necho hello\n")
    hello.chmod(0o755)
    os.link(hello, root / "bin" / "hello-again")
    (root / "bin" / "hi").symlink_to("hello")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    return root


def _build(mkimage: ModuleType, rootfs: Path, out: Path) -> None:
    code = mkimage.main(
        [
            str(rootfs),
            REF,
            str(out),
            "--entrypoint",
            "/bin/hello",
            "--cmd",
            '["--greet", "world"]',
            "--env",
            "FOO=bar",
            "--workdir",
            "/tmp",
            "--user",
            "65532:65532",
            "--mtime",
            "0",
        ]
    )
    assert code == 0


@pytest.fixture
def image(mkimage: ModuleType, rootfs: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out" / "tiny.tar"
    _build(mkimage, rootfs, out)
    return out


def _members(path: Path) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            f = tar.extractfile(member)
            assert f is not None, member.name
            found[member.name] = f.read()
    return found


def _json(data: bytes) -> Any:
    return json.loads(data)


def _blob(members: dict[str, bytes], digest: str) -> bytes:
    algorithm, _, hexdigest = digest.partition(":")
    assert algorithm == "sha256"
    return members[f"blobs/sha256/{hexdigest}"]


def test_tarball_is_an_oci_layout_whose_index_names_the_ref(image: Path) -> None:
    members = _members(image)
    assert _json(members["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    (entry,) = _json(members["index.json"])["manifests"]
    assert entry["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert entry["annotations"]["io.containerd.image.name"] == REF
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "1.0"
    assert len(_blob(members, entry["digest"])) == entry["size"]


def test_docker_manifest_tags_the_ref_and_points_at_the_blobs(image: Path) -> None:
    members = _members(image)
    (entry,) = _json(members["manifest.json"])
    assert entry["RepoTags"] == [REF]
    assert entry["Config"] in members
    assert all(layer in members for layer in entry["Layers"])


def test_every_blob_is_named_by_the_digest_of_its_content(image: Path) -> None:
    members = _members(image)
    blobs = {name: data for name, data in members.items() if name.startswith("blobs/sha256/")}
    assert len(blobs) == 3  # layer, config, manifest
    for name, data in blobs.items():
        assert hashlib.sha256(data).hexdigest() == name.removeprefix("blobs/sha256/")
    (entry,) = _json(members["index.json"])["manifests"]
    manifest = _json(_blob(members, entry["digest"]))
    for descriptor in [manifest["config"], *manifest["layers"]]:
        assert len(_blob(members, descriptor["digest"])) == descriptor["size"]


def test_config_carries_entrypoint_cmd_env_user_and_workdir(image: Path) -> None:
    members = _members(image)
    (entry,) = _json(members["manifest.json"])
    config = _json(members[entry["Config"]])
    assert config["os"] == "linux"
    assert config["config"]["Entrypoint"] == ["/bin/hello"]
    assert config["config"]["Cmd"] == ["--greet", "world"]
    assert "FOO=bar" in config["config"]["Env"]
    assert any(e.startswith("PATH=") for e in config["config"]["Env"])
    assert config["config"]["User"] == "65532:65532"
    assert config["config"]["WorkingDir"] == "/tmp"
    (layer_name,) = entry["Layers"]
    uncompressed = gzip.decompress(members[layer_name])
    diff_id = f"sha256:{hashlib.sha256(uncompressed).hexdigest()}"
    assert config["rootfs"] == {"type": "layers", "diff_ids": [diff_id]}


def test_layer_holds_the_rootfs_depth_first_in_sorted_order_with_numeric_owners(
    image: Path,
) -> None:
    members = _members(image)
    (entry,) = _json(members["manifest.json"])
    (layer_name,) = entry["Layers"]
    with tarfile.open(fileobj=io.BytesIO(members[layer_name]), mode="r:gz") as layer:
        entries = {m.name: m for m in layer.getmembers()}
        names = list(entries)
        hello = layer.extractfile("bin/hello")
        assert hello is not None
        assert hello.read() == b"#!/bin/sh\necho hello\n"
    assert names == [
        "bin",
        "bin/hello",
        "bin/hello-again",
        "bin/hi",
        "etc",
        "etc/passwd",
        "tmp",
    ]
    assert entries["bin/hello"].mode == 0o755
    assert entries["bin/hello-again"].islnk()
    assert entries["bin/hello-again"].linkname == "bin/hello"
    assert entries["bin/hi"].issym()
    assert entries["bin/hi"].linkname == "hello"
    assert entries["tmp"].mode == 0o1777
    assert all(m.uname == "" and m.gname == "" for m in entries.values())
    assert all(m.mtime == 0 for m in entries.values())


def test_same_rootfs_and_mtime_give_a_byte_identical_tarball(
    mkimage: ModuleType, rootfs: Path, image: Path, tmp_path: Path
) -> None:
    again = tmp_path / "again.tar"
    _build(mkimage, rootfs, again)
    assert again.read_bytes() == image.read_bytes()


def test_ref_without_a_tag_is_refused_and_nothing_is_written(
    mkimage: ModuleType, rootfs: Path, tmp_path: Path
) -> None:
    out = tmp_path / "untagged.tar"
    with pytest.raises(ValueError, match="needs a tag"):
        mkimage.build_image(rootfs, "localhost/localcache/tiny", out, config=mkimage.ImageConfig())
    assert list(tmp_path.glob("*.tar")) == []
