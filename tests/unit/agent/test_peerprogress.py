"""Downloads in progress served to peers (`agent.peerprogress`), their place in `status.peer`
(`agent.peerfiles`) and in the server's index (`agent.peersource`).

Matrix: which downloads are tracked (s3 origin and peer Jobs of enabled groups, not http
origins, not disabled groups, not finished ones); which files are whole (an s3transfer
temporary name and a fetcher's `.localcache-part` never are; a fetcher's staging directory
is looked into); hashes are reused by identity and survive the end of tracking for the
promoted folder's list; the status entry says `complete: false`; a partial folder is served
only to its own scope and only when no complete folder serves it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from localcache.agent import downloads, peerfiles, peerprogress, peersource, status
from localcache.agent.disk import digest, filelists, folders, layout, wholefiles
from localcache.api import modelnode, originpaths, peer
from localcache.devenv.waiting import wait_until
from localcache.download import staging
from tests.unit.agent.test_peerfiles import GROUP, KEY, Ready, _group, _units

JOB = "lmd-job-0-abcdefgh"
SCOPE_B = "b" * 64


def _entry(uri: str) -> modelnode.LocalModelInfo:
    return modelnode.LocalModelInfo.model_validate(
        {"sourceModelUri": uri, "modelName": "m", "nodeGroup": GROUP}
    )


def _downloading(source: str, job: str = JOB) -> status.Outcome:
    progress = modelnode.ModelProgress(job_name=job, source=source)
    return status.Outcome(modelnode.ModelStatus.DOWNLOADING, progress)


def _unit(uri: str) -> downloads.Unit:
    return downloads.units([_entry(uri)], node_name="node-a", job_namespace="kserve")[0]


def _in_flight(unit: downloads.Unit, outcome: status.Outcome, root: Path) -> list[str]:
    found = peerprogress.in_flight([unit], {GROUP: root}, {"m": outcome})
    return [f"{i.kind}:{i.staging}" for i in found]


def test_s3_origin_and_peer_downloads_of_enabled_groups_are_tracked(tmp_path: Path) -> None:
    s3, http = _unit("s3://b/m"), _unit("https://example.com/m")
    origin, follow = _downloading("origin"), _downloading("peer/node-b")
    staging = layout.staging_name(s3.storage_key, JOB)
    assert _in_flight(s3, origin, tmp_path) == [f"origin:{staging}"]
    assert _in_flight(s3, follow, tmp_path) == [f"peer:{staging}"]
    assert _in_flight(http, origin, tmp_path) == []  # written in place: nothing is whole
    assert _in_flight(http, _downloading("peer/node-b"), tmp_path) != []
    assert peerprogress.in_flight([s3], {}, {"m": origin}) == []  # group disabled
    done = status.Outcome(modelnode.ModelStatus.DOWNLOADED, modelnode.ModelProgress())
    assert _in_flight(s3, done, tmp_path) == []
    assert _in_flight(s3, _downloading("origin", job=""), tmp_path) == []
    assert _in_flight(s3, modelnode_progress_without_source(), tmp_path) == []


def modelnode_progress_without_source() -> status.Outcome:
    progress = modelnode.ModelProgress(job_name=JOB)  # peer distribution was off at launch
    return status.Outcome(modelnode.ModelStatus.DOWNLOADING, progress)


def _item(root: Path, kind: str) -> peerprogress.InFlight:
    return peerprogress.InFlight(
        root,
        layout.staging_name(KEY, JOB),
        KEY,
        "a" * 64,
        kind,  # type: ignore[arg-type]
    )


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _scan(
    item: peerprogress.InFlight,
    known: dict[digest.Identity, str] | None = None,
    *,
    twice: bool = True,
) -> tuple[peerprogress.Partial, wholefiles.Scanned]:
    """Scan `item` (twice: files unchanged since the previous look are listed)."""
    result = peerprogress.scan(item, known or {}, frozenset(), stop=lambda: False)
    assert result is not None
    if twice:
        result = peerprogress.scan(item, known or {}, result[1].seen, stop=lambda: False)
        assert result is not None
    return result


def test_only_whole_settled_files_are_listed_with_their_own_hashes(tmp_path: Path) -> None:
    origin = _item(tmp_path, "origin")
    assert peerprogress.scan(origin, {}, frozenset(), stop=lambda: False) is None  # no folder
    origin.folder.mkdir(parents=True)
    (origin.folder / "sub").mkdir()
    (origin.folder / "sub" / "model.bin").write_bytes(b"whole")
    (origin.folder / "sub" / "next.bin.3fA09bC1").write_bytes(b"being written")
    (origin.folder / "link").symlink_to("sub/model.bin")
    # the seed's record of the origin's checksums (and its temporary name): taken out of the
    # folder at promotion, so never a file a follower may take
    (origin.folder / originpaths.STAGED_SUMS).write_text("{}")
    (origin.folder / f"{originpaths.STAGED_SUMS}.7.tmp").write_text("{}")
    first, _ = _scan(origin, twice=False)
    assert first.manifest.files == []  # seen once: not settled yet
    partial, scanned = _scan(origin)
    assert partial.top == origin.folder
    assert not partial.manifest.complete
    assert [(f.path, f.sha256) for f in partial.manifest.files] == [
        ("sub/model.bin", _sha(b"whole"))
    ]
    assert partial.manifest.digest == partial.manifest.computed_digest()
    assert list(scanned.hashes.values()) == [_sha(b"whole")]


def test_a_file_written_between_two_looks_is_not_listed(tmp_path: Path) -> None:
    origin = _item(tmp_path, "origin")
    origin.folder.mkdir(parents=True)
    growing = origin.folder / "model.bin"
    growing.write_bytes(b"first half")
    first = peerprogress.scan(origin, {}, frozenset(), stop=lambda: False)
    assert first is not None
    with growing.open("ab") as f:
        f.write(b" second half")
    second = peerprogress.scan(origin, {}, first[1].seen, stop=lambda: False)
    assert second is not None
    assert second[0].manifest.files == []


def test_a_rewrite_with_its_mtime_restored_is_hashed_again(tmp_path: Path) -> None:
    origin = _item(tmp_path, "origin")
    origin.folder.mkdir(parents=True)
    path = origin.folder / "model.bin"
    path.write_bytes(b"garbage!")
    _, scanned = _scan(origin)
    times = path.stat()
    path.write_bytes(b"content!")  # same size, then the old mtime back (ctime moves on)
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    partial, _ = _scan(origin, dict(scanned.hashes))
    assert [f.sha256 for f in partial.manifest.files] == [_sha(b"content!")]


def test_a_directory_swapped_for_a_symlink_is_not_walked(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "secret.bin").write_bytes(b"another scope's weights")
    origin = _item(tmp_path, "origin")
    origin.folder.mkdir(parents=True)
    (origin.folder / "a").symlink_to(victim)
    (origin.folder / "b.bin").symlink_to(victim / "secret.bin")
    partial, scanned = _scan(origin)
    assert partial.manifest.files == []
    assert scanned.seen == frozenset()


def test_a_fetchers_staging_directory_is_looked_into_and_its_parts_left_out(
    tmp_path: Path,
) -> None:
    item = _item(tmp_path, "peer")
    inner = item.folder / (staging.PARTIAL_PREFIX + "0123456789ab")
    inner.mkdir(parents=True)
    (inner / "config.json").write_bytes(b"{}")
    (inner / ("model.bin" + peer.PART_SUFFIX)).write_bytes(b"half")
    partial, _ = _scan(item)
    assert partial.top == inner
    assert [f.path for f in partial.manifest.files] == ["config.json"]
    # committed: the files are in the staging folder itself
    (inner / "config.json").rename(item.folder / "config.json")
    (inner / ("model.bin" + peer.PART_SUFFIX)).unlink()
    inner.rmdir()
    partial, _ = _scan(item)
    assert (partial.top, [f.path for f in partial.manifest.files]) == (
        item.folder,
        ["config.json"],
    )
    # a symlink posing as the fetcher's directory is not followed
    inner.symlink_to(tmp_path)
    partial, _ = _scan(item)
    assert partial.manifest.files == []


def test_an_s3_download_holding_an_archive_lists_nothing(tmp_path: Path) -> None:
    origin = _item(tmp_path, "origin")
    origin.folder.mkdir(parents=True)
    (origin.folder / "model.tar.gz").write_bytes(b"archive")
    (origin.folder / "unpacked.bin").write_bytes(b"being unpacked")
    partial, _ = _scan(origin)
    assert partial.manifest.files == []


async def test_tracked_downloads_are_served_and_their_hashes_kept_for_the_promoted_list(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = folders.ModelDisk(tmp_path / "root")
    disk.ensure_layout()
    index = peersource.PeerFolders()
    progress = peerprogress.Progress(on_change=index.set_partials)
    item = _item(disk.root, "origin")
    item.folder.mkdir(parents=True)
    (item.folder / "model.bin").write_bytes(b"weights")
    runner = asyncio.create_task(progress.run(), name="peer-progress")
    try:
        progress.track([item])
        found = index.lookup(KEY, item.scope)  # at once: nothing yet, but never a 404
        assert found is not None
        assert found.manifest.files == []

        def listed() -> bool:
            found = index.lookup(KEY, item.scope)
            return found is not None and len(found.manifest.files) == 1

        await wait_until(listed, timeout=10, what="model.bin served")
        assert index.lookup(KEY, SCOPE_B) is None
        assert index.scopes(KEY) == {item.scope}
        # promotion: the folder is renamed into models/, tracking ends, the hash is kept and
        # the last manifest is still served (its files moved) until the complete list is
        target = disk.models / KEY
        item.folder.rename(target)
        progress.track([], finished=[item])
        kept = index.lookup(KEY, item.scope)
        assert kept is not None
        assert [f.path for f in kept.manifest.files] == ["model.bin"]
        calls: list[str] = []
        real = digest.file_sha256

        def counting(path: str, *, stop: Callable[[], bool]) -> str:
            calls.append(path)
            return real(path, stop=stop)

        monkeypatch.setattr(digest, "file_sha256", counting)
        listed_after = filelists.compute(target, KEY, known=progress.known(item.staging))
        assert calls == []
        assert listed_after.files[0].sha256 == _sha(b"weights")
        assert progress.known("another-staging") == {}
        # a new download of the same model and scope: served as itself, never the old one's
        again = dataclasses.replace(item, staging=layout.staging_name(KEY, "lmd-job-2-again000"))
        progress.track([again])
        found = index.lookup(KEY, item.scope)
        assert found is not None
        assert (found.path, found.manifest.files) == (again.folder, [])
        progress.track([])  # and it failed (not finished): not served any more
        assert index.lookup(KEY, item.scope) is None
        progress.track([again])
        progress.forget()
        assert index.lookup(KEY, item.scope) is None
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


def test_a_finished_download_whose_folder_is_unservable_stops_being_served_at_once(
    tmp_path: Path,
) -> None:
    """Its followers ask for the complete manifest every second: the seed found its folder
    unservable (the origin's checksums refuse it, say), so they must leave it (404) rather
    than wait out the tombstone and their own 10 minutes."""
    index = peersource.PeerFolders()
    progress = peerprogress.Progress(on_change=index.set_partials)
    item = _item(tmp_path / "root", "origin")
    other = _item(tmp_path / "other-root", "origin")
    progress.track([item, other])
    progress.track([], finished=[item, other])
    assert index.lookup(KEY, item.scope) is not None  # the tombstone, while the list is made
    progress.unservable(tmp_path / "root", "f" * 16)  # another model: nothing changes
    assert index.lookup(KEY, item.scope) is not None
    progress.unservable(tmp_path / "root", KEY)
    found = index.lookup(KEY, item.scope)
    assert found is not None
    assert found.path == other.folder, "only that root's"
    progress.unservable(tmp_path / "other-root", KEY)
    assert index.lookup(KEY, item.scope) is None


def test_a_complete_folder_is_served_before_a_partial_one(tmp_path: Path) -> None:
    disk = folders.ModelDisk(tmp_path / "root")
    disk.ensure_layout()
    item = _item(disk.root, "origin")
    index = peersource.PeerFolders()
    empty = peer.PeerManifest(
        storage_key=KEY, digest=peer.manifest_digest(files=()), complete=False, files=[]
    )
    index.set_partials([peerprogress.Partial(item, item.folder, empty)])
    found = index.lookup(KEY, item.scope)
    assert found is not None
    assert found.path == item.folder
    disk.model_path(KEY).mkdir()
    (disk.model_path(KEY) / "model.bin").write_bytes(b"weights")
    manifest = filelists.compute(disk.model_path(KEY), KEY)
    stamp = filelists.Stamp("j", "t")
    filelists.write(disk.root, filelists.FileList(KEY, stamp, manifest, (item.scope,)))
    served = peersource.Served(
        disk.root, KEY, KEY, manifest.digest, manifest.bytes, (item.scope,), stamp
    )
    index.replace([served])
    found = index.lookup(KEY, item.scope)
    assert found is not None
    assert found.manifest.complete
    assert found.path == disk.model_path(KEY)


async def test_status_lists_a_download_in_progress_as_incomplete(tmp_path: Path) -> None:
    disk = folders.ModelDisk(tmp_path / "root")
    disk.ensure_layout()
    files = peerfiles.PeerFiles(endpoint="https://10.0.0.1:8476", on_ready=Ready())
    units = _units("a")
    placements: dict[str, peerfiles.Placement] = {GROUP: (_group(enabled=True), disk)}
    outcomes = {"a": _downloading("origin")}
    published = await files.publish(units, placements, outcomes)
    assert published["peer"]["models"] == [
        {"storageKey": KEY, "complete": False, "scopes": [units[0].scope_id], "bytes": 0}
    ]
    off: dict[str, peerfiles.Placement] = {GROUP: (_group(enabled=False), disk)}
    assert await files.publish(units, off, outcomes) == {}
