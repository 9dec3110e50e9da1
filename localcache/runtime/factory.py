"""Shared informers: one LIST+WATCH and one cache per watched thing per process.

Components set up on one Manager (cache controllers, admission webhooks, node agents) read
many of the same resources. `InformerFactory` (client-go's SharedInformerFactory) hands every
consumer the same `Informer` for the same request, so the process opens one watch and keeps
one cache per (resource, namespace, label selector, field selector, transform).

Contract:
- Identity. `informer(...)` returns the same `Informer` for equal requests. Requests are
  equal when the `Resource`, the namespace and both selectors are equal (None and "" both
  mean "all namespaces" / "no selector") and the transforms compare equal: identity for
  functions, so consumers that want to share pass the same module-level function (not a
  lambda or a closure built per call); transforms must be hashable. The first request
  builds the informer and adds it to the Manager, once; the Manager runs it in its informer
  phase and gates /readyz on its sync.
- Transforms are not merged. Two transforms of one resource give two informers (two watches,
  two caches), never one richer informer for both. A transform is part of what a consumer's
  store promises: serving a metadata-only consumer full objects would hand its index
  functions, predicates and readers fields they were not written for (and defeat the memory
  bound it chose), and narrowing would drop fields the other consumer reads. Neither can be
  checked for arbitrary functions, so the factory does not guess: consumers that want to
  share agree on a transform (`informer.compact` for full objects, `informer.metadata_only`
  for metadata). A second transform of one watch target is logged
  (`informer_factory_second_transform`) so such duplicates show up.
- Indexers are merged by name. A name already present with an equal function (`==`; e.g.
  the same function object, or two `store.label_index` of one label) is accepted; a
  different function raises `IndexConflict` and adds none of the request's indexes. New
  indexes may be added only until the informer starts (the Manager's informer phase);
  afterwards a request that would add one raises `RuntimeError` (client-go refuses
  AddIndexers after start); asking again for indexes already there is fine.
- Timing. New informers can be requested only before the Manager runs (one created later
  would never be started): a request for an informer that does not exist yet then raises
  `RuntimeError`. Existing informers may be requested at any time.
- Who may mutate what. Objects in a store are shared by every consumer: nobody mutates
  them (copy first). Consumers may add handlers at any time (a late handler first gets the
  current content as adds) and read through `reader()`. They must not run the informer
  (the Manager does), add indexes behind the factory's back (conflicts would go unseen) or
  call its sink methods.
- Not promised: isolation between consumers. Handlers of all consumers run in registration
  order on the informer's one task, so a slow handler delays everyone's (a failing one is
  contained and counted); `synced` and `stats()` are the shared informer's.

Optional kinds (a CRD that may be missing, e.g. KServe's): `optional_informer(...)` hands out
one shared `optional.OptionalInformer` per (resource, transform) under the same identity and
index rules; it follows the CRD through a shared CRD informer filtered by name (gating
/readyz only on that LIST) and runs as a Manager runnable without the lease, so readiness
never waits for the optional kind. `stats()` includes its inner informer while it runs.

Every informer uses the factory's clock. One factory per Manager.
"""

from __future__ import annotations

import builtins
import collections
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import structlog

from localcache.runtime import clock as clock_mod
from localcache.runtime import informer as informer_mod
from localcache.runtime import kube, listwatch, reflector, store
from localcache.runtime import manager as manager_mod
from localcache.runtime.crds import optional

_log = structlog.get_logger(__name__)

NOT_STARTED: Final = "new"
"""`Manager.phase` before `run()`: the only phase in which informers can be created."""


class IndexConflict(ValueError):
    """An index was requested under a name another consumer uses for another function."""


