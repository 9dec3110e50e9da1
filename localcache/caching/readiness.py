"""Copy readiness on Nodes: "a serving pod starts only on a node whose copy is downloaded".

Pure rules, no I/O, shared by the node-label controller (`controllers.readiness`), the pod
webhook (`webhooks.podwait`) and the waiting-pod Events:

- Every cache has one readiness label key, `copy.localcache.kserve.io/<16 hex digits of
  SHA-256 over its status key>` (`label_key`): the name part stays a valid label name however
  long the cache's namespace and name are. Its value is `"true"`.
- A node carries the label of a cache exactly while its LocalModelNode lists the cache in
  `spec.localModels` (written by the controller: the node is in one of the cache's groups and
  the cache exists) AND its `status.modelStatus` says `ModelDownloaded` for it
  (`desired_labels`). So the label goes when the copy goes, the cache is deleted or the node
  leaves the group. Bounded: one label per cache entry of the node.
- Only keys under `PREFIX/` are ever written or removed (`label_patch`: a merge patch of
  `metadata.labels`, `null` for a removal); other labels of the Node are never touched.
- A pod waits for the copy through one more required node-affinity requirement per cache it
  mounts (`with_requirement`): ANDed into every existing `nodeSelectorTerm` (the terms are
  ORed, so each must carry it), or one new term when the pod has none. The pod's other
  constraints are kept as they are.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Final

from localcache.api import modelnode
from localcache.caching import keys

Obj = dict[str, Any]

PREFIX: Final = "copy.localcache.kserve.io"
VALUE: Final = "true"
HASH_LENGTH: Final = 16
WAITS_FOR_ANNOTATION: Final = f"{PREFIX}/waits-for"
"""On a pod, set by the pod webhook: the status keys of the caches it waits for,
comma-separated (what the controller's waiting-pod Events read)."""


def label_key(status_key: str) -> str:
    """The readiness label key of the cache with `status_key` (`name` or `namespace/name`)."""
    digest = hashlib.sha256(status_key.encode("utf-8")).hexdigest()[:HASH_LENGTH]
    return f"{PREFIX}/{digest}"


def is_own(key: str) -> bool:
    """Whether label `key` is one of localcache's readiness labels."""
    return key.startswith(PREFIX + "/")


def _entry_status_key(entry: Obj) -> str | None:
    try:
        return keys.status_key(str(entry.get("modelName") or ""), entry.get("namespace") or None)
    except ValueError:
        return None


def downloaded_status_keys(lmn: Obj | None) -> set[str]:
    """Status keys the LocalModelNode lists in its spec and reports `ModelDownloaded`."""
    if lmn is None:
        return set()
    listed = {
        sk
        for entry in (lmn.get("spec") or {}).get("localModels") or []
        if isinstance(entry, dict) and (sk := _entry_status_key(entry)) is not None
    }
    states = (lmn.get("status") or {}).get("modelStatus") or {}
    return {sk for sk in listed if states.get(sk) == modelnode.ModelStatus.DOWNLOADED}


def desired_labels(lmn: Obj | None, *, enabled: bool) -> dict[str, str]:
    """The readiness labels a node should carry (none when the setting is off)."""
    if not enabled:
        return {}
    return {label_key(sk): VALUE for sk in sorted(downloaded_status_keys(lmn))}


def label_patch(current: Mapping[str, str] | None, desired: Mapping[str, str]) -> Obj | None:
    """The merge patch bringing the node's own readiness labels from `current` to `desired`
    (other labels untouched), or None when nothing differs."""
    have = {k: v for k, v in (current or {}).items() if is_own(k)}
    changes: dict[str, str | None] = {k: v for k, v in desired.items() if have.get(k) != v}
    changes.update({k: None for k in have if k not in desired})
    if not changes:
        return None
    return {"metadata": {"labels": dict(sorted(changes.items()))}}


def requirement(status_key: str) -> Obj:
    """The node-selector requirement "this node holds a complete copy of the cache"."""
    return {"key": label_key(status_key), "operator": "In", "values": [VALUE]}


def with_requirements(affinity: Obj | None, requirements: Iterable[Obj]) -> Obj | None:
    """A copy of the pod's `affinity` whose required node affinity also demands every one of
    `requirements`, or None when it already does (module docstring)."""
    wanted = list(requirements)
    result: Obj = copy.deepcopy(affinity) if affinity else {}
    node = result.setdefault("nodeAffinity", {})
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms = (required or {}).get("nodeSelectorTerms") or []
    if not terms:
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {
            **(required or {}),
            "nodeSelectorTerms": [{"matchExpressions": wanted}],
        }
        return result if wanted else None
    changed = False
    for term in terms:
        expressions = term.setdefault("matchExpressions", [])
        for req in wanted:
            if req not in expressions:
                expressions.append(copy.deepcopy(req))
                changed = True
    return result if changed else None


def required_keys(pod: Obj) -> set[str]:
    """The readiness label keys a pod's required node affinity demands (any term)."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    required = affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    found: set[str] = set()
    for term in required.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            key = str(expr.get("key") or "")
            if is_own(key):
                found.add(key)
    return found
