"""Store index functions over LocalModel objects, one per meaning.

Components that read the same shared informer (controllers and webhooks read the cache kinds)
ask for the index by the same name and function, so the store keeps it once.
"""

from __future__ import annotations

from typing import Any, Final

CACHES_BY_NODE_GROUP: Final = "localcache/cache-node-group"
"""Caches of either kind by each name in `spec.nodeGroups`."""


def cache_node_groups(obj: dict[str, Any]) -> list[str]:
    """The node group names a cache lists (non-strings ignored)."""
    groups = (obj.get("spec") or {}).get("nodeGroups")
    return [g for g in groups if isinstance(g, str)] if isinstance(groups, list) else []
