"""Sharing downloads between entries (spec §5): same URI without credentials → one Job, one
folder, one status; a credential-needing entry never rides on another scope's download; a
ServiceAccount is looked up only in the entry's own namespace."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from localcache.caching import keys
from tests.integration.agent.harness import URI, Agent, entry

pytestmark = pytest.mark.kcm

KEY = keys.storage_key(URI)
FILES = {"model.bin": b"0123456789"}


async def _service_account(agent: Agent, namespace: str, name: str) -> None:
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
    await agent.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", account)


async def test_same_uri_in_cluster_and_namespace_cache_shares_one_job(
    agent: Agent, other_namespace: Callable[[], str]
) -> None:
    tenant = other_namespace()
    await agent.start()
    await agent.set_models(
        [
            entry("cluster-iris", group=agent.group),
            entry("tenant-iris", group=agent.group, namespace=tenant),
        ]
    )
    [job] = await agent.wait_jobs(1)
    await agent.wait_status(
        {"cluster-iris": "ModelDownloadPending", f"{tenant}/tenant-iris": "ModelDownloadPending"}
    )
    await agent.finish(job, succeed=True, files=FILES)
    status = await agent.wait_status(
        {"cluster-iris": "ModelDownloaded", f"{tenant}/tenant-iris": "ModelDownloaded"}
    )
    assert len(await agent.jobs()) == 1
    assert agent.disk.list_model_folders() == [KEY]
    progress = status["modelProgress"]
    assert progress["cluster-iris"]["jobName"] == job["metadata"]["name"]
    assert progress[f"{tenant}/tenant-iris"]["jobName"] == job["metadata"]["name"]


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
    assert agent.disk.list_model_folders() == [KEY]
    assert agent.disk.manifest(KEY) == first_manifest
    assert not any(agent.disk.staging.iterdir())
