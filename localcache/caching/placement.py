"""Which node holds which model: node-group membership, LocalModelNode entries, group usage.

Pure rules, no I/O. The cache reconcilers build a `Snapshot` from their informer stores once
per reconcile and ask it questions:

- Membership: a node belongs to a LocalModelNodeGroup when it matches the group's PV
  `nodeAffinity.required.nodeSelectorTerms` (Kubernetes `MatchNodeSelectorTerms`: terms are
  ORed, the requirements of one term ANDed, an empty term and a term with an invalid
  requirement match nothing; a group without node affinity matches no node). `node_matches`
  is the one node-selector matcher: the controller's membership and the agent's node-group
  fallback both ask it. Readiness does not affect membership; it only shows in the cache's
  status.
- A cache's member nodes are the members of any of its node groups that exist. When groups
  overlap, a node is placed through the first of them in `spec.nodeGroups` [P9], so the
  entry's `nodeGroup` never flips between reconciles.
- The desired `spec.localModels` of a node is computed from *every* cache of both kinds that
  is not being deleted, one entry per cache keyed by (namespace, modelName). Any reconciler
  that writes a LocalModelNode writes this whole desired list, so reconcilers of different
  caches agree and never remove each other's entries [P10]; entries of nodes that left a
  group, of removed groups and of deleted caches disappear [P7].
- Budgets (security review finding 5): every entry costs `entries.entry_cost` (its JSON size
  plus what the agent writes about it in the status). On one node, the entries of one
  namespace's caches may cost at most `entries.NAMESPACE_BUDGET`, and all entries
  `entries.NODE_BUDGET` (etcd refuses objects over 1.5 MiB, and one refused write stops
  every cache of the node).
  Entries are taken in a fixed order, cluster caches first, then by creation time, so the
  caches already in place keep their entries and a newcomer that would pass a budget is left
  out of that node (`Desired.left_out`), never another cache: the offender alone is reported.
- `merge_entries` turns the current list into the desired one keeping the existing order and
  any unknown fields of unchanged entries, and says whether anything changed (writes happen
  only then). Entry lists compare by `signature` (count and set of normalised entries), so
  callers can memoise the signature of a stored list per resourceVersion.
- Group usage: the sum of `modelSize` over the distinct source URIs of the caches that list
  the group, and what is left of `storageLimit` [P13].
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from localcache.api import modelcache, modelnode, nodegroup
from localcache.api.quantity import Quantity
from localcache.caching import entries, keys

Obj = dict[str, Any]
EntryKey = entries.EntryKey


# ------------------------------------------------------------------------ node selectors
# Kubernetes' semantics (k8s.io/component-helpers/scheduling/corev1/nodeaffinity with
# k8s.io/apimachinery labels.NewRequirement): a term with an invalid requirement is an error
# there, and an erroring term matches no node (the other terms still count).

_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_INT64 = re.compile(r"[+-]?[0-9]+")
_INT64_RANGE = range(-(2**63), 2**63)
_VALUE_COUNT: Final[Mapping[str, Callable[[int], bool]]] = {
    "In": lambda n: n > 0,
    "NotIn": lambda n: n > 0,
    "Exists": lambda n: n == 0,
    "DoesNotExist": lambda n: n == 0,
    "Gt": lambda n: n == 1,
    "Lt": lambda n: n == 1,
}


def _int64(text: str) -> int | None:
    """`text` as Go's `strconv.ParseInt(text, 10, 64)` reads it, else None."""
    if _INT64.fullmatch(text) is None:
        return None
    value = int(text)
    return value if value in _INT64_RANGE else None


def label_key_valid(key: str) -> bool:
    """A qualified name: `[prefix/]name`, prefix a DNS subdomain (253), name 63 characters."""
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or _DNS_SUBDOMAIN.fullmatch(prefix) is None):
        return False
    if not prefix and "/" in key:
        return False
    return len(name) <= 63 and _LABEL_NAME.fullmatch(name) is not None


def label_value_valid(value: str) -> bool:
    """A label value: empty, or at most 63 alphanumerics, `-`, `_`, `.` (alphanumeric ends)."""
    return value == "" or (len(value) <= 63 and _LABEL_NAME.fullmatch(value) is not None)


