"""KServe's agent envtest scenarios (reference §8.2, 1-12), ported to the real control plane
with localcache's changes: namespace entries' Jobs run in their own namespace, downloads land
in a staging folder first, and a missing storage-config is an error instead of a Job without
credentials."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
from collections.abc import Callable

import pytest

from localcache.agent import downloads
from localcache.agent.disk import layout
from localcache.agent.jobs import jobs
from localcache.caching import keys, names
from localcache.devenv.waiting import wait_until
from tests.integration.agent.harness import IMAGE, URI, Agent, Obj, entry

pytestmark = pytest.mark.kcm

KEY = keys.storage_key(URI)
FILES = {"model.bin": b"weights" * 10, "config.json": b"{}"}


def _container(job: Obj) -> Obj:
    containers = job["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: Obj = containers[0]
    return container


def _claim(job: Obj) -> str:
    volumes = job["spec"]["template"]["spec"]["volumes"]
    return str(volumes[0]["persistentVolumeClaim"]["claimName"])


async def _events(agent: Agent, reason: str) -> list[Obj]:
    found = await agent.rest(
        "GET", f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{agent.node}"
    )
    return [e for e in found["items"] if e["reason"] == reason]


async def test_downloads_reports_status_and_forgets_removed_model(agent: Agent) -> None:
    """Scenario 1: one Job labelled model/node; success → ModelDownloaded (folder promoted,
    manifest written, an Event posted); spec emptied → status key and folder gone."""
    await agent.start()
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)
    labels = job["metadata"]["labels"]
    assert labels[jobs.LABEL_MODEL] == "iris"
    assert labels[jobs.LABEL_NODE] == agent.node
    assert job["metadata"]["namespace"] == agent.namespace
    await agent.wait_status({"iris": "ModelDownloadPending"})

    await agent.finish(job, succeed=True, files=FILES)
    status = await agent.wait_status({"iris": "ModelDownloaded"})
    assert agent.disk.is_complete(KEY)
    assert (agent.disk.model_path(KEY) / "model.bin").read_bytes() == FILES["model.bin"]
    manifest = agent.disk.manifest(KEY)
    assert manifest is not None
    assert manifest.uri == URI
    assert manifest.job == job["metadata"]["name"]
    assert manifest.bytes == sum(len(v) for v in FILES.values())
    assert status["modelProgress"]["iris"]["percent"] == 100
    assert status["summary"] == {"total": 1, "downloaded": 1, "failed": 0}
    await wait_until(lambda: _events(agent, "ModelDownloaded"), what="a ModelDownloaded Event")

    await agent.set_models([])
    await agent.wait_status({})
    await wait_until(lambda: not agent.disk.model_path(KEY).exists(), what="folder deleted")
    assert agent.metric("localcache_agent_downloads_succeeded_total") == 1


async def test_job_mounts_a_staging_folder_named_by_storage_key(agent: Agent) -> None:
    """Scenario 2: one container, one mount whose subPath carries the storage key (the
    staging folder of this Job; the agent moves it to models/<storage key> afterwards)."""
    await agent.start()
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)
    container = _container(job)
    [mount] = container["volumeMounts"]
    assert mount["subPath"] == layout.staging_subpath(KEY, job["metadata"]["name"])
    assert KEY in mount["subPath"]
    assert mount["mountPath"] == "/mnt/models"
    assert agent.staging(job).is_dir()
    assert container["args"] == [URI, "/mnt/models"]


async def test_recreates_download_when_the_folder_is_lost(agent: Agent) -> None:
    """Scenario 3: after a success the folder is removed; a reconcile makes a second Job."""
    await agent.start()
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)
    await agent.finish(job, succeed=True, files=FILES)
    await agent.wait_status({"iris": "ModelDownloaded"})

    await asyncio.to_thread(shutil.rmtree, agent.disk.model_path(KEY))
    await agent.poke()
    first, second = await agent.wait_jobs(2)
    assert first["metadata"]["name"] == job["metadata"]["name"]
    assert _attempt(second) == 1
    await agent.finish(second, succeed=True, files=FILES)
    await wait_until(lambda: agent.disk.is_complete(KEY), what="model downloaded again")


async def test_deletes_unreferenced_storage_key_folders_only(agent: Agent) -> None:
    """Scenario 4 (with P18): an orphan storage-key folder goes; a folder the agent did not
    create (not storage-key shaped) stays."""
    orphan = agent.disk.models / "0123456789abcdef"
    foreign = agent.disk.models / "abc123def456"
    for folder in (orphan, foreign):
        folder.mkdir(parents=True)
        (folder / "f").write_bytes(b"x")
    await agent.set_models([])
    await agent.start()
    await wait_until(lambda: not orphan.exists(), what="orphan folder removed")
    assert (foreign / "f").exists()


async def test_deletes_job_of_model_removed_from_spec(agent: Agent) -> None:
    """Scenario 5: removing a model from the spec deletes its Job, not the others'."""
    await agent.start()
    other = entry("other", "s3://mybucket/other", group=agent.group)
    await agent.set_models([entry("iris", group=agent.group), other])
    await agent.wait_jobs(2)
    await agent.set_models([other])
    [left] = await agent.wait_jobs(1)
    assert left["metadata"]["labels"][jobs.LABEL_MODEL] == "other"
    await agent.wait_status({"other": "ModelDownloadPending"})


