"""InformerFactory: one informer (one LIST, one WATCH) per watch target and transform,
registered on the Manager once; indexers merged, conflicting ones refused; no new indexes
once started, no new informers once the Manager runs; separate informers per transform."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest

from localcache.runtime import clock, factory, informer, keys, kube, manager, store
from tests.unit.runtime.fake_source import settle

Obj = dict[str, Any]
CMS = kube.CONFIG_MAPS
NODES = kube.NODES
Target = tuple[str, str | None, str | None, str | None]


def cm(name: str, rv: str, **labels: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "resourceVersion": rv,
            "labels": labels,
            "managedFields": [{"manager": "kubectl"}],
        },
        "data": {"k": "v"},
    }


class FakeClient:
    """A `listwatch.ListWatchClient` without network: every LIST answers `objects` of the
    resource, every WATCH streams what `push()` sends; calls are counted per target."""

    def __init__(self, objects: dict[str, list[Obj]] | None = None) -> None:
        self.objects = objects or {}
        self.lists: collections.Counter[Target] = collections.Counter()
        self.watches: collections.Counter[Target] = collections.Counter()
        self._streams: dict[str, list[asyncio.Queue[Obj]]] = collections.defaultdict(list)

    async def list(
        self,
        res: kube.Resource,
        *,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
        resource_version: str | None,
        limit: int | None,
        continue_token: str | None,
        request_timeout: float | None,
    ) -> kube.ObjList:
        del resource_version, limit, continue_token, request_timeout
        self.lists[(str(res), namespace, label_selector, field_selector)] += 1
        return kube.ObjList(items=list(self.objects.get(str(res), [])), resource_version="10")

    def watch(
        self,
        res: kube.Resource,
        *,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
        resource_version: str | None,
        allow_bookmarks: bool,
        timeout_seconds: int | None,
        read_deadline: float,
    ) -> AbstractAsyncContextManager[AsyncIterator[Obj]]:
        del resource_version, allow_bookmarks, timeout_seconds, read_deadline
        self.watches[(str(res), namespace, label_selector, field_selector)] += 1
        queue: asyncio.Queue[Obj] = asyncio.Queue()
        self._streams[str(res)].append(queue)

        async def events() -> AsyncIterator[Obj]:
            while True:
                yield await queue.get()

        @asynccontextmanager
        async def stream() -> AsyncIterator[AsyncIterator[Obj]]:
            yield events()

        return stream()

    def push(self, res: kube.Resource, kind: str, obj: Obj) -> None:
        for queue in self._streams[str(res)]:
            queue.put_nowait({"type": kind, "object": obj})


@pytest.fixture
def mgr() -> manager.Manager:
    return manager.Manager(handle_signals=False, shutdown_timeout=2.0)


@pytest.fixture
def client() -> FakeClient:
    return FakeClient({str(CMS): [cm("a", "1", app="x")]})


@pytest.fixture
def shared(client: FakeClient, mgr: manager.Manager) -> factory.InformerFactory:
    return factory.InformerFactory(client, mgr, clock=clock.FakeClock())


@asynccontextmanager
async def running(mgr: manager.Manager) -> AsyncIterator[asyncio.Task[int]]:
    task = asyncio.create_task(mgr.run(), name="manager-under-test")
    try:
        await asyncio.wait_for(mgr.started.wait(), timeout=5)
        yield task
    finally:
        mgr.stop()
        assert await asyncio.wait_for(task, timeout=5) == 0


def names(objs: list[Obj]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


# ------------------------------------------------------------------------ identity


async def test_equal_requests_share_one_informer_listed_and_watched_once(
    client: FakeClient, mgr: manager.Manager, shared: factory.InformerFactory
) -> None:
    first = shared.informer(CMS)
    second = shared.informer(CMS, namespace="", label_selector="", field_selector="")
    seen: dict[str, list[str]] = {"first": [], "second": []}
    first.add_handler(lambda ev: seen["first"].append(ev.obj["metadata"]["name"]))
    second.add_handler(lambda ev: seen["second"].append(ev.obj["metadata"]["name"]))

    assert first is second
    async with running(mgr):
        client.push(CMS, "ADDED", cm("b", "2"))
        await settle()

    assert client.lists == {(str(CMS), None, None, None): 1}
    assert client.watches == {(str(CMS), None, None, None): 1}
    assert seen == {"first": ["a", "b"], "second": ["a", "b"]}
    [stats] = shared.stats()
    assert stats.consumers == 2
    assert stats.informer.synced


async def test_namespace_and_selectors_make_separate_informers(
    client: FakeClient, mgr: manager.Manager, shared: factory.InformerFactory
) -> None:
    requests: list[tuple[str | None, str | None, str | None]] = [
        (None, None, None),
        ("ns", None, None),
        (None, "app=x", None),
        (None, None, "metadata.name=a"),
    ]

    def get(ns: str | None, labels: str | None, fields: str | None) -> informer.Informer:
        return shared.informer(CMS, namespace=ns, label_selector=labels, field_selector=fields)

    made = [get(*r) for r in requests]
    again = [get(*r) for r in requests]

    assert len({id(i) for i in made}) == 4
    assert all(a is b for a, b in zip(made, again, strict=True))
    async with running(mgr):
        pass
    assert sorted(client.lists.values()) == [1, 1, 1, 1]
    assert (str(CMS), "ns", None, None) in client.lists
    assert (str(CMS), None, "app=x", None) in client.lists
    assert (str(CMS), None, None, "metadata.name=a") in client.lists


async def test_an_informer_is_registered_on_the_manager_once(
    client: FakeClient, mgr: manager.Manager, shared: factory.InformerFactory
) -> None:
    inf = shared.informer(CMS)
    for _ in range(3):
        assert shared.informer(CMS) is inf
    assert shared.informers() == [inf]
    async with running(mgr):
        assert inf.synced.is_set()
    # A second registration would have started (and listed with) a second task or failed
    # the run with "already started".
    assert client.lists[(str(CMS), None, None, None)] == 1


# ------------------------------------------------------------------------ transforms


async def test_different_transforms_get_separate_informers_with_their_own_shapes(
    client: FakeClient, mgr: manager.Manager, shared: factory.InformerFactory
) -> None:
    full = shared.informer(CMS)
    meta = shared.informer(CMS, transform=informer.metadata_only)

    assert full is not meta
    assert shared.informer(CMS, transform=informer.metadata_only) is meta
    async with running(mgr):
        key = keys.ObjectKey("ns", "a")
        full_obj, meta_obj = full.store.get(key), meta.store.get(key)
    assert full_obj is not None
    assert meta_obj is not None
    assert full_obj["data"] == {"k": "v"}
    assert "data" not in meta_obj
    assert meta_obj["metadata"]["labels"] == {"app": "x"}
    assert "managedFields" not in meta_obj["metadata"]
    assert "managedFields" not in full_obj["metadata"]
    assert client.lists[(str(CMS), None, None, None)] == 2


def test_the_default_transform_is_compact(shared: factory.InformerFactory) -> None:
    assert shared.informer(CMS) is shared.informer(CMS, transform=informer.compact)
    assert shared.informer(CMS) is not shared.informer(CMS, transform=None)
    assert [s.transform for s in shared.stats()] == [
        "localcache.runtime.informer.compact",
        "none",
    ]


# ------------------------------------------------------------------------ indexers


async def test_indexers_of_several_consumers_are_merged_into_one_store(
    mgr: manager.Manager, shared: factory.InformerFactory
) -> None:
    by_app = store.label_index("app")
    first = shared.informer(CMS, indexers={"app": by_app})
    second = shared.informer(CMS, indexers={"name": lambda o: [o["metadata"]["name"]]})

    assert first is second
    async with running(mgr):
        assert names(first.store.by_index("app", "x")) == ["a"]
        assert names(second.store.by_index("name", "a")) == ["a"]
    assert shared.stats()[0].indexes == ("namespace", "app", "name")


def test_the_same_index_asked_twice_is_accepted(shared: factory.InformerFactory) -> None:
    def by_name(obj: Obj) -> list[str]:
        return [obj["metadata"]["name"]]

    shared.informer(CMS, indexers={"name": by_name})
    shared.informer(CMS, indexers={"name": by_name})
    # Two label indexes of one label are equal, although built by separate calls.
    shared.informer(CMS, indexers={"app": store.label_index("app")})
    shared.informer(CMS, indexers={"app": store.label_index("app")})

    assert shared.stats()[0].indexes == ("namespace", "name", "app")


def test_an_index_name_taken_by_another_function_raises_and_adds_nothing(
    shared: factory.InformerFactory,
) -> None:
    inf = shared.informer(CMS, indexers={"app": store.label_index("app")})

    with pytest.raises(factory.IndexConflict, match="'app'"):
        shared.informer(
            CMS, indexers={"extra": store.label_index("x"), "app": store.label_index("tier")}
        )
    with pytest.raises(factory.IndexConflict, match="'namespace'"):
        shared.informer(CMS, indexers={"namespace": store.label_index("ns")})
    assert inf.store.index_names == ["namespace", "app"]


async def test_an_index_cannot_be_added_once_the_informer_started(
    mgr: manager.Manager, shared: factory.InformerFactory
) -> None:
    by_app = store.label_index("app")
    inf = shared.informer(CMS, indexers={"app": by_app})
    async with running(mgr):
        assert shared.informer(CMS, indexers={"app": by_app}) is inf
        with pytest.raises(RuntimeError, match="has started"):
            shared.informer(CMS, indexers={"tier": store.label_index("tier")})
    assert inf.store.index_names == ["namespace", "app"]


# ------------------------------------------------------------------------ timing


async def test_a_new_informer_cannot_be_requested_once_the_manager_runs(
    mgr: manager.Manager, shared: factory.InformerFactory
) -> None:
    existing = shared.informer(CMS)
    async with running(mgr):
        assert shared.informer(CMS) is existing
        with pytest.raises(RuntimeError, match="after the manager started"):
            shared.informer(NODES)
    assert shared.informers() == [existing]


def test_informers_are_listed_in_creation_order_with_their_targets(
    shared: factory.InformerFactory,
) -> None:
    shared.informer(NODES)
    shared.informer(CMS, namespace="ns", field_selector="metadata.name=a")
    shared.informer(NODES)

    assert [str(s.target) for s in shared.stats()] == [
        "nodes",
        "configmaps in ns fields metadata.name=a",
    ]
    assert [s.consumers for s in shared.stats()] == [2, 1]


def test_label_indexes_compare_by_label() -> None:
    assert store.label_index("a") == store.label_index("a")
    assert store.label_index("a") != store.label_index("b")
    assert store.label_index("a")({"metadata": {"labels": {"a": "1"}}}) == ["1"]
    assert store.label_index("a")({"metadata": {}}) == []


def test_metadata_only_keeps_metadata_without_managed_fields() -> None:
    out = informer.metadata_only(cm("a", "1", app="x"))

    assert out == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "a",
            "namespace": "ns",
            "resourceVersion": "1",
            "labels": {"app": "x"},
        },
    }
