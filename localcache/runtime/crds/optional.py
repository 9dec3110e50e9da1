"""Informers for kinds whose CustomResourceDefinition may come and go (discovery-driven).

KServe's InferenceService and ClusterStorageContainer CRDs are optional: the processes start
and serve without them, begin watching a kind when its CRD appears and stop when it goes.
An `OptionalInformer` watches the one CRD by name (`metadata.name=<plural>.<group>`, through
an ordinary informer that the factory shares and the Manager gates /readyz on: that LIST
always answers) and runs an inner `Informer` for the kind only while the CRD is served:
`Established=True` and the version we read listed as served (`crd_serves`).

Availability, as consumers see it (`availability`):

    ABSENT    the CRD is missing, not Established, or does not serve our version: there are
              no such objects; `reader()` is empty (consumers fall back as without the kind)
    SYNCING   the CRD serves, the inner informer's first LIST is not in yet: `reader()`
              raises `NotSynced` (a reconcile retries with backoff; never read "empty" as
              "none exist")
    SYNCED    `reader()` reads the inner informer's store

Contract:
- Each time the CRD starts serving, a *new* inner informer is built (an informer runs once)
  with the indexers and handlers registered so far; its first LIST reaches the handlers as
  `Added(initial=True)`, as for any informer. When the CRD stops serving, the inner informer
  is cancelled and awaited, and its store dropped (no `Deleted` events are sent for what it
  held: the apiserver deletes every object before it removes a CRD, so those usually came
  already). `on_change` callbacks run on entering SYNCED and on returning to ABSENT, so
  consumers can reconcile everything that depends on the kind.
- Readiness never waits for the inner informer (it is not registered with the Manager) and
  the Manager's leader-term replay does not cover it (consumers re-read the store when their
  own objects are replayed). `liveness_check()` follows whichever inner informer runs; it is
  not wired into /healthz (the Manager registers checks only for its own informers).
- Logs: `optional_kind_watch_started` / `optional_kind_synced` / `optional_kind_watch_stopped`
  with the resource and the reason.
- `run()` owns its child tasks in one TaskGroup: cancelling it stops the inner informer.

Errors: `NotSynced` (an `errors.LocalcacheError`, so a controller logs it without a
traceback and retries) is raised by readers while SYNCING.
"""

from __future__ import annotations

import asyncio
import builtins
import enum
from collections.abc import Callable, Mapping
from typing import Any, Final

import structlog

from localcache.runtime import clock as clock_mod
from localcache.runtime import errors, keys, listwatch
from localcache.runtime import informer as informer_mod
from localcache.runtime import kube as kube_mod
from localcache.runtime import store as store_mod

_log = structlog.get_logger(__name__)

Obj = dict[str, Any]
ChangeCallback = Callable[["Availability"], None]

CRDS: Final = kube_mod.CUSTOM_RESOURCE_DEFINITIONS


class NotSynced(errors.LocalcacheError):
    """A read of an optional kind whose CRD serves but whose informer has not synced yet."""


class Availability(enum.Enum):
    ABSENT = "absent"
    SYNCING = "syncing"
    SYNCED = "synced"


def crd_name(resource: kube_mod.Resource) -> str:
    """`metadata.name` of the CRD that defines `resource`: `<plural>.<group>`."""
    return f"{resource.plural}.{resource.group}"


def crd_field_selector(resource: kube_mod.Resource) -> str:
    return f"metadata.name={crd_name(resource)}"


def crd_serves(crd: Obj | None, version: str) -> bool:
    """Whether `crd` is Established and serves `version` (False for None)."""
    if crd is None:
        return False
    conditions = (crd.get("status") or {}).get("conditions") or []
    established = any(
        c.get("type") == "Established" and c.get("status") == "True" for c in conditions
    )
    versions = (crd.get("spec") or {}).get("versions") or []
    served = any(v.get("name") == version and v.get("served", False) for v in versions)
    return established and served


def crd_summary(crd: Obj) -> Obj:
    """The CRD informer's transform: what `crd_serves` reads (CRDs carry large schemas)."""
    spec = crd.get("spec") or {}
    return informer_mod.compact(
        {
            "apiVersion": crd.get("apiVersion"),
            "kind": crd.get("kind"),
            "metadata": crd.get("metadata") or {},
            "spec": {
                "group": spec.get("group"),
                "versions": [
                    {"name": v.get("name"), "served": v.get("served", False)}
                    for v in spec.get("versions") or []
                ],
            },
            "status": {"conditions": (crd.get("status") or {}).get("conditions") or []},
        }
    )


class OptionalReader:
    """A `store.Reader` that follows the optional informer: empty while ABSENT, `NotSynced`
    while SYNCING, the inner store while SYNCED."""

    def __init__(self, owner: OptionalInformer, namespace: str | None = None) -> None:
        self._owner = owner
        self._namespace = namespace

    def _view(self) -> store_mod.Reader | None:
        state = self._owner.availability
        if state is Availability.SYNCING:
            raise NotSynced(f"{self._owner.name} is being listed after its CRD appeared")
        if state is Availability.ABSENT:
            return None
        return self._owner.store.view(self._namespace)

    def get(self, key: keys.ObjectKey) -> Obj | None:
        view = self._view()
        return view.get(key) if view is not None else None

    def list(self, namespace: str | None = None) -> list[Obj]:
        view = self._view()
        return view.list(namespace) if view is not None else []

    def by_index(self, index: str, value: str) -> builtins.list[Obj]:
        view = self._view()
        return view.by_index(index, value) if view is not None else []

    def keys(self) -> builtins.list[keys.ObjectKey]:
        view = self._view()
        return view.keys() if view is not None else []


