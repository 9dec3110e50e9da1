"""Which node holds which model: node-group membership, LocalModelNode entries, group usage.

Pure rules, no I/O. The cache reconcilers build a `Snapshot` from their informer stores once
per reconcile and ask it questions:

- Membership: a node belongs to a LocalModelNodeGroup when it matches the group's PV
  `nodeAffinity.required.nodeSelectorTerms` (Kubernetes `MatchNodeSelectorTerms`: terms are
  ORed, the requirements of one term ANDed, an empty term matches nothing; a group without
  node affinity matches no node). Readiness does not affect membership; it only shows in the
  cache's status.
- A cache's member nodes are the members of any of its node groups that exist. When groups
  overlap, a node is placed through the first of them in `spec.nodeGroups` [P9], so the
  entry's `nodeGroup` never flips between reconciles.
- The desired `spec.localModels` of a node is computed from *every* cache of both kinds that
  is not being deleted, one entry per cache keyed by (namespace, modelName). Any reconciler
  that writes a LocalModelNode writes this whole desired list, so reconcilers of different
  caches agree and never remove each other's entries [P10]; entries of nodes that left a
  group, of removed groups and of deleted caches disappear [P7].
- `merge_entries` turns the current list into the desired one keeping the existing order and
  any unknown fields of unchanged entries, and says whether anything changed (writes happen
  only then). Entry lists compare by `signature` (count and set of normalised entries), so
  callers can memoise the signature of a stored list per resourceVersion.
- Group usage: the sum of `modelSize` over the distinct source URIs of the caches that list
  the group, and what is left of `storageLimit` [P13].
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from localcache.api import modelcache, modelnode, nodegroup
from localcache.api.quantity import Quantity
from localcache.caching import keys

Obj = dict[str, Any]
EntryKey = tuple[str, str]
"""(namespace or "", modelName): identifies one cache's entry on a LocalModelNode."""


# ------------------------------------------------------------------------ node selectors


