"""The LocalModelNode writer against an in-memory API: compare-and-swap, conflicts, fresh
desired state at write time, and its own writes standing in for a lagging store."""

from __future__ import annotations

import asyncio
import builtins
import copy
from collections.abc import Iterable
from typing import Any, Literal

from localcache.api import modelcache, nodegroup
from localcache.caching import placement
from localcache.controllers import nodes
from localcache.runtime import errors, kube
from localcache.runtime.keys import ObjectKey

Obj = dict[str, Any]
GROUP = nodegroup.LocalModelNodeGroup.from_dict(
    {
        "metadata": {"name": "gpu"},
        "spec": {
            "storageLimit": "10Gi",
            "persistentVolumeSpec": {
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "t", "operator": "In", "values": ["gpu"]}
                                ]
                            }
                        ]
                    }
                }
            },
            "persistentVolumeClaimSpec": {},
        },
    }
)
NODE = {"metadata": {"name": "n1", "uid": "node-uid", "labels": {"t": "gpu"}}}


def _cache(name: str, namespace: str = "") -> placement.PlacedCache:
    spec = modelcache.LocalModelCacheSpec.model_validate(
        {"sourceModelUri": f"s3://b/{name}", "modelSize": "1Gi", "nodeGroups": ["gpu"]}
    )
    return placement.PlacedCache(name=name, namespace=namespace, spec=spec)


