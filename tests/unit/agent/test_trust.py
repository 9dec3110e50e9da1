"""Which Jobs the agent trusts: only those whose namespace, name and uid it recorded when it
created them (issue 13, bug 1)."""

from __future__ import annotations

import json
from typing import Any

from localcache.agent import plan
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


def _hostile_job() -> dict[str, Any]:
    """A Job labelled for the node as a tenant can make it: 1 MiB of env, many labels and
    owners, long condition texts (security review finding 6)."""
    env = [{"name": f"E{i}", "value": "x" * 1024} for i in range(1024)]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "squat", "namespace": "team-a", "uid": "u-1", "resourceVersion": "9",
            "labels": {"node": "node-1", **{f"k{i}": "v" for i in range(500)}},
            "annotations": {"big": "y" * 200_000},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "X", "name": f"o{i}", "uid": f"{i}",
                 "controller": i == 0}
                for i in range(100)
            ],
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i", "env": env}]}}},
        "status": {
            "failed": 1, "startTime": "2026-01-01T00:00:00Z",
            "conditions": [
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                 "message": "m" * 100_000, "lastTransitionTime": "2026-01-01T00:01:00Z"}
            ] * 50,
        },
    }  # fmt: skip


def test_the_agent_keeps_a_bounded_slice_of_each_job_it_sees() -> None:
    job = _hostile_job()
    kept = trust.observed(job)
    assert len(json.dumps(job)) > 1_000_000
    assert len(json.dumps(kept)) < 40_000
    assert "spec" not in kept
    assert "annotations" not in kept["metadata"]
    assert "managedFields" not in kept["metadata"]
    assert (trust.ident_of(kept), trust.uid_of(kept)) == (("team-a", "squat"), "u-1")
    assert kept["metadata"]["ownerReferences"][0]["controller"] is True
    assert len(kept["metadata"]["ownerReferences"]) == trust.MAX_OWNERS
    assert len(kept["status"]["conditions"]) == trust.MAX_CONDITIONS
    assert plan.job_state(kept).phase == plan.job_state(job).phase == plan.JobPhase.FAILED


def test_what_the_agent_reads_of_its_own_job_survives_the_slice() -> None:
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "lmd-a", "namespace": "jobs", "uid": "u", "resourceVersion": "3",
                     "labels": {"node": "node-1", "storageKey": "k"},
                     "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"active": 1, "ready": 1, "startTime": "2026-01-01T00:00:00Z"},
    }  # fmt: skip
    kept = trust.observed(job)
    assert kept["metadata"] == {**job["metadata"], "ownerReferences": []}
    assert plan.job_state(kept) == plan.job_state(job)
