"""The agent's status writes: owned fields, their diffs, summaries and transitions (the diff
itself is tested in tests/unit/runtime/test_patch.py)."""

from __future__ import annotations

from localcache.agent import status
from localcache.api import modelnode
from localcache.runtime import patch as patch_mod

Progress = modelnode.ModelProgress
S = modelnode.ModelStatus


def test_removed_status_keys_become_null_and_changed_fields_are_diffed() -> None:
    current = {
        "modelStatus": {"iris": "ModelDownloading", "gone": "ModelDownloaded"},
        "modelProgress": {"iris": {"bytesOnDisk": 5, "message": "retrying"}},
    }
    desired = {
        "modelStatus": {"iris": "ModelDownloaded"},
        "modelProgress": {"iris": {"bytesOnDisk": 9}},
    }
    assert patch_mod.merge_patch(current, desired) == {
        "modelStatus": {"iris": "ModelDownloaded", "gone": None},
        "modelProgress": {"iris": {"bytesOnDisk": 9, "message": None}},
    }


def test_only_owned_fields_are_compared() -> None:
    current = {"modelStatus": {}, "somethingElse": {"kept": True}, "summary": None}
    assert status.owned(current) == {"modelStatus": {}}
    assert status.owned(None) == {}


def test_desired_status_has_states_progress_and_summary() -> None:
    done = status.Outcome(S.DOWNLOADED, Progress(bytes_on_disk=3, percent=100, job_name="j-0"))
    failed = status.Outcome(S.DOWNLOAD_ERROR, Progress(message="boom"))
    desired = status.desired_status({"a": done, "ns/b": done, "c": failed})
    assert desired == {
        "modelStatus": {
            "a": "ModelDownloaded",
            "ns/b": "ModelDownloaded",
            "c": "ModelDownloadError",
        },
        "modelProgress": {
            "a": {"bytesOnDisk": 3, "percent": 100, "jobName": "j-0"},
            "ns/b": {"bytesOnDisk": 3, "percent": 100, "jobName": "j-0"},
            "c": {"message": "boom"},
        },
        "summary": {"total": 3, "downloaded": 2, "failed": 1},
    }
    assert status.desired_status({}) == {
        "modelStatus": {},
        "modelProgress": {},
        "summary": {"total": 0, "downloaded": 0, "failed": 0},
    }


def test_transitions_are_new_final_states_only() -> None:
    before = {"a": "ModelDownloaded", "b": "ModelDownloading", "c": "ModelDownloadError"}
    outcomes = {
        "a": status.Outcome(S.DOWNLOADED, Progress()),
        "b": status.Outcome(S.DOWNLOADED, Progress()),
        "c": status.Outcome(S.DOWNLOAD_PENDING, Progress()),
        "d": status.Outcome(S.DOWNLOAD_ERROR, Progress(message="no secret")),
    }
    assert status.transitions(before, outcomes) == [
        status.Transition("b", S.DOWNLOADED, ""),
        status.Transition("d", S.DOWNLOAD_ERROR, "no secret"),
    ]


def test_previous_progress_skips_unreadable_entries() -> None:
    found = status.previous_progress(
        {"modelProgress": {"ok": {"jobName": "j-1"}, "bad": {"percent": 400}}}
    )
    assert list(found) == ["ok"]
    assert found["ok"].job_name == "j-1"
    assert status.previous_states(None) == {}


def test_job_records_are_an_owned_field_and_leave_when_empty() -> None:
    record = modelnode.DownloadJob(
        namespace="ns",
        name="lmd-x",
        uid="u1",
        status_key="iris",
        storage_key="0123456789abcdef",
        scope="s" * 64,
        attempt=0,
    )
    desired = status.desired_status({}, jobs=[record])
    assert desired["downloadJobs"] == [
        {
            "namespace": "ns",
            "name": "lmd-x",
            "uid": "u1",
            "statusKey": "iris",
            "storageKey": "0123456789abcdef",
            "scope": "s" * 64,
            "attempt": 0,
        }
    ]
    patched = patch_mod.merge_patch(status.owned(desired), status.desired_status({}))
    assert patched["downloadJobs"] is None
