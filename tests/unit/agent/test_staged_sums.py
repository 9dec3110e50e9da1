"""The SHA-256s an `s3://` seed's `localcache origin-sums` step staged (`download.seedsums`):
taken out of the download's folder at promotion into the folder's manifest
(`agent.disk.originsums`, `folders.ModelDisk.promote(..., seeded=True)`), then recorded and checked
when the folder's peer manifest is made (`filelists.compute(..., staged=...)`)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import pytest

from localcache.agent.disk import filelists, folders, layout, originsums
from localcache.api import originpaths

KEY = "0123456789abcdef"
S3 = "s3://models/llm"
BIG = os.urandom(64 * 1024)
SMALL = b"{}"


def _staged(sums: dict[str, str]) -> str:
    return originpaths.StagedSums(sha256=sums).model_dump_json()


def _download(disk: folders.ModelDisk, sums_file: str | None, job: str = "job") -> Path:
    staging = disk.prepare_staging(KEY, job)
    (staging / "weights").mkdir()
    (staging / "weights" / "part-0.bin").write_bytes(BIG)
    (staging / "config.json").write_bytes(SMALL)
    if sums_file is not None:
        (staging / originpaths.STAGED_SUMS).write_text(sums_file)
    return staging


def _manifest(uri: str = S3, job: str = "job") -> layout.Manifest:
    return layout.Manifest(
        storage_key=KEY, uri=uri, bytes=1, completed_at="2026-01-01T00:00:00Z", job=job
    )


def _disk(tmp_path: Path) -> folders.ModelDisk:
    disk = folders.ModelDisk(tmp_path / "root")
    disk.ensure_layout()
    return disk


def test_the_staged_sums_go_from_the_folder_into_its_manifest_and_are_checked(
    tmp_path: Path,
) -> None:
    disk = _disk(tmp_path)
    big = hashlib.sha256(BIG).hexdigest()
    staging = _download(disk, _staged({"weights/part-0.bin": big, "gone.bin": "0" * 64}))
    in_force = disk.promote(staging, KEY, _manifest(), seeded=True)
    folder = disk.model_path(KEY)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "weights"]
    assert in_force.origin_sums == (("gone.bin", "0" * 64), ("weights/part-0.bin", big))
    assert disk.manifest(KEY) == in_force  # kept across restarts, in the manifest
    manifest = filelists.compute(folder, KEY, uri=S3, staged=in_force.origin_sums)
    recorded = {f.path: f.origin_sha256 for f in manifest.files}
    assert recorded == {"config.json": None, "weights/part-0.bin": big}  # only files it holds


def test_bytes_that_are_not_the_origins_make_the_folder_unservable(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    other = hashlib.sha256(b"what the origin stores").hexdigest()
    staging = _download(disk, _staged({"weights/part-0.bin": other}))
    in_force = disk.promote(staging, KEY, _manifest(), seeded=True)
    with pytest.raises(filelists.OriginMismatch, match=r"weights/part-0\.bin"):
        filelists.compute(disk.model_path(KEY), KEY, uri=S3, staged=in_force.origin_sums)


@pytest.mark.parametrize(
    "content",
    ["not json", '{"sha256": {"../escape": "' + "a" * 64 + '"}}', '{"sha256": {"a": "x"}}', ""],
)
def test_a_malformed_staged_file_is_taken_out_and_leaves_the_copy_unchecked(
    tmp_path: Path, content: str
) -> None:
    disk = _disk(tmp_path)
    in_force = disk.promote(_download(disk, content), KEY, _manifest(), seeded=True)
    assert in_force.origin_sums == ()
    assert in_force.origin_unchecked
    assert not (disk.model_path(KEY) / originpaths.STAGED_SUMS).exists()


def test_a_seed_without_its_record_is_promoted_unchecked_and_never_listed(
    tmp_path: Path,
) -> None:
    """The sidecar had no answer from the origin (or was stopped before it): the node holds the
    model, but no file list is made for peers, across restarts (the manifest says so)."""
    disk = _disk(tmp_path)
    in_force = disk.promote(_download(disk, None), KEY, _manifest(), seeded=True)
    assert in_force.origin_unchecked
    assert in_force.origin_sums == ()
    assert disk.manifest(KEY) == in_force
    assert layout.Manifest.from_json(in_force.to_json()).origin_unchecked
    with pytest.raises(filelists.OriginUnchecked):
        filelists.compute(disk.model_path(KEY), KEY, uri=S3, unchecked=in_force.origin_unchecked)


def test_a_record_that_the_origin_stores_no_checksum_checks_nothing_and_is_served(
    tmp_path: Path,
) -> None:
    disk = _disk(tmp_path)
    in_force = disk.promote(_download(disk, _staged({})), KEY, _manifest(), seeded=True)
    assert in_force.origin_sums == ()
    assert not in_force.origin_unchecked
    assert "originUnchecked" not in in_force.to_json()
    manifest = filelists.compute(disk.model_path(KEY), KEY, uri=S3, unchecked=False)
    assert all(f.origin_sha256 is None for f in manifest.files)


def test_a_staged_symlink_or_fifo_is_removed_unopened_and_a_directory_is_the_models_own(
    tmp_path: Path,
) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text(_staged({"config.json": hashlib.sha256(SMALL).hexdigest()}))
    staging = tmp_path / "staging"
    staging.mkdir()
    staged = staging / originpaths.STAGED_SUMS
    staged.symlink_to(target)
    assert originsums.read_staged(staging) is None
    originsums.drop_staged(staging)
    assert not staged.is_symlink()
    assert target.exists()
    os.mkfifo(staged)  # opened, it would block the agent
    assert originsums.read_staged(staging) is None
    originsums.drop_staged(staging)
    assert not staged.exists()
    staged.mkdir()
    assert originsums.read_staged(staging) is None
    originsums.drop_staged(staging)
    assert staged.is_dir()


def test_an_oversized_staged_file_is_not_read(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    with (staging / originpaths.STAGED_SUMS).open("wb") as handle:
        handle.truncate(originpaths.MAX_STAGED_SUMS_BYTES + 1)
    assert originsums.read_staged(staging) is None


def test_a_folder_whose_modes_the_pod_took_away_is_promoted_unchecked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod runs as the agent's uid: it may chmod its staging folder (a tar entry `./` of
    mode 0 does it), so reading or removing the record fails (EACCES, as the agent is not
    root): that must not stop the agent's pass (the promotion fixes the modes)."""
    disk = _disk(tmp_path)
    staging = _download(disk, _staged({"weights/part-0.bin": hashlib.sha256(BIG).hexdigest()}))

    def denied(*_: object, **__: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "lstat", denied)
    monkeypatch.setattr(os, "listdir", denied)
    assert originsums.read_staged(staging) is None
    assert originsums.with_staged(_manifest(), staging).origin_unchecked
    assert originsums.staged_bytes(staging) == 0
    originsums.drop_staged(staging)  # logged, not raised
    monkeypatch.undo()
    assert disk.promote(staging, KEY, _manifest()).origin_sums == ()


