"""Store index functions over LocalModel objects, one per meaning.

Components that read the same shared informer (controllers and webhooks read the cache kinds)
ask for the index by the same name and function, so the store keeps it once.
"""

from __future__ import annotations

from typing import Any, Final

from localcache.api import inferenceservice
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
