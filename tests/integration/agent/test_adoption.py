"""Migration from KServe's localmodel add-on, on the real control plane: a model folder that
KServe's agent downloaded (no manifest) and reported `ModelDownloaded` before this agent
starts is adopted without a Job; reported in any other state, it is downloaded again."""

from __future__ import annotations

from localcache.caching import keys
from tests.integration.agent.harness import LMN, MERGE, URI, Agent, Obj, entry, eventually

KEY = keys.storage_key(URI)
FILES = {"model.bin": b"weights" * 10, "sub/config.json": b"{}"}


async def _events(agent: Agent, reason: str) -> list[Obj]:
    found = await agent.rest(
        "GET", f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{agent.node}"
    )
    return [e for e in found["items"] if e["reason"] == reason]


async def _as_kserve_left_it(agent: Agent, state: str) -> None:
    """The LocalModelNode, its status and the folder as KServe's agent left them: files
    written straight into models/<key>, no manifest, `state` in modelStatus."""
    await agent.set_models([entry("iris", group=agent.group)])
    body = {"status": {"modelStatus": {"iris": state}}}
    await agent.rest("PATCH", f"{LMN.path(name=agent.node)}/status", body, content_type=MERGE)
    folder = agent.root / "models" / KEY
    for name, data in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


async def test_folder_kserve_downloaded_is_adopted_without_a_job(agent: Agent) -> None:
    await _as_kserve_left_it(agent, "ModelDownloaded")
    await agent.start()

    async def adopted() -> list[Obj] | None:
        return await _events(agent, "ModelFolderAdopted") or None

    [event] = await eventually(adopted, what="a ModelFolderAdopted Event")
    assert event["type"] == "Normal"
    assert "iris" in event["message"]

    async def reported() -> Obj | None:
        status = await agent.node_status()
        progress = (status.get("modelProgress") or {}).get("iris") or {}
        return status if progress.get("bytesOnDisk") == 72 else None

    status = await eventually(reported, what=f"LocalModelNode {agent.node} reports iris's bytes")
    assert status["modelStatus"] == {"iris": "ModelDownloaded"}
    assert not status.get("downloadJobs")
    manifest = agent.disk.manifest(KEY)
    assert manifest is not None
    assert manifest.adopted
    assert agent.disk.is_complete(KEY)

    done = agent.reconciles()
    await agent.poke()
    await agent.reconciled(done + 1)
    assert await agent.jobs() == []
    assert agent.metric("localcache_agent_downloads_started_total") == 0
    assert await agent.model_status() == {"iris": "ModelDownloaded"}
    assert await _events(agent, "ModelDownloaded") == [], "nothing was downloaded"


async def test_folder_kserve_was_still_downloading_is_downloaded_again(agent: Agent) -> None:
    await _as_kserve_left_it(agent, "ModelDownloading")
    await agent.start()
    [job] = await agent.wait_jobs(1)
    assert job["metadata"]["name"].startswith(f"lmd-{KEY}-")
    await agent.wait_status({"iris": "ModelDownloadPending"})
    assert agent.disk.manifest(KEY) is None
    assert await _events(agent, "ModelFolderAdopted") == []
