"""Sharing downloads between entries (spec §5, issue 20): a download is reused within its
credential scope, and across scopes only when the content is the same (a tenant's download,
run in its own namespace, is never the open copy); a credential-needing entry never rides on
another scope's download; a ServiceAccount is looked up only in the entry's own namespace."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from localcache.agent import downloads
from localcache.agent.disk import layout
from localcache.caching import keys
from tests.integration.agent.harness import URI, Agent, entry

pytestmark = pytest.mark.kcm

KEY = keys.storage_key(URI)
FILES = {"model.bin": b"0123456789"}


async def _service_account(agent: Agent, namespace: str, name: str) -> None:
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
    await agent.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", account)


async def test_a_tenants_download_without_credentials_is_shared_only_when_the_same(
    agent: Agent, other_namespace: Callable[[], str]
) -> None:
    """Security review finding 3: a namespace cache's download runs in the tenant's
    namespace, where the tenant may write its bytes, so it is never the open copy: the cluster
    cache runs its own Job, and the two share one folder because the content is the same."""
    tenant = other_namespace()
    await agent.start()
    await agent.set_models(
        [
            entry("tenant-iris", group=agent.group, namespace=tenant),
            entry("cluster-iris", group=agent.group),
        ]
    )
    jobs = await agent.wait_jobs(2)
    assert {j["metadata"]["namespace"] for j in jobs} == {tenant, agent.namespace}
    for job in jobs:
        await agent.finish(job, succeed=True, files=FILES)
    status = await agent.wait_status(
        {"cluster-iris": "ModelDownloaded", f"{tenant}/tenant-iris": "ModelDownloaded"}
    )
    assert agent.disk.list_model_folders() == [KEY]
    progress = status["modelProgress"]
    assert "folder" not in progress["cluster-iris"]
    assert "folder" not in progress[f"{tenant}/tenant-iris"]


async def test_a_tenants_different_bytes_never_reach_the_cluster_cache(
    agent: Agent, other_namespace: Callable[[], str]
) -> None:
    """The tenant's download finishes first with bytes of its own; the cluster cache's
    download of the same URI differs, so it becomes that scope's own folder variant, and the
    status says which folder serves it."""
    tenant = other_namespace()
    await agent.start()
    await agent.set_models([entry("tenant-iris", group=agent.group, namespace=tenant)])
    [forged] = await agent.wait_jobs(1, tenant)
    await agent.finish(forged, succeed=True, files={"model.bin": b"attacker bytes"})
    await agent.wait_status({f"{tenant}/tenant-iris": "ModelDownloaded"})

    await agent.set_models(
        [
            entry("tenant-iris", group=agent.group, namespace=tenant),
            entry("cluster-iris", group=agent.group),
        ]
    )
    [own] = await agent.wait_jobs(1, agent.namespace)
    await agent.finish(own, succeed=True, files=FILES)
    status = await agent.wait_status(
        {"cluster-iris": "ModelDownloaded", f"{tenant}/tenant-iris": "ModelDownloaded"}
    )
    variant = layout.variant_of_scope(downloads.scope_id(None))
    assert status["modelProgress"]["cluster-iris"]["folder"] == f"{KEY}.{variant}"
    assert (agent.disk.model_path(KEY, variant) / "model.bin").read_bytes() == FILES["model.bin"]
    assert (agent.disk.model_path(KEY) / "model.bin").read_bytes() == b"attacker bytes"
    assert "folder" not in status["modelProgress"][f"{tenant}/tenant-iris"]


async def test_namespace_entry_service_account_is_not_looked_up_elsewhere(
    agent: Agent, other_namespace: Callable[[], str]
) -> None:
    """The ServiceAccount exists in jobNamespace and another namespace, not in the entry's."""
    tenant, elsewhere = other_namespace(), other_namespace()
    await _service_account(agent, agent.namespace, "downloader")
    await _service_account(agent, elsewhere, "downloader")
    await agent.start()
    await agent.set_models(
        [entry("iris", group=agent.group, namespace=tenant, serviceAccountName="downloader")]
    )
    status = await agent.wait_status({f"{tenant}/iris": "ModelDownloadError"})
    message = status["modelProgress"][f"{tenant}/iris"]["message"]
    assert f"ServiceAccount {tenant}/downloader not found in namespace {tenant}" in message
    assert await agent.jobs() == []


async def test_credential_scope_does_not_reuse_another_scopes_download(
    agent: Agent, other_namespace: Callable[[], str]
) -> None:
    """Tenant A downloads with its ServiceAccount. Tenant B (same URI, its own account) gets
    no Downloaded for free: it runs its own Job; when that fails B is ModelDownloadError
    although the folder exists; when its retry succeeds B is Downloaded, same one folder."""
    tenant_a, tenant_b = other_namespace(), other_namespace()
    # Failed conditions carry whole seconds: a 3 s backoff leaves the error visible >= 2 s.
    await agent.configure(
        local_model={"downloadRetryBackoffInSecs": 3, "downloadRetryMaxBackoffInSecs": 60}
    )
    await _service_account(agent, tenant_a, "reader-a")
    await _service_account(agent, tenant_b, "reader-b")
    await agent.start()
    a = entry("model", group=agent.group, namespace=tenant_a, serviceAccountName="reader-a")
    await agent.set_models([a])
    [job_a] = await agent.wait_jobs(1, tenant_a)
    await agent.finish(job_a, succeed=True, files=FILES)
    await agent.wait_status({f"{tenant_a}/model": "ModelDownloaded"})
    first_manifest = agent.disk.manifest(KEY)

    b = entry("model", group=agent.group, namespace=tenant_b, serviceAccountName="reader-b")
    await agent.set_models([a, b])
    [job_b] = await agent.wait_jobs(1, tenant_b)
    await agent.wait_status(
        {f"{tenant_a}/model": "ModelDownloaded", f"{tenant_b}/model": "ModelDownloadPending"}
    )
    await agent.finish(job_b, succeed=False, message="403 Forbidden: no access to bucket")
    status = await agent.wait_status(
        {f"{tenant_a}/model": "ModelDownloaded", f"{tenant_b}/model": "ModelDownloadError"}
    )
    assert "403 Forbidden" in status["modelProgress"][f"{tenant_b}/model"]["message"]
    assert agent.disk.is_complete(KEY)

    [_, retry_b] = await agent.wait_jobs(2, tenant_b)
    await agent.finish(retry_b, succeed=True, files=FILES)
    await agent.wait_status(
        {f"{tenant_a}/model": "ModelDownloaded", f"{tenant_b}/model": "ModelDownloaded"}
    )
    assert agent.disk.list_model_folders() == [KEY], "the same content: one folder"
    in_force = agent.disk.manifest(KEY)
    assert in_force is not None
    assert first_manifest is not None
    assert dataclasses.replace(in_force, digest="") == first_manifest
    assert not any(agent.disk.staging.iterdir())
