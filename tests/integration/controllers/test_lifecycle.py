"""Lifecycle edges on the real control plane: serving volumes recreated fresh after a
namespace empties [P3], deletion with the node group already gone [P5], many caches on the
same nodes at once [P10], and the idle cost of a forced resync."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from localcache.api import groupversion
from localcache.caching import names
from localcache.controllers import state
from localcache.devenv.waiting import wait_until
from localcache.runtime import kube
from tests.integration.controllers.conftest import (
    Controllers,
    Env,
    apiserver_writes,
    gone,
    grown,
    lists_exactly,
    phase_is,
)

pytestmark = pytest.mark.kcm

KINDS = ["cluster", "namespace"]
WRITES = ("create", "update", "patch", "delete")
OUR_RESOURCES = {
    state.LOCAL_MODEL_CACHES.plural,
    state.LOCAL_MODEL_NAMESPACE_CACHES.plural,
    state.LOCAL_MODEL_NODES.plural,
    state.LOCAL_MODEL_NODE_GROUPS.plural,
}


@pytest.mark.parametrize("kind", KINDS)
async def test_namespace_that_empties_then_gains_an_isvc_gets_a_fresh_bound_volume(
    env: Env, kind: str
) -> None:
    group = env.name("gpu")
    await env.group(group, group)
    await env.node(env.name("node"), group)
    isvc_ns = await env.namespace_("isvcs")
    await env.start()
    name = env.name("model")
    cache_ns = isvc_ns if kind == "namespace" else None
    await env.cache(name, [group], namespace=cache_ns)
    pv_name, pvc_name = names.serving_pv(name, group, isvc_ns), names.serving_pvc(name, group)
    bound = phase_is(env, kube.PERSISTENT_VOLUME_CLAIMS, pvc_name, isvc_ns, "Bound")

    await env.isvc("first", isvc_ns, cache=name, cache_namespace=cache_ns)
    await wait_until(bound, what=f"serving PVC {pvc_name} is bound")
    old_pv = await env.get(kube.PERSISTENT_VOLUMES, pv_name)
    assert old_pv is not None

    await env.api.delete(state.INFERENCE_SERVICES, "first", namespace=isvc_ns)
    await wait_until(gone(env, kube.PERSISTENT_VOLUMES, pv_name), what=f"PV {pv_name} goes")
    assert await env.get(kube.PERSISTENT_VOLUME_CLAIMS, pvc_name, isvc_ns) is None

    await env.isvc("second", isvc_ns, cache=name, cache_namespace=cache_ns)
    await wait_until(bound, what=f"the new serving PVC {pvc_name} is bound")
    new_pv = await env.get(kube.PERSISTENT_VOLUMES, pv_name)
    assert new_pv is not None
    assert new_pv["metadata"]["uid"] != old_pv["metadata"]["uid"], "a fresh PV, not the old one"
    assert new_pv["status"]["phase"] == "Bound"


@pytest.mark.parametrize("kind", KINDS)
async def test_cache_whose_node_group_is_gone_reports_it_and_still_deletes(
    env: Env, kind: str
) -> None:
    group = env.name("gpu")
    await env.group(group, group)
    node = await env.node(env.name("node"), group)
    cache_ns = await env.namespace_("tenant") if kind == "namespace" else None
    await env.start()
    name = env.name("model")
    await env.cache(name, [group], namespace=cache_ns)
    key = (cache_ns or "", name)
    await wait_until(lists_exactly(env, node, {key}), what=f"{node} lists {name}")

    await env.api.delete(state.LOCAL_MODEL_NODE_GROUPS, group)

    async def reports_missing_group() -> bool:
        status = await env.cache_status(name, cache_ns)
        found = {c["type"]: c for c in status.get("conditions") or []}
        ready = found.get("Ready") or {}
        return ready.get("reason") == "NodeGroupNotFound" and group in ready.get("message", "")

    await wait_until(reports_missing_group, what=f"{name} reports node group {group} missing")
    res = state.LOCAL_MODEL_NAMESPACE_CACHES if cache_ns else state.LOCAL_MODEL_CACHES
    await env.api.delete(res, name, namespace=cache_ns)
    await wait_until(gone(env, res, name, cache_ns), what=f"{name} is deleted, finalizer gone")
    assert key not in await env.entries(node)


async def test_twenty_caches_created_at_once_all_land_on_every_node(env: Env) -> None:
    group = env.name("gpu")
    await env.group(group, group, limit="100Gi")
    nodes = [await env.node(env.name(f"node-{i}"), group) for i in range(5)]
    tenants = [await env.namespace_(f"tenant-{i}") for i in range(2)]
    await env.start()
    uris = itertools.cycle(["s3://bucket/shared", "s3://bucket/other", "s3://bucket/third"])
    wanted: list[tuple[str | None, str]] = [(None, env.name(f"cluster-{i}")) for i in range(10)]
    wanted += [(tenants[i % 2], env.name(f"ns-{i}")) for i in range(10)]
    await asyncio.gather(
        *(env.cache(name, [group], namespace=ns, uri=next(uris)) for ns, name in wanted)
    )
    keys = {(ns or "", name) for ns, name in wanted}
    for node in nodes:
        await wait_until(
            lists_exactly(env, node, keys), timeout=60, what=f"{node} lists all 20 entries"
        )
    status_keys = {f"{ns}/{name}" if ns else name: "ModelDownloaded" for ns, name in wanted}
    for node in nodes:
        await env.set_model_status(node, status_keys)
    for ns, name in wanted:
        await env.wait_status(
            name,
            ns,
            copies={"available": 5, "total": 5, "failed": 0},
            within=60,
            what=f"cache {ns}/{name} sees its copy on all 5 nodes",
        )


def _idle(controllers: Controllers) -> bool:
    handle = controllers.handle
    return all(
        ctl.queue.stats().depth == 0 and ctl.stats().active_workers == 0
        for ctl in (handle.cluster, handle.namespaced, handle.node_groups)
    )


async def _nothing_terminating(env: Env) -> bool:
    paths = (
        "/api/v1/namespaces",
        f"/apis/{groupversion.GROUP}/{groupversion.VERSION}/localmodelcaches",
        f"/apis/{groupversion.GROUP}/{groupversion.VERSION}/localmodelnamespacecaches",
    )
    for path in paths:
        status, body = await asyncio.to_thread(env.plane.rest, "GET", path)
        assert status == 200, body
        if any(item["metadata"].get("deletionTimestamp") for item in body["items"]):
            return False
    return True


async def test_forced_resync_after_convergence_writes_nothing(env: Env) -> None:
    group = env.name("gpu")
    await env.group(group, group)
    nodes = [await env.node(env.name(f"node-{i}"), group) for i in range(2)]
    tenant = await env.namespace_("tenant")
    isvc_ns = await env.namespace_("isvcs")
    controllers = await env.start()
    caches = [
        (None, env.name("a")),
        (None, env.name("b")),
        (tenant, env.name("c")),
        (tenant, env.name("d")),
    ]
    for ns, name in caches:
        await env.cache(name, [group], namespace=ns)
    await env.isvc("uses-a", isvc_ns, cache=caches[0][1])
    await env.isvc("uses-c", tenant, cache=caches[2][1], cache_namespace=tenant)
    for node in nodes:
        await wait_until(
            lists_exactly(env, node, {(ns or "", n) for ns, n in caches}), what=f"{node} full"
        )
        await env.set_model_status(node, {caches[0][1]: "ModelDownloaded"})
    await env.wait_status(
        caches[0][1], copies={"available": 2, "total": 2, "failed": 0}, what="a is Ready"
    )
    for pvc, ns in (
        (names.serving_pvc(caches[0][1], group), isvc_ns),
        (names.serving_pvc(caches[2][1], group), tenant),
    ):
        await wait_until(
            phase_is(env, kube.PERSISTENT_VOLUME_CLAIMS, pvc, ns, "Bound"), what=f"{pvc} bound"
        )
    # The controllers reconcile cluster-wide: caches that earlier tests left in namespaces
    # still being deleted would be finalized during the measurement. Wait until none is left.
    await wait_until(
        lambda: _nothing_terminating(env),
        timeout=120,
        what="no namespace or cache of an earlier test is still terminating",
    )
    seen: list[int] = []

    def settled() -> bool:
        """Idle, and no write since the previous poll."""
        count = controllers.writes()
        quiet = bool(seen) and seen[-1] == count
        seen.append(count)
        return quiet and _idle(controllers)

    await wait_until(settled, interval=0.5, what="the controllers are idle")

    server_before = await asyncio.to_thread(apiserver_writes, env.plane, OUR_RESOURCES)
    client_before = {v: controllers.kube.requests[v] for v in WRITES}
    reconciles_before = sum(
        c.stats().reconciles for c in (controllers.handle.cluster, controllers.handle.namespaced)
    )
    enqueued = controllers.handle.resync()
    assert enqueued >= len(caches)

    def resynced() -> bool:
        done = sum(
            c.stats().reconciles
            for c in (controllers.handle.cluster, controllers.handle.namespaced)
        )
        return done - reconciles_before >= len(caches) and _idle(controllers)

    await wait_until(resynced, what="every cache was reconciled again")
    server_after = await asyncio.to_thread(apiserver_writes, env.plane, OUR_RESOURCES)
    sent = {v: controllers.kube.requests[v] - client_before.get(v, 0) for v in WRITES}
    assert sum(sent.values()) == 0, f"the controllers wrote during an idle resync: {sent}"
    assert grown(server_before, server_after) == {}, "writes to our kinds during an idle resync"
