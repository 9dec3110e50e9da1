"""Peer file lists of model folders (`agent.disk.filelists`): one walk for the content digest
and the manifest, bounds, storage, and removal with the folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localcache.agent.disk import digest, filelists, folders, layout
from localcache.api import peer

KEY = "0123456789abcdef"
SCOPE_A = "a" * 64
SCOPE_B = "b" * 64


def _tree(top: Path) -> Path:
    (top / "sub" / "deeper").mkdir(parents=True)
    (top / "empty").mkdir()
    (top / "model.bin").write_bytes(b"weights" * 1000)
    (top / "sub" / "config.json").write_bytes(b"{}")
    (top / "sub" / "deeper" / "zero").write_bytes(b"")
    os.symlink("sub/config.json", top / "link")
    os.mkfifo(top / "pipe")
    return top


def _manifest(job: str = "lmd-job-0-abcdefgh") -> layout.Manifest:
    return layout.Manifest(
        storage_key=KEY, uri="s3://b/m", bytes=7002, completed_at="2026-01-01T00:00:00Z", job=job
    )


def _promoted(tmp_path: Path, *, job: str = "lmd-job-0-abcdefgh") -> folders.ModelDisk:
    disk = folders.ModelDisk(tmp_path / "root")
    disk.ensure_layout()
    staging = disk.prepare_staging(KEY, "job")
    (staging / "model.bin").write_bytes(b"weights")
    disk.promote(staging, KEY, _manifest(job))
    return disk


def test_manifest_digest_is_the_tree_digest_from_one_walk(tmp_path: Path) -> None:
    top = _tree(tmp_path / "model")
    manifest = filelists.compute(top, KEY)
    assert manifest.digest == digest.tree_digest(top)
    assert manifest.computed_digest() == manifest.digest
    assert [f.path for f in manifest.files] == ["model.bin", "sub/config.json", "sub/deeper/zero"]
    assert manifest.dirs == ["empty", "sub", "sub/deeper"]
    assert [(link.path, link.target) for link in manifest.links] == [("link", "sub/config.json")]
    assert manifest.others == ["pipe"]
    assert manifest.bytes == 7002


def test_changed_content_changes_the_digest(tmp_path: Path) -> None:
    top = _tree(tmp_path / "model")
    before = filelists.compute(top, KEY).digest
    (top / "sub" / "config.json").write_bytes(b"[]")
    after = filelists.compute(top, KEY)
    assert after.digest != before
    assert after.digest == digest.tree_digest(top)


def test_more_entries_than_max_files_is_unservable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    top = _tree(tmp_path / "model")
    monkeypatch.setattr(peer, "MAX_FILES", 3)
    with pytest.raises(filelists.Unservable, match="more than 3 entries"):
        filelists.compute(top, KEY)


def test_deeper_than_max_depth_is_unservable(tmp_path: Path) -> None:
    top = tmp_path / "model"
    deep = top.joinpath(*["d"] * (peer.MAX_DEPTH + 1))
    deep.mkdir(parents=True)
    with pytest.raises(filelists.Unservable, match="deeper than"):
        filelists.compute(top, KEY)
    ok = tmp_path / "ok"
    ok.joinpath(*["d"] * peer.MAX_DEPTH).mkdir(parents=True)
    assert len(filelists.compute(ok, KEY).dirs) == peer.MAX_DEPTH


def test_a_path_longer_than_the_wire_allows_is_unservable(tmp_path: Path) -> None:
    top = tmp_path / "model"
    long = top / ("a" * 250) / ("b" * 250) / ("c" * 250) / ("d" * 250)
    long.mkdir(parents=True)
    (long / ("e" * 100)).write_bytes(b"x")
    with pytest.raises(filelists.Unservable):
        filelists.compute(top, KEY)


def test_a_stopped_walk_raises_stopped(tmp_path: Path) -> None:
    top = _tree(tmp_path / "model")
    with pytest.raises(digest.Stopped):
        filelists.compute(top, KEY, stop=lambda: True)


def test_stored_list_reads_back_only_when_whole_and_current(tmp_path: Path) -> None:
    disk = _promoted(tmp_path)
    manifest = disk.manifest(KEY)
    assert manifest is not None
    computed = filelists.compute(disk.model_path(KEY), KEY)
    stamp = filelists.Stamp.of(manifest)
    filelists.write(disk.root, filelists.FileList(KEY, stamp, computed, (SCOPE_A,)))
    assert filelists.path(disk.root, KEY).name == f"{KEY}.files.json"
    stored = filelists.current(disk.root, KEY, manifest)
    assert stored is not None
    assert stored.manifest == computed
    assert stored.scopes == (SCOPE_A,)
    other = _manifest("lmd-other-0-abcdefgh")
    assert filelists.current(disk.root, KEY, other) is None  # another promotion's list

    path = filelists.path(disk.root, KEY)
    text = path.read_text()
    path.write_text(text.replace(computed.files[0].sha256, "0" * 64))  # digest no longer agrees
    assert filelists.read(disk.root, KEY) is None
    path.write_text(text.replace(SCOPE_A, "not-a-digest"))
    assert filelists.read(disk.root, KEY) is None
    path.write_text("{")
    assert filelists.read(disk.root, KEY) is None


def test_scopes_keep_their_order_and_are_bounded() -> None:
    many = [f"{i:064x}" for i in range(40)]
    assert filelists.merge_scopes([SCOPE_B], [SCOPE_A, SCOPE_B]) == (SCOPE_B, SCOPE_A)
    assert filelists.merge_scopes([SCOPE_B, SCOPE_A], [SCOPE_A]) == (SCOPE_A,)
    merged = filelists.merge_scopes([many[39]], many)
    assert len(merged) == peer.MAX_SCOPES
    assert merged[0] == many[39]


def _store(disk: folders.ModelDisk, folder: str = KEY) -> Path:
    manifest = filelists.compute(disk.models / folder, KEY)
    stamp = filelists.Stamp("j", "t")
    filelists.write(disk.root, filelists.FileList(folder, stamp, manifest, (SCOPE_A,)))
    return filelists.path(disk.root, folder)


def test_file_list_is_removed_with_its_folder(tmp_path: Path) -> None:
    disk = _promoted(tmp_path)
    path = _store(disk)
    assert disk.delete_unreferenced(set()) == [KEY]
    assert not path.exists()
    assert not disk.model_path(KEY).exists()


def test_orphan_manifest_sweep_removes_the_file_list_too(tmp_path: Path) -> None:
    disk = _promoted(tmp_path)
    path = _store(disk)
    os.rename(disk.model_path(KEY), tmp_path / "gone")  # the folder vanished by other means
    disk.delete_unreferenced(set())
    assert not disk.manifest_path(KEY).exists()
    assert not path.exists()


def test_orphan_file_list_is_removed_before_a_folder_moves_into_place(tmp_path: Path) -> None:
    disk = folders.ModelDisk(tmp_path / "root")
    disk.ensure_layout()
    disk.model_path(KEY).mkdir()  # an incomplete folder: no manifest
    path = _store(disk)
    staging = disk.prepare_staging(KEY, "job")
    (staging / "model.bin").write_bytes(b"new")
    disk.promote(staging, KEY, _manifest())
    assert not path.exists()


def test_prune_removes_lists_of_folders_that_are_not_complete(tmp_path: Path) -> None:
    disk = _promoted(tmp_path)
    kept = _store(disk)
    variant = f"{KEY}.{'c' * 16}"
    disk.model_path(KEY, "c" * 16).mkdir()  # no manifest: not complete
    orphan = _store(disk, variant)
    assert filelists.prune(disk.root) == [variant]
    assert kept.exists()
    assert not orphan.exists()
