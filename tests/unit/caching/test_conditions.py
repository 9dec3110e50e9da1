"""Cache status aggregation: nodeStatus, copies, Ready/Degraded conditions and events."""

from __future__ import annotations

import pytest

from localcache.api import meta
from localcache.caching import conditions

NS = conditions.NodeStatus
T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:05:00Z"


@pytest.mark.parametrize(
    ("ready", "model_status", "expected"),
    [
        (True, "ModelDownloaded", NS.DOWNLOADED),
        (True, "ModelDownloading", NS.DOWNLOADING),
        (True, "ModelDownloadPending", NS.DOWNLOAD_PENDING),
        (True, "ModelDownloadError", NS.DOWNLOAD_ERROR),
        (True, None, NS.DOWNLOAD_PENDING),
        (True, "", NS.DOWNLOAD_PENDING),
        (True, "SomethingNew", NS.DOWNLOAD_PENDING),
        (False, "ModelDownloaded", NS.NOT_READY),
        (False, None, NS.NOT_READY),
    ],
)
def test_node_status_maps_the_model_state_and_not_ready_wins(
    ready: bool, model_status: str | None, expected: conditions.NodeStatus
) -> None:
    assert conditions.node_status(ready=ready, model_status=model_status) == expected


def test_copies_count_members_only_and_write_zeros() -> None:
    result = conditions.copies({"a": NS.DOWNLOADED, "b": NS.NOT_READY, "c": NS.DOWNLOAD_ERROR})
    assert result.to_dict() == {"available": 1, "total": 3, "failed": 1}
    assert conditions.copies({}).to_dict() == {"available": 0, "total": 0, "failed": 0}


def _conds(
    statuses: dict[str, conditions.NodeStatus],
    *,
    missing: list[str] | None = None,
    previous: list[meta.Condition] | None = None,
    now: str = T0,
) -> dict[str, meta.Condition]:
    out = conditions.conditions(
        statuses, missing_groups=missing or [], previous=previous, generation=3, now=now
    )
    return {c.type: c for c in out}


def test_ready_when_every_member_downloaded() -> None:
    conds = _conds({"a": NS.DOWNLOADED, "b": NS.DOWNLOADED})
    assert conds["Ready"].status == meta.ConditionStatus.TRUE
    assert conds["Ready"].reason == "ModelDownloaded"
    assert conds["Ready"].observed_generation == 3
    assert conds["Degraded"].status == meta.ConditionStatus.FALSE


@pytest.mark.parametrize(
    ("statuses", "reason"),
    [
        ({}, "NoMemberNodes"),
        ({"a": NS.DOWNLOADED, "b": NS.DOWNLOADING}, "DownloadInProgress"),
        ({"a": NS.DOWNLOADED, "b": NS.NOT_READY}, "NodesNotReady"),
        ({"a": NS.NOT_READY, "b": NS.DOWNLOAD_ERROR}, "DownloadFailed"),
    ],
)
def test_not_ready_reasons(statuses: dict[str, conditions.NodeStatus], reason: str) -> None:
    conds = _conds(statuses)
    assert conds["Ready"].status == meta.ConditionStatus.FALSE
    assert conds["Ready"].reason == reason


def test_failed_download_degrades_and_names_the_nodes() -> None:
    conds = _conds({"a": NS.DOWNLOAD_ERROR, "b": NS.DOWNLOADED})
    assert conds["Degraded"].status == meta.ConditionStatus.TRUE
    assert conds["Degraded"].reason == "DownloadFailed"
    assert "download failed on a" in conds["Degraded"].message


def test_missing_node_group_is_named_in_both_conditions() -> None:
    conds = _conds({"a": NS.DOWNLOADED}, missing=["gpu9"])
    assert conds["Ready"].status == meta.ConditionStatus.FALSE
    assert conds["Ready"].reason == "NodeGroupNotFound"
    assert conds["Degraded"].status == meta.ConditionStatus.TRUE
    assert conds["Degraded"].reason == "NodeGroupNotFound"
    assert "node group gpu9 not found" in conds["Degraded"].message


def test_long_node_lists_are_shortened() -> None:
    statuses = {f"n{i}": NS.DOWNLOAD_ERROR for i in range(9)}
    assert "and 4 more" in _conds(statuses)["Degraded"].message


def test_transition_time_kept_while_status_unchanged() -> None:
    first = _conds({"a": NS.DOWNLOADING})
    second = _conds({"a": NS.NOT_READY}, previous=list(first.values()), now=T1)
    assert second["Ready"].last_transition_time == T0
    assert second["Ready"].reason == "NodesNotReady"
    third = _conds({"a": NS.DOWNLOADED}, previous=list(second.values()), now=T1)
    assert third["Ready"].last_transition_time == T1
    assert third["Degraded"].last_transition_time == T0


def test_other_condition_types_are_kept() -> None:
    foreign = meta.Condition(
        type="Custom",
        status=meta.ConditionStatus.TRUE,
        last_transition_time=T0,
        reason="X",
        message="",
    )
    out = conditions.conditions({}, missing_groups=[], previous=[foreign], generation=None, now=T1)
    assert [c.type for c in out] == ["Ready", "Degraded", "Custom"]


def test_events_for_download_completion_failure_and_condition_changes() -> None:
    old_nodes = {"a": NS.DOWNLOADING, "b": NS.DOWNLOADING}
    new_nodes = {"a": NS.DOWNLOADED, "b": NS.DOWNLOAD_ERROR}
    old_conds = list(_conds(old_nodes).values())
    new_conds = list(_conds(new_nodes, previous=old_conds).values())
    found = conditions.events(
        old_nodes=old_nodes,
        new_nodes=new_nodes,
        old_conditions=old_conds,
        new_conditions=new_conds,
        failure_messages={"b": "403 from s3"},
    )
    assert [(e.type, e.reason) for e in found] == [
        ("Normal", "ModelDownloaded"),
        ("Warning", "DownloadFailed"),
        ("Warning", "Degraded"),
    ]
    assert found[1].message == "model download failed on node b: 403 from s3"


def test_no_events_when_nothing_changed_or_a_new_cache_starts_not_ready() -> None:
    nodes = {"a": NS.DOWNLOADING}
    conds = list(_conds(nodes).values())
    assert (
        conditions.events(
            old_nodes=nodes, new_nodes=nodes, old_conditions=conds, new_conditions=conds
        )
        == []
    )
    assert (
        conditions.events(old_nodes={}, new_nodes=nodes, old_conditions=[], new_conditions=conds)
        == []
    )


def test_ready_event_when_all_copies_arrive() -> None:
    before = list(_conds({"a": NS.DOWNLOADING}).values())
    after = list(_conds({"a": NS.DOWNLOADED}, previous=before, now=T1).values())
    found = conditions.events(
        old_nodes={"a": NS.DOWNLOADED},
        new_nodes={"a": NS.DOWNLOADED},
        old_conditions=before,
        new_conditions=after,
    )
    assert [(e.type, e.reason) for e in found] == [("Normal", "Ready")]
