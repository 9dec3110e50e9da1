"""The SHA-256 an origin published for a folder's files (`agent.disk.originsums`), recorded in
its peer manifest and checked against the bytes (`agent.disk.filelists.compute`).

The metadata files are written in huggingface_hub's `local_dir` format (its
`_local_folder.write_download_metadata`: commit, ETag, time, one per line), which KServe's
storage initializer leaves in an `hf://` model's folder."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pydantic
import pytest

from localcache.agent.disk import filelists, layout, originsums
from localcache.api import peer

KEY = "0123456789abcdef"
HF = "hf://org/model"
COMMIT = "11c5a3d5811f50298f278a704980280950aedb10"
WEIGHTS = b"weights" * 1000
CONFIG = b"{}"


def _hf_folder(top: Path, *, published: bytes = WEIGHTS) -> Path:
    """A folder as `snapshot_download(local_dir=top)` leaves it: an LFS file (its ETag is its
    SHA-256) and a git file (its ETag is a git blob SHA-1)."""
    meta = top / ".cache" / "huggingface" / "download" / "sub"
    meta.mkdir(parents=True)
    (top / "sub").mkdir()
    (top / "sub" / "model.safetensors").write_bytes(WEIGHTS)
    (top / "config.json").write_bytes(CONFIG)
    lfs = hashlib.sha256(published).hexdigest()
    (meta / "model.safetensors.metadata").write_text(f"{COMMIT}\n{lfs}\n1712656091.123\n")
    git_sha1 = hashlib.sha1(b"blob 2\0" + CONFIG, usedforsecurity=False).hexdigest()
    (meta.parent / "config.json.metadata").write_text(f"{COMMIT}\n{git_sha1}\n1712656091.1\n")
    (top / ".cache" / "huggingface" / ".gitignore").write_text("*\n")
    return top


def _origin_sums(manifest: peer.PeerManifest) -> dict[str, str | None]:
    return {f.path: f.origin_sha256 for f in manifest.files if not f.path.startswith(".cache")}


def test_an_hf_models_lfs_checksums_are_recorded_in_its_manifest(tmp_path: Path) -> None:
    top = _hf_folder(tmp_path / "model")
    manifest = filelists.compute(top, KEY, uri=HF)
    assert _origin_sums(manifest) == {
        "config.json": None,  # a git blob SHA-1: not a SHA-256 the origin published
        "sub/model.safetensors": hashlib.sha256(WEIGHTS).hexdigest(),
    }
    assert manifest.computed_digest() == manifest.digest  # the record is not in the digest
    again = peer.PeerManifest.model_validate(manifest.to_dict())
    assert again.files == manifest.files
    # never on the wire: a follower compares a source's partial and complete manifests
    served = peer.PeerManifest.model_validate_json(manifest.wire_json())
    assert served.files == [f.model_copy(update={"origin_sha256": None}) for f in manifest.files]
    assert "originSha256" not in manifest.wire_json()


def test_a_file_that_is_not_what_the_origin_published_makes_the_folder_unservable(
    tmp_path: Path,
) -> None:
    """The download is not what the Hub sent (one flipped byte): its folder is never served
    to peers, and the error names the file."""
    top = _hf_folder(tmp_path / "model", published=b"the hub's bytes")
    with pytest.raises(filelists.OriginMismatch, match=r"sub/model\.safetensors"):
        filelists.compute(top, KEY, uri=HF)
    assert issubclass(filelists.OriginMismatch, filelists.Unservable)


def test_only_an_hf_models_metadata_speaks_for_its_origin(tmp_path: Path) -> None:
    """The same files in an `s3://` model's folder are the tenant's bytes, nothing more."""
    top = _hf_folder(tmp_path / "model", published=b"the hub's bytes")
    manifest = filelists.compute(top, KEY, uri="s3://bucket/model")
    assert set(_origin_sums(manifest).values()) == {None}


def test_metadata_of_another_shape_or_behind_a_symlink_attests_nothing(tmp_path: Path) -> None:
    top = _hf_folder(tmp_path / "model", published=b"the hub's bytes")
    meta = top / ".cache" / "huggingface" / "download" / "sub" / "model.safetensors.metadata"
    sha = hashlib.sha256(WEIGHTS).hexdigest()
    files = [("sub/model.safetensors", len(WEIGHTS), sha)]
    for text in ("", "one line\n", f"{COMMIT}\n{sha.upper()}\n", f'{COMMIT}\n"{sha}"\n'):
        meta.write_text(text)
        listed = [*files, (str(meta.relative_to(top)), meta.stat().st_size, "0" * 64)]
        assert originsums.published(top, HF, listed) == {}
    meta.write_text(f"{COMMIT}\n{sha}\n")
    listed = [*files, (str(meta.relative_to(top)), meta.stat().st_size, "0" * 64)]
    assert originsums.published(top, HF, listed) == {"sub/model.safetensors": sha}
    meta.write_text(f"{COMMIT}\n{sha}\n" + "#" * originsums.MAX_METADATA_BYTES)
    too_big = [*files, (str(meta.relative_to(top)), meta.stat().st_size, "0" * 64)]
    assert originsums.published(top, HF, too_big) == {}
    # a symlinked directory on the way is never followed, even if the listing said otherwise
    elsewhere = tmp_path / "elsewhere"
    (top / ".cache").rename(elsewhere)
    meta_of_elsewhere = elsewhere / "huggingface" / "download" / "sub" / meta.name
    meta_of_elsewhere.write_text(f"{COMMIT}\n{sha}\n")
    os.symlink(elsewhere, top / ".cache")
    assert originsums.published(top, HF, listed) == {}
    assert filelists.compute(top, KEY, uri=HF).files[0].origin_sha256 is None


def test_mismatches_name_the_files_whose_bytes_differ() -> None:
    files = [("a", 1, "1" * 64), ("b", 1, "2" * 64), ("c", 1, "3" * 64)]
    assert originsums.mismatches(files, {"a": "1" * 64, "b": "9" * 64}) == ["b"]


def test_a_manifest_entry_whose_origin_sum_is_not_its_own_is_refused() -> None:
    """A receiver never takes a manifest that says the origin published other bytes."""
    with pytest.raises(pydantic.ValidationError, match="origin's sha256"):
        peer.ManifestFile(path="m", size=1, sha256="1" * 64, origin_sha256="2" * 64)


def test_a_list_stored_before_origin_checks_is_made_again_for_an_hf_model(tmp_path: Path) -> None:
    """A list an earlier version stored (no `originChecked`) was never checked against the
    Hub's checksums: for an `hf://` model it is not current (hashed again, once); for a
    model whose origin publishes none it still is."""
    root = tmp_path / "root"
    (root / layout.MANIFESTS_DIR).mkdir(parents=True)
    top = _hf_folder(tmp_path / "model")
    for uri, kept in ((HF, False), ("s3://bucket/model", True)):
        manifest = filelists.compute(top, KEY, uri=uri)
        stamp = layout.Manifest(
            storage_key=KEY, uri=uri, bytes=1, completed_at="2026-01-01T00:00:00Z", job="j"
        )
        files = filelists.FileList(KEY, filelists.Stamp.of(stamp), manifest, ())
        filelists.write(root, files)
        assert filelists.current(root, KEY, stamp) == files
        stored = filelists.path(root, KEY)
        earlier = json.loads(stored.read_text())
        del earlier["originChecked"]
        stored.write_text(json.dumps(earlier))
        found = filelists.current(root, KEY, stamp)
        assert (found is not None) == kept, uri
        assert found is None or not found.origin_checked
