"""Stalled downloads (issue 21): how long a running download has written nothing, measured on
a fake clock, and what `plan.decide` does with it: stop the Job, report `DownloadStalled` with
the size reached, retry after the backoff."""

from __future__ import annotations

import dataclasses
import datetime
import os
from pathlib import Path

import pytest

from localcache.agent import plan, stall
from localcache.agent.disk import layout, tree
from localcache.api import modelnode
from tests.unit.agent import test_decide as decide

STALL_POLICY = plan.Policy(
    backoff_s=10.0, max_backoff_s=300.0, progress_interval=5.0, stall_timeout_s=600.0
)


class _Clock:
    """A synchronous stand-in for `runtime.clock.FakeClock` (only `now` is read)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    async def sleep(self, seconds: float) -> None:
        raise AssertionError("GrowthWatch never sleeps")


def _usage(size: int, entries: int = 1, *, truncated: bool = False) -> tree.Usage:
    return tree.Usage(size, entries, truncated)


def test_idle_time_counts_from_the_last_growth_on_the_injected_clock() -> None:
    clock = _Clock()
    watch = stall.GrowthWatch(clock)
    assert watch.idle("uid", _usage(100), running=True) == 0.0
    clock.advance(300)
    assert watch.idle("uid", _usage(100), running=True) == 300.0
    clock.advance(100)
    assert watch.idle("uid", _usage(150), running=True) == 0.0, "grew: the clock restarts"
    clock.advance(50)
    assert watch.idle("uid", _usage(150, entries=2), running=True) == 0.0, "a new file"
    clock.advance(700)
    assert watch.idle("uid", _usage(120, entries=2), running=True) == 700.0, "shrinking"


def test_a_download_that_has_not_started_is_never_idle() -> None:
    """Image pulls and scheduling write nothing: only a running download can stall."""
    clock = _Clock()
    watch = stall.GrowthWatch(clock)
    assert watch.idle("uid", _usage(0, 0), running=False) == 0.0
    clock.advance(3600)
    assert watch.idle("uid", _usage(0, 0), running=False) == 0.0
    assert watch.idle("uid", _usage(0, 0), running=True) == 0.0, "clock starts now"
    clock.advance(601)
    assert watch.idle("uid", _usage(0, 0), running=True) == 601.0


def test_a_walk_cut_at_its_bound_counts_as_growth() -> None:
    clock = _Clock()
    watch = stall.GrowthWatch(clock)
    watch.idle("uid", _usage(10, truncated=True), running=True)
    clock.advance(900)
    assert watch.idle("uid", _usage(10, truncated=True), running=True) == 0.0


def test_jobs_no_longer_running_are_forgotten() -> None:
    clock = _Clock()
    watch = stall.GrowthWatch(clock)
    watch.idle("a", _usage(5), running=True)
    watch.idle("b", _usage(5), running=True)
    watch.retain(["b"])
    clock.advance(100)
    assert watch.idle("a", _usage(5), running=True) == 0.0, "seen anew"
    assert watch.idle("b", _usage(5), running=True) == 100.0


def test_folder_usage_is_bounded(tmp_path: Path) -> None:
    for i in range(5):
        (tmp_path / f"f{i}").write_bytes(b"x" * 10)
    assert tree.folder_usage(tmp_path, max_entries=100) == tree.Usage(50, 5, truncated=False)
    cut = tree.folder_usage(tmp_path, max_entries=3)
    assert cut.truncated
    assert cut.entries == 3
    deep = tmp_path / "deep"
    deep.mkdir()
    path = deep
    for _ in range(layout.MAX_TREE_DEPTH + 1):
        path = path / "d"
    os.makedirs(path)
    assert tree.folder_usage(deep, max_entries=10_000).truncated
    assert tree.folder_usage(tmp_path / "missing", max_entries=5) == tree.Usage(0, 0, False)


def _running(idle: float, *, size: int = 4096, ready: int = 1) -> plan.Observed:
    return dataclasses.replace(
        decide._observed(
            jobs=(decide._job(0, ready=ready),),
            latest=plan.JobFacts(decide.STAGING, staging_bytes=size, idle_s=idle),
        ),
        policy=STALL_POLICY,
    )


def test_a_download_idle_for_the_stall_timeout_is_stopped_with_the_size_reached() -> None:
    action = plan.decide(decide.UNIT, _running(600.0, size=4096))
    assert isinstance(action, plan.Stop)
    assert action.job == decide._job(0, ready=1)
    progress = action.outcome.progress
    assert action.outcome.status == modelnode.ModelStatus.DOWNLOAD_ERROR
    assert (progress.message or "").startswith("DownloadStalled: download Job jobs/")
    assert "wrote nothing for 600 s" in (progress.message or "")
    assert "stopped at 4096 bytes" in (progress.message or "")
    assert progress.bytes_on_disk == 4096
    assert progress.next_retry_time == plan.format_time(decide.T0 + datetime.timedelta(seconds=10))
    # the Job is gone: the error stays until the retry time, then attempt 1 starts
    recorded = {"iris": progress}
    waiting = plan.decide(decide.UNIT, decide._observed(progress=recorded))
    assert isinstance(waiting, plan.Wait)
    assert (waiting.outcome.progress.message or "").startswith(stall.STALLED)
    retried = plan.decide(decide.UNIT, decide._observed(progress=recorded, now=decide.LATER))
    assert retried == plan.Launch(attempt=1, message=progress.message)


@pytest.mark.parametrize("idle", [0.0, 599.9])
def test_a_download_idle_for_less_runs_on(idle: float) -> None:
    assert isinstance(plan.decide(decide.UNIT, _running(idle)), plan.Report)


def test_a_running_download_is_looked_at_again_by_the_time_it_would_stall() -> None:
    report = plan.decide(decide.UNIT, _running(597.5))
    assert isinstance(report, plan.Report)
    assert report.outcome.requeue_after == 2.5
    report = plan.decide(decide.UNIT, _running(599.9))
    assert isinstance(report, plan.Report)
    assert report.outcome.requeue_after == plan.STALL_LOOK_MIN_S
    report = plan.decide(decide.UNIT, _running(0.0))
    assert isinstance(report, plan.Report)
    assert report.outcome.requeue_after == STALL_POLICY.progress_interval


def test_a_stall_timeout_of_zero_never_stops_a_download() -> None:
    observed = dataclasses.replace(
        _running(10_000.0),
        policy=dataclasses.replace(STALL_POLICY, stall_timeout_s=0.0),
    )
    assert isinstance(plan.decide(decide.UNIT, observed), plan.Report)


def test_only_stopped_downloads_messages_mark_a_stop() -> None:
    assert stall.was_stopped("DownloadStalled: download Job a/b wrote nothing")
    assert stall.was_stopped("download Job a/b wrote 9 bytes, more than the cache's modelSize")
    assert not stall.was_stopped("download Job a/b failed: 404 Not Found (exit code 1)")
    assert not stall.was_stopped(None)
