"""An agent serving several models roots, on the real control plane: a node group's PV path
edited from root A to root B keeps (and reports) the models at A and downloads at B; and
KServe's sample node group (PV `local.path: /models`) is served when `/models` is a root."""

from __future__ import annotations

from pathlib import Path

import pytest

from localcache.agent.disk import folders, roots
from localcache.caching import keys
from localcache.devenv.waiting import wait_until
from tests.integration.agent.harness import LMNG, URI, Agent, Obj, entry

pytestmark = pytest.mark.kcm

KEY = keys.storage_key(URI)
FILES = {"model.bin": b"weights" * 10, "config.json": b"{}"}


async def _events(agent: Agent, reason: str) -> list[Obj]:
    found = await agent.rest(
        "GET", f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{agent.node}"
    )
    return [e for e in found["items"] if e["reason"] == reason]


async def _download(agent: Agent, job: Obj, on: folders.ModelDisk) -> None:
    staging = on.staging_path(KEY, job["metadata"]["name"])
    for name, data in FILES.items():
        (staging / name).write_bytes(data)
    await agent.finish(job, succeed=True)


async def test_path_edit_keeps_models_at_the_old_root_and_downloads_at_the_new(
    agent: Agent, tmp_path: Path
) -> None:
    other = tmp_path / "root-b"
    other.mkdir()
    a, b = folders.ModelDisk(agent.root), folders.ModelDisk(other)
    await agent.start(
        models_roots=(roots.Root(str(agent.root), agent.root), roots.Root(str(other), other))
    )
    await agent.set_models([entry("iris", group=agent.group)])
    [first] = await agent.wait_jobs(1)
    await _download(agent, first, a)
    await agent.wait_status({"iris": "ModelDownloaded"})
    assert a.is_complete(KEY)

    path = LMNG.path(name=agent.group)
    await agent.patch(path, {"spec": {"persistentVolumeSpec": {"hostPath": {"path": str(other)}}}})
    [_, second] = await agent.wait_jobs(2)
    assert b.staging_path(KEY, second["metadata"]["name"]).is_dir(), "downloads at B"
    await _download(agent, second, b)

    async def promoted_at_b() -> bool:
        return b.is_complete(KEY) and await agent.model_status() == {"iris": "ModelDownloaded"}

    await wait_until(promoted_at_b, timeout=30, what="iris promoted at root B and Downloaded")
    done = agent.reconciles()
    await agent.poke()
    await agent.reconciled(done + 1)
    assert a.is_complete(KEY), "the model at the old path A is kept"
    assert a.list_model_folders() == [KEY]
    [kept] = await _events(agent, "ModelFoldersKept")
    assert kept["type"] == "Warning"
    assert str(agent.root) in kept["message"]
    assert KEY in kept["message"]


async def test_kserve_sample_node_group_on_models_is_served(agent: Agent, tmp_path: Path) -> None:
    """KServe v0.20's docs/samples/localmodelcache node group, unchanged but for its name
    and node selector: PV `local.path: /models`, served on the root whose host path is
    /models (here mounted at a temporary folder)."""
    mounted = tmp_path / "kserve-models"
    mounted.mkdir()
    served = folders.ModelDisk(mounted, host_path="/models")
    await agent.start(
        models_roots=(
            roots.Root(str(agent.root), agent.root),
            roots.Root("/models", mounted),
        )
    )
    group = f"workers-{agent.node}"
    sample = {
        "apiVersion": LMNG.api_version,
        "kind": LMNG.kind,
        "metadata": {"name": group},
        "spec": {
            "storageLimit": "100Gi",
            "persistentVolumeClaimSpec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "100Gi"}},
                "storageClassName": "local-storage",
            },
            "persistentVolumeSpec": {
                "accessModes": ["ReadWriteOnce"],
                "capacity": {"storage": "100Gi"},
                "local": {"path": "/models"},
                "storageClassName": "local-storage",
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "node-type", "operator": "In", "values": ["gpu"]}
                                ]
                            }
                        ]
                    }
                },
            },
        },
    }
    await agent.create(LMNG.path(), sample, cleanup=True)
    await agent.set_models([entry("llama", group=group)])
    [job] = await agent.wait_jobs(1)
    await _download(agent, job, served)
    await agent.wait_status({"llama": "ModelDownloaded"})
    assert served.is_complete(KEY)
    assert folders.ModelDisk(agent.root).list_model_folders() == []


async def test_a_uri_on_groups_of_two_roots_is_on_both_before_either_reports_it(
    agent: Agent, tmp_path: Path
) -> None:
    """Issue 20 (seen on real pods): two caches of one URI on groups whose PVs lie on two
    roots were one download onto the first root, both reported ModelDownloaded, and the other
    group's pods mounted an empty folder."""
    other = tmp_path / "root-b"
    other.mkdir()
    a, b = folders.ModelDisk(agent.root), folders.ModelDisk(other)
    await agent.start(
        models_roots=(roots.Root(str(agent.root), agent.root), roots.Root(str(other), other))
    )
    second_group = await agent.node_group(f"{agent.group}-b", path=str(other))
    await agent.set_models([entry("on-a", group=agent.group), entry("on-b", group=second_group)])
    jobs = await agent.wait_jobs(2)
    staged = {
        disk: disk.staging_path(KEY, job["metadata"]["name"])
        for job in jobs
        for disk in (a, b)
        if disk.staging_path(KEY, job["metadata"]["name"]).is_dir()
    }
    assert set(staged) == {a, b}, "one download per root"
    for job in jobs:
        disk = a if a.staging_path(KEY, job["metadata"]["name"]).is_dir() else b
        status = await agent.model_status()
        assert "ModelDownloaded" not in status.values(), status
        await _download(agent, job, disk)
    await agent.wait_status({"on-a": "ModelDownloaded", "on-b": "ModelDownloaded"})
    assert a.is_complete(KEY)
    assert b.is_complete(KEY)


async def test_a_cache_on_a_group_the_agent_cannot_serve_leaves_other_caches_of_its_uri_alone(
    agent: Agent,
) -> None:
    """Issue 20 (seen on real pods): one cache's group error became the error of every other
    cache of the same URI, of another tenant and on a good group."""
    await agent.start()
    await agent.set_models(
        [entry("broken", group="no-such-group"), entry("fine", group=agent.group)]
    )
    [job] = await agent.wait_jobs(1)
    progress = (await agent.node_status()).get("modelProgress") or {}
    assert "no-such-group" not in str(progress.get("fine") or {}), progress
    await _download(agent, job, folders.ModelDisk(agent.root))

    async def fine_downloaded() -> bool:
        status = await agent.model_status()
        return status.get("fine") == "ModelDownloaded"

    await wait_until(fine_downloaded, timeout=30, what="the cache on the good group downloaded")
