"""The agent's pure decisions: download units and sharing, Job phases, retry timing,
failure messages, progress and the node-group fallback."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from localcache.agent import jobs, plan
from localcache.api import modelnode
from localcache.caching import keys

URI = "s3://mybucket/mymodel"
NODE = "node-1"
JOB_NS = "kserve-localmodel-jobs"


def _entry(name: str, uri: str = URI, **fields: Any) -> modelnode.LocalModelInfo:
    return modelnode.LocalModelInfo.model_validate(
        {"sourceModelUri": uri, "modelName": name, **fields}
    )


def _units(*entries: modelnode.LocalModelInfo) -> list[plan.Unit]:
    return plan.units(list(entries), node_name=NODE, job_namespace=JOB_NS)


# ---- units and sharing ------------------------------------------------------------------
def test_same_uri_without_credentials_is_one_unit_across_cache_kinds() -> None:
    [unit] = _units(_entry("cluster"), _entry("tenant", namespace="team-a"))
    assert unit.status_keys == ["cluster", "team-a/tenant"]
    assert unit.leader.model_name == "cluster"
    assert unit.scope is None
    assert unit.tag == unit.open_tag


def test_different_credential_scopes_of_one_uri_are_separate_units() -> None:
    units = _units(
        _entry("a", namespace="team-a", serviceAccountName="reader"),
        _entry("b", namespace="team-b", serviceAccountName="reader"),
        _entry("open"),
    )
    assert [u.status_keys for u in units] == [["team-a/a"], ["team-b/b"], ["open"]]
    assert len({u.tag for u in units}) == 3
    assert {u.storage_key for u in units} == {keys.storage_key(URI)}


def test_same_scope_shares_a_unit() -> None:
    """Cluster entries share jobNamespace's scope; a namespace entry with the same account
    name in jobNamespace is the same scope too."""
    [unit] = _units(
        _entry("a", serviceAccountName="reader"),
        _entry("b", serviceAccountName="reader"),
        _entry("c", namespace=JOB_NS, serviceAccountName="reader"),
    )
    assert unit.status_keys == ["a", "b", f"{JOB_NS}/c"]


def test_different_uris_are_different_units_in_spec_order() -> None:
    units = _units(_entry("x", "s3://b/x"), _entry("y", "s3://b/y"), _entry("x2", "s3://b/x"))
    assert [u.status_keys for u in units] == [["x", "x2"], ["y"]]


def test_unit_reuses_open_and_own_scope_downloads_only() -> None:
    [scoped, other, open_] = _units(
        _entry("a", namespace="team-a", serviceAccountName="reader"),
        _entry("b", namespace="team-b", serviceAccountName="reader"),
        _entry("open"),
    )
    own_job = f"{scoped.tag}-3"
    open_job = f"{open_.tag}-0"
    assert scoped.reuses(own_job)
    assert scoped.reuses(open_job)
    assert not scoped.reuses(f"{other.tag}-0")
    assert not open_.reuses(own_job), "a download with credentials is not free for all"
    assert not scoped.reuses(None)
    assert not scoped.reuses("iris-node-1-abcde")


def test_unit_tag_is_the_job_name_without_attempt() -> None:
    [unit] = _units(_entry("iris"))
    name = jobs.job_name(storage_key=unit.storage_key, node_name=NODE, attempt=7, scope=None)
    assert name == f"{unit.tag}-7"
    assert plan.parse_job_name(name) == (unit.storage_key, unit.tag, 7)
    assert plan.tag_of(name) == unit.tag


@pytest.mark.parametrize(
    "name",
    [
        "iris-node-1-abcde",
        "lmd-0123456789abcdef-0123abcd",
        "lmd-0123456789abcdef-0123abcd-01",
        "lmd-0123456789ABCDEF-0123abcd-0",
        "x-lmd-0123456789abcdef-0123abcd-0",
        "",
    ],
)
def test_foreign_job_names_are_not_ours(name: str) -> None:
    assert plan.parse_job_name(name) is None
    assert plan.tag_of(name) is None


def test_job_ref_skips_foreign_and_deleting_jobs() -> None:
    [unit] = _units(_entry("iris"))
    meta = {"name": f"{unit.tag}-2", "namespace": "ns"}
    ref = plan.job_ref({"metadata": meta})
    assert ref is not None
    assert (ref.namespace, ref.attempt, ref.tag) == ("ns", 2, unit.tag)
    assert plan.job_ref({"metadata": {**meta, "deletionTimestamp": "2026-01-01T00:00:00Z"}}) is None
    assert plan.job_ref({"metadata": {"name": "other", "namespace": "ns"}}) is None


def test_wanted_jobs_match_by_label_values_and_scope() -> None:
    long_name = "m" * 80
    units = _units(_entry(long_name, namespace="n" * 63))
    [unit] = units
    labels = jobs.job_labels(unit.leader, node_name=NODE, storage_key=unit.storage_key)
    ref = plan.job_ref({"metadata": {"name": f"{unit.tag}-0", "labels": labels}})
    assert ref is not None
    assert plan.job_identity(ref) in plan.wanted_job_labels(units)
    changed = _units(_entry(long_name, namespace="n" * 63, serviceAccountName="sa"))
    assert plan.job_identity(ref) not in plan.wanted_job_labels(changed)


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
    assert plan.pod_failure_message(pods) == "second failure"


def test_pod_message_falls_back_to_reason_and_exit_code_then_pod_message() -> None:
    oom = [_pod(T0, "Failed", containerStatuses=_terminated(reason="OOMKilled", exitCode=137))]
    assert plan.pod_failure_message(oom) == "OOMKilled (exit code 137)"
    evicted = [_pod(T0, "Failed", reason="Evicted", message="low on disk")]
    assert plan.pod_failure_message(evicted) == "low on disk"
    assert plan.pod_failure_message([_pod(T0, "Succeeded")]) == ""


def test_long_messages_are_clipped() -> None:
    pods = [_pod(T0, "Failed", containerStatuses=_terminated(message="x" * 5000))]
    message = plan.pod_failure_message(pods)
    assert len(message) == 1024
    assert message.endswith("...")


@pytest.mark.parametrize(
    ("size", "model_size", "expected"),
    [(0, None, None), (10, 0, None), (50, 200, 25), (199, 200, 99), (500, 200, 99)],
)
def test_percent_of_model_size_stays_below_100_while_downloading(
    size: int, model_size: int | None, expected: int | None
) -> None:
    assert plan.percent(size, model_size) == expected


# ---- node-group fallback -------------------------------------------------------------------
NODE_OBJ = {"metadata": {"name": "node-1", "labels": {"instance-type": "gpu", "gpus": "4"}}}


def _term(*exprs: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    term: dict[str, Any] = {"matchExpressions": list(exprs)}
    if fields:
        term["matchFields"] = fields
    return term


def _req(key: str, op: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": op, "values": list(values)}


@pytest.mark.parametrize(
    ("term", "matches"),
    [
        (_term(_req("instance-type", "In", "gpu", "tpu")), True),
        (_term(_req("instance-type", "In", "cpu")), False),
        (_term(_req("instance-type", "NotIn", "cpu")), True),
        (_term(_req("zone", "NotIn", "a")), True),
        (_term(_req("instance-type", "Exists")), True),
        (_term(_req("zone", "DoesNotExist")), True),
        (_term(_req("gpus", "Gt", "2")), True),
        (_term(_req("gpus", "Lt", "2")), False),
        (_term(_req("instance-type", "Gt", "2")), False),
        (_term(_req("instance-type", "In", "gpu"), _req("zone", "Exists")), False),
        (_term(fields=[_req("metadata.name", "In", "node-1")]), True),
        (_term(), False),
    ],
)
def test_node_selector_terms(term: dict[str, Any], matches: bool) -> None:
    assert plan.node_matches([term], NODE_OBJ) is matches


def test_terms_are_ored_and_absent_terms_match_nothing() -> None:
    terms = [_term(_req("zone", "Exists")), _term(_req("instance-type", "In", "gpu"))]
    assert plan.node_matches(terms, NODE_OBJ)
    assert not plan.node_matches(None, NODE_OBJ)
    assert not plan.node_matches([], NODE_OBJ)


# ---- time ------------------------------------------------------------------------------------
def test_times_round_trip_in_kubernetes_format() -> None:
    parsed = plan.parse_time("2026-03-01T10:00:00Z")
    assert parsed == datetime.datetime(2026, 3, 1, 10, tzinfo=datetime.UTC)
    assert plan.format_time(parsed) == "2026-03-01T10:00:00Z"
    assert plan.parse_time("2026-03-01T10:00:00") == parsed
    assert plan.parse_time("yesterday") is None
    assert plan.parse_time(None) is None
