"""Writing a cache's status and recording Events about it.

- The diff is `runtime.patch.merge_patch_of_keys(old, new)`: the JSON merge patch (RFC 7386)
  that turns `old` into `new` for the keys of `new`: nested maps are diffed (removed keys
  become `null`), other values are replaced when different. An empty result means "nothing
  to write".
- `write_status` patches only the fields the reconciler owns (`nodeStatus`, `copies`,
  `conditions`, and `inferenceServices` when ISVCs are tracked) through the status
  subresource, and only when they differ from what the store holds. Other status fields
  (`llmInferenceServices`, fields of newer versions) are left alone.
- `WrittenStatus` remembers the status this process last wrote to each cache until the
  informer store shows that write. A reconcile that runs before then (a retry 5 ms after a
  refused PVC, a second event in a burst) diffs against what was written, not against the
  store's older copy: otherwise it would write the same status again and record its Events
  twice, or skip a needed write because the old copy happens to equal the new state. It is
  a `runtime.store.WriteOverlay` keyed by uid.
- `write_status(..., guarded=True)` makes the write conditional on the resourceVersion it
  was computed from (the store's copy, or this process's last write while the store lags):
  a status computed from a copy older than the API's is refused (`errors.Conflict`, retried
  with backoff by the controller) instead of overwriting a newer status. The store can hold
  a version between the one a write replaced and the one it produced (events arrive late):
  an unguarded write from that copy would undo the newer status.
- `EventRecorder` records core/v1 Events on a cache through `runtime.events.Recorder`
  (component `localcache-controller`, deduplicated with a count bump; a cluster-scoped
  object's Events go to `default`). Failing to record an Event is logged, never raised:
  Events are informative.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import structlog

from localcache.caching import conditions
from localcache.controllers import scope, state
from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, events
from localcache.runtime import patch as patch_mod
from localcache.runtime import store as store_mod

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
COMPONENT: Final = "localcache-controller"


class WrittenStatus:
    """What this process last wrote to each cache's status (module docstring), by uid.
    An entry is dropped once the store's copy moved past the version the write was based
    on; at most `limit` caches are remembered (the oldest are forgotten first)."""

    def __init__(self, limit: int = 4096) -> None:
        self._overlay: store_mod.WriteOverlay[str, tuple[Obj, str]] = store_mod.WriteOverlay(
            limit=limit
        )

    def current(self, obj: Obj) -> Obj:
        """The status to treat as the cache's current one, for the store's copy `obj`."""
        return self.based_on(obj)[0]

    def based_on(self, obj: Obj) -> tuple[Obj, str]:
        """`current(obj)` and the resourceVersion it is the status of."""
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        stored = str(meta.get("resourceVersion") or "")
        found = self._overlay.get(uid, stored_version=stored)
        if found is not None:
            return found  # the store has not seen our write yet
        return dict(obj.get("status") or {}), stored

    def remember(self, obj: Obj, answer: Obj) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        replaced = str(meta.get("resourceVersion") or "")
        version = str((answer.get("metadata") or {}).get("resourceVersion") or "")
        self._overlay.wrote(
            uid, replaced=replaced, value=(dict(answer.get("status") or {}), version)
        )


async def write_status(
    api: state.Api,
    sc: scope.Scope,
    *,
    current: Obj,
    desired: Mapping[str, Any],
    written: WrittenStatus | None = None,
    guarded: bool = False,
) -> bool:
    """Patch the owned status fields of the cache object `current` (the store's copy)
    towards `desired`; True when a write was needed. With `written`, the diff is taken
    against what this process wrote last when the store has not caught up with it; with
    `guarded`, the write is refused (`errors.Conflict`) when the API's object has moved past
    the version the diff was taken from (module docstring)."""
    meta = current.get("metadata") or {}
    if written is not None:
        base, version = written.based_on(current)
    else:
        base, version = current.get("status") or {}, str(meta.get("resourceVersion") or "")
    diff = patch_mod.merge_patch_of_keys(base, desired)
    if not diff:
        return False
    body: Obj = {"status": diff}
    if guarded and version:
        body["metadata"] = {"resourceVersion": version}
    try:
        answer = await api.patch_status(
            sc.resource, str(meta["name"]), body, namespace=meta.get("namespace") or None
        )
    except errors.NotFound:
        _log.debug("cache_already_gone")  # deleted since the store's copy was taken
        return False
    if written is not None:
        written.remember(current, answer)
    _log.info("cache_status_updated", fields=sorted(diff))
    return True


class EventRecorder:
    """Records core/v1 Events on caches (see module docstring)."""

    def __init__(
        self,
        api: state.Api,
        *,
        component: str = COMPONENT,
        instance: str = "",
        now: Callable[[], str] = clock_mod.now_rfc3339,
    ) -> None:
        self._events = events.Recorder(api, component=component, instance=instance, now=now)

    async def record(
        self, sc: scope.Scope, cache: scope.CacheModel, event: conditions.EventSpec
    ) -> None:
        involved = events.involved_object(
            api_version=sc.kind.api_version,
            kind=sc.kind.kind,
            name=cache.name,
            uid=cache.metadata.uid or "",
            namespace=cache.namespace or "",
            resource_version=cache.metadata.resource_version,
        )
        try:
            await self._events.record(
                involved,
                type=event.type,
                reason=event.reason,
                message=event.message,
                namespace=sc.event_namespace(cache),
            )
        except errors.LocalcacheError as exc:
            _log.warning("event_not_recorded", reason=event.reason, error=str(exc))