class OptionalInformer:
    """An informer for `resource` that runs only while its CRD serves (module docstring)."""

    def __init__(
        self,
        client: listwatch.ListWatchClient,
        resource: kube_mod.Resource,
        *,
        crds: informer_mod.Informer,
        clock: clock_mod.Clock | None = None,
        transform: informer_mod.Transform | None = informer_mod.compact,
    ) -> None:
        """`crds` is an informer on CustomResourceDefinitions that holds this resource's
        CRD (e.g. filtered with `crd_field_selector(resource)`), run by someone else."""
        self._client = client
        self.resource = resource
        self._crds = crds
        self._clock = clock or clock_mod.SystemClock()
        self._transform = transform
        self._indexers: dict[str, store_mod.IndexFunc] = {}
        self._handlers: list[informer_mod.Handler] = []
        self._callbacks: list[ChangeCallback] = []
        self._current: informer_mod.Informer | None = None
        self._empty = store_mod.Store()
        self._wake = asyncio.Event()
        self._started = False
        self.availability = Availability.ABSENT
        crds.add_handler(lambda _event: self._wake.set())

    @property
    def name(self) -> str:
        return str(self.resource)

    @property
    def started(self) -> bool:
        return self._started

    @property
    def store(self) -> store_mod.Store:
        """The running inner informer's store, else an empty one with the same indexes."""
        return self._current.store if self._current is not None else self._empty

    @property
    def indexers(self) -> Mapping[str, store_mod.IndexFunc]:
        return dict(self._indexers)

    @property
    def current(self) -> informer_mod.Informer | None:
        """The inner informer while the CRD serves (for stats and tests)."""
        return self._current

    def settled(self) -> bool:
        """True unless SYNCING: reads answer for what the cluster holds."""
        return self.availability is not Availability.SYNCING

    def reader(self, namespace: str | None = None) -> OptionalReader:
        return OptionalReader(self, namespace)

    def add_indexers(self, indexers: Mapping[str, store_mod.IndexFunc]) -> None:
        """Indexes for every inner informer built from now on (and the one running)."""
        self._indexers.update(indexers)
        self._empty.add_indexers(indexers)
        if self._current is not None:
            self._current.add_indexers(indexers)

    def add_handler(self, handler: informer_mod.Handler) -> None:
        """Register a handler on the running inner informer and every later one."""
        self._handlers.append(handler)
        if self._current is not None:
            self._current.add_handler(handler)

    def on_change(self, callback: ChangeCallback) -> None:
        """Call `callback(availability)` on entering SYNCED and on returning to ABSENT."""
        self._callbacks.append(callback)

    def liveness_check(self) -> Callable[[], str | None]:
        def check() -> str | None:
            current = self._current
            return current.liveness_check()() if current is not None else None

        return check

    def wanted(self) -> bool:
        """Whether the CRD currently serves the version we read."""
        crd = self._crds.reader().get(keys.ObjectKey("", crd_name(self.resource)))
        return crd_serves(crd, self.resource.version)

    async def run(self) -> None:
        """Follow the CRD until cancelled (once)."""
        if self._started:
            raise RuntimeError(f"optional informer {self.name} was already started")
        self._started = True
        tasks: list[asyncio.Task[None]] = []
        await self._crds.synced.wait()
        try:
            async with asyncio.TaskGroup() as tg:
                while True:
                    self._wake.clear()
                    want = self.wanted()  # the CRD informer has synced (above)
                    if want and not tasks:
                        tasks = self._start(tg)
                    elif not want and tasks:
                        await self._stop(tasks, reason="crd_not_served")
                        tasks = []
                    await self._wake.wait()
        finally:
            if tasks:
                _log.info("optional_kind_watch_stopped", resource=self.name, reason="shutdown")
            self._current = None
            self.availability = Availability.ABSENT

    def _start(self, tg: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        source = listwatch.ListWatch(self._client, self.resource)
        inf = informer_mod.Informer(
            source, clock=self._clock, indexers=self._indexers, transform=self._transform
        )
        for handler in self._handlers:
            inf.add_handler(handler)
        self._current = inf
        self.availability = Availability.SYNCING
        _log.info("optional_kind_watch_started", resource=self.name, reason="crd_served")
        return [
            tg.create_task(inf.run(), name=f"optional informer {self.name}"),
            tg.create_task(self._announce(inf), name=f"optional informer {self.name} sync"),
        ]

    async def _announce(self, inf: informer_mod.Informer) -> None:
        await inf.synced.wait()
        if self._current is inf:
            self.availability = Availability.SYNCED
            _log.info("optional_kind_synced", resource=self.name, objects=len(inf.store))
            self._notify()

    async def _stop(self, tasks: list[asyncio.Task[None]], *, reason: str) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._current = None
        self.availability = Availability.ABSENT
        _log.info("optional_kind_watch_stopped", resource=self.name, reason=reason)
        self._notify()

    def _notify(self) -> None:
        for callback in self._callbacks:
            try:
                callback(self.availability)
            except Exception:
                _log.exception("optional_kind_callback_failed", resource=self.name)
