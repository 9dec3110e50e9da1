"""Which Jobs the agent trusts: only those whose namespace, name and uid it recorded when it
created them (issue 13, bug 1)."""

from __future__ import annotations

from typing import Any

from localcache.agent.jobs import trust
from localcache.api import modelnode

Obj = dict[str, Any]


def _record(name: str = "lmd-a", uid: str = "u1", **fields: Any) -> modelnode.DownloadJob:
    values: dict[str, Any] = {
        "namespace": "team-a",
        "name": name,
        "uid": uid,
        "statusKey": "team-a/iris",
        "storageKey": "0123456789abcdef",
        "scope": "s" * 64,
        "attempt": 0,
        **fields,
    }
    return modelnode.DownloadJob.model_validate(values)


def _job(name: str = "lmd-a", uid: str = "u1", namespace: str = "team-a", **meta: Any) -> Obj:
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid, **meta}}


def test_a_job_is_trusted_only_with_the_recorded_uid() -> None:
    result = trust.sort_jobs([_job()], [_record()], unseen_ok={})
    [ref] = result.trusted
    assert (ref.namespace, ref.name, ref.uid, ref.status_key) == (
        "team-a",
        "lmd-a",
        "u1",
        "team-a/iris",
    )
    assert result.untrusted == []


def test_same_name_with_another_uid_is_untrusted_and_the_record_is_dropped() -> None:
    forged = _job(uid="forged", ownerReferences=[{"uid": "node-uid", "controller": True}])
    result = trust.sort_jobs([forged], [_record()], unseen_ok={})
    assert result.trusted == []
    assert result.records == []
    assert result.untrusted == [forged]


def test_same_name_and_uid_in_another_namespace_is_untrusted() -> None:
    elsewhere = _job(namespace="team-b")
    result = trust.sort_jobs([elsewhere], [_record()], unseen_ok={})
    assert result.trusted == []
    assert result.untrusted == [elsewhere]


def test_unrecorded_jobs_are_untrusted_whatever_they_look_like() -> None:
    lookalike = _job(name="lmd-b", uid="u2", labels={"node": "node-1"})
    assert trust.sort_jobs([lookalike], [], unseen_ok={}).untrusted == [lookalike]


def test_an_unseen_job_is_kept_only_while_just_created_with_the_same_uid() -> None:
    fresh = _job()
    kept = trust.sort_jobs([], [_record()], unseen_ok={("team-a", "lmd-a"): fresh})
    assert [r.name for r in kept.trusted] == ["lmd-a"]
    assert kept.records == [_record()]
    other = trust.sort_jobs([], [_record()], unseen_ok={("team-a", "lmd-a"): _job(uid="x")})
    assert other.trusted == []
    assert other.records == []
    assert trust.sort_jobs([], [_record()], unseen_ok={}).records == []


def test_a_job_being_deleted_keeps_its_record_but_is_not_used() -> None:
    result = trust.sort_jobs(
        [_job(deletionTimestamp="2026-01-01T00:00:00Z")], [_record()], unseen_ok={}
    )
    assert result.trusted == []
    assert result.records == [_record()]
    assert result.untrusted == []


def test_records_merge_by_uid_and_parse_leniently() -> None:
    a, b = _record(), _record(name="lmd-b", uid="u2")
    assert trust.merge([b], [a, b]) == [a, b]
    status = {"downloadJobs": [a.to_dict(), {"name": "broken"}]}
    assert trust.parse_records(status) == [a]
    assert trust.parse_records(None) == []
    assert trust.parse_records({"downloadJobs": "nonsense"}) == []
