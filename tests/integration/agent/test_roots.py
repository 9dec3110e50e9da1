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
