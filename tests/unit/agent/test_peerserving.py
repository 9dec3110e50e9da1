"""The agent's peer-server runnable: caps from the node groups that enable peer distribution,
waiting for the certificate, serving over TLS, stopping on cancellation."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest

from localcache.agent import peerserving, peersource
from localcache.agent.peer import server
from localcache.agent.peer import tls as peer_tls
from localcache.api import peer
from localcache.runtime import clock as clock_mod
from localcache.runtime import kube as kube_mod
from localcache.runtime import metrics, store
from localcache.runtime.serving import certgen


def _group(name: str, peer_spec: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "storageLimit": "10Gi",
        "persistentVolumeSpec": {},
        "persistentVolumeClaimSpec": {},
    }
    if peer_spec is not None:
        spec["peerDistribution"] = peer_spec
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "LocalModelNodeGroup",
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": spec,
    }


def _groups(*objs: dict[str, Any]) -> store.Reader:
    s = store.Store()
    for obj in objs:
        s.upsert(obj)
    return s.view()


def test_caps_come_from_enabled_groups_only_and_the_smallest_wins() -> None:
    groups = _groups(
        _group("off", {"enabled": False, "maxUploads": 1, "uploadBandwidth": "1Mi"}),
        _group("none", None),
        _group("a", {"enabled": True, "maxUploads": 4, "uploadBandwidth": "40Mi"}),
        _group("b", {"enabled": True, "maxUploads": 3}),
    )
    assert peerserving.max_uploads(peerserving.enabled_specs(groups)) == 3
    assert peerserving.bandwidth(peerserving.enabled_specs(groups)) == 40 * 2**20


def test_without_an_enabled_group_the_defaults_apply() -> None:
    groups = _groups(_group("off", {"enabled": False, "maxUploads": 1}))
    assert peerserving.max_uploads(peerserving.enabled_specs(groups)) == peer.DEFAULT_MAX_UPLOADS
    assert peerserving.bandwidth(peerserving.enabled_specs(groups)) is None


async def test_it_waits_for_the_certificate_then_serves_over_tls_and_stops(tmp_path: Path) -> None:
    tls_dir = tmp_path / "peer-tls"
    clock = clock_mod.SystemClock()
    serving = peerserving.PeerServing(
        kube=cast(kube_mod.Kube, object()),  # no request here reaches the apiserver
        folders=peersource.PeerFolders(),
        groups=_groups(),
        port=0,
        tls_dir=tls_dir,
        metrics=metrics.Metrics(),
        clock=clock,
        host="127.0.0.1",
    )
    started: asyncio.Queue[int] = asyncio.Queue()
    real_start = server.PeerServer.start

    async def record_start(self: Any, host: str, port: int, ctx: ssl.SSLContext | None) -> int:
        bound: int = await real_start(self, host, port, ctx)
        started.put_nowait(bound)
        return bound

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(server.PeerServer, "start", record_start)
        task = asyncio.create_task(serving.run())
        await asyncio.sleep(0)  # let it look for the files once: none yet
        assert started.empty()
        bundle = certgen.issue_bundle([peer.SERVER_NAME], now=datetime.datetime.now(datetime.UTC))
        tls_dir.mkdir()
        (tls_dir / peer_tls.KEY_FILE).write_bytes(bundle.key_pem)
        (tls_dir / peer_tls.CERT_FILE).write_bytes(bundle.cert_pem)
        async with asyncio.timeout(10):
            port = await started.get()  # the certificate appeared: the server started
        client = ssl.create_default_context(cadata=bundle.ca_cert_pem.decode())
        url = f"https://127.0.0.1:{port}{peer.WIRE_PREFIX}/models/0123456789abcdef/manifest"
        assert await _status(url, client) in (401, 404)  # no token: never served
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    with pytest.raises(aiohttp.ClientConnectionError):
        await _status(url, client)


async def _status(url: str, client: ssl.SSLContext) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, ssl=client, server_hostname=peer.SERVER_NAME) as resp,
    ):
        return resp.status
