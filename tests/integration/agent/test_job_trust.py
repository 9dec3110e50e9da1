"""The agent trusts only download Jobs it created itself, by uid (issue 13, bug 1): a tenant
that replaces its download Job with a forged one of the same name gets no `ModelDownloaded`;
forged Failed or Active Jobs named like the agent's do not stall the real download; a Job
squatting on the name the agent would have used does not block it. Forged Jobs are reported,
never deleted.

The forged Jobs are what a tenant allowed to create Jobs in its namespace can make: same
name, labels and ownerReference as the agent's. Their status is set through the status
subresource, which a tenant cannot write but the test can (the strongest forgery)."""

from __future__ import annotations

import asyncio
import copy
import datetime
import hashlib
from collections.abc import Callable

import pytest

from localcache.agent import plan
from localcache.agent.jobs import jobs
from localcache.api import groupversion
from localcache.caching import keys
from localcache.devenv.waiting import wait_until
from tests.integration.agent.harness import URI, Agent, Obj, entry, eventually

pytestmark = pytest.mark.kcm

KEY = keys.storage_key(URI)
FILES = {"model.bin": b"0123456789"}
T0 = "2026-03-01T10:00:00Z"
T1 = "2026-03-01T10:01:00Z"


def _jobs_path(namespace: str, name: str = "") -> str:
    base = f"/apis/batch/v1/namespaces/{namespace}/jobs"
    return f"{base}/{name}" if name else base


async def _service_account(agent: Agent, namespace: str, name: str) -> None:
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}}
    await agent.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", account)


async def _forge(agent: Agent, job: Obj, *, status: Obj | None) -> Obj:
    """Create `job` (suspended, so no pod runs) and give it `status` via the subresource."""
    forged = copy.deepcopy(job)
    meta = forged["metadata"]
    for field in ("uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"):
        meta.pop(field, None)
    forged.pop("status", None)
    spec = forged["spec"]
    spec["suspend"] = True
    spec.pop("ttlSecondsAfterFinished", None)  # its forged finish time is long past
    template_labels = spec["template"]["metadata"].get("labels") or {}
    for label in list(template_labels):
        if label.startswith(("batch.kubernetes.io/", "controller-uid", "job-name")):
            del template_labels[label]
    spec.pop("selector", None)
    created: Obj = await agent.create(_jobs_path(meta["namespace"]), forged)
    if status is not None:
        path = f"{_jobs_path(meta['namespace'], meta['name'])}/status"
        created = await agent.patch(path, {"status": status})
    return created


async def _template(agent: Agent, namespace: str, name: str) -> Obj:
    """A Job shaped like the agent's download Jobs of this node: its labels and an
    ownerReference to the LocalModelNode."""
    node = await agent.rest("GET", groupversion.LOCAL_MODEL_NODE.path(name=agent.node))
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                jobs.LABEL_MODEL: "iris",
                jobs.LABEL_NODE: jobs.label_value(agent.node),
                jobs.LABEL_STORAGE_KEY: KEY,
            },
            "ownerReferences": [
                {
                    "apiVersion": groupversion.LOCAL_MODEL_NODE.api_version,
                    "kind": groupversion.LOCAL_MODEL_NODE.kind,
                    "name": agent.node,
                    "uid": node["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "tenant/own:latest"}],
                },
            },
        },
    }


def _names_the_agent_might_use(agent: Agent) -> list[str]:
    """Attempt 0 of the open unit, as the agent named it before (deterministic, 32-bit tag)
    and with today's 64-bit tag (the random suffix guessed)."""
    old_tag = hashlib.sha256(f"{agent.node}|None".encode()).hexdigest()[:8]
    new_tag = jobs.job_tag(storage_key=KEY, node_name=agent.node, scope=None)
    return [f"lmd-{KEY}-{old_tag}-0", f"{new_tag}-0-aaaaaaaa"]


