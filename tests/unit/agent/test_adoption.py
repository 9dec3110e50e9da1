"""Adoption of model folders KServe's add-on downloaded (`agent.adoption`): the folder is
adopted, without a Job, only when every condition holds; otherwise the agent downloads as it
always did. The disk side (`ModelDisk.adopt`) normalises like a promotion and writes the
manifest, or refuses and writes nothing."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from localcache.agent import adoption, downloads, reconciler, report
from localcache.agent.disk import folders, layout, roots
from localcache.api import modelnode
from localcache.caching import keys
from localcache.runtime import keys as rkeys
from localcache.runtime import metrics
from tests.unit.agent.test_reconciler import KEY, NODE, NS, URI, World, _entry

Obj = dict[str, Any]
OTHER_URI = "s3://mybucket/other"
OTHER_KEY = keys.storage_key(OTHER_URI)
FILES = {"weights.bin": b"w" * 100, "sub/config.json": b"{}"}


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def kserve_folder(on: folders.ModelDisk, key: str = KEY, files: dict[str, bytes] = FILES) -> Path:
    """A folder as KServe's download Job left it: files written straight into models/<key>,
    no manifest."""
    folder = on.models / key
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return folder


def kserve_status(world: World, model_status: dict[str, str], **extra: Any) -> None:
    """The LocalModelNode's status as KServe's agent (or an earlier run) wrote it."""
    node = world.stores["nodes"].get(rkeys.ObjectKey("", NODE))
    assert node is not None
    world.stores["nodes"].upsert({**node, "status": {"modelStatus": model_status, **extra}})


def restart(world: World) -> None:
    """A new agent process on the same stores, API and disk (nothing in memory kept)."""
    world.rec = reconciler.Reconciler(
        node_name=NODE,
        api=world.api,
        disk=world.disks,
        stores=reconciler.Stores(**{k: v.view() for k, v in world.stores.items()}),
        agent_metrics=report.AgentMetrics(metrics.Metrics()),
        config_namespace="kserve",
        clock=world.clock,
        wall_clock=lambda: world.now,
    )


def _events(world: World, reason: str) -> list[Obj]:
    return [e for e in world.api.events() if e["reason"] == reason]


async def test_folder_kserve_reported_downloaded_is_adopted_without_a_job(world: World) -> None:
    world.models(_entry(nodeGroup="gpu"))
    kserve_status(world, {"iris": "ModelDownloaded"})
    folder = kserve_folder(world.disk)
    os.chmod(folder / "weights.bin", 0o666)

    await world.reconcile()

    assert world.api.jobs() == []
    manifest = world.disk.manifest(KEY)
    assert manifest is not None
    assert manifest.adopted
    assert (manifest.uri, manifest.bytes) == (URI, 102)
    [unit] = downloads.units([_info("iris", nodeGroup="gpu")], node_name=NODE, job_namespace=NS)
    assert manifest.job == unit.tag
    assert world.disk.is_complete(KEY)
    assert stat.S_IMODE(os.lstat(folder / "weights.bin").st_mode) == layout.FILE_MODE
    status = world.status()
    assert status["modelStatus"] == {"iris": "ModelDownloaded"}
    assert status["modelProgress"]["iris"]["bytesOnDisk"] == 102
    assert "jobName" not in status["modelProgress"]["iris"]
    assert "downloadJobs" not in status
    [event] = _events(world, "ModelFolderAdopted")
    assert event["type"] == "Normal"
    assert "iris" in event["message"]
    assert _events(world, "ModelDownloaded") == [], "it was downloaded already"

    await world.reconcile()  # the adopted manifest is reused: still no Job
    assert world.api.jobs() == []
    assert len(_events(world, "ModelFolderAdopted")) == 1


@pytest.mark.parametrize(
    "state", ["ModelDownloading", "ModelDownloadPending", "ModelDownloadError"]
)
async def test_folder_is_not_adopted_unless_status_says_downloaded(
    world: World, state: str
) -> None:
    world.models(_entry(nodeGroup="gpu"))
    kserve_status(world, {"iris": state})
    kserve_folder(world.disk)
    await world.reconcile()
    assert len(world.api.jobs()) == 1
    assert world.disk.manifest(KEY) is None
    assert world.status()["modelStatus"] == {"iris": "ModelDownloadPending"}
    assert _events(world, "ModelFolderAdopted") == []


async def test_downloaded_status_of_another_entry_adopts_nothing(world: World) -> None:
    world.models(_entry(nodeGroup="gpu"), _entry("other", OTHER_URI, nodeGroup="gpu"))
    kserve_status(world, {"other": "ModelDownloaded"})
    kserve_folder(world.disk)  # iris's folder; other's storage key differs
    await world.reconcile()
    names = [j["metadata"]["name"] for j in world.api.jobs()]
    assert [n for n in names if n.startswith(f"lmd-{KEY}-")], "iris downloads again"
    assert world.disk.manifest(KEY) is None
    assert _events(world, "ModelFolderAdopted") == []


def test_evidence_is_the_first_read_and_follows_no_spec_edit() -> None:
    adoptions = adoption.Adoptions(node_name=NODE, reporter=None)  # type: ignore[arg-type]
    first = _node(_entry(), _entry("other", OTHER_URI))
    adoptions.observe(first, {"modelStatus": {"iris": "ModelDownloaded", "other": "Nope"}})
    [iris] = downloads.units(first.spec.local_models[:1], node_name=NODE, job_namespace=NS)
    assert adoptions.claims(iris) == ["iris"]

    adoptions.observe(first, {"modelStatus": {"other": "ModelDownloaded"}})  # not a first read
    [other] = downloads.units(first.spec.local_models[1:], node_name=NODE, job_namespace=NS)
    assert adoptions.claims(other) == []

    adoptions.observe(_node(_entry(uri=OTHER_URI)), None)  # iris now names another URI
    adoptions.observe(first, None)  # ... and back: the evidence is gone for good
    assert adoptions.claims(iris) == []


def _node(*entries: Obj) -> modelnode.LocalModelNode:
    return modelnode.LocalModelNode.model_validate(
        {"metadata": {"name": NODE}, "spec": {"localModels": list(entries)}}
    )


async def test_evidence_outlives_a_pass_that_could_not_place_the_unit(tmp_path: Path) -> None:
    a = folders.ModelDisk(tmp_path / "a", host_path="/mnt/models")
    b = folders.ModelDisk(tmp_path / "b", host_path="/models")
    two = World(tmp_path, disks=roots.Disks([a, b]))
    two.group("gpu", "/nowhere")
    two.models(_entry(nodeGroup="gpu"))
    kserve_status(two, {"iris": "ModelDownloaded"})
    kserve_folder(a)
    await two.reconcile()
    assert two.status()["modelStatus"] == {"iris": "ModelDownloadError"}
    two.group("gpu", "/mnt/models")
    await two.reconcile()
    assert two.api.jobs() == []
    assert two.status()["modelStatus"] == {"iris": "ModelDownloaded"}
    assert a.is_complete(KEY)


async def test_only_the_status_first_read_is_evidence(world: World) -> None:
    world.models()
    await world.reconcile()  # first read: no entry, no evidence
    world.models(_entry(nodeGroup="gpu"))
    kserve_status(world, {"iris": "ModelDownloaded"})
    kserve_folder(world.disk)
    await world.reconcile()
    assert len(world.api.jobs()) == 1
    assert world.disk.manifest(KEY) is None


async def test_symlinked_folder_is_not_adopted(world: World, tmp_path: Path) -> None:
    world.models(_entry(nodeGroup="gpu"))
    kserve_status(world, {"iris": "ModelDownloaded"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "weights.bin").write_bytes(b"w")
    world.disk.ensure_layout()
    (world.disk.models / KEY).symlink_to(elsewhere)
    await world.reconcile()
    assert len(world.api.jobs()) == 1
    assert world.disk.manifest(KEY) is None


async def test_missing_or_empty_folder_is_not_adopted(world: World) -> None:
    world.models(_entry(nodeGroup="gpu"), _entry("other", OTHER_URI, nodeGroup="gpu"))
    kserve_status(world, {"iris": "ModelDownloaded", "other": "ModelDownloaded"})
    world.disk.ensure_layout()
    (world.disk.models / KEY).mkdir()  # empty; OTHER_KEY's folder is missing
    await world.reconcile()
    assert len(world.api.jobs()) == 2
    assert world.disk.manifest(KEY) is None
    assert world.status()["modelStatus"] == {
        "iris": "ModelDownloadPending",
        "other": "ModelDownloadPending",
    }


async def test_unreadable_manifest_blocks_adoption(world: World) -> None:
    world.models(_entry(nodeGroup="gpu"))
    kserve_status(world, {"iris": "ModelDownloaded"})
    kserve_folder(world.disk)
    world.disk.ensure_layout()
    (world.disk.manifests / f"{KEY}.json").write_text("{broken")
    await world.reconcile()
    assert len(world.api.jobs()) == 1
    assert (world.disk.manifests / f"{KEY}.json").read_text() == "{broken"


async def test_live_job_of_ours_for_the_key_blocks_adoption(world: World) -> None:
    world.models(_entry(nodeGroup="gpu"))
    await world.reconcile()
    [job] = world.api.jobs()
    world.job_seen(job, active=1)
    # A restarted agent reads ModelDownloaded (a lost write, say) while our Job still runs.
    node = world.stores["nodes"].get(rkeys.ObjectKey("", NODE))
    assert node is not None
    kserve_status(world, {"iris": "ModelDownloaded"}, downloadJobs=node["status"]["downloadJobs"])
    kserve_folder(world.disk)
    restart(world)
    await world.reconcile()
    assert len(world.api.jobs()) == 1, "the running Job is followed"
    assert world.disk.manifest(KEY) is None
    assert world.status()["modelStatus"] == {"iris": "ModelDownloadPending"}


async def test_adoption_happens_on_the_root_serving_the_group(tmp_path: Path) -> None:
    a = folders.ModelDisk(tmp_path / "a", host_path="/mnt/models")
    b = folders.ModelDisk(tmp_path / "b", host_path="/models")
    two = World(tmp_path, disks=roots.Disks([a, b]))
    two.group("other", "/models")
    two.models(_entry(nodeGroup="other"), _entry("twin", OTHER_URI, nodeGroup="gpu"))
    kserve_status(two, {"iris": "ModelDownloaded", "twin": "ModelDownloaded"})
    kserve_folder(a, KEY)  # iris is served on b: its folder on a is not evidence of anything
    kserve_folder(a, OTHER_KEY)
    await two.reconcile()
    [job] = two.api.jobs()
    assert job["metadata"]["name"].startswith(f"lmd-{KEY}-")
    assert b.manifest(KEY) is None
    assert a.manifest(OTHER_KEY) is not None


# ---- the disk side ----------------------------------------------------------------------------
def _adopt(on: folders.ModelDisk, key: str = KEY) -> layout.Adoption:
    return on.adopt(key, uri=URI, job="lmd-tag", completed_at="2026-03-01T10:00:00Z")


@pytest.fixture
def root(tmp_path: Path) -> folders.ModelDisk:
    on = folders.ModelDisk(tmp_path / "root")
    on.ensure_layout()
    return on


def test_adopt_normalises_like_a_promotion_and_writes_the_manifest(
    root: folders.ModelDisk, tmp_path: Path
) -> None:
    folder = kserve_folder(root)
    os.chmod(folder / "weights.bin", 0o4777)
    os.chmod(folder / "sub", 0o777)
    os.mkfifo(folder / "pipe")
    (folder / "escape").symlink_to(tmp_path)
    (folder / "absolute").symlink_to("/etc/passwd")
    (folder / "inside").symlink_to("sub/config.json")

    done = _adopt(root)

    assert done.refused == ""
    assert done.manifest is not None
    assert stat.S_IMODE(os.lstat(folder / "weights.bin").st_mode) == layout.FILE_MODE
    assert stat.S_IMODE(os.lstat(folder / "sub").st_mode) == layout.DIR_MODE
    assert sorted(p.name for p in folder.iterdir()) == ["inside", "sub", "weights.bin"]
    written = json.loads((root.manifests / f"{KEY}.json").read_text())
    assert written == {
        "storageKey": KEY,
        "uri": URI,
        "bytes": 102,
        "completedAt": "2026-03-01T10:00:00Z",
        "job": "lmd-tag",
        "adopted": True,
        "originUnchecked": True,  # KServe read it by ranges: no origin checksum was checked
    }
    assert root.manifest(KEY) == done.manifest
    assert root.is_complete(KEY)
    assert [p.name for p in root.manifests.iterdir()] == [f"{KEY}.json"], "no temp file left"


def test_adopt_tolerates_modes_it_cannot_change(
    root: folders.ModelDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = kserve_folder(root)
    os.chmod(folder / "weights.bin", 0o600)
    chmod = os.chmod

    def foreign(path: Any, mode: int, **kw: Any) -> None:
        if str(path).endswith("weights.bin"):
            raise PermissionError(1, "Operation not permitted", str(path))
        chmod(path, mode, **kw)

    monkeypatch.setattr(os, "chmod", foreign)
    done = _adopt(root)
    assert done.manifest is not None
    assert done.modes_not_fixed == (str(folder / "weights.bin"),)
    assert root.is_complete(KEY)


def test_adopt_refuses_what_it_cannot_clean(
    root: folders.ModelDisk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = kserve_folder(root)
    (folder / "escape").symlink_to(tmp_path)
    unlink = os.unlink

    def stuck(path: Any, **kw: Any) -> None:
        if str(path).endswith("escape"):
            raise PermissionError(13, "Permission denied", str(path))
        unlink(path, **kw)

    monkeypatch.setattr(os, "unlink", stuck)
    done = _adopt(root)
    assert done.manifest is None
    assert "escape" in done.refused
    assert root.manifest(KEY) is None


def test_promote_still_fails_on_an_entry_it_cannot_remove(
    root: folders.ModelDisk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tree.normalise` now reports instead of raising; promotion keeps failing for it."""
    staging = root.prepare_staging(KEY, "lmd-job")
    (staging / "m.bin").write_bytes(b"m")
    (staging / "escape").symlink_to(tmp_path)
    unlink = os.unlink

    def stuck(path: Any, **kw: Any) -> None:
        if str(path).endswith("escape"):
            raise PermissionError(13, "Permission denied", str(path))
        unlink(path, **kw)

    monkeypatch.setattr(os, "unlink", stuck)
    manifest = layout.Manifest(storage_key=KEY, uri=URI, bytes=1, completed_at="t", job="lmd-job")
    with pytest.raises(layout.DiskError, match="could not remove"):
        root.promote(staging, KEY, manifest)
    assert not root.is_complete(KEY)


