"""Failures: a Job that still retries is not an error [P17]; a Job that failed for good is,
with the gist of the pod's message (never a log tail as such, issue 21), and is retried
after the backoff; misconfiguration is reported instead of looping [P15]; progress is
reported while downloading; a bad ConfigMap keeps the last good configuration."""

from __future__ import annotations

import datetime

import pytest

from localcache.agent import downloads, plan
from localcache.caching import jobfailures as failures
from localcache.caching import keys
from localcache.devenv.waiting import wait_until
from tests.integration.agent.harness import URI, Agent, Obj, entry, eventually

pytestmark = pytest.mark.kcm

KEY = keys.storage_key(URI)


@pytest.mark.slow
async def test_retrying_job_is_not_an_error_until_it_fails_for_good(agent: Agent) -> None:
    # Failed conditions carry whole seconds: a 3 s backoff leaves the error visible >= 2 s.
    await agent.configure(
        local_model={"downloadRetryBackoffInSecs": 3, "downloadRetryMaxBackoffInSecs": 60}
    )
    await agent.start(job_backoff_limit=1)
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)

    await agent.finish(
        job, succeed=False, message="RuntimeError: Failed to connect to HTTP endpoint"
    )

    async def retrying() -> dict[str, str] | None:
        status = await agent.node_status()
        message = (status.get("modelProgress") or {}).get("iris", {}).get("message") or ""
        return status["modelStatus"] if failures.GIST_CONNECT in message else None

    states = await eventually(retrying, what="the pod failure noted in status")
    assert states == {"iris": "ModelDownloadPending"}

    # The Job controller starts a second pod after its own backoff (~10 s); it fails too.
    await agent.finish(job, succeed=False, message="tenant log line\nHTTP access denied for 'x'")
    await agent.wait_job_condition(job, "Failed")
    status = await agent.wait_status({"iris": "ModelDownloadError"})
    message = status["modelProgress"]["iris"]["message"]
    assert f"{failures.GIST_FORBIDDEN} (exit code 1)" in message
    assert "tenant log line" not in message, "a log tail is never published as such"
    assert agent.metric("localcache_agent_downloads_failed_total") == 1

    # Retried after the backoff with a new attempt; the failure message stays.
    [_, retry] = await agent.wait_jobs(2)
    assert _attempt(retry) == 1
    status = await agent.wait_status({"iris": "ModelDownloadPending"})
    assert failures.GIST_FORBIDDEN in status["modelProgress"]["iris"]["message"]
    await agent.finish(retry, succeed=True, files={"m": b"x"})
    status = await agent.wait_status({"iris": "ModelDownloaded"})
    assert "message" not in status["modelProgress"]["iris"]


async def test_failed_job_is_retried_with_growing_backoff(agent: Agent) -> None:
    await agent.configure(
        local_model={"downloadRetryBackoffInSecs": 1, "downloadRetryMaxBackoffInSecs": 600}
    )
    await agent.start()
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)
    await agent.finish(job, succeed=False, message="HTTP resource not found at 'x'.")
    [_, second] = await agent.wait_jobs(2)
    await agent.finish(second, succeed=False, message="Failed to unpack archive file.")
    await agent.wait_job_condition(second, "Failed")

    async def error_with_retry_time() -> Obj | None:
        status = await agent.node_status()
        progress = (status.get("modelProgress") or {}).get("iris") or {}
        message = progress.get("message") or ""
        if failures.GIST_ARCHIVE_INVALID in message and progress.get("nextRetryTime"):
            return dict(progress)
        return None

    progress = await eventually(error_with_retry_time, what="second failure awaiting retry")
    assert progress["attempts"] == 2
    [failed] = [c for c in (await agent.jobs())[1]["status"]["conditions"] if c["type"] == "Failed"]
    retry_at = plan.parse_time(progress["nextRetryTime"])
    failed_at = plan.parse_time(failed["lastTransitionTime"])
    assert retry_at is not None
    assert failed_at is not None
    assert retry_at - failed_at == datetime.timedelta(
        seconds=2
    )  # 1 s doubled for the second attempt
    await agent.wait_jobs(3)


async def test_pv_path_different_from_models_root_is_an_error_not_a_loop(agent: Agent) -> None:
    group = await agent.node_group(f"elsewhere-{agent.node}", path="/var/lib/elsewhere")
    await agent.start()
    await agent.set_models([entry("iris", group=group)])
    status = await agent.wait_status({"iris": "ModelDownloadError"})
    message = status["modelProgress"]["iris"]["message"]
    assert "/var/lib/elsewhere" in message
    assert str(agent.root) in message
    done = agent.reconciles()
    await agent.poke()
    await agent.reconciled(done + 1)
    assert await agent.jobs() == []
    assert (await agent.model_status()) == {"iris": "ModelDownloadError"}


async def test_missing_node_group_is_an_error(agent: Agent) -> None:
    await agent.start()
    await agent.set_models([entry("iris", group="no-such-group")])
    status = await agent.wait_status({"iris": "ModelDownloadError"})
    assert (
        "LocalModelNodeGroup no-such-group not found" in status["modelProgress"]["iris"]["message"]
    )


async def test_progress_reports_bytes_and_percent_of_model_size(agent: Agent) -> None:
    name = f"iris-{agent.node}"
    cache = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "LocalModelCache",
        "metadata": {"name": name},
        "spec": {"sourceModelUri": URI, "modelSize": "200", "nodeGroups": [agent.group]},
    }
    await agent.create("/apis/serving.kserve.io/v1alpha1/localmodelcaches", cache, cleanup=True)
    await agent.start()
    await agent.set_models([entry(name, group=agent.group)])
    [job] = await agent.wait_jobs(1)
    (agent.staging(job) / "part").write_bytes(b"x" * 50)

    async def progress() -> Obj | None:
        status = await agent.node_status()
        found = (status.get("modelProgress") or {}).get(name) or {}
        return dict(found) if found.get("bytesOnDisk") == 50 else None

    found = await eventually(progress, what="50 bytes reported")
    assert found["percent"] == 25
    assert (await agent.model_status()) == {name: "ModelDownloading"}


async def test_invalid_config_keeps_the_last_good_one(agent: Agent) -> None:
    await agent.start()
    await agent.set_models([entry("iris", group=agent.group)])
    await agent.wait_jobs(1)
    await agent.configure(raw_local_model="{not json")
    await agent.set_models(
        [entry("iris", group=agent.group), entry("other", "s3://b/other", group=agent.group)]
    )
    found = await agent.wait_jobs(2)
    assert {j["metadata"]["namespace"] for j in found} == {agent.namespace}

    async def warned() -> bool:
        events = await agent.rest(
            "GET",
            f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3D{agent.node}",
        )
        return any(e["reason"] == "InvalidConfiguration" for e in events["items"])

    await wait_until(warned, what="an InvalidConfiguration Event")


def _attempt(job: Obj) -> int:
    parsed = downloads.parse_job_name(job["metadata"]["name"])
    assert parsed is not None, job["metadata"]["name"]
    return parsed[2]