@dataclass(frozen=True, slots=True)
class _LabelTest:
    """One valid `matchExpressions` requirement (`bound` set for `Gt` and `Lt`)."""

    key: str
    operator: str
    values: tuple[str, ...]
    bound: int | None = None

    def holds(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "In":
            return present and labels[self.key] in self.values
        if self.operator == "NotIn":
            return not present or labels[self.key] not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        have = _int64(labels[self.key]) if present else None
        if have is None or self.bound is None:
            return False
        return have > self.bound if self.operator == "Gt" else have < self.bound


def _label_requirement(req: Any) -> _LabelTest | None:
    """One `matchExpressions` requirement, or None when it is invalid: unknown operator, bad
    key or value, `In`/`NotIn` without values, `Exists`/`DoesNotExist` with values, `Gt`/`Lt`
    without exactly one integer value."""
    if not isinstance(req, Mapping):
        return None
    key, operator, raw = req.get("key"), req.get("operator"), req.get("values") or []
    if not isinstance(key, str) or not label_key_valid(key) or not isinstance(raw, list):
        return None
    count_ok = _VALUE_COUNT.get(operator) if isinstance(operator, str) else None
    values = tuple(str(v) for v in raw)
    if operator is None or count_ok is None or not count_ok(len(values)):
        return None
    if operator in ("Gt", "Lt"):
        bound = _int64(values[0])
        return None if bound is None else _LabelTest(key, operator, values, bound)
    if not all(label_value_valid(v) for v in values):
        return None
    return _LabelTest(key, operator, values)


def _field_requirement(req: Any) -> Callable[[str], bool] | None:
    """The test one `matchFields` requirement makes of a node's name, or None when it is
    invalid: only `metadata.name`, with `In` or `NotIn` and exactly one value."""
    if not isinstance(req, Mapping) or req.get("key") != "metadata.name":
        return None
    values = req.get("values") or []
    if not isinstance(values, list) or len(values) != 1:
        return None
    want = str(values[0])
    if req.get("operator") == "In":
        return lambda name: name == want
    if req.get("operator") == "NotIn":
        return lambda name: name != want
    return None


def _term_matches(labels: Mapping[str, str], name: str, term: Any) -> bool:
    if not isinstance(term, Mapping):
        return False
    expressions = term.get("matchExpressions") or []
    field_reqs = term.get("matchFields") or []
    if not isinstance(expressions, list) or not isinstance(field_reqs, list):
        return False
    if not expressions and not field_reqs:
        return False  # an empty term selects no node
    label_tests = [_label_requirement(r) for r in expressions]
    field_tests = [_field_requirement(r) for r in field_reqs]
    if any(t is None for t in label_tests) or any(t is None for t in field_tests):
        return False  # an invalid term is an error: it matches nothing
    return all(t.holds(labels) for t in label_tests if t) and all(t(name) for t in field_tests if t)


def node_matches(node: Obj, terms: Sequence[Any] | None) -> bool:
    """Kubernetes `MatchNodeSelectorTerms`: does the node satisfy any of the terms (ORed; the
    requirements of one term ANDed)? `None` or no terms (no node affinity) match nothing, and
    so do an empty term and a term with an invalid requirement (see `_label_requirement` and
    `_field_requirement`). The one matcher of controller and agent."""
    if not terms:
        return False
    meta = node.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    name = str(meta.get("name") or "")
    return any(_term_matches(labels, name, term) for term in terms)


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
    created: str = ""
    """creationTimestamp (RFC 3339, so it sorts as text): the order of the budgets."""

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
    _desired: dict[frozenset[str], entries.Desired] = field(init=False, default_factory=dict)
    _entries: dict[tuple[int, str], tuple[Obj, int]] = field(init=False, default_factory=dict)
    """(cache index, group) → the entry and its budget cost, made once per snapshot."""
    _order: list[int] | None = field(init=False, default=None)
    """Cache indexes in budget order, sorted once per snapshot."""

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

    def desired_entries(self, node: str) -> entries.Desired:
        """Every entry the node's LocalModelNode should list (none for unknown nodes)."""
        member_of = self.node_groups.get(node, frozenset())
        found = self._desired.get(member_of)
        if found is None:
            found = self._desired[member_of] = self._compute(member_of)
        return found

    def left_out(self, node: str, key: EntryKey) -> str | None:
        """Why the entry `key` is not on `node` although its cache is placed there (a budget),
        or None."""
        return self.desired_entries(node).left_out.get(key)

    def _compute(self, member_of: frozenset[str]) -> entries.Desired:
        desired: dict[EntryKey, Obj] = {}
        left_out: dict[EntryKey, str] = {}
        if not member_of:
            return entries.Desired.of(desired)
        spent: dict[str, int] = {}
        total = 0
        if self._order is None:
            self._order = sorted(range(len(self.caches)), key=self._budget_order)
        for index in self._order:
            cache = self.caches[index]
            if cache.deleting:
                continue
            group = first_group(cache.spec.node_groups, member_of)
            if group is None:
                continue
            made = self._entries.get((index, group))
            if made is None:
                entry = entry_for(cache, group).to_dict()
                made = self._entries[(index, group)] = (entry, entries.entry_cost(entry))
            entry, cost = made
            namespace = cache.namespace
            if namespace and spent.get(namespace, 0) + cost > entries.NAMESPACE_BUDGET:
                left_out[cache.entry_key] = (
                    f"the entries of namespace {namespace} would take more than "
                    f"{entries.NAMESPACE_BUDGET // 1024} KiB of the node's LocalModelNode"
                )
                continue
            if total + cost > entries.NODE_BUDGET:
                left_out[cache.entry_key] = (
                    "the node's LocalModelNode would take more than "
                    f"{entries.NODE_BUDGET // 1024} KiB"
                )
                continue
            spent[namespace] = spent.get(namespace, 0) + cost
            total += cost
            desired[cache.entry_key] = entry
        return entries.Desired.of(desired, left_out)

    def _budget_order(self, index: int) -> tuple[bool, str, str, str]:
        cache = self.caches[index]
        return (bool(cache.namespace), cache.created, cache.namespace, cache.name)


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
