"""Background hashing and `status.peer` (`agent.peerfiles`), and the peer server's folder
index (`agent.peersource`)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from localcache.agent import downloads, peerfiles, peersource, status
from localcache.agent.disk import digest, filelists, folders, layout
from localcache.api import modelnode, nodegroup, originpaths, peer
from localcache.caching import keys
from localcache.devenv.waiting import wait_until
from localcache.runtime import durable

URI = "s3://bucket/model"
KEY = keys.storage_key(URI)
GROUP = "gpu"


def _group(*, enabled: bool) -> nodegroup.LocalModelNodeGroup:
    term = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}
    return nodegroup.LocalModelNodeGroup.model_validate(
        {
            "metadata": {"name": GROUP},
            "spec": {
                "storageLimit": "1Gi",
                "persistentVolumeClaimSpec": {},
                "persistentVolumeSpec": {
                    "hostPath": {"path": "/mnt/models"},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [term]}},
                },
                "peerDistribution": {"enabled": enabled},
            },
        }
    )


def _units(*names: str, namespaces: tuple[str | None, ...] = ()) -> list[downloads.Unit]:
    entries = [
        modelnode.LocalModelInfo.model_validate(
            {
                "sourceModelUri": URI,
                "modelName": name,
                "nodeGroup": GROUP,
                **({"namespace": ns} if (ns := dict(enumerate(namespaces)).get(i)) else {}),
            }
        )
        for i, name in enumerate(names)
    ]
    return downloads.units(entries, node_name="node-a", job_namespace="kserve")


def _downloaded(folder: str | None = None) -> status.Outcome:
    progress = modelnode.ModelProgress(percent=100, folder=folder)
    return status.Outcome(modelnode.ModelStatus.DOWNLOADED, progress)


def _outcomes(units: list[downloads.Unit], outcome: status.Outcome) -> dict[str, status.Outcome]:
    return {key: outcome for unit in units for key in unit.status_keys}


def _disk(
    tmp_path: Path,
    *,
    job: str = "lmd-job-0-abcdefgh",
    uri: str = URI,
    seeded: bool = False,
    staged: str | None = None,
) -> folders.ModelDisk:
    """`disk` holding a promoted folder of `uri`; `seeded`: by a Job with the checksum sidecar,
    which left the record `staged` (None: none)."""
    disk = folders.ModelDisk(tmp_path / "root")
    disk.ensure_layout()
    staging = disk.prepare_staging(KEY, "job")
    (staging / "model.bin").write_bytes(b"weights")
    if staged is not None:
        (staging / originpaths.STAGED_SUMS).write_text(staged)
    manifest = layout.Manifest(
        storage_key=KEY, uri=uri, bytes=7, completed_at="2026-01-01T00:00:00Z", job=job
    )
    disk.promote(staging, KEY, manifest, seeded=seeded)
    return disk


class Ready:
    """`on_ready` that tests can wait for."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


async def _with_worker(files: peerfiles.PeerFiles, body: Callable[[], Any]) -> None:
    worker = asyncio.create_task(files.run(), name="peer-files worker")
    try:
        await body()
    finally:
        worker.cancel()
        with pytest.raises(asyncio.CancelledError):
            await worker


def test_endpoint_is_set_only_when_serving() -> None:
    assert peerfiles.endpoint("10.0.0.7", 8476) == "https://10.0.0.7:8476"
    assert peerfiles.endpoint("fd00::7", 8476) == "https://[fd00::7]:8476"
    assert peerfiles.endpoint("10.0.0.7", 0) is None
    assert peerfiles.endpoint("", 8476) is None
    assert peerfiles.endpoint("not-an-ip", 8476) is None


def test_wanted_folders_carry_every_downloaded_units_scope(tmp_path: Path) -> None:
    disk = folders.ModelDisk(tmp_path)
    units = _units("a", "b", namespaces=(None, "tenant"))
    assert len({u.scope_id for u in units}) == 2
    placements = {GROUP: (_group(enabled=True), disk)}
    [want] = peerfiles.wanted(units, placements, _outcomes(units, _downloaded())) or []
    assert (want.folder, want.variant) == (KEY, None)
    assert want.scopes == {u.scope_id for u in units}

    variant = f"{KEY}.{'c' * 16}"
    [want] = peerfiles.wanted(units[:1], placements, _outcomes(units, _downloaded(variant))) or []
    assert (want.folder, want.variant) == (variant, "c" * 16)

    pending = status.Outcome(modelnode.ModelStatus.DOWNLOADING, modelnode.ModelProgress())
    assert peerfiles.wanted(units, placements, _outcomes(units, pending)) == []
    off = {GROUP: (_group(enabled=False), disk)}
    assert peerfiles.wanted(units, off, _outcomes(units, _downloaded())) is None


