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
SUFFIX = "abcd1234"


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
    own_job = f"{scoped.tag}-3-{SUFFIX}"
    open_job = f"{open_.tag}-0-{SUFFIX}"
    assert scoped.reuses(own_job)
    assert scoped.reuses(open_job)
    assert not scoped.reuses(f"{other.tag}-0-{SUFFIX}")
    assert not open_.reuses(own_job), "a download with credentials is not free for all"
    assert not scoped.reuses(None)
    assert not scoped.reuses("iris-node-1-abcde")


def test_unit_tag_is_the_job_name_without_attempt_and_suffix() -> None:
    [unit] = _units(_entry("iris"))
    name = jobs.job_name(
        storage_key=unit.storage_key, node_name=NODE, attempt=7, scope=None, suffix=SUFFIX
    )
    assert name == f"{unit.tag}-7-{SUFFIX}"
    assert plan.parse_job_name(name) == (unit.storage_key, unit.tag, 7)
    assert plan.tag_of(name) == unit.tag


def test_scope_tag_in_job_names_has_64_bits() -> None:
    """Risk 5: a 32-bit tag let colliding scopes be found by brute force."""
    [unit] = _units(_entry("iris", namespace="team-a", serviceAccountName="reader"))
    digest = unit.tag.rpartition("-")[2]
    assert len(digest) * 4 >= 64
    assert len(unit.scope_id) == 64, "units and Job records use the full SHA-256 of the scope"


def test_units_are_grouped_by_full_scope_not_by_tag(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even if two scopes' tags collided, their entries stay separate units."""
    monkeypatch.setattr(plan, "unit_tag", lambda **_: "lmd-0000000000000000-0000000000000000")
    units = _units(
        _entry("a", namespace="team-a", serviceAccountName="reader"),
        _entry("b", namespace="team-b", serviceAccountName="reader"),
    )
    assert [u.status_keys for u in units] == [["team-a/a"], ["team-b/b"]]
    assert units[0].tag == units[1].tag
    assert units[0].scope_id != units[1].scope_id


@pytest.mark.parametrize(
    "name",
    [
        "iris-node-1-abcde",
        "lmd-0123456789abcdef-0123abcd-0",
        "lmd-0123456789abcdef-0123456789abcdef-0",
        "lmd-0123456789abcdef-0123456789abcdef-01-abcd1234",
        "lmd-0123456789ABCDEF-0123456789abcdef-0-abcd1234",
        "lmd-0123456789abcdef-0123456789abcdef-0-abcd123",
        "x-lmd-0123456789abcdef-0123456789abcdef-0-abcd1234",
        "",
    ],
)
def test_foreign_job_names_are_not_ours(name: str) -> None:
    assert plan.parse_job_name(name) is None
    assert plan.tag_of(name) is None


def _ref(unit: plan.Unit, *, namespace: str, attempt: int = 0, **fields: Any) -> plan.JobRef:
    values: dict[str, Any] = {
        "namespace": namespace,
        "name": f"{unit.tag}-{attempt}-{SUFFIX}",
        "uid": f"uid-{attempt}",
        "status_key": unit.status_keys[0],
        "storage_key": unit.storage_key,
        "scope": unit.scope_id,
        "attempt": attempt,
        "obj": {},
        **fields,
    }
    return plan.JobRef(**values)


def test_wanted_jobs_match_by_entry_storage_key_and_full_scope() -> None:
    long_name = "m" * 80
    units = _units(_entry(long_name, namespace="n" * 63))
    [unit] = units
    ref = _ref(unit, namespace="n" * 63)
    assert ref.identity in plan.wanted_jobs(units)
    changed = _units(_entry(long_name, namespace="n" * 63, serviceAccountName="sa"))
    assert ref.identity not in plan.wanted_jobs(changed)


def test_unit_jobs_are_its_scope_in_its_namespaces_oldest_first() -> None:
    [unit, other] = _units(
        _entry("a", namespace="team-a", serviceAccountName="reader"),
        _entry("b", namespace="team-b", serviceAccountName="reader"),
    )
    assert unit.namespaces == {"team-a"}
    second, first = _ref(unit, namespace="team-a", attempt=1), _ref(unit, namespace="team-a")
    elsewhere = _ref(unit, namespace="team-b", attempt=2)
    others = _ref(other, namespace="team-b")
    assert plan.unit_jobs(unit, [second, elsewhere, others, first]) == [first, second]


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
    assert len(message) == plan.POD_MESSAGE_LIMIT
    assert message.endswith("...")


def test_pod_message_is_one_line_without_control_characters() -> None:
    """Risk 5: a termination message (or, with FallbackToLogsOnError, log lines) must not
    reach the cluster-scoped status as raw multi-line text."""
    logs = (
        "secret-token=abc\nTraceback (most recent call last):\n  ...\nValueError: \x1b[31mbad\r\n"
    )
    pods = [_pod(T0, "Failed", containerStatuses=_terminated(message=logs))]
    assert plan.pod_failure_message(pods) == "ValueError: [31mbad"
    assert plan.one_line("a\u2028b\x85") == "b"
    assert plan.one_line(None) == ""


def test_pod_message_only_from_pods_the_job_controls() -> None:
    own = _pod(T0, "Failed", containerStatuses=_terminated(message="own"))
    own["metadata"]["ownerReferences"] = [{"uid": "job-uid", "controller": True}]
    forged = _pod(T1, "Failed", containerStatuses=_terminated(message="forged"))
    forged["metadata"]["ownerReferences"] = [{"uid": "other", "controller": True}]
    assert plan.pod_failure_message([own, forged], job_uid="job-uid") == "own"


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


def test_a_folder_downloaded_under_a_32_bit_tag_is_reused_after_the_upgrade() -> None:
    """Manifests and status of earlier versions name Jobs `lmd-<key>-<8 hex>-<attempt>`: the
    same scope's folder is reused (no download again), another scope's is not."""
    (unit,) = _units(_entry("a", namespace="team-a", serviceAccountName="reader"))
    (other,) = _units(_entry("b", namespace="team-b", serviceAccountName="writer"))
    legacy = f"{unit.tag[:-8]}-0"
    assert unit.reuses(legacy)
    assert not other.reuses(legacy)
    assert unit.reuses(f"{unit.open_tag[:-8]}-3")
    assert not unit.reuses(f"{unit.tag[:-8]}x-0")
