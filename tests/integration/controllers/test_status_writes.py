"""Guarded status writes on the real apiserver (`controllers.status.write_status(guarded=True)`).

The shared-volume controller computes a cache's status from its informer copies. Under load the
store can hold a version older than the API's (our own newer write not yet seen): an unguarded
write from that copy replaced `ImportSucceeded` with `ImportRunning`, and once the Job was
removed the cache was imported again (CI failure of test_shared_volume.py::
test_a_completed_import_whose_job_is_removed_stays_ready). A guarded write is refused instead.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from localcache.api import groupversion
from localcache.controllers import namespacecache, state, status
from localcache.runtime import errors, kube

Obj = dict[str, Any]
NS_CACHES = state.LOCAL_MODEL_NAMESPACE_CACHES


def _ready(reason: str, value: str) -> Obj:
    return {
        "conditions": [
            {
                "type": "Ready",
                "status": value,
                "reason": reason,
                "message": reason,
                "lastTransitionTime": "2026-12-06T00:00:00Z",
            }
        ]
    }


@pytest.fixture
async def cache(api: kube.Kube) -> AsyncIterator[Obj]:
    namespace = f"status-{uuid.uuid4().hex[:8]}"
    await api.create(
        kube.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    body = {
        "apiVersion": groupversion.LOCAL_MODEL_NAMESPACE_CACHE.api_version,
        "kind": groupversion.LOCAL_MODEL_NAMESPACE_CACHE.kind,
        "metadata": {"name": "model", "namespace": namespace},
        "spec": {"sourceModelUri": "s3://bucket/model", "modelSize": "1Mi", "pvcRef": "shared"},
    }
    yield await api.create(NS_CACHES, body, namespace=namespace)
    await api.delete(kube.NAMESPACES, namespace)


async def test_a_guarded_write_from_an_older_copy_is_refused(api: kube.Kube, cache: Obj) -> None:
    meta = cache["metadata"]
    sc = namespacecache.SCOPE
    await api.patch_status(
        NS_CACHES, meta["name"], {"status": _ready("ImportSucceeded", "True")},
        namespace=meta["namespace"],
    )  # fmt: skip
    # the store still holds `cache` (created, no status): a status computed from it must not
    # replace the newer one
    with pytest.raises(errors.Conflict):
        await status.write_status(
            api, sc, current=cache, desired=_ready("ImportRunning", "False"),
            written=status.WrittenStatus(), guarded=True,
        )  # fmt: skip
    now = await api.get(NS_CACHES, meta["name"], namespace=meta["namespace"])
    assert now["status"]["conditions"][0]["reason"] == "ImportSucceeded"


async def test_guarded_writes_follow_our_own_writes_while_the_store_lags(
    api: kube.Kube, cache: Obj
) -> None:
    meta, sc, written = cache["metadata"], namespacecache.SCOPE, status.WrittenStatus()
    for reason in ("ImportPending", "ImportRunning", "ImportSucceeded"):
        # the store never moves past `cache`: each write is based on the one before it
        assert await status.write_status(
            api, sc, current=cache, desired=_ready(reason, "False"), written=written, guarded=True
        )
    now = await api.get(NS_CACHES, meta["name"], namespace=meta["namespace"])
    assert now["status"]["conditions"][0]["reason"] == "ImportSucceeded"
    assert written.current(cache)["conditions"][0]["reason"] == "ImportSucceeded"