def test_adopt_refuses_an_unreadable_directory(
    root: folders.ModelDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = kserve_folder(root)
    scandir = os.scandir

    def closed(path: Any) -> Any:
        if str(path).endswith("sub"):
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", closed)
    done = _adopt(root)
    assert done.manifest is None
    assert str(folder / "sub") in done.refused
    assert root.manifest(KEY) is None


@pytest.mark.parametrize(
    "case", ["missing", "symlink", "file", "empty", "empty-chain", "manifest", "record"]
)
def test_adopt_refuses_and_writes_nothing(
    root: folders.ModelDisk, tmp_path: Path, case: str
) -> None:
    folder = root.models / KEY
    if case == "symlink":
        (tmp_path / "real").mkdir()
        (tmp_path / "real" / "f").write_bytes(b"x")
        folder.symlink_to(tmp_path / "real")
    elif case == "file":
        folder.write_bytes(b"x")
    elif case == "empty":
        folder.mkdir()
    elif case == "empty-chain":  # what the kubelet makes for a subPath below a missing folder
        (folder / "a" / "b").mkdir(parents=True)
    elif case != "missing":
        kserve_folder(root)
        suffix = layout.MANIFEST_SUFFIX if case == "manifest" else layout.RECORD_SUFFIX
        (root.manifests / f"{KEY}{suffix}").write_text("{}")
    before = sorted(p.name for p in root.manifests.iterdir())
    done = _adopt(root)
    assert done.manifest is None
    assert done.refused
    assert sorted(p.name for p in root.manifests.iterdir()) == before


# ---- records and pure rules -------------------------------------------------------------------
def test_manifests_of_earlier_versions_read_as_not_adopted() -> None:
    old = {"storageKey": KEY, "uri": URI, "bytes": 1, "completedAt": "t", "job": "j"}
    manifest = layout.Manifest.from_json(old)
    assert not manifest.adopted
    assert manifest.to_json() == old, "a manifest that is not adopted is written as before"


def test_adopted_manifest_is_reused_by_its_scope_only() -> None:
    units = downloads.units(
        [
            _info("open"),
            _info("private", serviceAccountName="sa", namespace="team"),
        ],
        node_name=NODE,
        job_namespace=NS,
    )
    open_unit, private = units
    assert open_unit.reuses(open_unit.tag)
    assert private.reuses(open_unit.tag), "a download that needed no credentials is shared"
    assert private.reuses(private.tag)
    assert not open_unit.reuses(private.tag)


def test_job_live_reads_the_storage_key_from_job_names() -> None:
    [unit] = downloads.units([_info("iris")], node_name=NODE, job_namespace=NS)
    name = f"{unit.tag}-0-abcdefgh"
    assert adoption.job_live(KEY, [name])
    assert not adoption.job_live(OTHER_KEY, [name])
    assert not adoption.job_live(KEY, ["someone-elses-job"])


def _info(name: str, **extra: Any) -> modelnode.LocalModelInfo:
    return modelnode.LocalModelInfo.model_validate(_entry(name, **extra))
