"""Peer-mode Jobs whose pod never starts (`agent.peerstart`): stopped `START_S` after their
creation, and the unit's next Job is the origin's (`agent.peering`)."""

from __future__ import annotations

import datetime
from pathlib import Path

from localcache.agent import downloads, peering, peerstart, plan, stall, status
from localcache.agent.jobs import peerjob
from localcache.api import modelnode
from localcache.runtime import clock as clock_mod
from tests.unit.agent.test_peering import (
    KEY,
    FakeApi,
    Rig,
    _group,
    _is_seed_origin,
    _node,
    _ref,
    _serving,
    _unit,
)

Pending = modelnode.ModelStatus.DOWNLOAD_PENDING
CREATED = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def _at(seconds: float) -> datetime.datetime:
    return CREATED + datetime.timedelta(seconds=seconds)


def _job(
    *, peer: bool = True, uid: str = "uid-1", attempt: int = 0, seed: bool = False
) -> downloads.JobRef:
    labels = {peerjob.PEER_LABEL: "true"} if peer else {}
    labels |= {peerjob.SUMS_LABEL: "true"} if seed else {}
    obj = {"metadata": {"name": "job-1", "uid": uid, "labels": labels,
                        "creationTimestamp": clock_mod.rfc3339(CREATED)}}  # fmt: skip
    return downloads.JobRef("jobs", "job-1", uid, "iris", KEY, _unit().scope_id, attempt, obj)


def _report(
    state: modelnode.ModelStatus = Pending, size: int = 0, message: str | None = None
) -> plan.Report:
    progress = modelnode.ModelProgress(bytes_on_disk=size, job_name="job-1", message=message)
    return plan.Report(status.Outcome(state, progress, 5.0))


def test_a_peer_job_pending_for_start_s_is_stopped_and_the_unit_marked() -> None:
    watch = peerstart.StartWatch()
    job = _job(attempt=1)
    assert watch.check(_report(), job, _at(peerstart.START_S - 1)) == _report()
    assert not watch.take(KEY, job.scope)
    stopped = watch.check(_report(), job, _at(peerstart.START_S))
    assert isinstance(stopped, plan.Stop)
    assert stopped.job == job
    progress = stopped.outcome.progress
    assert "did not start within 120 s" in (progress.message or "")
    # a stopped download's status: the next attempt counts as one, at once
    assert stall.was_stopped(progress.message)
    assert progress.attempts == 2
    assert progress.next_retry_time == clock_mod.rfc3339(_at(peerstart.START_S))
    assert watch.take(KEY, job.scope)
    assert not watch.take(KEY, job.scope), "the mark is taken once"


def test_a_peer_job_that_runs_or_wrote_bytes_and_origin_jobs_are_left_alone() -> None:
    watch = peerstart.StartWatch()
    late = _at(10 * peerstart.START_S)
    for action, job in (
        (_report(modelnode.ModelStatus.DOWNLOADING), _job()),
        (_report(size=10), _job()),
        (_report(), _job(peer=False)),
    ):
        assert watch.check(action, job, late) == action
    assert watch.check(_report(), None, late) == _report()
    undated = _job()
    del undated.obj["metadata"]["creationTimestamp"]
    assert watch.check(_report(), undated, late) == _report()


async def test_after_a_peer_job_never_started_the_next_job_is_the_origins(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, FakeApi([_node("me"), _serving("a", _unit().scope_id)]))
    first = await rig.mode(_group(True))
    assert isinstance(first, peering.Mode)
    assert first.source == "peer/a"
    job = _job()
    assert await rig.peers.fast_fallback(_report(), job, _at(1)) == _report()
    stopped = await rig.peers.fast_fallback(_report(), job, _at(peerstart.START_S))
    assert isinstance(stopped, plan.Stop)
    assert await rig.mode(_group(True)) == peering.Mode("origin")  # the plain origin Job
    assert rig.fallbacks("peer-not-started") == 1
    again = await rig.mode(_group(True))
    assert isinstance(again, peering.Mode)
    assert again.source == "peer/a", "only the next Job is the origin's"


async def test_a_seed_whose_pod_cannot_start_is_stopped_and_the_plain_origin_job_is_next(
    tmp_path: Path,
) -> None:
    """The seed's checksum sidecar runs `--peer-image`: when the node cannot pull it, the
    origin download must not wait for ever. A seed still pulling an image is left alone."""
    rig = Rig(tmp_path, FakeApi([_node("me")]))
    seed = _job(peer=False, seed=True)
    stuck = _report(message=f"{plan.NOT_STARTED}job-1 cannot start: ImagePullBackOff")
    late = _at(peerstart.START_S)
    assert await rig.peers.fast_fallback(_report(), seed, late) == _report()  # still pulling
    assert await rig.peers.fast_fallback(stuck, seed, _at(peerstart.START_S - 1)) == stuck
    stopped = await rig.peers.fast_fallback(stuck, seed, late)
    assert isinstance(stopped, plan.Stop)
    assert "seed Job jobs/job-1 did not start within 120 s" in (
        stopped.outcome.progress.message or ""
    )
    assert await rig.mode(_group(True)) == peering.Mode("origin")  # no sidecar this time
    assert rig.fallbacks("peer-not-started") == 1
    after_failed_peer = await rig.mode(_group(True), _ref(peer=True))  # the origin again: ...
    assert _is_seed_origin(after_failed_peer), "... with its sidecar: only one Job went without"
