"""The status merge patch: only what changed, removed map keys as null."""

from __future__ import annotations

from localcache.controllers import status


def test_equal_status_gives_an_empty_patch() -> None:
    same = {"nodeStatus": {"a": "NodeDownloaded"}, "copies": {"total": 1}, "conditions": []}
    assert status.merge_diff(same, same) == {}


def test_changed_and_removed_map_keys() -> None:
    old = {"nodeStatus": {"a": "NodeDownloaded", "gone": "NodeNotReady"}, "copies": {"total": 2}}
    new = {"nodeStatus": {"a": "NodeDownloading"}, "copies": {"total": 1}}
    assert status.merge_diff(old, new) == {
        "nodeStatus": {"a": "NodeDownloading", "gone": None},
        "copies": {"total": 1},
    }


def test_lists_are_replaced_whole_and_unowned_fields_left_alone() -> None:
    old = {"inferenceServices": [{"name": "a"}], "llmInferenceServices": [{"name": "x"}]}
    new = {"inferenceServices": [{"name": "b"}]}
    assert status.merge_diff(old, new) == {"inferenceServices": [{"name": "b"}]}


def test_missing_old_fields_are_written() -> None:
    assert status.merge_diff({}, {"nodeStatus": {}}) == {"nodeStatus": {}}
