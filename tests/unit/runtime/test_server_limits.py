"""Issue 13 risk 6: slow clients are cut off. The admission server (TLS) closes a connection
whose handshake never comes, one that completes TLS but sends no request, one that never
finishes its header, and answers 408 to a body that never arrives; the metrics server closes
silent connections too. Limits are short here; each test allows several times the limit."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from localcache.devenv import certs
from localcache.runtime import metrics
from localcache.runtime.serving import admission, httpserver, review, tls

LIMITS = httpserver.ServerLimits(handshake_timeout_s=0.5, idle_timeout_s=0.5, body_timeout_s=0.5)
DEADLINE_S = 5.0


async def _allowed(req: review.Request) -> review.Response:
    return review.allowed()


class Endpoint:
    def __init__(self, port: int, ca_pem: bytes) -> None:
        self.port = port
        self.client_ssl = ssl.create_default_context(cadata=ca_pem.decode())


@pytest.fixture
async def webhook(tmp_path: Path) -> AsyncIterator[Endpoint]:
    ca = certs.TinyCA("limits-test-ca")
    pair = ca.serving_cert(["127.0.0.1", "localhost"])
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    reloadable = tls.ReloadableTLS(tmp_path / "tls.crt", tmp_path / "tls.key")
    server = admission.AdmissionServer(
        metrics=metrics.Metrics(), body_timeout_s=LIMITS.body_timeout_s
    )
    server.register("/validate", _allowed)
    async with tls.serve(
        server.app(),
        host="127.0.0.1",
        port=0,
        ssl_context=reloadable.context,
        shutdown_timeout_s=1.0,
        limits=LIMITS,
    ) as port:
        yield Endpoint(port, ca.cert_pem)


async def _closed_by_server(reader: asyncio.StreamReader) -> float:
    """Seconds until the server closes the connection (EOF or reset); fails past DEADLINE_S."""
    started = time.monotonic()
    try:
        async with asyncio.timeout(DEADLINE_S):
            while await reader.read(4096):
                pass
    except TimeoutError:
        pytest.fail(f"the server kept a silent connection open for {DEADLINE_S}s")
    except (ConnectionResetError, ssl.SSLError):
        pass
    return time.monotonic() - started


async def test_a_client_that_never_starts_tls_is_disconnected(webhook: Endpoint) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", webhook.port)
    try:
        assert await _closed_by_server(reader) < DEADLINE_S
    finally:
        writer.close()


async def test_a_client_that_completes_tls_but_sends_nothing_is_disconnected(
    webhook: Endpoint,
) -> None:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", webhook.port, ssl=webhook.client_ssl, server_hostname="127.0.0.1"
    )
    try:
        assert await _closed_by_server(reader) < DEADLINE_S
    finally:
        writer.close()


async def test_a_request_header_that_never_ends_is_cut_off(webhook: Endpoint) -> None:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", webhook.port, ssl=webhook.client_ssl, server_hostname="127.0.0.1"
    )
    try:
        writer.write(b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl")
        await writer.drain()
        assert await _closed_by_server(reader) < DEADLINE_S
    finally:
        writer.close()


async def test_a_body_that_never_arrives_gets_408_and_the_connection_closes(
    webhook: Endpoint,
) -> None:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", webhook.port, ssl=webhook.client_ssl, server_hostname="127.0.0.1"
    )
    try:
        writer.write(
            b"POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"apiVers'
        )
        await writer.drain()
        async with asyncio.timeout(DEADLINE_S):
            status_line = await reader.readline()
        assert status_line.startswith(b"HTTP/1.1 408"), status_line
        await _closed_by_server(reader)
    finally:
        writer.close()


async def test_a_prompt_request_still_gets_an_answer(webhook: Endpoint) -> None:
    body = (
        b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview",'
        b'"request":{"uid":"u1","operation":"CREATE"}}'
    )
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", webhook.port, ssl=webhook.client_ssl, server_hostname="127.0.0.1"
    )
    try:
        head = (
            "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body)
        await writer.drain()
        async with asyncio.timeout(DEADLINE_S):
            status_line = await reader.readline()
        assert status_line.startswith(b"HTTP/1.1 400"), status_line  # answered, not cut off
    finally:
        writer.close()


async def test_the_metrics_server_closes_silent_connections() -> None:
    server = httpserver.HttpServer(
        host="127.0.0.1", port=0, metrics=metrics.Metrics(), limits=LIMITS
    )
    async with server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            assert await _closed_by_server(reader) < DEADLINE_S
        finally:
            writer.close()
