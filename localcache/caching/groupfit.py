"""Which of a cache's node groups a workload can run on: the node group follows the workload.

Pure rules, no I/O (KServe #5914: KServe's webhook takes `nodeGroups[0]` even when the
workload's nodeSelector points at another group's nodes, and the pod then cannot be scheduled
where its claim is). A serving object (an InferenceService's predictor; an
LLMInferenceService's `spec.template`, `spec.worker`, `spec.prefill.template`) is described by
one `Workload` per pod template: its `nodeSelector` and its `affinity` dicts, as in the
object's JSON.

`pick_group(cache_groups, node_groups=..., nodes=..., workloads=..., requested=..., current=...)`
(or `GroupFit(...).pick(cache, cache_groups, requested=...)`, which finds `current` itself):
- Only groups of `cache_groups` that exist (keys of `node_groups`) count, in spec order.
- `requested` (the `serving.kserve.io/nodegroup` annotation) wins when it is one of them,
  fitting or not (a warning says so when it does not fit); when it is not, no group is picked.
- Without any constraint (no workload has a nodeSelector or a required node affinity), or
  when the nodes are unknown (`nodes` None), the first existing group: KServe's choice.
- Otherwise the group the object uses now (`current`, read from its claim annotation) when it
  still exists and fits, so that an update does not move running pods to another group that
  has started to fit; else the first existing group that fits. A group fits when every
  workload can be scheduled on at least one of its nodes: a node is the group's when it
  matches the group's PV node affinity (`placement.node_matches`), and a workload can be
  scheduled on it when the node carries every `nodeSelector` label with that value and
  matches the workload's `affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution
  .nodeSelectorTerms` (the same matcher: terms ORed, all operators, `matchFields`). Taints,
  resources and preferred affinity are not considered (the scheduler weighs them later).
- When no group fits, the first existing group with `fits=False` and a `why` that names the
  groups and the constraints: KServe's choice is kept, the caller warns.

Not promised: the answer is as fresh as the `nodes` the caller passes (an informer store);
nodes that join later can make another group fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localcache.api import nodegroup
from localcache.caching import names, placement

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Workload:
    """One pod template's node constraints. `what` names it in messages (e.g. "the
    predictor", "spec.worker")."""

    node_selector: Mapping[str, Any] | None = None
    affinity: Mapping[str, Any] | None = None
    what: str = "the workload"

    @classmethod
    def of(cls, pod_spec: Any, what: str = "the workload") -> Workload:
        """From a pod-spec-like dict (an ISVC predictor, an LLMInferenceService template):
        its `nodeSelector` and `affinity`; anything that is not a dict counts as absent."""
        spec = pod_spec if isinstance(pod_spec, Mapping) else {}
        selector, affinity = spec.get("nodeSelector"), spec.get("affinity")
        return cls(
            node_selector=selector if isinstance(selector, Mapping) else None,
            affinity=affinity if isinstance(affinity, Mapping) else None,
            what=what,
        )

    def required_terms(self) -> list[Any] | None:
        """`affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution
        .nodeSelectorTerms`; None when there is no required node affinity."""
        node_affinity = (self.affinity or {}).get("nodeAffinity")
        if not isinstance(node_affinity, Mapping):
            return None
        required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
        if not isinstance(required, Mapping):
            return None
        terms = required.get("nodeSelectorTerms")
        return list(terms) if isinstance(terms, list) else []

    @property
    def constrained(self) -> bool:
        return bool(self.node_selector) or self.required_terms() is not None

    def schedulable_on(self, node: Obj) -> bool:
        """Whether the node satisfies the nodeSelector and the required node affinity."""
        labels = (node.get("metadata") or {}).get("labels") or {}
        for key, value in (self.node_selector or {}).items():
            if labels.get(key) != value:
                return False
        terms = self.required_terms()
        return terms is None or placement.node_matches(node, terms)

    def describe(self) -> str:
        """`the predictor's nodeSelector gpu=a100 and required node affinity`."""
        parts = []
        if self.node_selector:
            pairs = ",".join(f"{k}={v}" for k, v in sorted(self.node_selector.items()))
            parts.append(f"nodeSelector {pairs}")
        if self.required_terms() is not None:
            parts.append("required node affinity")
        return f"{self.what}'s {' and '.join(parts)}"


