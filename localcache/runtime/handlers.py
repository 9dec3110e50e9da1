"""Informer event → work-queue keys (controller-runtime's `pkg/handler`).

Each builder returns an informer `Handler` that turns an event into zero or more
`ObjectKey`s and adds them to a queue, if every given predicate passes:

- `enqueue_self`: the object's own key;
- `enqueue_owner`: the key of the owner named in `metadata.ownerReferences` (matched by
  API group and kind; by default only the `controller: true` reference), for both the old and
  the new object of an update, so a change of owner reaches both;
- `enqueue_mapped`: whatever keys a function computes from the object (old and new for
  updates).

The queue carries keys, never events: reconcilers re-read state. Handlers run on the
informer's task and only call the queue's synchronous `add`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from localcache.runtime import informer, keys, predicates

Obj = dict[str, Any]
MapFunc = Callable[[Obj], Iterable[keys.ObjectKey]]


class KeyQueue(Protocol):
    """The part of a work queue a handler uses."""

    def add(self, key: keys.ObjectKey) -> None: ...


def _objects(event: informer.Event) -> tuple[Obj, ...]:
    if isinstance(event, informer.Updated):
        return (event.old, event.new)
    return (event.obj,)


def _mapped_handler(
    queue: KeyQueue, keys_of: MapFunc, filters: tuple[predicates.Predicate, ...]
) -> informer.Handler:
    def handle(event: informer.Event) -> None:
        if not all(p(event) for p in filters):
            return
        seen: set[keys.ObjectKey] = set()
        for obj in _objects(event):
            for key in keys_of(obj):
                if key not in seen:
                    seen.add(key)
                    queue.add(key)

    return handle


def enqueue_self(queue: KeyQueue, *filters: predicates.Predicate) -> informer.Handler:
    """Enqueue the object's own key."""

    if not filters:

        def handle_all(event: informer.Event) -> None:
            queue.add(keys.ObjectKey.of(event.obj))

        return handle_all

    def handle(event: informer.Event) -> None:
        if all(p(event) for p in filters):
            queue.add(keys.ObjectKey.of(event.obj))

    return handle


def _group(api_version: str) -> str:
    group, _, version = api_version.rpartition("/")
    return group if version else ""


def owner_keys(
    obj: Obj,
    *,
    owner_api_version: str,
    owner_kind: str,
    owner_namespaced: bool,
    only_controller: bool,
) -> list[keys.ObjectKey]:
    """Keys of the matching owners in `obj`'s ownerReferences (group and kind must match)."""
    meta = obj.get("metadata") or {}
    namespace = (meta.get("namespace") or "") if owner_namespaced else ""
    group = _group(owner_api_version)
    found: list[keys.ObjectKey] = []
    for ref in meta.get("ownerReferences") or []:
        if not isinstance(ref, dict) or ref.get("kind") != owner_kind:
            continue
        if _group(str(ref.get("apiVersion") or "")) != group:
            continue
        if only_controller and not ref.get("controller"):
            continue
        name = ref.get("name")
        if name:
            found.append(keys.ObjectKey(namespace, str(name)))
    return found


def enqueue_owner(
    queue: KeyQueue,
    *filters: predicates.Predicate,
    owner_api_version: str,
    owner_kind: str,
    owner_namespaced: bool = True,
    only_controller: bool = True,
) -> informer.Handler:
    """Enqueue the owner(s) of kind `owner_kind` in group of `owner_api_version`. A
    cluster-scoped owner (`owner_namespaced=False`) gets a key without namespace."""

    def keys_of(obj: Obj) -> list[keys.ObjectKey]:
        return owner_keys(
            obj,
            owner_api_version=owner_api_version,
            owner_kind=owner_kind,
            owner_namespaced=owner_namespaced,
            only_controller=only_controller,
        )

    return _mapped_handler(queue, keys_of, filters)


def enqueue_mapped(
    queue: KeyQueue, keys_of: MapFunc, *filters: predicates.Predicate
) -> informer.Handler:
    """Enqueue every key `keys_of(obj)` returns (for old and new on updates, deduplicated)."""
    return _mapped_handler(queue, keys_of, filters)
