"""The informer's cache: objects by `ObjectKey`, with named secondary indexes.

Vocabulary (client-go `index.go`): a *key* identifies one object; an *index name* names an
index function; an *indexed value* is one of the strings that function returns for an object.
`by_index("owner", "ns/a")` returns every object whose index function yields "ns/a".

Contract:
- One event loop, no locks: every method is synchronous and completes before another runs.
- Objects are stored and handed out as is (no copies). Readers must not mutate them; the
  informer replaces, never edits, a stored object when a newer version arrives.
- `replace(objs)` installs a complete new state (after a LIST) and reports what changed,
  including `Tombstone`s (last known state) for keys that vanished: deletes that happened
  while the watch was down.
- Identity is the key, not the UID: a delete and re-create while disconnected looks like an
  update; compare `metadata.uid` where that matters.
- Consumers that only read declare the `Reader` Protocol; `view()` gives a read-only,
  optionally namespace-scoped `Reader`.

`WriteOverlay` is the store's read-your-own-writes companion: a writer remembers what its
write returned, keyed as it likes, with the resourceVersion the write replaced, and reads that
instead of the store's copy while the store still shows the replaced version (an informer
lags its own process's writes by a watch event). Once the store moved on, the entry is
dropped at the next read: the store is again the freshest copy. At most `limit` entries are
kept (the least recently written are forgotten first).
"""

from __future__ import annotations

import builtins
import types
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, KeysView, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from localcache.runtime.keys import ObjectKey

Obj = dict[str, Any]
IndexFunc = Callable[[Obj], Iterable[str]]
"""Maps an object to its indexed values (none, one or many)."""

_Objs = list[Obj]
_Keys = list[ObjectKey]

NAMESPACE_INDEX = "namespace"
"""Built-in index of every store: the object's namespace ("" for cluster-scoped objects)."""


def namespace_index(obj: Obj) -> list[str]:
    return [(obj.get("metadata") or {}).get("namespace") or ""]


@dataclass(frozen=True, slots=True)
class LabelIndex:
    """Index by the value of one label (objects without it are not indexed). Two indexes
    of the same label compare equal, so consumers sharing a store may each ask for one."""

    label: str

    def __call__(self, obj: Obj) -> list[str]:
        value = ((obj.get("metadata") or {}).get("labels") or {}).get(self.label)
        return [value] if value is not None else []


def label_index(label: str) -> IndexFunc:
    """Index by the value of one label (a `LabelIndex`)."""
    return LabelIndex(label)


@dataclass(frozen=True, slots=True)
class Tombstone:
    """A delete that was not observed as it happened (it vanished from a relist):
    `last_known` is the last state this store held, which may be stale."""

    key: ObjectKey
    last_known: Obj


@dataclass(frozen=True, slots=True)
class Replaced:
    """What `Store.replace` changed: new keys, changed keys (old, new), vanished keys."""

    added: list[Obj] = field(default_factory=list)
    updated: list[tuple[Obj, Obj]] = field(default_factory=list)
    deleted: list[Tombstone] = field(default_factory=list)
    unchanged: int = 0


