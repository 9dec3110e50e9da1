"""Store index functions over LocalModel objects, one per meaning.

Components that read the same shared informer (controllers and webhooks read the cache kinds)
ask for the index by the same name and function, so the store keeps it once.
"""

from __future__ import annotations

from typing import Any, Final

from localcache.api import inferenceservice
from localcache.caching import keys
from localcache.runtime import informer

CACHES_BY_NODE_GROUP: Final = "localcache/cache-node-group"
"""Caches of either kind by each name in `spec.nodeGroups`."""


def cache_node_groups(obj: dict[str, Any]) -> list[str]:
    """The node group names a cache lists (non-strings ignored)."""
    groups = (obj.get("spec") or {}).get("nodeGroups")
    return [g for g in groups if isinstance(g, str)] if isinstance(groups, list) else []


def isvc_use(obj: dict[str, Any]) -> dict[str, Any]:
    """The informer transform of InferenceServices, shared by the controllers and the
    webhooks: the metadata (labels say which cache an ISVC uses) and, of the spec, only each
    predictor implementation's `storageUri` (whether that cache serves it: a label alone
    proves nothing)."""
    slim = informer.metadata_only(obj)
    predictor = (obj.get("spec") or {}).get("predictor")
    if isinstance(predictor, dict):
        uris = {
            key: {"storageUri": impl["storageUri"]}
            for key in inferenceservice.PREDICTOR_KEYS
            if isinstance(impl := predictor.get(key), dict)
            and isinstance(impl.get("storageUri"), str)
        }
        if uris:
            slim["spec"] = {"predictor": uris}
    return slim


def cache_name(obj: dict[str, Any]) -> list[str]:
    """A cache's name (the webhooks' name index)."""
    name = (obj.get("metadata") or {}).get("name")
    return [name] if isinstance(name, str) else []


def isvc_used_cache(obj: dict[str, Any]) -> list[str]:
    """The status key of the cache an InferenceService is labelled for: `name` for a cluster
    cache, `ns/name` for a namespace cache of its own namespace; nothing otherwise."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    name = labels.get(inferenceservice.LOCAL_MODEL_LABEL)
    namespace = labels.get(inferenceservice.LOCAL_MODEL_NAMESPACE_LABEL)
    if not name or (namespace is not None and namespace != meta.get("namespace")):
        return []
    try:
        return [keys.status_key(name, namespace)]
    except ValueError:
        return []


def isvc_storage_uri(obj: dict[str, Any]) -> str | None:
    """The storage URI of an InferenceService's predictor (whole or `isvc_use`'s slice): that
    of its first implementation in KServe's order (`InferenceService.storage_uri`); None when
    it has none. Read from the dict, no model built: predicates call it on every ISVC event."""
    predictor = (obj.get("spec") or {}).get("predictor")
    if not isinstance(predictor, dict):
        return None
    for key in inferenceservice.PREDICTOR_KEYS:
        impl = predictor.get(key)
        if isinstance(impl, dict):
            uri = impl.get("storageUri")
            return uri if isinstance(uri, str) else None
    return None


def isvc_uses_uri(obj: dict[str, Any], cache_uri: str) -> bool:
    """Whether a cache of `cache_uri` serves the InferenceService's storage URI: what makes a
    label a use (a label alone proves nothing: anyone who can edit the ISVC can set it)."""
    storage_uri = isvc_storage_uri(obj)
    return storage_uri is not None and keys.match_storage_uri(cache_uri, storage_uri)


def slim_node(obj: dict[str, Any]) -> dict[str, Any]:
    """The informer transform of Nodes, shared by the controllers and the webhooks: name,
    uid, labels and the Ready condition (Nodes carry large statuses: images, addresses)."""
    meta = obj.get("metadata") or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    return {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion", "labels") if k in meta},
        "status": {"conditions": [c for c in conditions if c.get("type") == "Ready"]},
    }