def _int_or_none(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _requirement_matches(values_by_key: Mapping[str, str], req: Mapping[str, Any]) -> bool:
    key = req.get("key")
    operator = req.get("operator")
    values = [str(v) for v in req.get("values") or []]
    if not isinstance(key, str) or not key:
        return False
    present = key in values_by_key
    value = values_by_key.get(key, "")
    if operator == "In":
        return present and value in values
    if operator == "NotIn":
        return not present or value not in values
    if operator == "Exists":
        return present and not values
    if operator == "DoesNotExist":
        return not present and not values
    if operator in ("Gt", "Lt"):
        if not present or len(values) != 1:
            return False
        have, bound = _int_or_none(value), _int_or_none(values[0])
        if have is None or bound is None:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _term_matches(labels: Mapping[str, str], fields: Mapping[str, str], term: Any) -> bool:
    if not isinstance(term, Mapping):
        return False
    expressions = term.get("matchExpressions") or []
    field_reqs = term.get("matchFields") or []
    if not expressions and not field_reqs:
        return False
    for req in field_reqs:
        if not isinstance(req, Mapping) or req.get("key") != "metadata.name":
            return False
        if req.get("operator") not in ("In", "NotIn"):
            return False
    return all(
        isinstance(req, Mapping) and _requirement_matches(labels, req) for req in expressions
    ) and all(_requirement_matches(fields, req) for req in field_reqs)


def node_matches(node: Obj, terms: Sequence[Any] | None) -> bool:
    """Kubernetes `MatchNodeSelectorTerms`: does the node satisfy any of the terms?
    `None` (no node affinity) matches nothing."""
    if not terms:
        return False
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    fields = {"metadata.name": str(meta.get("name") or "")}
    return any(_term_matches(labels, fields, term) for term in terms)


def node_is_ready(node: Obj) -> bool:
    """The node's `Ready` condition is `True`."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def groups_of(node: Obj, groups: Mapping[str, nodegroup.LocalModelNodeGroup]) -> frozenset[str]:
    """The names of the groups (among `groups`) that the node belongs to."""
    return frozenset(
        name
        for name, group in groups.items()
        if node_matches(node, group.spec.node_selector_terms())
    )


def first_group(spec_node_groups: Sequence[str], member_of: Iterable[str]) -> str | None:
    """The group a node is placed through: the first of `spec.nodeGroups` it belongs to."""
    member = set(member_of)
    return next((g for g in spec_node_groups if g in member), None)


# ------------------------------------------------------------------------ caches and entries


@dataclass(frozen=True, slots=True)
class PlacedCache:
    """One cache of either kind, as placement sees it. `namespace` is "" for a cluster cache."""

    name: str
    namespace: str
    spec: modelcache.LocalModelCacheSpec
    deleting: bool = False

    @property
    def entry_key(self) -> EntryKey:
        return (self.namespace, self.name)

    @property
    def status_key(self) -> keys.StatusKey:
        return keys.status_key(self.name, self.namespace or None)


def entry_for(cache: PlacedCache, node_group: str) -> modelnode.LocalModelInfo:
    """The LocalModelNode entry for `cache` placed through `node_group`."""
    storage = cache.spec.storage.model_copy(deep=True) if cache.spec.storage else None
    return modelnode.LocalModelInfo(
        source_model_uri=cache.spec.source_model_uri,
        model_name=cache.name,
        namespace=cache.namespace or None,
        node_group=node_group,
        service_account_name=cache.spec.service_account_name or None,
        storage=storage,
    )


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

    @classmethod
    def of(cls, entries: Mapping[EntryKey, Obj]) -> Desired:
        return cls(entries, signature(entries.values()))

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


# ------------------------------------------------------------------------ the snapshot


@dataclass
class Snapshot:
    """Nodes, node groups and caches at one moment, with memberships computed once.
    Desired entry lists are computed once per distinct set of groups a node belongs to."""

    nodes: Mapping[str, Obj]
    groups: Mapping[str, nodegroup.LocalModelNodeGroup]
    caches: Sequence[PlacedCache]
    node_groups: dict[str, frozenset[str]] = field(init=False)
    """Node name → names of the groups it belongs to."""
    _desired: dict[frozenset[str], Desired] = field(init=False, default_factory=dict)
    _entries: dict[tuple[int, str], Obj] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.node_groups = {name: groups_of(node, self.groups) for name, node in self.nodes.items()}

    def missing_groups(self, spec_node_groups: Sequence[str]) -> list[str]:
        """The groups of a cache's spec that do not exist, in spec order."""
        return [g for g in dict.fromkeys(spec_node_groups) if g not in self.groups]

    def members(self, spec_node_groups: Sequence[str]) -> dict[str, str]:
        """Member node → the group it is placed through, for a cache with these groups."""
        placed: dict[str, str] = {}
        for node, member_of in self.node_groups.items():
            group = first_group(spec_node_groups, member_of)
            if group is not None:
                placed[node] = group
        return placed

    def is_ready(self, node: str) -> bool:
        obj = self.nodes.get(node)
        return obj is not None and node_is_ready(obj)

    def desired_entries(self, node: str) -> Desired:
        """Every entry the node's LocalModelNode should list (none for unknown nodes)."""
        member_of = self.node_groups.get(node, frozenset())
        found = self._desired.get(member_of)
        if found is None:
            found = self._desired[member_of] = Desired.of(self._compute(member_of))
        return found

    def _compute(self, member_of: frozenset[str]) -> dict[EntryKey, Obj]:
        desired: dict[EntryKey, Obj] = {}
        if not member_of:
            return desired
        for index, cache in enumerate(self.caches):
            if cache.deleting:
                continue
            group = first_group(cache.spec.node_groups, member_of)
            if group is None:
                continue
            entry = self._entries.get((index, group))
            if entry is None:
                entry = self._entries[(index, group)] = entry_for(cache, group).to_dict()
            desired[cache.entry_key] = entry
        return desired


# ------------------------------------------------------------------------ group usage


@dataclass(frozen=True, slots=True)
class GroupUsage:
    used: Quantity
    available: Quantity


def group_usage(
    group_name: str, storage_limit: Quantity, caches: Iterable[PlacedCache]
) -> GroupUsage:
    """Space taken on `group_name` by the distinct source URIs of the caches listing it (the
    largest `modelSize` when caches of one URI disagree), and what is left of the limit
    (negative when over-committed)."""
    by_uri: dict[str, Quantity] = {}
    for cache in caches:
        if cache.deleting or group_name not in cache.spec.node_groups:
            continue
        uri = cache.spec.source_model_uri
        size = cache.spec.model_size
        if uri not in by_uri or size > by_uri[uri]:
            by_uri[uri] = size
    used = sum((q.value for q in by_uri.values()), start=Quantity(0).value)
    return GroupUsage(
        used=Quantity.from_value(used), available=Quantity.from_value(storage_limit.value - used)
    )