async def test_service_account_credentials_are_injected(agent: Agent) -> None:
    """Scenario 6: the named ServiceAccount's HF secret is referenced (never copied) and the
    pod runs as that ServiceAccount; default image and args."""
    ns = agent.namespace
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hf"},
        "data": {"HF_TOKEN": base64.b64encode(b"hf_secret_value").decode()},
    }
    await agent.create(f"/api/v1/namespaces/{ns}/secrets", secret)
    account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": "model-downloader"},
        "secrets": [{"name": "hf"}],
    }
    await agent.create(f"/api/v1/namespaces/{ns}/serviceaccounts", account)
    uri = "hf://meta-llama/Meta-Llama-3-8B"
    await agent.start()
    await agent.set_models(
        [entry("llama3", uri, group=agent.group, serviceAccountName="model-downloader")]
    )
    [job] = await agent.wait_jobs(1)
    container = _container(job)
    assert container["image"] == IMAGE
    assert container["args"] == [uri, "/mnt/models"]
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "model-downloader"
    assert {
        "name": "HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}},
    } in container["env"]
    assert "hf_secret_value" not in json.dumps(job)


async def test_storage_key_credentials_need_the_storage_config_secret(agent: Agent) -> None:
    """Scenario 7 (spec §2): a missing storage-config secret is a ModelDownloadError naming
    it, with no Job; once the secret exists the Job references it."""
    ns = agent.namespace
    await agent.start()
    await agent.set_models([entry("iris", group=agent.group, storage={"key": "my-s3-credentials"})])
    status = await agent.wait_status({"iris": "ModelDownloadError"})
    message = status["modelProgress"]["iris"]["message"]
    assert f"Secret {ns}/storage-config" in message
    assert await agent.jobs() == []

    value = json.dumps({"type": "s3", "bucket": "mybucket", "access_key_id": "AKIA-SECRET"})
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "storage-config"},
        "data": {"my-s3-credentials": base64.b64encode(value.encode()).decode()},
    }
    await agent.create(f"/api/v1/namespaces/{ns}/secrets", secret)
    await agent.poke()
    [job] = await agent.wait_jobs(1)
    env = _container(job)["env"]
    ref = {"secretKeyRef": {"name": "storage-config", "key": "my-s3-credentials"}}
    assert {"name": "STORAGE_CONFIG", "valueFrom": ref} in env
    assert "AKIA-SECRET" not in json.dumps(job)


async def test_namespace_entry_job_runs_in_its_namespace_with_status_key(
    agent: Agent, other_namespace: Callable[[], str]
) -> None:
    """Scenarios 8 and 9: the Job of a namespace entry runs in that namespace, labelled
    model/node/modelNamespace; its status key is `namespace/name`."""
    tenant = other_namespace()
    await agent.start()
    await agent.set_models([entry("ns-status-model", group=agent.group, namespace=tenant)])
    [job] = await agent.wait_jobs(1)
    assert job["metadata"]["namespace"] == tenant
    labels = job["metadata"]["labels"]
    assert (labels["model"], labels["node"], labels["modelNamespace"]) == (
        "ns-status-model",
        agent.node,
        tenant,
    )
    await agent.finish(job, succeed=True, files=FILES)
    await agent.wait_status({f"{tenant}/ns-status-model": "ModelDownloaded"})


async def test_pvc_name_uses_the_entry_node_group_among_overlapping_ones(agent: Agent) -> None:
    """Scenario 10: with two node groups of identical affinity, the entry's nodeGroup names
    the download PVC; the pod is pinned by nodeSelector, not nodeName."""
    qwen = await agent.node_group(f"qwen-{agent.node}")
    sklearn = await agent.node_group(f"sklearn-{agent.node}")
    await agent.start()
    await agent.set_models([entry("sklearn-model", group=sklearn)])
    [job] = await agent.wait_jobs(1)
    assert _claim(job) == names.download_pvc("sklearn-model", sklearn, namespaced=False)
    assert qwen not in _claim(job)
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {"kubernetes.io/hostname": agent.node}
    assert "nodeName" not in pod_spec


async def test_namespace_entry_pvc_name_has_download_suffix(
    agent: Agent, other_namespace: Callable[[], str]
) -> None:
    """Scenario 11 (spec §3): a namespace entry's download PVC is `{cache}-{group}-download`
    in its own namespace."""
    tenant = other_namespace()
    await agent.start()
    await agent.set_models([entry("sklearn-model", group=agent.group, namespace=tenant)])
    [job] = await agent.wait_jobs(1)
    assert _claim(job) == names.download_pvc("sklearn-model", agent.group, namespaced=True)


async def test_cluster_and_namespace_models_have_separate_status_entries(
    agent: Agent, other_namespace: Callable[[], str]
) -> None:
    """Scenario 12: two Jobs, both succeed → exactly `cluster-model` and `<ns>/ns-model`."""
    tenant = other_namespace()
    await agent.start()
    await agent.set_models(
        [
            entry("cluster-model", "s3://mybucket/cluster", group=agent.group),
            entry("ns-model", "s3://mybucket/ns", group=agent.group, namespace=tenant),
        ]
    )
    found = await agent.wait_jobs(2)
    for job in found:
        await agent.finish(job, succeed=True, files=FILES)
    await agent.wait_status(
        {"cluster-model": "ModelDownloaded", f"{tenant}/ns-model": "ModelDownloaded"}
    )


def _attempt(job: Obj) -> int:
    parsed = downloads.parse_job_name(job["metadata"]["name"])
    assert parsed is not None, job["metadata"]["name"]
    return parsed[2]
