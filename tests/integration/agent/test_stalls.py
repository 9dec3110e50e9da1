"""Stalled downloads against the real apiserver (issue 21): a download whose staging folder
stops growing for `downloadStallTimeoutInSecs` has its Job deleted (by uid), is reported
`DownloadStalled` with the size reached (status and a Warning Event), and is retried; and the
download Job carries the node group's and the cache's `spec.download`."""

from __future__ import annotations

import pytest

from localcache.agent import stall
from tests.integration.agent.harness import URI, Agent, Obj, entry, eventually

pytestmark = pytest.mark.kcm


async def test_a_download_that_stops_growing_is_stopped_reported_and_retried(
    agent: Agent,
) -> None:
    await agent.configure(local_model={"downloadStallTimeoutInSecs": 2})
    await agent.start()
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)
    (agent.staging(job) / "part").write_bytes(b"x" * 1234)  # then nothing more

    async def stalled() -> Obj | None:
        progress = ((await agent.node_status()).get("modelProgress") or {}).get("iris") or {}
        return dict(progress) if stall.STALLED in (progress.get("message") or "") else None

    progress = await eventually(stalled, within=30, what="iris reported DownloadStalled")
    assert "stopped at 1234 bytes" in progress["message"]
    uid = job["metadata"]["uid"]

    async def retried() -> Obj | None:
        jobs = await agent.jobs()
        fresh = [j for j in jobs if j["metadata"]["uid"] != uid]
        return fresh[0] if len(jobs) == 1 and fresh else None

    retry = await eventually(retried, within=30, what="the stalled Job deleted, a retry created")
    assert retry["metadata"]["name"].split("-")[-2] == "1", "attempt 1"
    await agent.finish(retry, succeed=True, files={"model.bin": b"weights"})
    await agent.wait_status({"iris": "ModelDownloaded"})

    async def event() -> Obj | None:
        events = await agent.rest("GET", "/api/v1/namespaces/default/events")
        found = [
            e for e in events["items"]
            if e.get("reason") == stall.STALLED and e["involvedObject"]["name"] == agent.node
        ]  # fmt: skip
        return found[0] if found else None

    posted = await eventually(event, what="a DownloadStalled Event on the LocalModelNode")
    assert posted["type"] == "Warning"
    assert "model iris: DownloadStalled" in posted["message"]


async def test_the_download_job_carries_the_groups_and_the_caches_download_spec(
    agent: Agent,
) -> None:
    await agent.configure()
    group = await agent.node_group(f"dl-{agent.node}")
    await agent.patch(
        f"/apis/serving.kserve.io/v1alpha1/localmodelnodegroups/{group}",
        {"spec": {"download": {
            "env": [{"name": "HF_HUB_DISABLE_XET", "value": "0"}, {"name": "GROUP", "value": "g"}],
            "resources": {"limits": {"memory": "4Gi"}},
        }}},
    )  # fmt: skip
    name = f"llm-{agent.node}"
    cache = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "LocalModelCache",
        "metadata": {"name": name},
        "spec": {
            "sourceModelUri": URI, "modelSize": "1Gi", "nodeGroups": [group],
            "download": {
                "env": [
                    {"name": "HF_HUB_DISABLE_XET", "value": "1"},
                    {"name": "AWS_SECRET_ACCESS_KEY", "value": "never-applied"},
                ],
                "resources": {"limits": {"memory": "16Gi"}, "requests": {"memory": "8Gi"}},
            },
        },
    }  # fmt: skip
    await agent.create("/apis/serving.kserve.io/v1alpha1/localmodelcaches", cache, cleanup=True)
    await agent.start()
    await agent.set_models([entry(name, group=group)])
    [job] = await agent.wait_jobs(1)
    [container] = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HF_HUB_DISABLE_XET"] == "1", "the cache wins over its node group"
    assert env["GROUP"] == "g"
    assert env["HF_HUB_ENABLE_HF_TRANSFER"] == "1", "KServe's Hugging Face defaults"
    assert "AWS_SECRET_ACCESS_KEY" not in env, "a credential name is never applied"
    assert container["resources"]["limits"]["memory"] == "16Gi"
    assert container["resources"]["requests"]["memory"] == "8Gi"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


async def test_a_namespace_caches_job_gets_only_tuning_names_and_the_groups_literals(
    agent: Agent,
) -> None:
    await agent.configure()
    group = await agent.node_group(f"dlns-{agent.node}")
    mirror = {"configMapKeyRef": {"name": "mirror", "key": "url"}}
    await agent.patch(
        f"/apis/serving.kserve.io/v1alpha1/localmodelnodegroups/{group}",
        {"spec": {"download": {"env": [
            {"name": "HF_ENDPOINT", "valueFrom": mirror}, {"name": "GROUP", "value": "g"},
        ]}}},
    )  # fmt: skip
    # stored without the webhook (as where none runs): the agent still applies tuning names only
    cache = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "LocalModelNamespaceCache",
        "metadata": {"name": "llm", "namespace": agent.namespace},
        "spec": {
            "sourceModelUri": URI, "modelSize": "1Gi", "nodeGroups": [group],
            "download": {"env": [{"name": "HF_HUB_DISABLE_XET", "value": "1"},
                                 {"name": "HF_ENDPOINT", "value": "https://tenant.example"}]},
        },
    }  # fmt: skip
    await agent.create(
        f"/apis/serving.kserve.io/v1alpha1/namespaces/{agent.namespace}/localmodelnamespacecaches",
        cache,
    )
    await agent.start()
    await agent.set_models([entry("llm", group=group, namespace=agent.namespace)])
    [job] = await agent.wait_jobs(1, agent.namespace)
    [container] = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_HUB_DISABLE_XET"]["value"] == "1"
    assert env["GROUP"]["value"] == "g", "the group's literal values apply"
    assert "HF_ENDPOINT" not in env, "neither the tenant's redirect nor the group's reference"
