"""Event filters for handlers (controller-runtime's `pkg/predicate`).

A `Predicate` takes an informer event and says whether it should enqueue anything. The
change predicates (`generation_changed`, `labels_changed`, `annotations_changed`,
`resource_version_changed`) only ever filter *updates*: adds and deletes pass. Combine with
`all_of`, `any_of` and `not_`; build your own with `funcs` (per event kind) or `matching`
(on the object, the new one for updates), or pass any `Callable[[Event], bool]`.

Caveats (as in controller-runtime): status-subresource writes do not bump
`metadata.generation`, so `generation_changed` hides them; a relist's catch-up update of an
object changed while disconnected is filtered like any other update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from localcache.runtime import informer

Obj = dict[str, Any]
Predicate = Callable[[informer.Event], bool]


def _meta(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _on_update(changed: Callable[[Obj, Obj], bool]) -> Predicate:
    def predicate(event: informer.Event) -> bool:
        if isinstance(event, informer.Updated):
            return changed(event.old, event.new)
        return True

    return predicate


generation_changed: Predicate = _on_update(
    lambda old, new: _meta(old).get("generation") != _meta(new).get("generation")
)
"""Updates pass only when `metadata.generation` changed (spec changes, for most kinds)."""

labels_changed: Predicate = _on_update(
    lambda old, new: (_meta(old).get("labels") or {}) != (_meta(new).get("labels") or {})
)
"""Updates pass only when the labels changed."""

annotations_changed: Predicate = _on_update(
    lambda old, new: (_meta(old).get("annotations") or {}) != (_meta(new).get("annotations") or {})
)
"""Updates pass only when the annotations changed."""

resource_version_changed: Predicate = _on_update(
    lambda old, new: _meta(old).get("resourceVersion") != _meta(new).get("resourceVersion")
)
"""Updates pass only when the resourceVersion changed (drops no-op resync-like updates)."""


def all_of(*predicates: Predicate) -> Predicate:
    """Passes when every predicate passes (and with none)."""

    def predicate(event: informer.Event) -> bool:
        return all(p(event) for p in predicates)

    return predicate


def any_of(*predicates: Predicate) -> Predicate:
    """Passes when at least one predicate passes (never with none)."""

    def predicate(event: informer.Event) -> bool:
        return any(p(event) for p in predicates)

    return predicate


def not_(inner: Predicate) -> Predicate:
    """Passes when `inner` does not."""

    def predicate(event: informer.Event) -> bool:
        return not inner(event)

    return predicate


def funcs(
    *,
    added: Callable[[Obj], bool] | None = None,
    updated: Callable[[Obj, Obj], bool] | None = None,
    deleted: Callable[[Obj], bool] | None = None,
) -> Predicate:
    """One check per event kind; a kind without a check passes."""

    def predicate(event: informer.Event) -> bool:
        if isinstance(event, informer.Added):
            return added is None or added(event.obj)
        if isinstance(event, informer.Updated):
            return updated is None or updated(event.old, event.new)
        return deleted is None or deleted(event.obj)

    return predicate


def matching(check: Callable[[Obj], bool]) -> Predicate:
    """Passes when `check(obj)` holds for the event's object (the new one for updates)."""

    def predicate(event: informer.Event) -> bool:
        return check(event.obj)

    return predicate
