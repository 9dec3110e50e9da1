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


# ------------------------------------------------------------------------ failures reach the cache


@pytest.mark.parametrize(
    ("model_status", "attempts", "message", "expected"),
    [
        # the agent retries a failed download: the entry is Pending/Downloading again, with a
        # later attempt that carries the last failure message
        ("ModelDownloadPending", 2, "download Job j-0 failed: 403", NS.DOWNLOAD_ERROR),
        ("ModelDownloading", 3, "download Job j-1 failed: 403", NS.DOWNLOAD_ERROR),
        # a pod failed while the first Job still retries: not a failure yet [P17]
        ("ModelDownloading", 1, "a download pod failed, Job j-0 retries: x", NS.DOWNLOADING),
        # a lost folder downloaded again: a later attempt without a failure
        ("ModelDownloadPending", 2, None, NS.DOWNLOAD_PENDING),
        ("ModelDownloaded", 3, "download Job j-1 failed: 403", NS.DOWNLOADED),
        ("ModelDownloadError", 1, "download Job j-0 failed: 403", NS.DOWNLOAD_ERROR),
    ],
)
def test_a_retry_after_a_failure_stays_a_download_error_until_it_succeeds(
    model_status: str, attempts: int, message: str | None, expected: conditions.NodeStatus
) -> None:
    found = conditions.node_status(
        ready=True, model_status=model_status, attempts=attempts, message=message
    )
    assert found == expected


def test_degraded_names_the_failed_nodes_the_retries_and_the_first_message() -> None:
    statuses = {"n1": NS.DOWNLOAD_ERROR, "n2": NS.DOWNLOAD_ERROR, "n3": NS.DOWNLOADED}
    out = conditions.conditions(
        statuses,
        missing_groups=[],
        previous=None,
        generation=1,
        now=T0,
        retrying={"n2"},
        failure_messages={"n1": "download Job j failed: 403 Forbidden", "n3": "old"},
    )
    degraded = {c.type: c for c in out}["Degraded"]
    assert degraded.status == meta.ConditionStatus.TRUE
    assert degraded.reason == "DownloadFailed"
    assert degraded.message == (
        "download failed on n1, n2 (retry running on n2); n1: download Job j failed: 403 Forbidden"
    )


def _lifecycle(
    steps: list[dict[str, conditions.NodeStatus]],
) -> list[list[tuple[str, str]]]:
    """The events of each step of a node's status history, as the reconciler records them."""
    old_nodes: dict[str, conditions.NodeStatus] = {}
    old_conds: list[meta.Condition] = []
    found = []
    for nodes in steps:
        new_conds = conditions.conditions(
            nodes, missing_groups=[], previous=old_conds, generation=1, now=T0
        )
        events = conditions.events(
            old_nodes=old_nodes,
            new_nodes=nodes,
            old_conditions=old_conds,
            new_conditions=new_conds,
        )
        found.append([(str(e.type), e.reason) for e in events])
        old_nodes, old_conds = nodes, new_conds
    return found


def test_recovered_only_after_the_retry_succeeds() -> None:
    def node(model_status: str, attempts: int, message: str | None) -> conditions.NodeStatus:
        return conditions.node_status(
            ready=True, model_status=model_status, attempts=attempts, message=message
        )

    failure = "download Job j-0 failed: no such bucket"
    steps = [
        {"a": node("ModelDownloading", 1, None)},
        {"a": node("ModelDownloadError", 1, failure)},
        {"a": node("ModelDownloadPending", 2, failure)},  # the retry starts
        {"a": node("ModelDownloading", 2, failure)},
        {"a": node("ModelDownloaded", 2, None)},
    ]
    assert _lifecycle(steps) == [
        [],
        [("Warning", "DownloadFailed"), ("Warning", "Degraded")],
        [],
        [],
        [("Normal", "ModelDownloaded"), ("Normal", "Ready"), ("Normal", "Recovered")],
    ]


REFUSED = conditions.Refusal(
    verb="create",
    kind="PersistentVolumeClaim",
    name="bert-gpu-download",
    namespace="team-a",
    code=403,
    reason="Forbidden",
    message='persistentvolumeclaims "bert-gpu-download" is forbidden: exceeded quota: q',
)


def test_a_refused_derived_object_degrades_the_cache_with_the_apiservers_message() -> None:
    out = conditions.conditions(
        {"a": NS.DOWNLOAD_ERROR},
        missing_groups=[],
        previous=None,
        generation=1,
        now=T0,
        refused=[REFUSED],
    )
    degraded = {c.type: c for c in out}["Degraded"]
    assert degraded.status == meta.ConditionStatus.TRUE
    assert degraded.reason == "VolumeRefused"
    assert degraded.message == (
        "cannot create PersistentVolumeClaim team-a/bert-gpu-download: 403 Forbidden: "
        'persistentvolumeclaims "bert-gpu-download" is forbidden: exceeded quota: q; '
        "download failed on a"
    )


def test_a_refusal_is_an_event_once_not_at_every_retry() -> None:
    before = list(_conds({"a": NS.DOWNLOADING}).values())
    refused = conditions.conditions(
        {"a": NS.DOWNLOADING},
        missing_groups=[],
        previous=before,
        generation=1,
        now=T1,
        refused=[REFUSED],
    )
    first = conditions.events(
        old_nodes={"a": NS.DOWNLOADING},
        new_nodes={"a": NS.DOWNLOADING},
        old_conditions=before,
        new_conditions=refused,
        refused=[REFUSED],
    )
    assert [(e.type, e.reason) for e in first] == [
        ("Warning", "VolumeRefused"),
        ("Warning", "Degraded"),
    ]
    assert first[0].message == REFUSED.describe()
    again = conditions.events(
        old_nodes={"a": NS.DOWNLOADING},
        new_nodes={"a": NS.DOWNLOADING},
        old_conditions=refused,
        new_conditions=refused,
        refused=[REFUSED],
    )
    assert again == []