@dataclass(frozen=True, slots=True)
class WatchTarget:
    """What one informer lists and watches."""

    resource: kube.Resource
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None

    def __str__(self) -> str:
        parts = [str(self.resource)]
        if self.namespace:
            parts.append(f"in {self.namespace}")
        if self.label_selector:
            parts.append(f"labels {self.label_selector}")
        if self.field_selector:
            parts.append(f"fields {self.field_selector}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class SharedInformerStats:
    """One shared informer: what it watches, how many requests it served, its indexes."""

    target: WatchTarget
    transform: str
    consumers: int
    """Requests answered with this informer (the first included)."""
    indexes: tuple[str, ...]
    informer: informer_mod.InformerStats


@dataclass
class _Entry:
    informer: informer_mod.Informer
    target: WatchTarget
    transform: informer_mod.Transform | None
    consumers: int = 1


def _new_indexers(
    present: Mapping[str, store.IndexFunc],
    requested: Mapping[str, store.IndexFunc],
    *,
    owner: str,
) -> dict[str, store.IndexFunc]:
    """The requested indexes not present yet; `IndexConflict` for a name present with another
    function (two consumers must agree on what an index means)."""
    new: dict[str, store.IndexFunc] = {}
    for name, func in requested.items():
        existing = present.get(name)
        if existing is None:
            new[name] = func
        elif existing != func:
            raise IndexConflict(
                f"index {name!r} of {owner} already exists with another function "
                f"({_describe(existing)}, requested {_describe(func)})"
            )
    return new


def _describe(func: object) -> str:
    """A function's (or callable object's) dotted name, for logs, errors and stats."""
    if func is None:
        return "none"
    name = getattr(func, "__qualname__", None) or repr(func)
    return f"{getattr(func, '__module__', '?')}.{name}"


class InformerFactory:
    """Hands out one shared `Informer` per watch target and transform (module docstring)."""

    def __init__(
        self,
        client: listwatch.ListWatchClient,
        manager: manager_mod.Manager,
        *,
        clock: clock_mod.Clock | None = None,
    ) -> None:
        self._client = client
        self._manager = manager
        self._clock = clock or clock_mod.SystemClock()
        self._entries: dict[tuple[WatchTarget, informer_mod.Transform | None], _Entry] = {}
        self._optional: dict[
            tuple[kube.Resource, informer_mod.Transform | None], optional.OptionalInformer
        ] = {}
        self._optional_consumers: collections.Counter[optional.OptionalInformer] = (
            collections.Counter()
        )

    def informer(
        self,
        resource: kube.Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: informer_mod.Transform | None = informer_mod.compact,
        indexers: Mapping[str, store.IndexFunc] | None = None,
        page_size: int | None = None,
    ) -> informer_mod.Informer:
        """The shared informer for this request, created and registered on first use, with
        `indexers` merged into its store; `page_size` (objects per list page) applies when
        it is created (smaller for kinds anyone may fill with large objects)."""
        target = WatchTarget(
            resource,
            namespace or None,
            label_selector or None,
            field_selector or None,
        )
        entry = self._entries.get((target, transform))
        if entry is None:
            entry = self._create(target, transform, page_size)
        else:
            entry.consumers += 1
        self._merge_indexers(entry, indexers or {})
        return entry.informer

    def optional_informer(
        self,
        resource: kube.Resource,
        *,
        transform: informer_mod.Transform | None = informer_mod.compact,
        indexers: Mapping[str, store.IndexFunc] | None = None,
    ) -> optional.OptionalInformer:
        """The shared informer for a kind whose CRD may come and go (module docstring),
        created and registered on first use, with `indexers` merged in."""
        opt = self._optional.get((resource, transform))
        if opt is None:
            if self._manager.phase != NOT_STARTED:
                raise RuntimeError(
                    f"optional informer for {resource} requested after the manager started"
                )
            crds = self.informer(
                optional.CRDS,
                field_selector=optional.crd_field_selector(resource),
                transform=optional.crd_summary,
            )
            opt = optional.OptionalInformer(
                self._client, resource, crds=crds, clock=self._clock, transform=transform
            )
            self._manager.add_runnable(f"optional {resource}", opt, needs_leader=False)
            self._optional[(resource, transform)] = opt
        self._optional_consumers[opt] += 1
        self._merge_optional_indexers(opt, indexers or {})
        return opt

    def _merge_optional_indexers(
        self, opt: optional.OptionalInformer, indexers: Mapping[str, store.IndexFunc]
    ) -> None:
        new = _new_indexers(opt.indexers, indexers, owner=f"optional {opt.name}")
        if new and opt.started:
            raise RuntimeError(f"cannot add indexes {sorted(new)} to optional {opt.name}")
        if new:
            opt.add_indexers(new)

    def informers(self) -> builtins.list[informer_mod.Informer]:
        """Every informer created, in creation order."""
        return [e.informer for e in self._entries.values()]

    def stats(self) -> builtins.list[SharedInformerStats]:
        """Every shared informer, then the inner informers of optional kinds that run."""
        found = [
            SharedInformerStats(
                target=e.target,
                transform=_describe(e.transform),
                consumers=e.consumers,
                indexes=tuple(e.informer.store.index_names),
                informer=e.informer.stats(),
            )
            for e in self._entries.values()
        ]
        for (resource, transform), opt in self._optional.items():
            if (inner := opt.current) is not None:
                found.append(
                    SharedInformerStats(
                        target=WatchTarget(resource),
                        transform=_describe(transform),
                        consumers=self._optional_consumers[opt],
                        indexes=tuple(inner.store.index_names),
                        informer=inner.stats(),
                    )
                )
        return found

    def _create(
        self,
        target: WatchTarget,
        transform: informer_mod.Transform | None,
        page_size: int | None = None,
    ) -> _Entry:
        if self._manager.phase != NOT_STARTED:
            raise RuntimeError(
                f"informer for {target} requested after the manager started "
                f"(phase {self._manager.phase}); it would never run"
            )
        others = [e for (t, _), e in self._entries.items() if t == target]
        if others:
            _log.info(
                "informer_factory_second_transform",
                target=str(target),
                transform=_describe(transform),
                existing=[_describe(e.transform) for e in others],
            )
        source = listwatch.ListWatch(
            self._client,
            target.resource,
            namespace=target.namespace,
            label_selector=target.label_selector,
            field_selector=target.field_selector,
        )
        inf = informer_mod.Informer(
            source,
            clock=self._clock,
            transform=transform,
            page_size=page_size or reflector.PAGE_SIZE,
        )
        self._manager.add_informer(inf)
        entry = _Entry(inf, target, transform)
        self._entries[(target, transform)] = entry
        return entry

    def _merge_indexers(self, entry: _Entry, indexers: Mapping[str, store.IndexFunc]) -> None:
        new = _new_indexers(entry.informer.store.indexers, indexers, owner=str(entry.target))
        if not new:
            return
        if entry.informer.started:
            raise RuntimeError(
                f"cannot add indexes {sorted(new)} to {entry.target}: its informer has started"
            )
        entry.informer.add_indexers(new)