COMPLETE: Obj = {
    "startTime": T0,
    "completionTime": T1,
    "succeeded": 1,
    "conditions": [
        {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": T1},
        {"type": "Complete", "status": "True", "lastTransitionTime": T1},
    ],
}


def _failed_now() -> Obj:
    """A Failed status from just now (the retry of a real failure would wait the backoff)."""
    now = plan.format_time(datetime.datetime.now(datetime.UTC))
    return {
        "startTime": now,
        "failed": 1,
        "conditions": [
            {"type": "FailureTarget", "status": "True", "lastTransitionTime": now},
            {"type": "Failed", "status": "True", "lastTransitionTime": now, "message": "forged"},
        ],
    }


async def _untrusted_reported(agent: Agent, namespace: str, name: str) -> None:
    async def reported() -> bool:
        events = await agent.rest(
            "GET",
            f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{agent.node}",
        )
        return any(
            e["reason"] == "UntrustedDownloadJob" and f"{namespace}/{name}" in e["message"]
            for e in events["items"]
        )

    await wait_until(reported, what=f"an UntrustedDownloadJob Event for {namespace}/{name}")


async def _agents_job(agent: Agent, namespace: str, *, not_uids: set[str]) -> Obj:
    async def found() -> Obj | None:
        mine = [j for j in await agent.jobs(namespace) if j["metadata"]["uid"] not in not_uids]
        return mine[0] if mine else None

    return await eventually(found, what=f"a download Job of the agent in {namespace}")


async def test_replaced_download_job_does_not_get_model_downloaded(
    agent: Agent, other_namespace: Callable[[], str]
) -> None:
    """Tenant B downloads its private model. Tenant A (same URI, its own ServiceAccount)
    deletes its download Job and creates one of the same name that it controls, with files
    in the staging folder and a Complete status: A stays pending on a new Job of the agent's,
    B's folder is untouched, and the forged Job is reported but not deleted."""
    tenant_a, tenant_b = other_namespace(), other_namespace()
    await _service_account(agent, tenant_a, "reader-a")
    await _service_account(agent, tenant_b, "reader-b")
    await agent.start()
    b = entry("model", group=agent.group, namespace=tenant_b, serviceAccountName="reader-b")
    await agent.set_models([b])
    [job_b] = await agent.wait_jobs(1, tenant_b)
    await agent.finish(job_b, succeed=True, files=FILES)
    await agent.wait_status({f"{tenant_b}/model": "ModelDownloaded"})
    manifest_b = agent.disk.manifest(KEY)

    a = entry("model", group=agent.group, namespace=tenant_a, serviceAccountName="reader-a")
    await agent.set_models([b, a])
    [job_a] = await agent.wait_jobs(1, tenant_a)
    await agent.wait_status(
        {f"{tenant_b}/model": "ModelDownloaded", f"{tenant_a}/model": "ModelDownloadPending"}
    )
    name = job_a["metadata"]["name"]
    (agent.staging(job_a) / "model.bin").write_bytes(b"what tenant A wrote")
    await agent.rest(
        "DELETE",
        f"{_jobs_path(tenant_a, name)}?propagationPolicy=Background",
        ok=(200, 202),
    )

    async def gone() -> bool:
        status, _ = await asyncio.to_thread(agent.plane.rest, "GET", _jobs_path(tenant_a, name))
        return status == 404

    await wait_until(gone, what=f"Job {tenant_a}/{name} deleted")
    forged = await _forge(agent, job_a, status=COMPLETE)

    await _untrusted_reported(agent, tenant_a, name)
    replacement = await _agents_job(
        agent, tenant_a, not_uids={job_a["metadata"]["uid"], forged["metadata"]["uid"]}
    )
    assert replacement["metadata"]["name"] != name
    expected = {f"{tenant_b}/model": "ModelDownloaded", f"{tenant_a}/model": "ModelDownloadPending"}

    async def pending_on_replacement() -> Obj | None:
        status = await agent.node_status()
        progress = (status.get("modelProgress") or {}).get(f"{tenant_a}/model") or {}
        on_it = progress.get("jobName") == replacement["metadata"]["name"]
        return status if on_it and status.get("modelStatus") == expected else None

    status = await eventually(pending_on_replacement, what="A pending on the agent's new Job")
    recorded = {(r["namespace"], r["name"], r["uid"]) for r in status["downloadJobs"]}
    assert (tenant_a, name, forged["metadata"]["uid"]) not in recorded
    assert agent.disk.manifest(KEY) == manifest_b
    still = await agent.rest("GET", _jobs_path(tenant_a, name))
    assert still["metadata"]["uid"] == forged["metadata"]["uid"], "never delete what is not ours"

    # Only the agent's own Job can prove A's access.
    await agent.finish(replacement, succeed=True, files=FILES)
    await agent.wait_status(
        {f"{tenant_b}/model": "ModelDownloaded", f"{tenant_a}/model": "ModelDownloaded"}
    )


@pytest.mark.parametrize("failed", [True, False], ids=["failed", "active"])
async def test_forged_failed_or_active_job_does_not_stall_the_download(
    agent: Agent, failed: bool
) -> None:
    """Jobs named and labelled like the agent's next download Job, already Failed (a long
    backoff would follow) or Active (suspended: it never ends), exist before the agent
    starts: the agent runs its own Job and downloads."""
    await agent.configure(
        local_model={"downloadRetryBackoffInSecs": 600, "downloadRetryMaxBackoffInSecs": 3600}
    )
    await agent.set_models([entry("iris", group=agent.group)])
    forged_uids = set()
    for name in _names_the_agent_might_use(agent):
        template = await _template(agent, agent.namespace, name)
        forged = await _forge(agent, template, status=_failed_now() if failed else None)
        forged_uids.add(forged["metadata"]["uid"])
    await agent.start()

    job = await _agents_job(agent, agent.namespace, not_uids=forged_uids)
    await agent.wait_status({"iris": "ModelDownloadPending"})
    await agent.finish(job, succeed=True, files=FILES)
    status = await agent.wait_status({"iris": "ModelDownloaded"})
    assert status["modelProgress"]["iris"]["jobName"] == job["metadata"]["name"]
    for name in _names_the_agent_might_use(agent):
        await _untrusted_reported(agent, agent.namespace, name)
    assert len(await agent.jobs()) == 3, "forged Jobs are not deleted"


async def test_job_squatting_on_the_agents_name_does_not_block_it(agent: Agent) -> None:
    """A Job without the agent's labels holds the name the agent used to pick for attempt 0
    (AlreadyExists was taken as 'ours', and the download never started)."""
    await agent.set_models([entry("iris", group=agent.group)])
    squatters = set()
    for name in _names_the_agent_might_use(agent):
        template = await _template(agent, agent.namespace, name)
        template["metadata"]["labels"] = {"app": "squatter"}
        del template["metadata"]["ownerReferences"]
        squatters.add((await _forge(agent, template, status=None))["metadata"]["uid"])
    await agent.start()

    job = await _agents_job(agent, agent.namespace, not_uids=squatters)
    await agent.finish(job, succeed=True, files=FILES)
    await agent.wait_status({"iris": "ModelDownloaded"})
