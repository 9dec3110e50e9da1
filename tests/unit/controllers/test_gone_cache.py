"""A cache deleted while its key waits in the queue is done, not an error to retry: the
informer store may still hold it after the apiserver removed it, so writes to it answer 404."""

from __future__ import annotations

from typing import Any, cast

import pytest

from localcache.caching import config as config_mod
from localcache.controllers import clustercache, namespacecache, reconciler, scope, state, status
from localcache.runtime import errors, kube, store
from localcache.runtime.keys import ObjectKey

Obj = dict[str, Any]


class GoneApi:
    """Every write answers 404, as for an object the apiserver already deleted."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    async def patch(self, res: kube.Resource, name: str, patch: Any, **_: Any) -> Obj:
        self.writes.append(f"patch {res.plural}/{name}")
        raise errors.NotFound(404, f"{res.plural} {name!r} not found", reason="NotFound")

    async def patch_status(self, res: kube.Resource, name: str, patch: Any, **_: Any) -> Obj:
        self.writes.append(f"patch_status {res.plural}/{name}")
        raise errors.NotFound(404, f"{res.plural} {name!r} not found", reason="NotFound")


def _cache(sc: scope.Scope, namespace: str) -> Obj:
    meta: Obj = {"name": "iris", "uid": "u1", "resourceVersion": "7", "generation": 1}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": sc.kind.kind,
        "metadata": meta,
        "spec": {"sourceModelUri": "gs://models/iris", "modelSize": "1Gi", "nodeGroups": ["g"]},
    }


def _stores(sc: scope.Scope, obj: Obj) -> state.Stores:
    empty = store.Store().view()
    caches = store.Store()
    caches.upsert(obj)
    return state.Stores(
        caches=caches.view() if not sc.namespaced else empty,
        namespace_caches=caches.view() if sc.namespaced else empty,
        nodes=empty,
        local_model_nodes=empty,
        node_groups=empty,
        persistent_volumes=empty,
        persistent_volume_claims=empty,
        inference_services=None,
    )


class _Reader:
    def __init__(self, stores: state.Stores) -> None:
        self.stores = stores

    def snapshot(self) -> Any:
        raise AssertionError("a gone cache must not be reconciled further")


@pytest.mark.parametrize(
    ("sc", "namespace"), [(clustercache.SCOPE, ""), (namespacecache.SCOPE, "team-a")]
)
async def test_gone_cache_without_finalizer_ends_the_reconcile(
    sc: scope.Scope, namespace: str
) -> None:
    api = GoneApi()
    obj = _cache(sc, namespace)
    rec = reconciler.CacheReconciler(
        sc,
        api=cast(state.Api, api),
        reader=cast(state.StateReader, _Reader(_stores(sc, obj))),
        config=lambda: config_mod.parse_config({}),
        recorder=cast(status.EventRecorder, None),
        writer=cast(Any, None),
    )
    result = await rec.reconcile(ObjectKey(namespace, "iris"))
    assert result.requeue_after is None
    assert api.writes == [f"patch {sc.kind.plural}/iris"]


async def test_status_write_to_a_gone_cache_is_not_an_error() -> None:
    api = GoneApi()
    current = _cache(clustercache.SCOPE, "")
    written = await status.write_status(
        cast(state.Api, api),
        clustercache.SCOPE,
        current=current,
        desired={"copies": {"available": 0, "total": 1}},
    )
    assert written is False
    assert api.writes == ["patch_status localmodelcaches/iris"]
