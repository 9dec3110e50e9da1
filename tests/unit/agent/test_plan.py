"""The facts the agent's decisions read: Job phases, retry timing, failure messages,
progress and times (the state machine itself is tests/unit/agent/test_decide.py, units
test_downloads.py, the node-group fallback's matcher `caching.placement.node_matches`
tests/unit/caching)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from localcache.agent import downloads, plan
from localcache.agent.jobs import launcher
from localcache.api import modelnode

URI = "s3://mybucket/mymodel"
NODE = "node-1"
JOB_NS = "kserve-localmodel-jobs"
SUFFIX = "abcd1234"


def _entry(name: str, uri: str = URI, **fields: Any) -> modelnode.LocalModelInfo:
    return modelnode.LocalModelInfo.model_validate(
        {"sourceModelUri": uri, "modelName": name, **fields}
    )


def _units(*entries: modelnode.LocalModelInfo) -> list[downloads.Unit]:
    return downloads.units(list(entries), node_name=NODE, job_namespace=JOB_NS)


# ---- Job state ---------------------------------------------------------------------------
T0 = "2026-03-01T10:00:00Z"
T1 = "2026-03-01T10:05:00Z"


def _cond(kind: str, status: str = "True", at: str = T1, **extra: str) -> dict[str, str]:
    return {"type": kind, "status": status, "lastTransitionTime": at, **extra}


def test_job_with_failed_pods_but_no_failed_condition_is_still_active() -> None:
    state = plan.job_state(
        {"status": {"failed": 2, "active": 1, "conditions": [_cond("FailureTarget")]}}
    )
    assert state.phase is plan.JobPhase.ACTIVE
    assert state.failed_pods == 2


def test_failed_condition_makes_the_job_failed_with_its_time_and_message() -> None:
    job = {
        "status": {
            "failed": 1,
            "startTime": T0,
            "conditions": [
                _cond("FailureTarget"),
                _cond("Failed", reason="BackoffLimitExceeded", message="Job has reached the limit"),
            ],
        }
    }
    state = plan.job_state(job)
    assert state.phase is plan.JobPhase.FAILED
    assert state.finished_at == plan.parse_time(T1)
    assert state.started_at == plan.parse_time(T0)
    assert (state.reason, state.message) == ("BackoffLimitExceeded", "Job has reached the limit")


def test_complete_job_uses_completion_time() -> None:
    job = {
        "status": {
            "succeeded": 1,
            "completionTime": "2026-03-01T10:04:00Z",
            "ready": 0,
            "conditions": [_cond("SuccessCriteriaMet"), _cond("Complete")],
        }
    }
    state = plan.job_state(job)
    assert state.phase is plan.JobPhase.COMPLETE
    assert state.finished_at == plan.parse_time("2026-03-01T10:04:00Z")


def test_false_conditions_do_not_finish_a_job() -> None:
    state = plan.job_state({"status": {"ready": 1, "conditions": [_cond("Failed", "False")]}})
    assert state.phase is plan.JobPhase.ACTIVE
    assert state.ready == 1


@pytest.mark.parametrize(
    ("attempt", "delay"), [(0, 60), (1, 120), (2, 240), (5, 1920), (6, 3600), (100, 3600)]
)
def test_retry_backoff_doubles_from_the_base_up_to_the_cap(attempt: int, delay: float) -> None:
    assert plan.retry_delay(attempt, base=60, cap=3600) == delay


# ---- failure messages and progress -------------------------------------------------------
def _pod(created: str, phase: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"creationTimestamp": created}, "status": {"phase": phase, **status}}


def _terminated(**term: Any) -> list[dict[str, Any]]:
    return [{"name": "c", "state": {"terminated": term}}]


def test_pod_message_is_the_newest_failed_pods_termination_message() -> None:
    pods = [
        _pod(T1, "Failed", containerStatuses=_terminated(message=" second failure \n")),
        _pod(T0, "Failed", containerStatuses=_terminated(message="first failure")),
        _pod("2026-03-01T10:09:00Z", "Pending"),
    ]
    assert launcher.pod_failure_message(pods) == "second failure"


def test_pod_message_falls_back_to_reason_and_exit_code_then_pod_message() -> None:
    oom = [_pod(T0, "Failed", containerStatuses=_terminated(reason="OOMKilled", exitCode=137))]
    assert launcher.pod_failure_message(oom) == "OOMKilled (exit code 137)"
    evicted = [_pod(T0, "Failed", reason="Evicted", message="low on disk")]
    assert launcher.pod_failure_message(evicted) == "low on disk"
    assert launcher.pod_failure_message([_pod(T0, "Succeeded")]) == ""


def test_long_messages_are_clipped() -> None:
    pods = [_pod(T0, "Failed", containerStatuses=_terminated(message="x" * 5000))]
    message = launcher.pod_failure_message(pods)
    assert len(message) == plan.POD_MESSAGE_LIMIT
    assert message.endswith("...")


def test_pod_message_is_one_line_without_control_characters() -> None:
    """Risk 5: a termination message (or, with FallbackToLogsOnError, log lines) must not
    reach the cluster-scoped status as raw multi-line text."""
    logs = (
        "secret-token=abc\nTraceback (most recent call last):\n  ...\nValueError: \x1b[31mbad\r\n"
    )
    pods = [_pod(T0, "Failed", containerStatuses=_terminated(message=logs))]
    assert launcher.pod_failure_message(pods) == "ValueError: [31mbad"
    assert plan.one_line("a\u2028b\x85") == "b"
    assert plan.one_line(None) == ""


def test_pod_message_only_from_pods_the_job_controls() -> None:
    own = _pod(T0, "Failed", containerStatuses=_terminated(message="own"))
    own["metadata"]["ownerReferences"] = [{"uid": "job-uid", "controller": True}]
    forged = _pod(T1, "Failed", containerStatuses=_terminated(message="forged"))
    forged["metadata"]["ownerReferences"] = [{"uid": "other", "controller": True}]
    assert launcher.pod_failure_message([own, forged], job_uid="job-uid") == "own"


@pytest.mark.parametrize(
    ("size", "model_size", "expected"),
    [(0, None, None), (10, 0, None), (50, 200, 25), (199, 200, 99), (500, 200, 99)],
)
def test_percent_of_model_size_stays_below_100_while_downloading(
    size: int, model_size: int | None, expected: int | None
) -> None:
    assert plan.percent(size, model_size) == expected


# ---- time ------------------------------------------------------------------------------------
def test_times_round_trip_in_kubernetes_format() -> None:
    parsed = plan.parse_time("2026-03-01T10:00:00Z")
    assert parsed == datetime.datetime(2026, 3, 1, 10, tzinfo=datetime.UTC)
    assert plan.format_time(parsed) == "2026-03-01T10:00:00Z"
    assert plan.parse_time("2026-03-01T10:00:00") == parsed
    assert plan.parse_time("yesterday") is None
    assert plan.parse_time(None) is None
