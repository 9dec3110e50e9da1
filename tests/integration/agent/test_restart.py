"""Agent restarts at each step of the atomic-folder protocol converge without a duplicate
download and without losing a finished one (spec §5, [P16]): Job running; Job done but the
folder not moved; the promotion interrupted after its intent record or after the move
(manifest not written)."""

from __future__ import annotations

import threading

import pytest

from localcache.agent.disk import folders
from localcache.caching import keys
from localcache.devenv.waiting import wait_until
from tests.integration.agent.harness import URI, Agent, entry

pytestmark = pytest.mark.kcm

KEY = keys.storage_key(URI)
FILES = {"weights.bin": b"w" * 64, "config.json": b"{}"}


class Crash(Exception):
    """The agent process dying at a checkpoint."""


class Freeze:
    """Replaces `folders._checkpoint`: the agent freezes at `step` (its promotion thread blocks)
    until released, then dies there, leaving the disk exactly as it was at that step."""

    def __init__(self, step: str) -> None:
        self.step = step
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, reached: str) -> None:
        if reached == self.step:
            self.reached.set()
            self.release.wait(timeout=60)
            raise Crash(reached)


async def _assert_one_download(agent: Agent, job_name: str) -> None:
    await agent.wait_status({"iris": "ModelDownloaded"})
    assert [j["metadata"]["name"] for j in await agent.jobs()] == [job_name]
    assert agent.metric("localcache_agent_downloads_started_total") == 0
    assert agent.disk.is_complete(KEY)
    assert (agent.disk.model_path(KEY) / "weights.bin").read_bytes() == FILES["weights.bin"]
    manifest = agent.disk.manifest(KEY)
    assert manifest is not None
    assert manifest.job == job_name
    assert list(agent.disk.staging.iterdir()) == []


async def test_restart_while_job_runs_keeps_the_job(agent: Agent) -> None:
    await agent.start()
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)
    await agent.wait_status({"iris": "ModelDownloadPending"})
    await agent.stop()

    await agent.start()
    await agent.reconciled(1)
    assert len(await agent.jobs()) == 1
    assert agent.staging(job).is_dir()
    await agent.finish(job, succeed=True, files=FILES)
    await _assert_one_download(agent, job["metadata"]["name"])


async def test_restart_after_job_finished_unseen_promotes_it(agent: Agent) -> None:
    await agent.start()
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)
    # Stopped once the Job's record is in status: a Job whose record a crash lost is never
    # trusted (tests/integration/agent/test_job_trust.py).
    await agent.wait_status({"iris": "ModelDownloadPending"})
    await agent.stop()
    await agent.finish(job, succeed=True, files=FILES)
    await agent.wait_job_condition(job, "Complete")

    await agent.start()
    await _assert_one_download(agent, job["metadata"]["name"])


@pytest.mark.parametrize(
    ("step", "moved"),
    [("record-written", False), ("renamed", True)],
    ids=["done-not-moved", "moved-without-manifest"],
)
async def test_restart_in_the_middle_of_promotion_finishes_it(
    agent: Agent, monkeypatch: pytest.MonkeyPatch, step: str, moved: bool
) -> None:
    freeze = Freeze(step)
    monkeypatch.setattr(folders, "_checkpoint", freeze)
    await agent.start()
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)
    await agent.finish(job, succeed=True, files=FILES)
    await wait_until(freeze.reached.is_set, timeout=40, what=f"promotion reached {step}")
    await agent.stop()
    freeze.release.set()
    monkeypatch.setattr(folders, "_checkpoint", lambda _step: None)

    # The state the crash left: a folder never counts as downloaded without its manifest.
    await wait_until(
        lambda: agent.disk.model_path(KEY).is_dir() == moved, what="disk state after crash"
    )
    assert agent.staging(job).is_dir() != moved
    assert agent.disk.manifest(KEY) is None
    assert not agent.disk.is_complete(KEY)

    await agent.start()
    await _assert_one_download(agent, job["metadata"]["name"])
