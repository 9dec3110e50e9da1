"""An informer: a reflector filling a store, and event handlers told about every change.

Guarantees (after client-go's SharedInformer):
- The store converges to the server's state (eventual consistency); it is updated *before*
  handlers hear of a change, so a handler that reads the store sees at least that version.
- Handlers are told in order, per object and overall, on the informer's task. Each handler
  gets `Added`, `Updated` (old and new) and `Deleted` events; a delete missed while
  disconnected arrives after the relist as `Deleted(final_state_unknown=True)` carrying the
  last known state.
- `synced` is set once the first LIST is in the store and its `Added(initial=True)` events
  have been delivered. A handler added later first receives the current content as
  `Added(initial=True)`.
- A relist does not notify about objects whose resourceVersion did not change.

Not promised: every intermediate version (changes coalesce while disconnected), UID as
identity (a delete + re-create while disconnected is an `Updated` with a new UID), ordering
across informers. Handlers must be quick and non-blocking (they typically enqueue a key);
they must not mutate objects. An exception in a handler is logged and counted, never fatal.
Objects pass through `transform` first (default `compact`: drop `metadata.managedFields`
and share repeated strings across the cache; `metadata_only` keeps only the metadata).
Informers shared by several consumers of one process come from `factory.InformerFactory`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from localcache.runtime import clock as clock_mod
from localcache.runtime import keys, listwatch, reflector, store

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
Transform = Callable[[Obj], Obj]
_intern = sys.intern


@dataclass(frozen=True, slots=True)
class Added:
    obj: Obj
    initial: bool = False
    """True when the object came with the first LIST (or a handler's catch-up replay)."""


@dataclass(frozen=True, slots=True)
class Updated:
    old: Obj
    new: Obj

    @property
    def obj(self) -> Obj:
        return self.new


@dataclass(frozen=True, slots=True)
class Deleted:
    obj: Obj
    final_state_unknown: bool = False
    """True for a delete missed while disconnected: `obj` is the last state seen."""


Event = Added | Updated | Deleted
Handler = Callable[[Event], None]


def strip_managed_fields(obj: Obj) -> Obj:
    """`metadata.managedFields` is large and never needed by a cache: drop it (in place)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def _interned(obj: Obj) -> Obj:
    """A copy of `obj` whose keys (at every depth) are interned strings."""
    out: Obj = {}
    for key, value in obj.items():
        kind = type(value)
        if kind is dict:
            value = _interned(value)
        elif kind is list:
            value = [_interned(v) if type(v) is dict else v for v in value]
        out[_intern(key)] = value
    return out


def compact(obj: Obj) -> Obj:
    """The default transform: drop managedFields, then share the strings every object
    repeats (all keys; apiVersion, kind, namespace and label values) across the cache.
    JSON decoding gives every watch event its own copy of each key, which otherwise costs
    more than the object's data for small objects. Returns a new dict."""
    strip_managed_fields(obj)
    out = _interned(obj)
    for field_name in ("apiVersion", "kind"):
        value = out.get(field_name)
        if type(value) is str:
            out[field_name] = _intern(value)
    meta = out.get("metadata")
    if type(meta) is dict:
        namespace = meta.get("namespace")
        if type(namespace) is str:
            meta["namespace"] = _intern(namespace)
        labels = meta.get("labels")
        if type(labels) is dict:  # our own copy: intern its values in place
            for k, v in labels.items():
                if type(v) is str:
                    labels[k] = _intern(v)
    return out


def metadata_only(obj: Obj) -> Obj:
    """A transform for caches that read only metadata (e.g. labels of every InferenceService
    in the cluster): apiVersion, kind and metadata without managedFields, compacted."""
    return compact(
        {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": _meta_of(obj)}
    )


def _meta_of(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


@dataclass(frozen=True, slots=True)
class InformerStats:
    resource: str
    objects: int
    resource_version: str
    synced: bool
    relists: int
    watch_restarts: int
    events: int
    """Watch events received, bookmarks included."""
    errors: int
    """Failed list/watch attempts plus handler exceptions."""
    last_event_age: float | None
    """Seconds since the last watch event or bookmark (None before the first)."""
    progress_age: float
    """Seconds since the list/watch loop last made progress (see `liveness_check`)."""


class Informer:
    """Reflector + store + handler fan-out for one resource (see the module docstring)."""

    def __init__(
        self,
        source: listwatch.ListerWatcher,
        *,
        clock: clock_mod.Clock | None = None,
        indexers: Mapping[str, store.IndexFunc] | None = None,
        transform: Transform | None = compact,
        read_deadline: float = reflector.READ_DEADLINE_S,
        page_size: int = reflector.PAGE_SIZE,
        reflector_options: Mapping[str, Any] | None = None,
    ) -> None:
        self._clock = clock or clock_mod.SystemClock()
        self.store = store.Store(indexers)
        self._transform = transform
        self._handlers: list[Handler] = []
        self._handler_errors = 0
        self.synced = asyncio.Event()
        """Set once the first LIST is in the store and delivered to the handlers."""
        self._reflector = reflector.Reflector(
            source,
            self,
            clock=self._clock,
            read_deadline=read_deadline,
            page_size=page_size,
            **dict(reflector_options or {}),
        )
        self._started = False

    @property
    def name(self) -> str:
        return self._reflector.description

    @property
    def started(self) -> bool:
        """True once `run()` was called (indexes should be added before: see `factory`)."""
        return self._started

    def reader(self, namespace: str | None = None) -> store.View:
        """A read-only view of the cache (optionally one namespace) for reconcilers."""
        return self.store.view(namespace)

    def add_handler(self, handler: Handler) -> None:
        """Register a handler; once synced, it first gets the current content as adds."""
        self._handlers.append(handler)
        if self.synced.is_set():
            for obj in self.store.list():
                self._call(handler, Added(obj, initial=True))

    def replay(self) -> int:
        """Send the current content to every handler again as `Added(initial=True)`, as at
        sync (a controller restarted with a fresh queue catches up); returns how many objects.
        Does nothing before the first sync."""
        if not self.synced.is_set():
            return 0
        objs = self.store.list()
        for obj in objs:
            self._dispatch(Added(obj, initial=True))
        return len(objs)

    def add_indexers(self, indexers: Mapping[str, store.IndexFunc]) -> None:
        self.store.add_indexers(indexers)

    async def run(self) -> None:
        """List and watch until cancelled (once per informer)."""
        if self._started:
            raise RuntimeError(f"informer {self.name} was already started")
        self._started = True
        _log.info("informer_started", resource=self.name)
        try:
            await self._reflector.run()
        finally:
            _log.info("informer_stopped", resource=self.name)

    def stats(self) -> InformerStats:
        r = self._reflector.stats()
        now = self._clock.now()
        return InformerStats(
            resource=self.name,
            objects=len(self.store),
            resource_version=r.resource_version,
            synced=self.synced.is_set(),
            relists=max(0, r.lists - 1),
            watch_restarts=max(0, r.watches - 1),
            events=r.events,
            errors=r.errors + self._handler_errors,
            last_event_age=None if r.last_event_at is None else max(0.0, now - r.last_event_at),
            progress_age=max(0.0, now - r.last_progress_at),
        )

    # ---------------------------------------------------------------- health

    def liveness_check(self) -> Callable[[], str | None]:
        """For /healthz: fails when the list/watch loop has made no progress for longer than
        any of its waits may take (a silent watch is abandoned well before that)."""

        def check() -> str | None:
            if not self._started:
                return None
            age = self.stats().progress_age
            limit = self._reflector.liveness_deadline
            if age > limit:
                return f"watch of {self.name} silent for {age:.0f}s (deadline {limit:.0f}s)"
            return None

        return check

    def synced_check(self) -> Callable[[], str | None]:
        """For /readyz: fails until the first LIST has been delivered."""

        def check() -> str | None:
            return None if self.synced.is_set() else f"informer {self.name} has not synced"

        return check

    # ---------------------------------------------------------------- StoreSink

    def replace(self, objs: list[Obj], resource_version: str) -> None:
        transform = self._transform
        fresh = [transform(o) for o in objs] if transform is not None else objs
        delta = self.store.replace(fresh)
        initial = not self.synced.is_set()
        for obj in delta.added:
            self._dispatch(Added(obj, initial=initial))
        for old, new in delta.updated:
            self._dispatch(Updated(old, new))
        for tomb in delta.deleted:
            self._dispatch(Deleted(tomb.last_known, final_state_unknown=True))
        if initial:
            self.synced.set()
            _log.info(
                "informer_synced",
                resource=self.name,
                objects=len(fresh),
                resource_version=resource_version,
            )
        elif delta.added or delta.updated or delta.deleted:
            _log.info(
                "informer_relisted",
                resource=self.name,
                added=len(delta.added),
                updated=len(delta.updated),
                deleted=len(delta.deleted),
            )

    def upsert(self, obj: Obj) -> None:
        if self._transform is not None:
            obj = self._transform(obj)
        old = self.store.upsert(obj)
        self._dispatch(Added(obj) if old is None else Updated(old, obj))

    def delete(self, obj: Obj) -> None:
        if self._transform is not None:
            obj = self._transform(obj)
        old = self.store.delete(keys.ObjectKey.of(obj))
        if old is not None:
            self._dispatch(Deleted(obj))

    def _dispatch(self, event: Event) -> None:
        for handler in self._handlers:  # _call() inlined: this runs for every event
            try:
                handler(event)
            except Exception:
                self._handler_failed(event)

    def _call(self, handler: Handler, event: Event) -> None:
        try:
            handler(event)
        except Exception:
            self._handler_failed(event)

    def _handler_failed(self, event: Event) -> None:
        self._handler_errors += 1
        _log.exception(
            "informer_handler_failed", resource=self.name, event_type=type(event).__name__
        )