async def test_disabled_peer_distribution_hashes_and_writes_nothing(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    before = sorted(p.name for p in disk.manifests.iterdir())
    files = peerfiles.PeerFiles(endpoint="https://10.0.0.7:8476", on_ready=Ready())
    units = _units("a")
    placements = {GROUP: (_group(enabled=False), disk)}
    assert await files.publish(units, placements, _outcomes(units, _downloaded())) == {}
    assert files.stats().queued == 0
    assert sorted(p.name for p in disk.manifests.iterdir()) == before


async def _first_publish(
    disk: folders.ModelDisk,
) -> tuple[
    peerfiles.PeerFiles,
    Ready,
    list[downloads.Unit],
    dict[str, peerfiles.Placement],
    dict[str, status.Outcome],
]:
    """A worker-less `PeerFiles` on `disk`'s one Downloaded unit, after its first pass (the
    folder queued for hashing, nothing listed yet)."""
    ready = Ready()
    files = peerfiles.PeerFiles(endpoint="https://10.0.0.7:8476", on_ready=ready)
    units = _units("a")
    placements: dict[str, peerfiles.Placement] = {GROUP: (_group(enabled=True), disk)}
    outcomes = _outcomes(units, _downloaded())
    first = await files.publish(units, placements, outcomes)
    assert first == {"peer": {"endpoint": "https://10.0.0.7:8476", "models": []}}
    return files, ready, units, placements, outcomes


async def test_promoted_folder_is_published_after_it_was_hashed(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    files, ready, units, placements, outcomes = await _first_publish(disk)
    assert files.stats().queued == 1
    assert not filelists.path(disk.root, KEY).exists()

    async def hashed() -> None:
        await wait_until(lambda: ready.count == 1, timeout=10, what="the folder hashed")
        published = await files.publish(units, placements, outcomes)
        [model] = published["peer"]["models"]
        assert model == {
            "storageKey": KEY,
            "digest": digest.tree_digest(disk.model_path(KEY)),
            "scopes": [units[0].scope_id],
            "bytes": 7,
        }
        assert filelists.path(disk.root, KEY).exists()
        found = files.source.lookup(KEY, units[0].scope_id)
        assert found is not None
        assert found.path == disk.model_path(KEY)
        assert found.manifest.digest == model["digest"]
        assert found.scopes == {units[0].scope_id}
        assert files.source.lookup(KEY, "f" * 64) is None

    await _with_worker(files, hashed)

    # another scope reusing the folder is added without hashing again
    both = _units("a", "b", namespaces=(None, "tenant"))
    published = await files.publish(both, placements, _outcomes(both, _downloaded()))
    [model] = published["peer"]["models"]
    assert model["scopes"] == [units[0].scope_id, both[1].scope_id]
    stored = filelists.read(disk.root, KEY)
    assert stored is not None
    assert stored.scopes == (units[0].scope_id, both[1].scope_id)
    assert files.stats().hashed == 1


async def test_the_origins_checksums_a_proof_saw_are_recorded_in_the_file_list(
    tmp_path: Path,
) -> None:
    """The SHA-256s an S3 origin answered to a proof this node ran go into the folder's
    list at the next pass: only for the content proven (its digest) and only where they are
    the file's own."""
    disk = _disk(tmp_path)
    files, ready, units, placements, outcomes = await _first_publish(disk)
    await _with_worker(
        files, lambda: wait_until(lambda: ready.count == 1, timeout=10, what="the folder hashed")
    )
    await files.publish(units, placements, outcomes)
    stored = filelists.read(disk.root, KEY)
    assert stored is not None
    own = stored.manifest.files[0].sha256
    folder, digest_now = disk.model_path(KEY), stored.manifest.digest

    files.origin_sums(folder, "sha256:" + "0" * 64, {"model.bin": own})  # another content
    files.origin_sums(tmp_path / "elsewhere" / "models" / KEY, digest_now, {"model.bin": own})
    assert ready.count == 3  # each asks for a pass
    await files.publish(units, placements, outcomes)
    assert filelists.read(disk.root, KEY) == stored

    files.origin_sums(folder, digest_now, {"model.bin": "9" * 64})  # not the file's own
    await files.publish(units, placements, outcomes)
    assert filelists.read(disk.root, KEY) == stored

    files.origin_sums(folder, digest_now, {"model.bin": own, "not-in-it": own})
    await files.publish(units, placements, outcomes)
    recorded = filelists.read(disk.root, KEY)
    assert recorded is not None
    assert [(f.path, f.origin_sha256) for f in recorded.manifest.files] == [("model.bin", own)]
    assert recorded.manifest.digest == digest_now
    assert files.stats().hashed == 1  # recorded without hashing again


async def test_a_seed_whose_origin_stores_no_checksum_is_served(tmp_path: Path) -> None:
    """The sidecar's record of an answer with no SHA-256 in it: nothing to check, served."""
    disk = _disk(tmp_path, seeded=True, staged=originpaths.StagedSums(sha256={}).model_dump_json())
    files, ready, units, placements, outcomes = await _first_publish(disk)

    async def served() -> None:
        await wait_until(lambda: ready.count == 1, timeout=10, what="the folder hashed")
        published = await files.publish(units, placements, outcomes)
        [model] = published["peer"]["models"]
        assert model["storageKey"] == KEY
        assert model["digest"], model
        assert "unservable" not in published["peer"]

    await _with_worker(files, served)


def _not_utf8(tmp_path: Path) -> folders.ModelDisk:
    disk = _disk(tmp_path)
    (disk.model_path(KEY) / os.fsdecode(b"not-utf8-\xff")).write_bytes(b"x")
    return disk


def _not_the_hubs(tmp_path: Path) -> folders.ModelDisk:
    """An `hf://` download whose file is not the SHA-256 the Hub published for it."""
    disk = _disk(tmp_path, uri="hf://org/model")
    meta = disk.model_path(KEY) / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    (meta / "model.bin.metadata").write_text(f"{'c' * 40}\n{'0' * 64}\n1712656091.1\n")
    return disk


def _seed_without_its_record(tmp_path: Path) -> folders.ModelDisk:
    """An `s3://` seed whose checksum sidecar left no record: the download ended before the
    origin answered it (CI at 8a771cb), or the origin refused it."""
    return _disk(tmp_path, seeded=True)


@pytest.mark.parametrize(
    ("folder", "reason"),
    [
        (_not_utf8, "unservable"),
        (_not_the_hubs, "origin-mismatch"),
        (_seed_without_its_record, "origin-unchecked"),
    ],
)
async def test_a_folder_that_cannot_be_hashed_is_published_as_unservable(
    tmp_path: Path, folder: Callable[[Path], folders.ModelDisk], reason: str
) -> None:
    """A name that is not UTF-8 (the wire cannot carry it), a file that is not what its
    origin published, or a seed's copy never checked against what its origin stores. Its
    followers must not wait for it: the failure is said in
    `status.peer.unservable` (the pass after it is asked for at once), and it is never
    retried for that promotion."""
    disk = folder(tmp_path)
    files, ready, units, placements, outcomes = await _first_publish(disk)

    async def failed() -> None:
        await wait_until(lambda: ready.count == 1, timeout=10, what="the hash to fail")
        for _ in range(2):
            published = await files.publish(units, placements, outcomes)
            assert published["peer"] == {
                "endpoint": "https://10.0.0.7:8476",
                "models": [],
                "unservable": [{"storageKey": KEY, "reason": reason}],
            }
            assert files.stats().queued == 0
        assert files.source.lookup(KEY, units[0].scope_id) is None

    await _with_worker(files, failed)
    assert files.stats().failed == 1


async def test_turning_peer_distribution_off_drops_the_queue_and_the_index(
    tmp_path: Path,
) -> None:
    disk = _disk(tmp_path)
    files = peerfiles.PeerFiles(endpoint=None, on_ready=Ready())
    units = _units("a")
    outcomes = _outcomes(units, _downloaded())
    await files.publish(units, {GROUP: (_group(enabled=True), disk)}, outcomes)
    assert files.stats().queued == 1
    assert await files.publish(units, {GROUP: (_group(enabled=False), disk)}, outcomes) == {}
    assert files.stats() == peerfiles.Stats(queued=0, ready=0, served=0, hashed=0, failed=0)
    assert files.source.lookup(KEY) is None


async def test_a_new_promotion_drops_the_list_and_hashes_again(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    ready = Ready()
    files = peerfiles.PeerFiles(endpoint=None, on_ready=ready)
    units = _units("a")
    placements = {GROUP: (_group(enabled=True), disk)}
    outcomes = _outcomes(units, _downloaded())
    await files.publish(units, placements, outcomes)

    async def hashed() -> None:
        await wait_until(lambda: ready.count == 1, timeout=10, what="the folder hashed")
        assert (await files.publish(units, placements, outcomes))["peer"]["models"]

    await _with_worker(files, hashed)
    manifest = disk.manifest(KEY)
    assert manifest is not None
    newer = dataclasses.replace(manifest, job="lmd-new-0-abcdefgh")
    (disk.model_path(KEY) / "model.bin").write_bytes(b"other weights")
    durable.write_json_atomic(disk.manifest_path(KEY), newer.to_json())
    again = await files.publish(units, placements, outcomes)
    assert again == {"peer": {"models": []}}
    assert not filelists.path(disk.root, KEY).exists()
    assert files.stats().queued == 1
    assert files.source.lookup(KEY) is None


async def test_start_up_publishes_stored_lists_and_queues_folders_without_one(
    tmp_path: Path,
) -> None:
    disk = _disk(tmp_path)
    manifest = disk.manifest(KEY)
    assert manifest is not None
    units = _units("a")
    computed = filelists.compute(disk.model_path(KEY), KEY)
    stamp = filelists.Stamp.of(manifest)
    filelists.write(disk.root, filelists.FileList(KEY, stamp, computed, (units[0].scope_id,)))
    placements = {GROUP: (_group(enabled=True), disk)}
    files = peerfiles.PeerFiles(endpoint=None, on_ready=Ready())
    published = await files.publish(units, placements, _outcomes(units, _downloaded()))
    assert [m["digest"] for m in published["peer"]["models"]] == [computed.digest]
    assert files.stats().queued == 0

    filelists.remove(disk.root, KEY)
    restarted = peerfiles.PeerFiles(endpoint=None, on_ready=Ready())
    published = await restarted.publish(units, placements, _outcomes(units, _downloaded()))
    assert published == {"peer": {"models": []}}
    assert restarted.stats().queued == 1


async def test_cancelling_the_worker_stops_and_awaits_the_hashing_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = _disk(tmp_path)
    started, finished = threading.Event(), threading.Event()

    def slow(
        folder: Path,
        storage_key: str,
        *,
        uri: str,
        staged: object = (),
        unchecked: bool = False,
        stop: Callable[[], bool],
        known: object = None,
    ) -> peer.PeerManifest:
        started.set()
        try:
            while not stop():
                threading.Event().wait(0.01)
            raise digest.Stopped(str(folder))
        finally:
            finished.set()

    monkeypatch.setattr(filelists, "compute", slow)
    files = peerfiles.PeerFiles(endpoint=None, on_ready=Ready())
    units = _units("a")
    placements = {GROUP: (_group(enabled=True), disk)}
    await files.publish(units, placements, _outcomes(units, _downloaded()))
    worker = asyncio.create_task(files.run(), name="peer-files worker")
    await wait_until(started.is_set, timeout=10, what="the hashing thread started")
    worker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await worker
    assert finished.is_set()  # the thread had ended when the worker's cancellation returned


def test_lookup_gives_a_requester_the_folder_its_scope_proved(tmp_path: Path) -> None:
    disk = _disk(tmp_path)
    variant = "c" * 16
    folder = layout.folder_name(KEY, variant)
    disk.model_path(KEY, variant).mkdir()
    (disk.model_path(KEY, variant) / "model.bin").write_bytes(b"other weights")
    stamp = filelists.Stamp("j", "t")
    served = []
    for name, scope in ((KEY, "a" * 64), (folder, "b" * 64)):
        manifest = filelists.compute(disk.models / name, KEY)
        filelists.write(disk.root, filelists.FileList(name, stamp, manifest, (scope,)))
        served.append(
            peersource.Served(
                disk.root, name, KEY, manifest.digest, manifest.bytes, (scope,), stamp
            )
        )
    index = peersource.PeerFolders()
    index.replace(reversed(served))
    assert (found := index.lookup(KEY)) is not None
    assert found.path == disk.model_path(KEY)
    assert (found := index.lookup(KEY, "b" * 64)) is not None
    assert found.path == disk.model_path(KEY, variant)
    assert found.manifest.digest == served[1].digest
    assert index.lookup(KEY, "d" * 64) is None
    assert index.lookup("f" * 16) is None
    index.replace(served[:1])
    assert index.lookup(KEY, "b" * 64) is None
