"""The node-group usage reconciler: keeps `LocalModelNodeGroup.status.used/available` equal to
the space taken by the distinct model URIs of the caches (both kinds) that list the group
[P13]. Keyed by group name, so one group's status is never written by two reconciles at once;
triggered by the group itself (created, `storageLimit` changed) and by caches that list it
(created, deleted, spec changed). The kind has no status subresource (as in KServe), so the
status is merge-patched on the object itself, and only when a value differs."""

from __future__ import annotations

import pydantic
import structlog

from localcache.api import nodegroup
from localcache.caching import placement
from localcache.controllers import state
from localcache.runtime import errors, reconcile
from localcache.runtime import keys as runtime_keys

_log = structlog.get_logger(__name__)


class NodeGroupUsageReconciler:
    def __init__(self, *, api: state.Api, reader: state.StateReader) -> None:
        self._api = api
        self._reader = reader

    async def reconcile(self, key: runtime_keys.ObjectKey) -> reconcile.Result:
        raw = self._reader.stores.node_groups.get(key)
        if raw is None:
            return reconcile.Result()
        try:
            group = nodegroup.LocalModelNodeGroup.model_validate(raw)
        except pydantic.ValidationError as exc:
            raise errors.TerminalError(f"LocalModelNodeGroup {key} is invalid: {exc}") from exc
        usage = placement.group_usage(group.name, group.spec.storage_limit, self._reader.caches())
        current = group.status
        if (
            current is not None
            and current.used == usage.used
            and current.available == usage.available
        ):
            return reconcile.Result()
        await self._api.patch(
            state.LOCAL_MODEL_NODE_GROUPS,
            group.name,
            {"status": {"used": str(usage.used), "available": str(usage.available)}},
        )
        _log.info("node_group_usage_updated", used=str(usage.used), available=str(usage.available))
        return reconcile.Result()
