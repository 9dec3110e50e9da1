"""Capacity rules of cache admission: what the caches placed on a node group may declare.

- `check_capacity` [P13]: on each node group, the sum of `modelSize` over the distinct
  `sourceModelUri`s of every cache (both kinds) placed on it stays within its `storageLimit`;
  a URI already on the group adds only what its size grows.
- `check_namespace_share` (security review finding 9): on each node group, the namespace
  caches of one namespace declare at most `percent` of its `storageLimit` (the same
  distinct-URI sum, over that namespace's caches only), so one tenant cannot take a shared
  group whole and block every later cache on it; a cache of a URI already on the group, as
  large, adds nothing and passes. Cluster caches are the admins' and
  count only in `check_capacity`.

Both are checked on create, for groups an update adds, and for all groups when an update
grows `modelSize`; a write that adds nothing is never denied, even on a group already over a
limit. `modelSize` is enforced on disk by the agent, so these bounds hold for real bytes too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from localcache.api import modelcache, nodegroup, quantity
from localcache.webhooks import isvc

AnyCache = isvc.AnyCache


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken rule: the field, and a message naming the conflicting object."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def _fmt(value: Fraction) -> str:
    return quantity.Quantity.from_value(value).canonical()


def _same(a: AnyCache, b: AnyCache) -> bool:
    return type(a) is type(b) and a.namespace == b.namespace and a.name == b.name


def _checked_groups(cache: AnyCache, old: AnyCache | None) -> list[str]:
    if old is None or cache.spec.model_size.value > old.spec.model_size.value:
        return list(dict.fromkeys(cache.spec.node_groups))
    return [g for g in dict.fromkeys(cache.spec.node_groups) if g not in old.spec.node_groups]


def _sizes_by_uri(group: str, cache: AnyCache, others: Iterable[AnyCache]) -> dict[str, Fraction]:
    """The largest declared size per URI among `others` on `group`, `cache` itself left out."""
    per_uri: dict[str, Fraction] = {}
    for other in others:
        if group in other.spec.node_groups and not _same(other, cache):
            src = other.spec.source_model_uri
            per_uri[src] = max(per_uri.get(src, Fraction(0)), other.spec.model_size.value)
    return per_uri


def _need(per_uri: dict[str, Fraction], cache: AnyCache) -> tuple[Fraction, Fraction]:
    """(used without `cache`, needed with it)."""
    uri, size = cache.spec.source_model_uri, cache.spec.model_size.value
    used = sum(per_uri.values(), Fraction(0))
    have = per_uri.get(uri, Fraction(0))
    return used, used - have + max(have, size)


def check_capacity(
    cache: AnyCache,
    *,
    old: AnyCache | None,
    node_groups: Mapping[str, nodegroup.LocalModelNodeGroup],
    caches: Sequence[AnyCache],
) -> list[Violation]:
    """`caches`: every cache of both kinds on the groups of `cache` (it may be among them)."""
    violations = []
    for group in _checked_groups(cache, old):
        node_group = node_groups.get(group)
        if node_group is None:
            continue  # reported by check_node_groups
        per_uri = _sizes_by_uri(group, cache, caches)
        used, need = _need(per_uri, cache)
        limit = node_group.spec.storage_limit
        if need > limit.value and need > used:
            violations.append(
                Violation(
                    "spec.modelSize",
                    f"LocalModelNodeGroup {group} has storageLimit {limit}, but its models would "
                    f"need {_fmt(need)}: {_fmt(used)} used by {len(per_uri)} other model "
                    f"URI(s) plus {_fmt(need - used)} for {cache.spec.source_model_uri}",
                )
            )
    return violations


def check_namespace_share(
    cache: AnyCache,
    *,
    old: AnyCache | None,
    node_groups: Mapping[str, nodegroup.LocalModelNodeGroup],
    caches: Sequence[AnyCache],
    percent: int,
) -> list[Violation]:
    """`caches`: every cache of both kinds on the groups of `cache`. A write that adds
    nothing to the group (its URI is there already, as large) is never denied."""
    if not isinstance(cache, modelcache.LocalModelNamespaceCache):
        return []
    share = Fraction(percent, 100)
    own = [
        c
        for c in caches
        if isinstance(c, modelcache.LocalModelNamespaceCache) and c.namespace == cache.namespace
    ]
    violations = []
    for group in _checked_groups(cache, old):
        node_group = node_groups.get(group)
        if node_group is None:
            continue
        group_used, group_need = _need(_sizes_by_uri(group, cache, caches), cache)
        used, need = _need(_sizes_by_uri(group, cache, own), cache)
        limit = node_group.spec.storage_limit
        allowed = limit.value * share
        if need > allowed and need > used and group_need > group_used:
            violations.append(
                Violation(
                    "spec.modelSize",
                    f"the namespace caches of namespace {cache.namespace} may declare at most "
                    f"{percent}% of LocalModelNodeGroup {group}'s "
                    f"storageLimit {limit} ({_fmt(allowed)}, "
                    "localModel.namespaceStorageSharePercent), but would declare "
                    f"{_fmt(need)}: {_fmt(used)} already plus {_fmt(need - used)} for "
                    f"{cache.spec.source_model_uri}",
                )
            )
    return violations
