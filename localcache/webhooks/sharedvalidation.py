"""Validation of a LocalModelNamespaceCache's storage mode (KServe #6107's rules, made stricter
where KServe's validator is weak). Pure; `validation.CacheValidator` calls it.

`check_mode` reads the raw object, before it is parsed, so that its denials name the field
even where the served CRD is KServe's (no CEL rules, `pvcRef` perhaps pruned by then):
- exactly one of `spec.nodeGroups` and `spec.pvcRef` is set (present counts, as CEL's
  `has()`: an empty `nodeGroups` list is set);
- `spec.pvcRef` is a PersistentVolumeClaim name: a DNS-1123 subdomain of at most 253 characters;
- on UPDATE `spec.pvcRef` does not change, nor is it added or removed;
- on CREATE, the object was not applied with a `spec.pvcRef` the apiserver pruned (the served
  CRD is KServe v0.20's, `caching.prunedmode`): it would silently be a node-group cache.
An update of an object being deleted is always allowed (as every rule of `validation`).

`check_destination` (CREATE only): no other shared-volume cache of the namespace, not being
deleted, imports the same model (storage key of `sourceModelUri`) onto the same claim. Not on
UPDATE: KServe's validator refuses every update of both caches once two share a destination
(a race it cannot close), which wedges them (no finalizer or label can change); the
controller's `DestinationConflict` condition reports such a pair instead and decides who owns
the destination (first created, then name, then uid). The caches are read from the webhook's
informer store, like every other rule here: a fresh LIST would not close the race either (two
concurrent creates both list before either is stored), so the controller stays the authority
and admission gives early feedback without an API call per request.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from localcache.api import modelcache
from localcache.caching import keys, prunedmode
from localcache.webhooks import capacity

Obj = dict[str, Any]
Violation = capacity.Violation

_PVC_REF = re.compile(modelcache.PVC_REF_PATTERN)


def _spec(obj: Obj | None) -> Obj:
    spec = (obj or {}).get("spec")
    return spec if isinstance(spec, dict) else {}


def _shown(value: object) -> str:
    return "(unset)" if value is None else repr(value)[:300]


def check_mode(obj: Obj, *, old: Obj | None) -> list[Violation]:
    """Violations of the storage-mode rules by the raw `obj` (`old`: the object before an
    update, None on create)."""
    meta = obj.get("metadata")
    if old is not None and isinstance(meta, dict) and meta.get("deletionTimestamp"):
        return []
    spec = _spec(obj)
    groups, ref = spec.get("nodeGroups"), spec.get("pvcRef")
    found: list[Violation] = []
    if groups is not None and ref is not None:
        found.append(
            Violation(
                "spec.pvcRef",
                "spec.nodeGroups and spec.pvcRef are mutually exclusive: set nodeGroups for a "
                "copy on every node of the groups, or pvcRef for one copy on a shared claim",
            )
        )
    elif groups is None and ref is None:
        found.append(
            Violation(
                "spec.nodeGroups",
                "exactly one of spec.nodeGroups or spec.pvcRef must be set",
            )
        )
    if ref is not None and not (
        isinstance(ref, str)
        and len(ref) <= modelcache.MAX_PVC_REF_LENGTH
        and _PVC_REF.fullmatch(ref)
    ):
        found.append(
            Violation(
                "spec.pvcRef",
                f"{_shown(ref)} is not a PersistentVolumeClaim name: a lowercase RFC 1123 "
                f"subdomain of at most {modelcache.MAX_PVC_REF_LENGTH} characters (letters, "
                "digits, '-' and '.', starting and ending with a letter or digit)",
            )
        )
    # on CREATE only: an existing cache must stay updatable (finalizers, status report)
    if old is None and (dropped := prunedmode.dropped_pvc_ref(obj)) is not None:
        found.append(Violation("spec.pvcRef", prunedmode.message(dropped)))
    if old is not None:
        before = _spec(old).get("pvcRef")
        if before != ref:
            found.append(
                Violation(
                    "spec.pvcRef",
                    f"spec.pvcRef is immutable (was {_shown(before)}, now {_shown(ref)}): "
                    "create a new cache for another claim or mode",
                )
            )
    return found


def check_destination(
    cache: modelcache.LocalModelNamespaceCache,
    *,
    old: object | None,
    namespace_caches: Iterable[modelcache.LocalModelNamespaceCache],
) -> list[Violation]:
    """On create of a shared-volume cache: another cache of its namespace that imports the same
    model onto the same claim (module docstring)."""
    if old is not None or not cache.spec.shared_volume:
        return []
    key = keys.storage_key(cache.spec.source_model_uri)
    for other in sorted(namespace_caches, key=lambda c: c.name):
        if (
            other.namespace != cache.namespace
            or other.name == cache.name
            or other.metadata.deletion_timestamp
            or other.spec.pvc_ref != cache.spec.pvc_ref
            or keys.storage_key(other.spec.source_model_uri) != key
        ):
            continue
        return [
            Violation(
                "spec.pvcRef",
                f"LocalModelNamespaceCache {other.namespace}/{other.name} already imports "
                f"{other.spec.source_model_uri} onto claim {cache.spec.pvc_ref} (models/{key}): "
                "one cache per claim and model; use that cache, or another claim",
            )
        ]
    return []
