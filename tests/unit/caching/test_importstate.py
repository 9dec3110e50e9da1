"""A shared-volume cache's import: phase, failure gist, placed size, trust, backoff, status."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localcache.api import meta
from localcache.caching import importjob, importstate, sharedvolume

Obj = dict[str, Any]
JOB_UID = "job-uid"
SECRET_LOG = "Traceback ... token=s3cr3t https://user:pw@host/x?sig=abc\n404 Not Found"


def _job(conditions: list[Obj] | None = None, **counts: int) -> Obj:
    return {
        "metadata": {"name": "m-import", "namespace": "team", "uid": JOB_UID},
        "status": {"conditions": conditions or [], **counts},
    }


def _pod(*, owner: str = JOB_UID, created: str = "2026-01-01T00:00:00Z", **status: Any) -> Obj:
    return {
        "metadata": {
            "name": f"p-{created}",
            "creationTimestamp": created,
            "ownerReferences": [{"kind": "Job", "uid": owner, "controller": True}],
        },
        "status": status,
    }


def _term(name: str, code: int, message: str = "", reason: str = "Error") -> Obj:
    return {
        "name": name,
        "state": {"terminated": {"exitCode": code, "reason": reason, "message": message}},
    }


@pytest.mark.parametrize(
    ("job", "phase"),
    [
        (_job(), "pending"),
        (_job(active=1), "running"),
        (_job(ready=1), "running"),
        (_job([{"type": "Complete", "status": "True"}]), "succeeded"),
        (_job([{"type": "Failed", "status": "True"}], failed=3), "failed"),
        (_job([{"type": "Failed", "status": "False"}], active=1), "running"),
    ],
)
def test_phase_follows_the_job(job: Obj, phase: str) -> None:
    assert importstate.phase_of(job) == phase


def test_a_download_failure_is_published_as_its_gist_only() -> None:
    failed = _job([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}])
    pod = _pod(
        phase="Failed",
        initContainerStatuses=[
            _term(importjob.PREPARE_CONTAINER, 0, reason="Completed"),
            _term(importjob.DOWNLOAD_CONTAINER, 1, SECRET_LOG),
        ],
    )
    message = importstate.failure_message(failed, [pod])
    assert message == (
        "import Job failed (BackoffLimitExceeded): download failed: 404 Not Found (exit code 1)"
    )
    for leaked in ("s3cr3t", "pw@", "sig=", "Traceback"):
        assert leaked not in message


def test_an_unrecognised_download_failure_names_no_log_text() -> None:
    pod = _pod(
        phase="Failed",
        initContainerStatuses=[_term(importjob.DOWNLOAD_CONTAINER, 2, "something odd: secret")],
    )
    message = importstate.failure_message(_job([{"type": "Failed", "status": "True"}]), [pod])
    assert message == "import Job failed: download failed: Error (exit code 2)"


def test_a_failed_step_of_ours_is_named_with_its_exit_code() -> None:
    pod = _pod(phase="Failed", containerStatuses=[_term(importjob.PLACE_CONTAINER, 3, "x")])
    message = importstate.failure_message(_job([{"type": "Failed", "status": "True"}]), [pod])
    assert message == "import Job failed: place failed: Error (exit code 3)"


def test_pods_of_other_jobs_are_not_read() -> None:
    pod = _pod(
        owner="someone-else",
        phase="Failed",
        initContainerStatuses=[_term(importjob.DOWNLOAD_CONTAINER, 1, "404 Not Found")],
    )
    assert importstate.failure_message(_job(), [pod]) == "import Job failed"


def test_the_placed_size_comes_from_the_place_termination_message() -> None:
    message = json.dumps({"bytes": 1234, "files": 3})
    older = _pod(created="2026-01-01T00:00:00Z", containerStatuses=[_term("place", 1, "x")])
    newer = _pod(
        created="2026-01-01T00:01:00Z",
        containerStatuses=[_term(importjob.PLACE_CONTAINER, 0, message, "Completed")],
    )
    assert importstate.placed_bytes(JOB_UID, [newer, older]) == 1234
    assert importstate.placed_bytes("other", [newer]) is None
    bad = _pod(containerStatuses=[_term(importjob.PLACE_CONTAINER, 0, "not json", "Completed")])
    assert importstate.placed_bytes(JOB_UID, [bad]) is None


def test_progress_lines_are_parsed_strictly() -> None:
    found = importjob.progress_from_log('{"bytes": 10, "files": 1}\n')
    assert found is not None
    assert found.bytes == 10
    assert importjob.progress_from_log('{"bytes": true, "files": 1}') is None
    assert importjob.progress_from_log("x" * 300) is None


def test_a_job_is_trusted_only_by_the_recorded_uid() -> None:
    ours = {"metadata": {"uid": "j1", "ownerReferences": [{"uid": "c1", "controller": True}]}}
    assert importstate.judge(ours, recorded_uid="j1", cache_uid="c1") == "ours"
    assert importstate.judge(ours, recorded_uid=None, cache_uid="c1") == "unproven"
    assert importstate.judge(ours, recorded_uid="j0", cache_uid="c1") == "unproven"
    assert importstate.judge(ours, recorded_uid=None, cache_uid="c2") == "foreign"
    plain = {"metadata": {"uid": "j2", "labels": {"model": "m"}}}
    assert importstate.judge(plain, recorded_uid=None, cache_uid="c1") == "foreign"


@pytest.mark.parametrize(("failed", "delay"), [(1, 60), (2, 120), (3, 240), (4, 300), (50, 300)])
def test_the_retry_backoff_doubles_up_to_its_cap(failed: int, delay: int) -> None:
    assert importstate.retry_delay(failed, base=60, cap=300) == delay


def test_times_are_rfc3339_and_waits_never_negative() -> None:
    later = importstate.later("2026-01-01T00:00:00Z", 90)
    assert later == "2026-01-01T00:01:30Z"
    assert importstate.seconds_until(later, "2026-01-01T00:01:00Z") == 30
    assert importstate.seconds_until(later, "2026-01-01T00:02:00Z") == 0
    assert importstate.seconds_until(None, "2026-01-01T00:02:00Z") == 0


def test_ready_keeps_its_transition_time_while_its_status_holds() -> None:
    pending = importstate.Outcome(False, sharedvolume.REASON_IMPORT_PENDING, "pending")
    first = importstate.ready_condition(pending, previous=None, generation=1, now="T1")
    assert [c.type for c in first] == ["Ready"]
    assert first[0].status == meta.ConditionStatus.FALSE
    assert first[0].observed_generation == 1
    running = importstate.Outcome(False, sharedvolume.REASON_IMPORT_RUNNING, "running")
    second = importstate.ready_condition(running, previous=first, generation=2, now="T2")
    assert second[0].last_transition_time == "T1"
    assert second[0].reason == sharedvolume.REASON_IMPORT_RUNNING
    assert second[0].observed_generation == 2
    done = importstate.Outcome(True, sharedvolume.REASON_IMPORT_SUCCEEDED, "done", available=1)
    third = importstate.ready_condition(done, previous=second, generation=2, now="T3")
    assert third[0].status == meta.ConditionStatus.TRUE
    assert third[0].last_transition_time == "T3"
    assert importstate.copies(done).to_dict() == {"total": 1, "available": 1, "failed": 0}
    failed = importstate.Outcome(False, sharedvolume.REASON_IMPORT_FAILED, "x", failed=1)
    assert importstate.copies(failed).to_dict() == {"total": 1, "available": 0, "failed": 1}


def test_events_on_ready_and_on_new_problems_only() -> None:
    def cond(ready: bool, reason: str) -> list[meta.Condition]:
        outcome = importstate.Outcome(ready, reason, "msg")
        return importstate.ready_condition(outcome, previous=None, generation=1, now="T")

    pending = cond(False, sharedvolume.REASON_IMPORT_PENDING)
    conflict = cond(False, sharedvolume.REASON_IMPORT_JOB_CONFLICT)
    ready = cond(True, sharedvolume.REASON_IMPORT_SUCCEEDED)
    assert importstate.events(None, pending) == []
    assert [e.reason for e in importstate.events(pending, conflict)] == ["ImportJobConflict"]
    assert importstate.events(conflict, conflict) == []
    assert [(e.type, e.reason) for e in importstate.events(pending, ready)] == [("Normal", "Ready")]


def test_a_job_reported_succeeded_stays_succeeded_when_a_lagging_copy_says_running() -> None:
    # the controller saw the Job complete (a GET) before its informer caught up: the older
    # copy (active=1) must not undo ImportSucceeded (CI: a completed import re-imported)
    lagging = {**_job(active=1), "metadata": {"uid": "u1"}}
    done = sharedvolume.REASON_IMPORT_SUCCEEDED
    assert importstate.phase_seen(lagging, reported=done, recorded_uid="u1") == "succeeded"
    # another Job, or a status that never said succeeded: the Job's own phase
    assert importstate.phase_seen(lagging, reported=done, recorded_uid="u2") == "running"
    running = sharedvolume.REASON_IMPORT_RUNNING
    assert importstate.phase_seen(lagging, reported=running, recorded_uid="u1") == "running"
    assert importstate.phase_seen(lagging, reported=done, recorded_uid=None) == "running"
