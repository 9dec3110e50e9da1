"""Informers against the real control plane: sync and events, an apiserver outage with deletes
made behind its back, a watch expired by etcd compaction, a silent connection, and 500 rapid
updates to one key. ConfigMaps stand in for any resource: the runtime knows no domain type."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime import clock, handlers, informer, kube, reflector
from tests.integration.runtime.conftest import (
    RecordingReconciler,
    Spawn,
    configmap,
    configmap_informer,
    etcd_compact,
    etcd_delete,
    etcd_revision,
    kubeconfig_for_server,
    make_controller,
)
from tests.integration.runtime.proxy import FreezableProxy

Obj = dict[str, Any]


def _versions(objs: list[Obj]) -> dict[str, str]:
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in objs}


def server_state(plane: ControlPlane, namespace: str) -> dict[str, str]:
    """name -> resourceVersion as a fresh quorum list says (through the harness)."""
    status, body = plane.rest("GET", f"/api/v1/namespaces/{namespace}/configmaps")
    assert status == 200, body
    return _versions(body["items"])


def rest_create(plane: ControlPlane, namespace: str, name: str, **data: str) -> None:
    status, body = plane.rest(
        "POST", f"/api/v1/namespaces/{namespace}/configmaps", configmap(namespace, name, **data)
    )
    assert status == 201, body


async def store_matches_server(inf: informer.Informer, plane: ControlPlane, ns: str) -> bool:
    server = await asyncio.to_thread(server_state, plane, ns)
    return _versions(inf.store.list()) == server


def quick_backoff() -> dict[str, Any]:
    """Reflector options for outage tests: the same policy with a 4 s cap, so recovery after
    a long outage is not dominated by a 30-60 s sleep."""
    return {"backoff": reflector.Backoff(clock=clock.SystemClock(), cap=4.0)}


async def test_initial_sync_then_create_update_delete_reach_the_reconciler(
    namespace: str, kube_client: kube.Kube, spawn: Spawn
) -> None:
    for name in ("a", "b", "c"):
        await kube_client.create(kube.CONFIG_MAPS, configmap(namespace, name, v="1"))
    inf = configmap_informer(kube_client, namespace)
    rec = RecordingReconciler(inf.reader())
    ctl = make_controller("sync-test", rec)
    inf.add_handler(handlers.enqueue_self(ctl.queue))
    spawn(inf.run(), "informer")
    await wait_until(inf.synced.is_set, timeout=30, what="informer synced its first list")
    assert inf.stats().objects == 3
    spawn(ctl.run(), "controller")
    await wait_until(
        lambda: all(rec.last_seen(n) == {"v": "1"} for n in "abc"),
        timeout=30,
        what="the three initial ConfigMaps reconciled",
    )

    await kube_client.create(kube.CONFIG_MAPS, configmap(namespace, "d", v="1"))
    await wait_until(lambda: rec.last_seen("d") == {"v": "1"}, timeout=30, what="d reconciled")
    await kube_client.patch(kube.CONFIG_MAPS, "a", {"data": {"v": "2"}}, namespace=namespace)
    await wait_until(lambda: rec.last_seen("a") == {"v": "2"}, timeout=30, what="a's update seen")
    await kube_client.delete(kube.CONFIG_MAPS, "b", namespace=namespace)
    await wait_until(lambda: rec.last_seen("b") is None, timeout=30, what="b's delete seen")
    assert sorted(str(k) for k in inf.store) == [f"{namespace}/{n}" for n in "acd"]
    assert inf.stats().relists == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_apiserver_outage_heals_without_restart_and_delivers_missed_deletes(
    control_plane: ControlPlane, namespace: str, kube_client: kube.Kube, spawn: Spawn
) -> None:
    for name in ("keep-1", "keep-2", "doomed-1", "doomed-2"):
        await kube_client.create(kube.CONFIG_MAPS, configmap(namespace, name, v="1"))
    inf = configmap_informer(kube_client, namespace, reflector_options=quick_backoff())
    deleted: list[tuple[str, bool]] = []

    def on_event(ev: informer.Event) -> None:
        if isinstance(ev, informer.Deleted):
            deleted.append((ev.obj["metadata"]["name"], ev.final_state_unknown))

    inf.add_handler(on_event)
    spawn(inf.run(), "informer")
    await wait_until(inf.synced.is_set, timeout=30, what="informer synced")

    await asyncio.to_thread(control_plane.stop_apiserver)
    # The apiserver is down: delete two objects behind its back, straight in etcd.
    for name in ("doomed-1", "doomed-2"):
        assert await asyncio.to_thread(
            etcd_delete, control_plane, f"/registry/configmaps/{namespace}/{name}"
        )
    await asyncio.to_thread(control_plane.restart_apiserver)
    await asyncio.to_thread(rest_create, control_plane, namespace, "born-after", v="1")

    await wait_until(
        lambda: store_matches_server(inf, control_plane, namespace),
        timeout=120,
        what="the informer's store equals a fresh list after the apiserver came back",
    )
    assert sorted(name for name, _ in deleted) == ["doomed-1", "doomed-2"]
    assert sorted(str(k) for k in inf.store) == [
        f"{namespace}/{n}" for n in ("born-after", "keep-1", "keep-2")
    ]
    assert inf.stats().errors >= 1


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_watch_expired_by_etcd_compaction_relists_and_converges(
    control_plane: ControlPlane, namespace: str, spawn: Spawn
) -> None:
    # Without the watch cache, watches are served by etcd, whose compaction expires them.
    await asyncio.to_thread(control_plane.restart_apiserver, {"watch-cache": "false"})
    client = await kube.Kube.from_kubeconfig(control_plane.kubeconfig_path)
    try:
        for name in ("a", "b"):
            await client.create(kube.CONFIG_MAPS, configmap(namespace, name, v="1"))
        # Short server timeouts: the reflector re-watches from its resume point every 1-2 s.
        options = {"min_watch_timeout": 1, **quick_backoff()}
        inf = configmap_informer(client, namespace, reflector_options=options)
        spawn(inf.run(), "informer")
        await wait_until(inf.synced.is_set, timeout=30, what="informer synced")
        resume_point = int(inf.stats().resource_version)

        # Move etcd past the informer's resume point elsewhere, then compact it away (a
        # watch from RV r starts at revision r+1, so the compaction must pass r+1).
        bump = f"bump-{namespace}"
        await client.create(kube.CONFIG_MAPS, configmap("default", bump, v="1"))
        await client.patch(kube.CONFIG_MAPS, bump, {"data": {"v": "2"}}, namespace="default")
        revision = await asyncio.to_thread(etcd_revision, control_plane)
        assert revision > resume_point + 1
        await asyncio.to_thread(etcd_compact, control_plane, revision)

        await wait_until(
            lambda: inf.stats().relists >= 1, timeout=60, what="a relist after the 410"
        )
        assert int(inf.stats().resource_version) >= revision
        await client.patch(kube.CONFIG_MAPS, "a", {"data": {"v": "2"}}, namespace=namespace)
        await client.delete(kube.CONFIG_MAPS, "b", namespace=namespace)
        await wait_until(
            lambda: store_matches_server(inf, control_plane, namespace),
            timeout=60,
            what="the store equals a fresh list after the relist",
        )
        assert inf.store.list()[0]["data"] == {"v": "2"}
        await client.delete(kube.CONFIG_MAPS, bump, namespace="default")
    finally:
        await client.close()
        await asyncio.to_thread(control_plane.restart_apiserver)


@pytest.mark.slow
async def test_a_silent_connection_is_abandoned_after_the_read_deadline(
    control_plane: ControlPlane, namespace: str, spawn: Spawn, tmp_path: Any
) -> None:
    proxy = FreezableProxy(upstream_port=control_plane.api_port)
    await proxy.start()
    path = kubeconfig_for_server(
        control_plane, tmp_path / "via-proxy.kubeconfig", f"https://127.0.0.1:{proxy.port}"
    )
    client = await kube.Kube.from_kubeconfig(path)
    try:
        inf = configmap_informer(
            client, namespace, read_deadline=2.0, reflector_options=quick_backoff()
        )
        spawn(inf.run(), "informer")
        await wait_until(inf.synced.is_set, timeout=30, what="informer synced")
        await asyncio.to_thread(rest_create, control_plane, namespace, "before", v="1")
        await wait_until(
            lambda: len(inf.store) == 1, timeout=30, what="the live watch delivered 'before'"
        )
        restarts = inf.stats().watch_restarts

        proxy.freeze_existing()  # open connections stay up but carry no more bytes
        await asyncio.to_thread(rest_create, control_plane, namespace, "after", v="1")
        await wait_until(
            lambda: len(inf.store) == 2,
            timeout=30,
            what="'after' delivered over a new watch once the frozen one was abandoned",
        )
        stats = inf.stats()
        assert stats.watch_restarts > restarts
        assert stats.errors >= 1
        assert stats.relists == 0
        assert proxy.frozen_connections >= 1
    finally:
        await client.close()
        await proxy.close()


@pytest.mark.slow
async def test_rapid_updates_to_one_key_never_overlap_and_end_in_the_final_state(
    namespace: str, kube_client: kube.Kube, spawn: Spawn
) -> None:
    await kube_client.create(kube.CONFIG_MAPS, configmap(namespace, "hot", n="0"))
    inf = configmap_informer(kube_client, namespace)
    rec = RecordingReconciler(inf.reader(), hold=0.003)
    ctl = make_controller("hot-test", rec, workers=4)
    inf.add_handler(handlers.enqueue_self(ctl.queue))
    spawn(inf.run(), "informer")
    await wait_until(inf.synced.is_set, timeout=30, what="informer synced")
    spawn(ctl.run(), "controller")

    for i in range(1, 501):
        await kube_client.patch(
            kube.CONFIG_MAPS, "hot", {"data": {"n": str(i)}}, namespace=namespace
        )
    await wait_until(
        lambda: rec.last_seen("hot") == {"n": "500"} and not rec.in_flight,
        timeout=60,
        what="the reconciler saw the final state n=500",
    )
    assert rec.overlaps == []
    assert len(rec.seen) >= 2
    assert ctl.stats().errors == 0
