"""client-go's REST client metrics on the real apiserver: every request of `kube.Kube` is
counted in `rest_client_requests_total{code,method,host}` and timed in
`rest_client_request_duration_seconds{verb,host}` (reads, 404s, watches), and a controller
process built by the composition root exposes them on its /metrics endpoint."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import urllib.parse

import aiohttp
import pytest

from localcache import app
from localcache import settings as settings_mod
from localcache.devenv.assets import free_port
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime import errors, kube, manager, metrics


def _host(client: kube.Kube) -> str:
    return urllib.parse.urlsplit(client.server).netloc


async def test_every_request_is_counted_by_code_method_and_host_and_timed(
    control_plane: ControlPlane, namespace: str
) -> None:
    registry = metrics.Metrics()
    async with await kube.Kube.from_kubeconfig(control_plane.kubeconfig_path) as client:
        client.instrument(registry.rest_client())
        host = _host(client)
        await client.get(kube.NAMESPACES, namespace)
        await client.list(kube.CONFIG_MAPS, namespace=namespace)
        with pytest.raises(errors.NotFound):
            await client.get(kube.CONFIG_MAPS, "no-such-configmap", namespace=namespace)
        await client.create(
            kube.CONFIG_MAPS,
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "counted"}},
            namespace=namespace,
        )
        async with client.watch(kube.CONFIG_MAPS, namespace=namespace, timeout_seconds=1) as events:
            async for _ in events:
                break

    def requests(code: str, method: str) -> float | None:
        return registry.value("rest_client_requests_total", code=code, method=method, host=host)

    assert requests("200", "GET") == 3  # get, list, watch
    assert requests("404", "GET") == 1
    assert requests("201", "POST") == 1
    timed_gets = registry.value("rest_client_request_duration_seconds_count", verb="GET", host=host)
    assert timed_gets == 4
    timed_posts = registry.value(
        "rest_client_request_duration_seconds_count", verb="POST", host=host
    )
    assert timed_posts == 1


async def test_a_controller_exposes_rest_client_requests_on_its_metrics_endpoint(
    control_plane: ControlPlane, crds: list[str]
) -> None:
    port = free_port()
    settings = settings_mod.from_args(
        argparse.Namespace(),
        "controller",
        {
            "KUBECONFIG": str(control_plane.kubeconfig_path),
            "LOCALCACHE_METRICS_PORT": str(port),
            "LOCALCACHE_BIND_ADDRESS": "127.0.0.1",
            "LOCALCACHE_WEBHOOK_PORT": "0",
            "LOCALCACHE_LEADER_ELECT": "false",
        },
    )
    built: list[manager.Manager] = []
    task = asyncio.create_task(
        app.run_components(
            settings,
            app.Components(controller=True),
            on_manager=built.append,
            handle_signals=False,
        ),
        name="controller-under-test",
    )
    scraped = ""

    async def scrape() -> bool:
        nonlocal scraped
        if task.done():
            return True
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
                session.get(f"http://127.0.0.1:{port}/metrics") as resp,
            ):
                scraped = await resp.text()
        except aiohttp.ClientError:
            return False
        return _ok_gets(scraped) > 0

    try:
        await wait_until(
            scrape,
            timeout=60,
            what="/metrics shows a non-zero rest_client_requests_total with code 200",
        )
        assert not task.done(), f"the controller stopped with exit code {task.result()}"
    finally:
        for mgr in built:
            mgr.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=15)
    assert "# TYPE rest_client_request_duration_seconds histogram" in scraped
    assert "# TYPE controller_runtime_reconcile_panics_total counter" in scraped


def _ok_gets(text: str) -> float:
    """The sum of rest_client_requests_total{code="200",method="GET"} over hosts."""
    pattern = r'^rest_client_requests_total\{code="200",host="[^"]+",method="GET"\} (\S+)$'
    return sum(float(m[1]) for m in re.finditer(pattern, text, re.MULTILINE))