class Reader(Protocol):
    """Read access to a cache: what reconcilers should depend on."""

    def get(self, key: ObjectKey) -> Obj | None: ...

    def list(self, namespace: str | None = None) -> _Objs: ...

    def by_index(self, index: str, value: str) -> _Objs: ...

    def keys(self) -> _Keys: ...


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class Store:
    """A keyed object cache with named indexes (see the module docstring)."""

    def __init__(self, indexers: Mapping[str, IndexFunc] | None = None) -> None:
        self._items: dict[ObjectKey, Obj] = {}
        self._indexers: dict[str, IndexFunc] = {NAMESPACE_INDEX: namespace_index}
        self._indices: dict[str, dict[str, set[ObjectKey]]] = {NAMESPACE_INDEX: {}}
        if indexers:
            self.add_indexers(indexers)

    # ---------------------------------------------------------------- indexes

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add named indexes; existing objects are indexed at once."""
        for name, func in indexers.items():
            if name in self._indexers:
                raise ValueError(f"index {name!r} already exists")
            self._indexers[name] = func
            index: dict[str, set[ObjectKey]] = {}
            self._indices[name] = index
            for key, obj in self._items.items():
                for value in func(obj):
                    index.setdefault(value, set()).add(key)

    @property
    def index_names(self) -> builtins.list[str]:
        return builtins.list(self._indexers)

    @property
    def indexers(self) -> Mapping[str, IndexFunc]:
        """The index functions by name (read-only; the built-in namespace index included)."""
        return types.MappingProxyType(self._indexers)

    def _index(self, key: ObjectKey, old: Obj | None, new: Obj | None) -> None:
        for name, func in self._indexers.items():
            old_values = builtins.list(func(old)) if old is not None else []
            new_values = builtins.list(func(new)) if new is not None else []
            if old_values == new_values:
                continue  # the common case: an update that does not move the object
            index = self._indices[name]
            if not old_values:  # a new object (the other common case)
                for value in new_values:
                    bucket = index.get(value)
                    if bucket is None:  # (setdefault would build a set every time)
                        index[value] = bucket = set()
                    bucket.add(key)
                continue
            for value in set(old_values).difference(new_values):
                bucket = index.get(value)
                if bucket is not None:
                    bucket.discard(key)
                    if not bucket:
                        del index[value]
            for value in set(new_values).difference(old_values):
                index.setdefault(value, set()).add(key)

    # ---------------------------------------------------------------- reads

    def get(self, key: ObjectKey) -> Obj | None:
        return self._items.get(key)

    def list(self, namespace: str | None = None) -> _Objs:
        """Every object, or those of one namespace ("" = cluster-scoped ones)."""
        if namespace is None:
            return builtins.list(self._items.values())
        return self.by_index(NAMESPACE_INDEX, namespace)

    def by_index(self, index: str, value: str) -> _Objs:
        items = self._items
        return [items[k] for k in self.index_keys(index, value)]

    def index_keys(self, index: str, value: str) -> _Keys:
        try:
            bucket = self._indices[index].get(value, ())
        except KeyError:
            raise KeyError(f"no index named {index!r}") from None
        return sorted(bucket)

    def index_values(self, index: str) -> builtins.list[str]:
        """The values present in an index."""
        return builtins.list(self._indices[index])

    def keys(self) -> _Keys:
        return builtins.list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[ObjectKey]:
        return iter(builtins.list(self._items))

    def view(self, namespace: str | None = None) -> View:
        """A read-only `Reader` over this store, optionally limited to one namespace."""
        return View(self, namespace)

    # ---------------------------------------------------------------- writes

    def upsert(self, obj: Obj) -> Obj | None:
        """Insert or replace one object; returns the previous version (or None)."""
        key = ObjectKey.of(obj)
        old = self._items.get(key)
        self._items[key] = obj
        self._index(key, old, obj)
        return old

    def delete(self, key: ObjectKey) -> Obj | None:
        """Remove one object; returns it (or None if it was not there)."""
        old = self._items.pop(key, None)
        if old is not None:
            self._index(key, old, None)
        return old

    def replace(self, objs: Iterable[Obj]) -> Replaced:
        """Install exactly `objs` as the new content. Objects whose resourceVersion did not
        change are kept and reported only in `unchanged`."""
        fresh: dict[ObjectKey, Obj] = {}
        for obj in objs:
            fresh[ObjectKey.of(obj)] = obj
        added: _Objs = []
        updated: builtins.list[tuple[Obj, Obj]] = []
        deleted: builtins.list[Tombstone] = []
        unchanged = 0
        for key, gone in builtins.list(self._items.items()):
            if key not in fresh:
                self.delete(key)
                deleted.append(Tombstone(key, gone))
        for key, obj in fresh.items():
            old = self._items.get(key)
            if old is None:
                self.upsert(obj)
                added.append(obj)
            elif _rv(old) != _rv(obj) or not _rv(obj):
                self.upsert(obj)
                updated.append((old, obj))
            else:
                unchanged += 1
        return Replaced(added, updated, deleted, unchanged)


class View:
    """A read-only `Reader` over a `Store`, optionally limited to one namespace."""

    def __init__(self, store: Store, namespace: str | None = None) -> None:
        self._store = store
        self._namespace = namespace

    def _visible(self, obj: Obj | None) -> bool:
        if obj is None or self._namespace is None:
            return obj is not None
        return ((obj.get("metadata") or {}).get("namespace") or "") == self._namespace

    def get(self, key: ObjectKey) -> Obj | None:
        obj = self._store.get(key)
        return obj if self._visible(obj) else None

    def list(self, namespace: str | None = None) -> _Objs:
        if self._namespace is not None:
            if namespace not in (None, self._namespace):
                return []
            namespace = self._namespace
        return self._store.list(namespace)

    def by_index(self, index: str, value: str) -> _Objs:
        return [o for o in self._store.by_index(index, value) if self._visible(o)]

    def keys(self) -> _Keys:
        if self._namespace is None:
            return self._store.keys()
        return self._store.index_keys(NAMESPACE_INDEX, self._namespace)


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class WriteOverlay(Generic[K, V]):
    """What this process last wrote, standing in for the store's older copy (module doc)."""

    def __init__(self, *, limit: int | None = None) -> None:
        self._limit = limit
        self._entries: OrderedDict[K, tuple[str, V]] = OrderedDict()

    def wrote(self, key: K, *, replaced: str, value: V) -> None:
        """Remember `value` (what the write returned, or what to read instead) for `key`,
        written over resourceVersion `replaced` ("" for a create)."""
        self._entries[key] = (replaced, value)
        self._entries.move_to_end(key)
        while self._limit is not None and len(self._entries) > self._limit:
            self._entries.popitem(last=False)

    def get(self, key: K, *, stored_version: str) -> V | None:
        """The remembered value while the store's copy is still at the replaced version
        (`stored_version`, "" when the store has none); else None, and the entry is dropped."""
        found = self._entries.get(key)
        if found is None:
            return None
        replaced, value = found
        if stored_version == replaced:
            return value
        del self._entries[key]
        return None

    def forget(self, key: K) -> None:
        self._entries.pop(key, None)

    def keys(self) -> KeysView[K]:
        return self._entries.keys()