@dataclass(frozen=True, slots=True)
class GroupPick:
    """The node group picked (None: none usable) and whether the workloads fit on it (None:
    not judged: no constraint or nodes unknown). `why` explains a pick that does not fit."""

    group: str | None
    fits: bool | None = None
    why: str | None = None


def group_nodes(group: nodegroup.LocalModelNodeGroup, nodes: Iterable[Obj]) -> list[Obj]:
    """The nodes that belong to the group (its PV node affinity)."""
    terms = group.spec.node_selector_terms()
    return [n for n in nodes if placement.node_matches(n, terms)]


def fits(
    group: nodegroup.LocalModelNodeGroup, *, nodes: Iterable[Obj], workloads: Sequence[Workload]
) -> bool:
    """Every workload can be scheduled on some node of the group."""
    members = group_nodes(group, nodes)
    return all(any(w.schedulable_on(n) for n in members) for w in workloads)


def _unfit(groups: Sequence[str], workloads: Sequence[Workload]) -> str:
    which = "node group " if len(groups) == 1 else "node groups "
    constraints = "; ".join(w.describe() for w in workloads if w.constrained)
    return f"no node of {which}{', '.join(groups)} matches both the group and {constraints}"


def pick_group(
    cache_groups: Sequence[str],
    *,
    node_groups: Mapping[str, nodegroup.LocalModelNodeGroup],
    nodes: Iterable[Obj] | None,
    workloads: Sequence[Workload] = (),
    requested: str | None = None,
    current: str | None = None,
) -> GroupPick:
    """The node group a serving object's claim should come from (module docstring).

    `cache_groups`: the cache's `spec.nodeGroups`; `node_groups`: the LocalModelNodeGroups
    that exist, by name; `nodes`: the cluster's Node objects (None: unknown); `workloads`:
    the object's pod templates; `requested`: the `serving.kserve.io/nodegroup` annotation;
    `current`: the group whose claim the object names now (None: none of this cache's).
    """
    existing = [g for g in dict.fromkeys(cache_groups) if g in node_groups]
    constrained = [w for w in workloads if w.constrained]
    judge = nodes is not None and bool(constrained)
    seen = list(nodes) if nodes is not None else []
    if requested is not None:
        if requested not in existing:
            return GroupPick(None)
        if not judge:
            return GroupPick(requested)
        ok = fits(node_groups[requested], nodes=seen, workloads=constrained)
        return GroupPick(requested, ok, None if ok else _unfit([requested], constrained))
    if not existing:
        return GroupPick(None)
    if not judge:
        return GroupPick(existing[0])
    first = [current] if current in existing else []
    for name in dict.fromkeys([*first, *existing]):  # the current group first, judged once
        if fits(node_groups[name], nodes=seen, workloads=constrained):
            return GroupPick(name, True)
    return GroupPick(existing[0], False, _unfit(existing, constrained))


@dataclass(frozen=True, slots=True)
class GroupFit:
    """`pick_group`'s inputs that do not depend on the cache: the LocalModelNodeGroups that
    exist by name, the cluster's nodes (None: unknown) and the serving object's workloads."""

    node_groups: Mapping[str, nodegroup.LocalModelNodeGroup]
    nodes: Sequence[Obj] | None
    workloads: Sequence[Workload]
    current_claim: str | None = None
    """The serving claim the object names now (`internal.serving.kserve.io/localmodel-pvc-name`)."""

    @property
    def constrained(self) -> bool:
        return any(w.constrained for w in self.workloads)

    def pick(
        self, cache: str, cache_groups: Sequence[str], *, requested: str | None = None
    ) -> GroupPick:
        """`pick_group` for the cache named `cache`; its group whose serving claim is
        `current_claim` is the current one."""
        claim = self.current_claim
        current = next((g for g in cache_groups if names.serving_pvc(cache, g) == claim), None)
        return pick_group(
            cache_groups,
            node_groups=self.node_groups,
            nodes=self.nodes,
            workloads=self.workloads,
            requested=requested,
            current=current,
        )