class FakeApi:
    """LocalModelNodes in memory with resourceVersion preconditions, counting calls."""

    def __init__(self) -> None:
        self.objects: dict[str, Obj] = {}
        self.calls: list[str] = []
        self._rv = 0

    def _bump(self, obj: Obj) -> Obj:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        return copy.deepcopy(obj)

    async def get(self, res: kube.Resource, name: str, *, namespace: str | None = None) -> Obj:
        self.calls.append("get")
        if name not in self.objects:
            raise errors.NotFound(404, "not found")
        return copy.deepcopy(self.objects[name])

    async def list(
        self,
        res: kube.Resource,
        *,
        namespace: str | None = None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> kube.ObjList:
        raise NotImplementedError

    async def create(self, res: kube.Resource, obj: Obj, *, namespace: str | None = None) -> Obj:
        self.calls.append("create")
        name = obj["metadata"]["name"]
        if name in self.objects:
            raise errors.Conflict(409, "exists", reason="AlreadyExists")
        self.objects[name] = copy.deepcopy(obj)
        return self._bump(self.objects[name])

    async def patch(
        self,
        res: kube.Resource,
        name: str,
        patch: kube.Patch,
        *,
        namespace: str | None = None,
        patch_type: kube.PatchType = "merge",
    ) -> Obj:
        self.calls.append("patch")
        assert isinstance(patch, dict)
        if name not in self.objects:
            raise errors.NotFound(404, "not found")
        obj = self.objects[name]
        want = patch["metadata"].get("resourceVersion")
        if want and want != obj["metadata"]["resourceVersion"]:
            raise errors.Conflict(409, "stale", reason="Conflict")
        if "ownerReferences" in patch["metadata"]:
            obj["metadata"]["ownerReferences"] = patch["metadata"]["ownerReferences"]
        if "spec" in patch:
            obj["spec"] = copy.deepcopy(patch["spec"])
        return self._bump(obj)

    async def patch_status(
        self,
        res: kube.Resource,
        name: str,
        patch: kube.Patch,
        *,
        namespace: str | None = None,
        patch_type: kube.PatchType = "merge",
    ) -> Obj:
        raise NotImplementedError

    async def delete(
        self,
        res: kube.Resource,
        name: str,
        *,
        namespace: str | None = None,
        propagation_policy: Literal["Foreground", "Background", "Orphan"] | None = None,
    ) -> Obj:
        raise NotImplementedError


class FakeStore:
    """A lagging informer store: holds whatever the test put there."""

    def __init__(self) -> None:
        self.objects: dict[ObjectKey, Obj] = {}

    def put(self, obj: Obj) -> None:
        self.objects[ObjectKey("", obj["metadata"]["name"])] = copy.deepcopy(obj)

    def get(self, key: ObjectKey) -> Obj | None:
        return self.objects.get(key)

    def list(self, namespace: str | None = None) -> list[Obj]:
        return list(self.objects.values())

    def by_index(self, index: str, value: str) -> builtins.list[Obj]:
        return []

    def keys(self) -> builtins.list[ObjectKey]:
        return builtins.list(self.objects)


class World:
    def __init__(self, caches: Iterable[placement.PlacedCache]) -> None:
        self.caches = list(caches)
        self.api = FakeApi()
        self.store = FakeStore()
        self.writer = nodes.LocalModelNodes(self.api, store=self.store, snapshot=self.snapshot)

    def snapshot(self) -> placement.Snapshot:
        return placement.Snapshot(nodes={"n1": NODE}, groups={"gpu": GROUP}, caches=self.caches)

    def names_on_server(self) -> set[str]:
        return {e["modelName"] for e in self.api.objects["n1"]["spec"]["localModels"]}


async def test_creates_an_owned_object_and_then_writes_nothing_more() -> None:
    world = World([_cache("a")])
    assert await world.writer.sync(["n1"], world.snapshot()) == 1
    created = world.api.objects["n1"]
    assert created["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "node-uid"}
    ]
    world.store.put(created)
    assert await world.writer.sync(["n1"], world.snapshot()) == 0
    assert world.api.calls == ["create"]


async def test_own_write_stands_in_for_a_lagging_store() -> None:
    world = World([_cache("a")])
    await world.writer.sync(["n1"], world.snapshot())
    world.caches.append(_cache("b"))
    assert await world.writer.sync(["n1"], world.snapshot()) == 1
    assert world.api.calls == ["create", "patch"], "no AlreadyExists, no conflict"
    assert world.names_on_server() == {"a", "b"}


async def test_stale_store_costs_one_conflict_then_writes_from_fresh_state() -> None:
    world = World([_cache("a")])
    await world.writer.sync(["n1"], world.snapshot())
    stale = copy.deepcopy(world.api.objects["n1"])
    world.store.put(stale)
    # Someone else (another process) writes meanwhile; our store has not seen it.
    world.api.objects["n1"]["metadata"]["resourceVersion"] = "99"
    world.caches.append(_cache("b"))
    assert await world.writer.sync(["n1"], world.snapshot()) == 1
    assert world.api.calls == ["create", "patch", "get", "patch"]
    assert world.names_on_server() == {"a", "b"}


async def test_desired_state_is_recomputed_at_write_time() -> None:
    """A reconcile whose snapshot predates cache `b` must not remove `b`'s entry that a
    later writer already put there."""
    world = World([_cache("a")])
    old_snapshot = world.snapshot()
    world.caches.append(_cache("b"))
    await world.writer.sync(["n1"], world.snapshot())
    world.store.put(world.api.objects["n1"])
    calls = len(world.api.calls)
    assert await world.writer.sync(["n1"], old_snapshot) == 0
    assert world.api.calls[calls:] == []
    assert world.names_on_server() == {"a", "b"}


async def test_already_existing_object_is_read_and_patched() -> None:
    world = World([_cache("a")])
    world.api.objects["n1"] = {
        "metadata": {"name": "n1", "resourceVersion": "5"},
        "spec": {"localModels": [{"sourceModelUri": "s3://b/x", "modelName": "x"}]},
    }
    assert await world.writer.sync(["n1"], world.snapshot()) == 1
    assert world.api.calls == ["create", "get", "patch"]
    assert world.names_on_server() == {"a"}
    assert world.api.objects["n1"]["metadata"]["ownerReferences"][0]["kind"] == "Node"


async def test_drop_entry_removes_only_that_entry() -> None:
    world = World([_cache("a"), _cache("b", "team")])
    await world.writer.sync(["n1"], world.snapshot())
    await world.writer.drop_entry(copy.deepcopy(world.api.objects["n1"]), ("team", "b"))
    assert world.names_on_server() == {"a"}


async def test_settled_waits_for_writes_already_started() -> None:
    world = World([_cache("a")])
    entered, gate = asyncio.Event(), asyncio.Event()
    create = world.api.create

    async def slow_create(res: kube.Resource, obj: Obj, *, namespace: str | None = None) -> Obj:
        entered.set()
        await gate.wait()
        return await create(res, obj, namespace=namespace)

    world.api.create = slow_create  # type: ignore[method-assign]
    writing = asyncio.create_task(world.writer.sync(["n1"], world.snapshot()), name="write")
    await entered.wait()
    settled = asyncio.create_task(world.writer.settled(), name="settled")
    await asyncio.sleep(0)  # one turn: `settled` runs up to its wait
    assert not settled.done()
    gate.set()
    await settled
    assert "n1" in world.api.objects
    assert await writing == 1
