"""Writing a cache's status and recording Events about it.

- `merge_diff(old, new)` is the JSON merge patch (RFC 7386) that turns `old` into `new` for
  the keys of `new`: nested maps are diffed (removed keys become `null`), other values are
  replaced when different. An empty result means "nothing to write".
- `write_status` patches only the fields the reconciler owns (`nodeStatus`, `copies`,
  `conditions`, and `inferenceServices` when ISVCs are tracked) through the status
  subresource, and only when they differ from what the store holds. Other status fields
  (`llmInferenceServices`, fields of newer versions) are left alone.
- `WrittenStatus` remembers the status this process last wrote to each cache until the
  informer store shows that write. A reconcile that runs before then (a retry 5 ms after a
  refused PVC, a second event in a burst) diffs against what was written, not against the
  store's older copy: otherwise it would write the same status again and record its Events
  twice, or skip a needed write because the old copy happens to equal the new state.
- `EventRecorder` creates core/v1 Events on an object, as client-go's recorder does (a
  cluster-scoped object's Events go to `default`). Failing to record an Event is logged,
  never raised: Events are informative.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import structlog

from localcache.caching import conditions, names
from localcache.controllers import scope, state
from localcache.runtime import errors, kube

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
COMPONENT: Final = "localcache-controller"


def now_rfc3339() -> str:
    """Wall-clock time as metav1.Time renders it (seconds, UTC, `Z`)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> Obj:
    """The merge patch from `old` to `new`, over the keys of `new` (see module docstring)."""
    patch: Obj = {}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = merge_diff(before, value)
            for gone in before.keys() - value.keys():
                nested[gone] = None
            if nested:
                patch[key] = nested
        elif before != value:
            patch[key] = value
    return patch


@dataclass(frozen=True, slots=True)
class _Written:
    based_on: str  # the resourceVersion the store held when we wrote
    status: Obj  # the status the apiserver answered with


class WrittenStatus:
    """What this process last wrote to each cache's status (module docstring), by uid.
    An entry is dropped once the store's copy moved past the version the write was based
    on; at most `limit` caches are remembered (the oldest are forgotten first)."""

    def __init__(self, limit: int = 4096) -> None:
        self._limit = limit
        self._by_uid: OrderedDict[str, _Written] = OrderedDict()

    def current(self, obj: Obj) -> Obj:
        """The status to treat as the cache's current one, for the store's copy `obj`."""
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        found = self._by_uid.get(uid)
        if found is not None and found.based_on == str(meta.get("resourceVersion") or ""):
            return found.status  # the store has not seen our write yet
        self._by_uid.pop(uid, None)
        return dict(obj.get("status") or {})

    def remember(self, obj: Obj, answer: Obj) -> None:
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        self._by_uid[uid] = _Written(
            str(meta.get("resourceVersion") or ""), dict(answer.get("status") or {})
        )
        self._by_uid.move_to_end(uid)
        while len(self._by_uid) > self._limit:
            self._by_uid.popitem(last=False)


async def write_status(
    api: state.Api,
    sc: scope.Scope,
    *,
    current: Obj,
    desired: Mapping[str, Any],
    written: WrittenStatus | None = None,
) -> bool:
    """Patch the owned status fields of the cache object `current` (the store's copy)
    towards `desired`; True when a write was needed. With `written`, the diff is taken
    against what this process wrote last when the store has not caught up with it."""
    meta = current.get("metadata") or {}
    base = written.current(current) if written is not None else current.get("status") or {}
    diff = merge_diff(base, desired)
    if not diff:
        return False
    try:
        answer = await api.patch_status(
            sc.resource,
            str(meta["name"]),
            {"status": diff},
            namespace=meta.get("namespace") or None,
        )
    except errors.NotFound:
        _log.debug("cache_already_gone")  # deleted since the store's copy was taken
        return False
    if written is not None:
        written.remember(current, answer)
    _log.info("cache_status_updated", fields=sorted(diff))
    return True


class EventRecorder:
    """Records core/v1 Events (see module docstring)."""

    def __init__(
        self,
        api: state.Api,
        *,
        component: str = COMPONENT,
        instance: str = "",
        now: Callable[[], str] = now_rfc3339,
    ) -> None:
        self._api = api
        self._component = component
        self._instance = instance
        self._now = now

    async def record(
        self, sc: scope.Scope, cache: scope.CacheModel, event: conditions.EventSpec
    ) -> None:
        namespace = sc.event_namespace(cache)
        now = self._now()
        involved: Obj = {
            "apiVersion": sc.kind.api_version,
            "kind": sc.kind.kind,
            "name": cache.name,
            "uid": cache.metadata.uid,
            "resourceVersion": cache.metadata.resource_version,
        }
        if cache.namespace:
            involved["namespace"] = cache.namespace
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": names.event_name(cache.name, uuid.uuid4().hex[:16]),
                "namespace": namespace,
            },
            "involvedObject": involved,
            "reason": event.reason,
            "message": event.message,
            "type": event.type,
            "source": {"component": self._component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
        }
        try:
            await self._api.create(kube.EVENTS, body, namespace=namespace)
        except errors.LocalcacheError as exc:
            _log.warning("event_not_recorded", reason=event.reason, error=str(exc))
