"""Failures reach the cache (issue 14): a node's failed download, and a derived object the
apiserver refuses, show in the cache's `Degraded` condition, `copies.failed` and Events on the
real control plane, and `Recovered` comes only after a success."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from localcache.controllers import state as controller_state
from localcache.devenv.waiting import wait_until
from localcache.runtime import kube
from tests.integration.controllers.conftest import Env

pytestmark = pytest.mark.kcm

Obj = dict[str, Any]
RESOURCE_QUOTAS = kube.Resource("", "v1", "resourcequotas", "ResourceQuota")
FAILURE = "download Job lmd-x-0 failed: no such bucket"


async def _one_node(env: Env) -> tuple[str, str]:
    group = env.name("gpu1")
    await env.group(group, group)
    node = await env.node(env.name("node-1"), group)
    return group, node


async def _report(env: Env, node: str, key: str, state: str, **progress: Any) -> None:
    """Play the agent: the entry's `modelStatus` and `modelProgress`, as the agent writes them."""
    await env.api.patch_status(
        controller_state.LOCAL_MODEL_NODES,
        node,
        {"status": {"modelStatus": {key: state}, "modelProgress": {key: progress}}},
    )


async def _events(env: Env, cache: Obj) -> list[Obj]:
    """Events recorded on `cache` (by uid), oldest first."""
    meta = cache["metadata"]
    found = await env.api.list(kube.EVENTS, namespace=meta.get("namespace") or "default")
    mine = [e for e in found.items if (e.get("involvedObject") or {}).get("uid") == meta["uid"]]
    return sorted(mine, key=lambda e: str(e.get("firstTimestamp") or ""))


def _reasons(events: list[Obj]) -> list[tuple[str, str]]:
    return [(str(e.get("type")), str(e.get("reason"))) for e in events]


def _degraded(found: Obj) -> Obj:
    return {c["type"]: c for c in found.get("conditions") or []}.get("Degraded") or {}


async def test_a_failed_download_degrades_the_cache_until_a_retry_succeeds(env: Env) -> None:
    """(a) An entry in ModelDownloadError makes the cache Degraded=True naming the node, with
    FAILED 1 and a Warning Event; while the retry runs (the agent turns the entry back to
    Pending/Downloading) it stays so, with no Recovered; Recovered comes with ModelDownloaded."""
    group, node = await _one_node(env)
    await env.start()
    name = env.name("model")
    cache = await env.cache(name, [group])
    await wait_until(functools.partial(env.entries, node), what=f"{node} lists {name}")

    await _report(env, node, name, "ModelDownloadError", attempts=1, message=FAILURE)
    found = await env.wait_status(
        name,
        copies={"available": 0, "total": 1, "failed": 1},
        nodeStatus={node: "NodeDownloadError"},
        what="the cache counts the failed download",
    )
    degraded = _degraded(found)
    assert (degraded["status"], degraded["reason"]) == ("True", "DownloadFailed")
    assert node in degraded["message"]
    assert FAILURE in degraded["message"]

    async def warned() -> list[Obj]:
        events = await _events(env, cache)
        return events if ("Warning", "Degraded") in _reasons(events) else []

    events = await wait_until(warned, what=f"a Warning Degraded Event on {name}")
    assert ("Warning", "DownloadFailed") in _reasons(events)
    assert any(node in str(e.get("message")) for e in events if e.get("reason") == "Degraded")

    # the agent starts attempt 2: the entry is pending again, carrying the failure message
    await _report(env, node, name, "ModelDownloadPending", attempts=2, message=FAILURE)

    async def retrying() -> Obj:
        found = await env.cache_status(name)
        return found if "retry running on" in _degraded(found).get("message", "") else {}

    found = await wait_until(retrying, what="the Degraded message says the retry runs")
    assert _degraded(found)["status"] == "True"
    assert found["copies"]["failed"] == 1
    assert found["nodeStatus"] == {node: "NodeDownloadError"}
    assert "Recovered" not in [r for _, r in _reasons(await _events(env, cache))]

    await _report(env, node, name, "ModelDownloaded", attempts=2, percent=100)
    found = await env.wait_status(
        name,
        copies={"available": 1, "total": 1, "failed": 0},
        what="the cache counts the downloaded copy",
    )
    assert _degraded(found)["status"] == "False"

    async def recovered() -> bool:
        return ("Normal", "Recovered") in _reasons(await _events(env, cache))

    await wait_until(recovered, what=f"a Normal Recovered Event on {name}")
    reasons = [r for _, r in _reasons(await _events(env, cache))]
    assert reasons.count("Degraded") == 1, reasons
    assert reasons.count("Recovered") == 1, reasons


async def test_a_derived_object_the_apiserver_refuses_reaches_status_and_events(
    env: Env,
) -> None:
    """(b) A ResourceQuota that allows no PVC in a namespace cache's namespace makes the
    apiserver refuse its download PVC (403): the cache is Degraded=True with reason
    VolumeRefused and the apiserver's message, with one Warning Event, however often the
    controller retries; lifting the quota lets the retry create it, and the cache recovers."""
    group, _ = await _one_node(env)
    tenant = await env.namespace_("tenant")
    quota = "no-claims"
    await env.api.create(
        RESOURCE_QUOTAS,
        {
            "metadata": {"name": quota, "namespace": tenant},
            "spec": {"hard": {"persistentvolumeclaims": "0"}},
        },
        namespace=tenant,
    )
    # play the resource-quota controller (the test's kube-controller-manager does not run
    # it): with its usage recorded, quota admission refuses the first PVC as exceeding it
    usage = {"persistentvolumeclaims": "0"}
    await env.api.patch_status(
        RESOURCE_QUOTAS,
        quota,
        {"status": {"hard": usage, "used": usage}},
        namespace=tenant,
    )
    await env.start()
    name = env.name("model")
    cache = await env.cache(name, [group], namespace=tenant)

    async def refused() -> Obj:
        found = await env.cache_status(name, tenant)
        return found if _degraded(found).get("reason") == "VolumeRefused" else {}

    found = await wait_until(refused, what="Degraded says the apiserver refused a volume")
    degraded = _degraded(found)
    assert degraded["status"] == "True"
    assert "cannot create PersistentVolumeClaim" in degraded["message"]
    assert "403 Forbidden" in degraded["message"]
    assert "exceeded quota" in degraded["message"]

    async def warned() -> list[Obj]:
        events = await _events(env, cache)
        return events if ("Warning", "VolumeRefused") in _reasons(events) else []

    events = await wait_until(warned, what=f"a Warning VolumeRefused Event on {name}")
    refusal = next(e for e in events if e["reason"] == "VolumeRefused")
    assert "exceeded quota" in refusal["message"]

    await env.api.delete(RESOURCE_QUOTAS, quota, namespace=tenant)

    async def recovered() -> Obj:
        found = await env.cache_status(name, tenant)
        return found if _degraded(found).get("status") == "False" else {}

    await wait_until(recovered, timeout=60, what="the cache recovers once the PVC is created")
    events = await wait_until(
        functools.partial(_events_with, env, cache, "Recovered"),
        what=f"a Normal Recovered Event on {name}",
    )
    reasons = [r for _, r in _reasons(events)]
    # the refused create was retried (with backoff) until the quota went: one Event each
    assert reasons.count("VolumeRefused") == 1, reasons
    assert reasons.count("Degraded") == 1, reasons


async def _events_with(env: Env, cache: Obj, reason: str) -> list[Obj]:
    events = await _events(env, cache)
    return events if reason in [r for _, r in _reasons(events)] else []
