"""JSON merge patches (RFC 7386) computed as diffs: the one implementation for every writer.

- `merge_patch(current, desired)`: the patch that turns `current` into `desired`. Objects
  are diffed key by key (a key of `current` that `desired` lacks becomes `null`); anything
  else (lists, scalars, an object replacing a non-object) is replaced whole. `{}` when equal.
- `merge_patch_of_keys(current, desired)`: the same, over the keys of `desired` only: a
  top-level key `desired` does not name is left alone (a writer that owns some fields of an
  object, e.g. the status fields a reconciler owns). Nested objects are diffed in full, and
  a `null` for a key that is already absent is no change (so `{}` means "nothing to write").

Contract: applying the result with RFC 7386 semantics to `current` yields `desired` (for
`merge_patch_of_keys`, on the keys of `desired`); neither input is modified; the result
shares no mutable objects with `current` but may share values with `desired`. Not promised:
a minimal patch for lists (RFC 7386 has no list operations) or for `null` values inside
`desired` (they mean "remove" to the apiserver).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def merge_patch(current: Any, desired: Any) -> Any:
    """The RFC 7386 merge patch from `current` to `desired` ({} when they are equal); a
    `null` in `desired` is written even where `current` lacks the key."""
    return _diff(current, desired, absent_is_null=False)


def merge_patch_of_keys(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch from `current` to `desired` over the keys of `desired` ({} when
    nothing differs there); a `null` in `desired` where `current` lacks the key (or holds
    `null`) is no change."""
    patch: dict[str, Any] = _diff(
        {k: v for k, v in current.items() if k in desired}, desired, absent_is_null=True
    )
    return patch


def _diff(current: Any, desired: Any, *, absent_is_null: bool) -> Any:
    if not isinstance(current, Mapping) or not isinstance(desired, Mapping):
        return desired
    patch: dict[str, Any] = {}
    for key in current:
        if key not in desired:
            patch[key] = None
    for key, value in desired.items():
        if key not in current:
            if value is not None or not absent_is_null:
                patch[key] = value
        elif current[key] != value:
            if isinstance(value, Mapping) and isinstance(current[key], Mapping):
                nested = _diff(current[key], value, absent_is_null=absent_is_null)
                if nested or not absent_is_null:
                    patch[key] = nested
            else:
                patch[key] = value
    return patch
