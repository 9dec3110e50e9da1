"""The agent DaemonSet's tolerations: installer's kept, node groups' added and removed, bounds."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localcache.caching import agenttolerations as rules

GPU = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
TPU = {"key": "google.com/tpu", "operator": "Equal", "value": "present", "effect": "NoSchedule"}
INSTALLER = {"key": "dedicated", "operator": "Equal", "value": "infra", "effect": "NoSchedule"}


def _plan(live: Any, record: str | None, groups: Any) -> rules.Plan:
    return rules.plan(live=live, record=record, groups=groups)


def test_groups_tolerations_are_added_after_the_installers() -> None:
    plan = _plan([INSTALLER], None, [("gpus", [GPU])])
    assert plan.tolerations == [INSTALLER, GPU]
    assert json.loads(plan.record) == [GPU]


def test_a_toleration_no_group_has_any_more_goes_away_and_the_installers_stays() -> None:
    first = _plan([INSTALLER], None, [("gpus", [GPU]), ("tpus", [TPU])])
    second = _plan(first.tolerations, first.record, [("tpus", [TPU])])
    assert second.tolerations == [INSTALLER, TPU]
    third = _plan(second.tolerations, second.record, [])
    assert third.tolerations == [INSTALLER]
    assert third.record == "[]"


def test_an_installer_reapply_replaces_the_list_and_the_groups_come_back() -> None:
    synced = _plan([INSTALLER], None, [("gpus", [GPU])])
    # kubectl apply / helm upgrade: the list is replaced, the annotation is kept
    again = _plan([INSTALLER], synced.record, [("gpus", [GPU])])
    assert again.tolerations == [INSTALLER, GPU]


def test_an_installer_change_is_kept_with_the_groups() -> None:
    synced = _plan([INSTALLER], None, [("gpus", [GPU])])
    extra = {"key": "spot", "operator": "Exists"}
    again = _plan([extra], synced.record, [("gpus", [GPU])])
    assert again.tolerations == [extra, GPU]


def test_a_group_toleration_the_installer_already_has_is_not_recorded() -> None:
    plan = _plan([GPU], None, [("gpus", [GPU])])
    assert plan.tolerations == [GPU]
    assert plan.record == "[]"
    gone = _plan(plan.tolerations, plan.record, [])
    assert gone.tolerations == [GPU]  # the installer's, never removed


def test_duplicates_across_groups_are_added_once_in_group_name_order() -> None:
    plan = _plan(None, None, [("zeta", [TPU, GPU]), ("alpha", [GPU])])
    assert plan.tolerations == [GPU, TPU]


def test_identity_treats_an_empty_operator_as_equal_and_writes_it_out() -> None:
    bare = {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"}
    assert rules.identity(bare) == rules.identity(TPU)
    plan = _plan(None, None, [("tpus", [bare])])
    assert plan.tolerations == [TPU]


def test_the_plan_is_stable_once_applied() -> None:
    groups = [("gpus", [GPU, {"key": "a", "value": "b"}]), ("tpus", [TPU])]
    first = _plan([INSTALLER], None, groups)
    second = _plan(first.tolerations, first.record, groups)
    assert (second.tolerations, second.record) == (first.tolerations, first.record)


def test_an_unreadable_record_keeps_everything_live_as_the_installers() -> None:
    plan = _plan([INSTALLER, GPU], "{not json", [])
    assert plan.tolerations == [INSTALLER, GPU]
    assert rules.parse_record("{not json") is None
    assert rules.parse_record('{"a": 1}') is None
    assert rules.parse_record(None) == []


@pytest.mark.parametrize(
    ("tol", "fragment"),
    [
        ({"key": "bad key!", "operator": "Exists"}, "qualified name"),
        ({"key": "x" * 64, "operator": "Exists"}, "qualified name"),
        ({"key": "a/b/c", "operator": "Exists"}, "qualified name"),
        ({"key": "k", "operator": "In"}, "operator must be"),
        ({"operator": "Equal", "value": "v"}, "empty key"),
        ({"key": "k", "operator": "Exists", "value": "v"}, "takes no value"),
        ({"key": "k", "value": "v" * 64}, "label value"),
        ({"key": "k", "effect": "NoRun"}, "effect must be"),
        ({"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}, "tolerationSeconds"),
        ({"key": "k", "effect": "NoExecute", "tolerationSeconds": "5"}, "tolerationSeconds"),
        ({"key": 5}, "strings"),
    ],
)
def test_invalid_tolerations_are_rejected_naming_group_and_key(
    tol: dict[str, Any], fragment: str
) -> None:
    assert rules.problem(tol) is not None
    plan = _plan([INSTALLER], None, [("gpus", [tol, GPU])])
    assert plan.tolerations == [INSTALLER, GPU]
    (rejected,) = plan.rejected
    assert rejected.group == "gpus"
    assert fragment in rejected.reason
    assert rejected.key == str(tol.get("key") or "")


@pytest.mark.parametrize(
    "tol",
    [
        GPU,
        TPU,
        {"operator": "Exists"},  # tolerates every taint
        {"key": "example.com/x", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "k", "value": ""},
    ],
)
def test_valid_tolerations_pass(tol: dict[str, Any]) -> None:
    assert rules.problem(tol) is None


def test_a_group_contributes_at_most_max_per_group() -> None:
    many = [{"key": f"k{i}", "operator": "Exists"} for i in range(rules.MAX_PER_GROUP + 3)]
    plan = _plan(None, None, [("big", many), ("small", [GPU])])
    assert len(plan.tolerations) == rules.MAX_PER_GROUP + 1
    assert plan.tolerations[-1] == GPU
    assert [r.key for r in plan.rejected] == [f"k{i}" for i in range(rules.MAX_PER_GROUP, 19)]
    assert all("at most" in r.reason for r in plan.rejected)


def test_at_most_max_added_come_from_groups() -> None:
    groups = [
        (f"g{n:02}", [{"key": f"g{n}-k{i}", "operator": "Exists"} for i in range(10)])
        for n in range(8)
    ]
    plan = _plan([INSTALLER], None, groups)
    assert len(plan.added) == rules.MAX_ADDED
    assert len(plan.rejected) == 80 - rules.MAX_ADDED
    assert plan.rejected[0].group == "g06"
    # an already chosen duplicate never counts against the bound
    again = _plan([INSTALLER], None, [*groups, ("zz", [groups[0][1][0]])])
    assert len(again.rejected) == len(plan.rejected)


def test_a_non_object_toleration_is_rejected() -> None:
    plan = _plan(None, None, [("odd", ["nvidia.com/gpu", GPU])])
    assert plan.tolerations == [GPU]
    assert plan.rejected[0].reason == "a toleration must be an object"
