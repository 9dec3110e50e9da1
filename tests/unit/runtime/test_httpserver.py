"""HTTP endpoints: /metrics, /healthz, /readyz through aiohttp's test client.

Matrix: /metrics serves the registry with its content type; /healthz and /readyz pass with
no checks, pass when every check passes, fail with 500 listing every failing check (a raising
check fails too); liveness and readiness are independent; duplicate check names are refused;
the server binds a free port, answers, and stops cleanly as an async context manager.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import test_utils, web

from localcache.devenv.waiting import wait_until
from localcache.runtime import metrics
from localcache.runtime.serving import httpserver

Client = test_utils.TestClient[web.Request, web.Application]


@pytest.fixture
def server() -> httpserver.HttpServer:
    return httpserver.HttpServer(host="127.0.0.1", port=0, metrics=metrics.Metrics())


@pytest.fixture
async def client(server: httpserver.HttpServer) -> AsyncIterator[Client]:
    async with test_utils.TestClient(test_utils.TestServer(server.app)) as test_client:
        yield test_client


async def test_metrics_endpoint_serves_the_registry(
    server: httpserver.HttpServer, client: Client
) -> None:
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "process_resident_memory_bytes" in await response.text()


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
async def test_endpoint_without_checks_is_ok(client: Client, path: str) -> None:
    response = await client.get(path)
    assert (response.status, await response.text()) == (200, "ok")


async def test_healthz_passes_when_every_liveness_check_passes(
    server: httpserver.HttpServer, client: Client
) -> None:
    server.add_liveness_check("watch-pods", lambda: None)
    server.add_liveness_check("worker", lambda: None)
    response = await client.get("/healthz")
    assert (response.status, await response.text()) == (200, "ok")


async def test_healthz_fails_listing_every_failing_check(
    server: httpserver.HttpServer, client: Client
) -> None:
    def broken() -> str | None:
        raise RuntimeError("cannot tell")

    server.add_liveness_check("watch-pods", lambda: "watch pods silent for 130s")
    server.add_liveness_check("fine", lambda: None)
    server.add_liveness_check("worker", broken)
    response = await client.get("/healthz")
    assert response.status == 500
    assert (await response.text()).splitlines() == [
        "watch-pods: watch pods silent for 130s",
        "worker: check raised RuntimeError: cannot tell",
    ]


async def test_readyz_follows_readiness_checks_only(
    server: httpserver.HttpServer, client: Client
) -> None:
    synced = False
    server.add_readiness_check("informers", lambda: None if synced else "pods not synced")
    server.add_liveness_check("fine", lambda: None)
    not_ready = await client.get("/readyz")
    assert (not_ready.status, await not_ready.text()) == (500, "informers: pods not synced\n")
    assert (await client.get("/healthz")).status == 200
    synced = True
    ready = await client.get("/readyz")
    assert (ready.status, await ready.text()) == (200, "ok")


def test_duplicate_check_names_are_refused(server: httpserver.HttpServer) -> None:
    server.add_readiness_check("informers", lambda: None)
    with pytest.raises(ValueError, match="already registered"):
        server.add_readiness_check("informers", lambda: None)


async def test_server_binds_a_free_port_serves_and_stops_cleanly(
    server: httpserver.HttpServer,
) -> None:
    timeout = aiohttp.ClientTimeout(total=5)
    async with server, aiohttp.ClientSession(timeout=timeout) as session:
        port = server.port
        assert port > 0
        async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
            assert (response.status, await response.text()) == (200, "ok")
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.port
    async with aiohttp.ClientSession(timeout=timeout) as session:
        with pytest.raises(aiohttp.ClientConnectionError):
            await session.get(f"http://127.0.0.1:{port}/healthz")


async def test_run_serves_until_cancelled(server: httpserver.HttpServer) -> None:
    task = asyncio.create_task(server.run(), name="test-http-run")
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await wait_until(lambda: server.started, timeout=5, what="the HTTP server listens")
        async with session.get(f"http://127.0.0.1:{server.port}/readyz") as response:
            assert response.status == 200
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
