"""Peer file lists on the real control plane: with `spec.peerDistribution.enabled` on the
node group, a downloaded model appears in `status.peer.models` (digest of its folder, scope
of the Job that downloaded it) after the Downloaded status; with it off, `status.peer` stays
unset and no file list is written. The `s3://` model's origin Job is a seed: its checksum
sidecar's record (here: the origin stores none) is what lets its copy be served; without the
sidecar (an agent without a peer image) the copy is `origin-unchecked`."""

from __future__ import annotations

import pytest

from localcache.agent import peering
from localcache.agent.disk import digest, filelists, layout
from localcache.api import originpaths
from localcache.caching import keys
from tests.integration.agent.harness import LMNG, URI, Agent, Obj, entry, eventually

pytestmark = pytest.mark.kcm

KEY = keys.storage_key(URI)
FILES = {"model.bin": b"weights" * 10, "config.json": b"{}"}
RECORD = {originpaths.STAGED_SUMS: originpaths.StagedSums(sha256={}).model_dump_json().encode()}
SEEDING = peering.PeerSettings(image="localcache:peer-test")


async def _downloaded(agent: Agent, files: dict[str, bytes] = FILES | RECORD) -> Obj:
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)
    await agent.finish(job, succeed=True, files=files)
    return await agent.wait_status({"iris": "ModelDownloaded"})


async def test_downloaded_model_is_published_to_peers_when_enabled(agent: Agent) -> None:
    await agent.patch(
        LMNG.path(name=agent.group), {"spec": {"peerDistribution": {"enabled": True}}}
    )
    await agent.start(peer_port=8476, pod_ip="10.1.2.3", peer=SEEDING)
    await _downloaded(agent)
    manifest = agent.disk.manifest(KEY)
    assert manifest is not None

    async def published() -> Obj | None:
        peer = (await agent.node_status()).get("peer") or {}
        return peer if peer.get("models") else None

    peer = await eventually(published, what=f"{agent.node} lists {KEY} in status.peer.models")
    assert peer["endpoint"] == "https://10.1.2.3:8476"
    [model] = peer["models"]
    [record] = (await agent.node_status())["downloadJobs"]
    assert model == {
        "storageKey": KEY,
        "digest": digest.tree_digest(agent.disk.model_path(KEY)),
        "scopes": [record["scope"]],
        "bytes": manifest.bytes,
    }
    assert len(record["scope"]) == 64
    stored = filelists.current(agent.root, KEY, manifest)
    assert stored is not None
    assert stored.manifest.digest == model["digest"]

    await agent.set_models([])
    await agent.wait_status({})

    async def unpublished() -> bool | None:
        listed = ((await agent.node_status()).get("peer") or {}).get("models")
        return True if not filelists.path(agent.root, KEY).exists() and not listed else None

    await eventually(unpublished, what="the file list and status.peer.models gone with the folder")


async def test_a_download_in_progress_is_published_incomplete_then_complete(agent: Agent) -> None:
    await agent.patch(
        LMNG.path(name=agent.group), {"spec": {"peerDistribution": {"enabled": True}}}
    )
    await agent.start(peer_port=8476, pod_ip="10.1.2.3", peer=SEEDING)
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)

    async def listed() -> list[Obj] | None:
        models = ((await agent.node_status()).get("peer") or {}).get("models")
        return list(models) if models else None

    [partial] = await eventually(listed, what=f"{agent.node} lists {KEY} while downloading")
    [record] = (await agent.node_status())["downloadJobs"]
    assert partial == {
        "storageKey": KEY,
        "complete": False,
        "scopes": [record["scope"]],
        "bytes": 0,
    }
    await agent.finish(job, succeed=True, files=FILES | RECORD)
    await agent.wait_status({"iris": "ModelDownloaded"})

    async def completed() -> list[Obj] | None:
        models = await listed()
        return models if models and "complete" not in models[0] else None

    [model] = await eventually(completed, what=f"{agent.node} lists {KEY} complete")
    assert model["digest"] == digest.tree_digest(agent.disk.model_path(KEY))


async def test_an_origin_copy_no_sidecar_checked_is_never_published(agent: Agent) -> None:
    """No peer image: the origin Job has no checksum sidecar, so nothing compared the bytes
    with the checksums the origin stores (boto3 does not for an object it reads by ranges)."""
    await agent.patch(
        LMNG.path(name=agent.group), {"spec": {"peerDistribution": {"enabled": True}}}
    )
    await agent.start(peer_port=8476, pod_ip="10.1.2.3")
    await _downloaded(agent, FILES)

    async def refused() -> Obj | None:
        peer = (await agent.node_status()).get("peer") or {}
        return peer if peer.get("unservable") else None

    peer = await eventually(refused, what=f"{agent.node} lists {KEY} in status.peer.unservable")
    assert peer["unservable"] == [{"storageKey": KEY, "reason": "origin-unchecked"}]
    assert not peer.get("models")
    manifest = agent.disk.manifest(KEY)
    assert manifest is not None
    assert manifest.origin_unchecked


async def test_nothing_is_published_or_hashed_when_disabled(agent: Agent) -> None:
    await agent.patch(
        LMNG.path(name=agent.group), {"spec": {"peerDistribution": {"enabled": False}}}
    )  # on by default
    await agent.start(peer_port=8476, pod_ip="10.1.2.3")
    await _downloaded(agent)
    before = agent.reconciles()  # counted before the poke: its reconcile may finish at once
    await agent.poke()
    await agent.reconciled(before + 1)
    status = await agent.node_status()
    assert "peer" not in status
    names = sorted(p.name for p in (agent.root / layout.MANIFESTS_DIR).iterdir())
    assert not [n for n in names if n.endswith(layout.FILES_SUFFIX)], names
