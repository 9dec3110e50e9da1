"""The one merge-patch diff: RFC 7386 from current to desired, in full or over some keys."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from localcache.runtime import patch


def _apply(target: Any, diff: Any) -> Any:
    """RFC 7386 MergePatch, as the apiserver applies it."""
    if not isinstance(diff, dict):
        return diff
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in diff.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _apply(result.get(key), value)
    return result


_json = st.recursive(
    st.one_of(st.booleans(), st.integers(), st.text(max_size=5)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)
_objects = st.dictionaries(st.text(max_size=3), _json, max_size=4)


@given(_objects, _objects)
def test_a_merge_patch_turns_current_into_desired(current: Any, desired: Any) -> None:
    assert _apply(current, patch.merge_patch(current, desired)) == desired


@given(_objects, _objects)
def test_a_patch_of_keys_turns_those_keys_into_desired_and_leaves_the_rest(
    current: Any, desired: Any
) -> None:
    applied = _apply(current, patch.merge_patch_of_keys(current, desired))
    assert {k: applied.get(k) for k in desired} == desired
    assert {k: v for k, v in applied.items() if k not in desired} == {
        k: v for k, v in current.items() if k not in desired
    }


@given(_objects)
def test_nothing_changed_gives_an_empty_patch(current: Any) -> None:
    assert patch.merge_patch(current, copy.deepcopy(current)) == {}
    assert patch.merge_patch_of_keys(current, copy.deepcopy(current)) == {}


def test_removed_keys_become_null_and_lists_are_replaced_whole() -> None:
    current = {"a": {"x": 1, "gone": 2}, "l": [1, 2], "top": 1}
    desired = {"a": {"x": 3}, "l": [2]}
    assert patch.merge_patch(current, desired) == {
        "a": {"x": 3, "gone": None},
        "l": [2],
        "top": None,
    }
    assert patch.merge_patch_of_keys(current, desired) == {"a": {"x": 3, "gone": None}, "l": [2]}


def test_a_null_for_an_absent_key_is_written_in_full_and_no_change_over_keys() -> None:
    assert patch.merge_patch({}, {"k": None}) == {"k": None}
    assert patch.merge_patch_of_keys({}, {"k": None}) == {}
    assert patch.merge_patch_of_keys({"a": {}}, {"a": {"k": None}}) == {}


def test_non_objects_are_replaced_whole() -> None:
    assert patch.merge_patch([1], {"a": 1}) == {"a": 1}
    assert patch.merge_patch({"a": 1}, 5) == 5