def test_only_a_seeded_download_has_its_staged_record_taken(tmp_path: Path) -> None:
    """A Job without the sidecar (peer distribution off, no --peer-image, a follower) may hold
    a model file of that name (an object of the bucket): it stays the model's."""
    disk = _disk(tmp_path)
    sums = _staged({"config.json": hashlib.sha256(SMALL).hexdigest()})
    in_force = disk.promote(_download(disk, sums), KEY, _manifest())
    assert in_force.origin_sums == ()
    assert not in_force.origin_unchecked
    assert (disk.model_path(KEY) / originpaths.STAGED_SUMS).read_text() == sums
    files = [("config.json", len(SMALL), "0" * 64)]
    staged = (("config.json", "1" * 64),)
    assert originsums.published(tmp_path, "gs://models/llm", files, staged=staged) == {}


def test_a_crash_after_the_record_keeps_the_sums_and_recovery_removes_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _disk(tmp_path)
    big = hashlib.sha256(BIG).hexdigest()
    staging = _download(disk, _staged({"weights/part-0.bin": big}))
    (staging / f"{originpaths.STAGED_SUMS}.17.tmp").write_text("{")  # a stopped sidecar's

    def crash(step: str) -> None:
        if step == "record-written":
            raise RuntimeError(step)

    monkeypatch.setattr(folders, "_checkpoint", crash)
    with pytest.raises(RuntimeError):
        disk.promote(staging, KEY, _manifest(), seeded=True)
    monkeypatch.setattr(folders, "_checkpoint", lambda _step: None)
    [recovered] = disk.recover()
    assert recovered.outcome == "promoted"
    assert sorted(p.name for p in disk.model_path(KEY).iterdir()) == ["config.json", "weights"]
    manifest = disk.manifest(KEY)
    assert manifest is not None
    assert manifest.origin_sums == (("weights/part-0.bin", big),)


def test_a_manifest_without_recorded_sums_reads_as_before(tmp_path: Path) -> None:
    plain = _manifest().to_json()
    assert "originSha256" not in plain
    assert layout.Manifest.from_json(plain) == _manifest()
    garbled = {**plain, "originSha256": {"a": "not a sha"}}
    assert layout.Manifest.from_json(garbled).origin_sums == ()


def test_a_stored_list_of_an_unchecked_copy_is_never_current(tmp_path: Path) -> None:
    """A list stored for that promotion (by a version that did not check) is not served."""
    disk = _disk(tmp_path)
    in_force = disk.promote(_download(disk, None), KEY, _manifest(), seeded=True)
    listed = filelists.compute(disk.model_path(KEY), KEY, uri=S3)
    stored = filelists.FileList(in_force.folder, filelists.Stamp.of(in_force), listed, ())
    filelists.write(disk.root, stored)
    assert filelists.read(disk.root, in_force.folder) is not None
    assert filelists.current(disk.root, in_force.folder, in_force) is None
    checked = dataclasses.replace(in_force, origin_unchecked=False)
    assert filelists.current(disk.root, in_force.folder, checked) is not None
