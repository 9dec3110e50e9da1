"""LocalModelNode entry lists: how two lists compare, how one becomes another, and what an
entry costs against the budgets that keep a LocalModelNode within etcd's object size limit.

Pure rules, no I/O. `placement.Snapshot` decides which entries a node should list;
this module only handles lists of entries as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

Obj = dict[str, Any]
EntryKey = tuple[str, str]
"""(namespace or "", modelName): identifies one cache's entry on a LocalModelNode."""
STATUS_ALLOWANCE: Final = 1024
"""Bytes counted per entry for what the agent reports about it (state, progress, its Job)."""
NAMESPACE_BUDGET: Final = 64 * 1024
"""Bytes that one namespace's entries may cost on one LocalModelNode (~50 short URIs)."""
NODE_BUDGET: Final = 1024 * 1024
"""Bytes that all entries may cost on one LocalModelNode (etcd's limit is 1.5 MiB)."""


def entry_key_of(entry: Mapping[str, Any]) -> EntryKey:
    """(namespace, modelName) of a raw entry."""
    return (str(entry.get("namespace") or ""), str(entry.get("modelName") or ""))


Comparable = tuple[Any, ...]
Signature = tuple[int, frozenset[Comparable]]
"""How many entries a list has, and the set of their known fields: two lists with equal
signatures hold the same entries (with no duplicates when the count equals the set size)."""


def comparable(entry: Mapping[str, Any]) -> Comparable:
    """The fields of an entry that matter, normalised ("" = absent, parameters as a map)."""
    storage = entry.get("storage") or {}
    storage_key = storage.get("key") if isinstance(storage, Mapping) else None
    params = storage.get("parameters") if isinstance(storage, Mapping) else None
    return (
        entry.get("sourceModelUri") or "",
        entry.get("modelName") or "",
        entry.get("namespace") or "",
        entry.get("nodeGroup") or "",
        entry.get("serviceAccountName") or "",
        storage_key or "",
        tuple(sorted((params or {}).items())),
    )


def signature(entries: Collection[Mapping[str, Any]]) -> Signature:
    return (len(entries), frozenset(comparable(e) for e in entries))


@dataclass(frozen=True, slots=True)
class Desired:
    """The entries a LocalModelNode should list, as JSON (never mutate), with their signature."""

    entries: Mapping[EntryKey, Obj]
    signature: Signature
    left_out: Mapping[EntryKey, str] = field(default_factory=dict)
    """Entries of caches placed on the node but over a budget, with the reason."""

    @classmethod
    def of(
        cls, entries: Mapping[EntryKey, Obj], left_out: Mapping[EntryKey, str] | None = None
    ) -> Desired:
        return cls(entries, signature(entries.values()), dict(left_out or {}))

    def __len__(self) -> int:
        return len(self.entries)


def merge_entries(
    current: Sequence[Mapping[str, Any]],
    desired: Desired,
    *,
    current_signature: Signature | None = None,
) -> list[Obj] | None:
    """The new `spec.localModels` list, or `None` when `current` already matches `desired`.

    Kept entries stay where they are (with any unknown fields) when their known fields are
    unchanged; changed ones are replaced in place; new ones are appended in key order;
    entries not desired (and duplicates) are dropped. `current_signature`, when the caller
    has it memoised, makes the unchanged case cheap.
    """
    if (current_signature or signature(current)) == desired.signature:
        return None
    wanted = desired.entries
    result: list[Obj] = []
    seen: set[EntryKey] = set()
    for entry in current:
        key = entry_key_of(entry)
        want = wanted.get(key)
        if want is None or key in seen:
            continue
        seen.add(key)
        result.append(dict(entry) if comparable(entry) == comparable(want) else dict(want))
    result.extend(dict(wanted[key]) for key in sorted(wanted) if key not in seen)
    return result


def entry_cost(entry: Mapping[str, Any]) -> int:
    """What an entry counts against the budgets (module docstring)."""
    return len(json.dumps(entry, separators=(",", ":"))) + STATUS_ALLOWANCE
