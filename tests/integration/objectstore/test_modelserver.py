"""The model file server serves exact bytes, throttles when asked, and counts requests."""

from __future__ import annotations

import http.client
import json
import os
import socket
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcache.devenv import modelserver
from localcache.devenv.waiting import wait_until_sync

RATE = 100 * 1024
BIG = 200 * 1024


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    (root / "iris").mkdir()
    (root / "iris" / "model.joblib").write_bytes(os.urandom(70_000) + b"\x00end")
    (root / "big.bin").write_bytes(os.urandom(BIG))
    return root


@pytest.fixture(scope="module")
def server(models: Path) -> Iterator[modelserver.ModelServer]:
    with modelserver.ModelServer(models, log_path=models.parent / "modelserver.log").start() as s:
        yield s


def _head(url: str) -> tuple[int, str | None]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)
    try:
        conn.request("HEAD", parts.path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Length")
    finally:
        conn.close()


def test_file_is_served_byte_exact(server: modelserver.ModelServer, models: Path) -> None:
    status, body = modelserver.http_get(server.url("iris/model.joblib"))

    assert status == 200
    assert body == (models / "iris" / "model.joblib").read_bytes()


def test_head_reports_the_length_without_a_body(server: modelserver.ModelServer) -> None:
    assert _head(server.url("iris/model.joblib")) == (200, str(70_000 + 4))


def _get_range(url: str, value: str) -> tuple[int, str | None, bytes]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)
    try:
        conn.request("GET", parts.path, headers={"Range": value})
        response = conn.getresponse()
        return response.status, response.getheader("Content-Range"), response.read()
    finally:
        conn.close()


def test_one_byte_range_is_served_as_206(server: modelserver.ModelServer, models: Path) -> None:
    data = (models / "big.bin").read_bytes()
    url = server.url("big.bin")

    assert _get_range(url, "bytes=1000-") == (206, f"bytes 1000-{BIG - 1}/{BIG}", data[1000:])
    assert _get_range(url, "bytes=10-19") == (206, f"bytes 10-19/{BIG}", data[10:20])
    assert _get_range(url, f"bytes={BIG}-") == (416, f"bytes */{BIG}", b"")
    assert _get_range(url, "bytes=0-1,5-6") == (200, None, data)  # several: ignored
    assert _get_range(url, "bytes=10-5") == (200, None, data)  # invalid: ignored


def test_missing_file_is_404(server: modelserver.ModelServer) -> None:
    assert modelserver.http_get(server.url("nope.bin"))[0] == 404


def test_stats_count_requests_per_path(server: modelserver.ModelServer) -> None:
    before = server.stats().requests.get("/big.bin", 0)

    modelserver.http_get(server.url("big.bin"))
    _head(server.url("big.bin"))
    modelserver.http_get(server.url("big.bin") + "?attempt=3")

    stats = server.stats()
    assert stats.requests["/big.bin"] == before + 3
    assert "/_stats" not in stats.requests

    # the server counts a chunk once its write returns, which may be after the client read it
    def all_bytes_counted() -> bool:
        sent = server.stats().bytes_sent["/big.bin"]
        assert sent >= 2 * BIG, f"{sent} bytes counted"
        return True

    wait_until_sync(all_bytes_counted, timeout=10, interval=0.05, what="both bodies counted")


def test_throttle_makes_a_200kb_file_take_at_least_1_5s_at_100kb_per_s(models: Path) -> None:
    throttled = modelserver.ModelServer(models, rate=RATE, log_path=models.parent / "slow.log")
    with throttled.start():
        started = time.monotonic()
        status, body = modelserver.http_get(throttled.url("big.bin"), timeout=30)
        elapsed = time.monotonic() - started

    assert status == 200
    assert body == (models / "big.bin").read_bytes()
    assert elapsed >= 1.5, f"200 KiB at 100 KiB/s arrived in {elapsed:.2f}s"


def test_stopped_server_refuses_connections(models: Path) -> None:
    server = modelserver.ModelServer(models).start()
    url = server.url("big.bin")
    server.stop()
    server.stop()  # idempotent

    with pytest.raises(ConnectionRefusedError):
        modelserver.http_get(url, timeout=2)


def test_a_stall_marker_holds_the_first_get_after_half_the_body(
    server: modelserver.ModelServer, models: Path
) -> None:
    """The stalled origin of the DownloadStalled e2e test: the first GET stops sending after
    half its body and holds the connection; the next GET is served whole."""
    data = os.urandom(100_000)
    (models / "stalls.bin").write_bytes(data)
    (models / "stalls.bin.stall").write_text("1")
    parts = urllib.parse.urlsplit(server.url("stalls.bin"))
    with socket.create_connection((parts.hostname or "", parts.port or 80), timeout=5) as sock:
        sock.sendall(f"GET {parts.path} HTTP/1.0\r\n\r\n".encode())
        received = b""
        while b"\r\n\r\n" not in received or len(received.split(b"\r\n\r\n", 1)[1]) < 50_000:
            chunk = sock.recv(65536)
            assert chunk, f"the connection closed after {len(received)} bytes"
            received += chunk
        head, body = received.split(b"\r\n\r\n", 1)
        assert f"Content-Length: {len(data)}".encode() in head
        assert body == data[:50_000]
        sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            sock.recv(1)  # nothing more comes: the origin stalls
    assert modelserver.http_get(server.url("stalls.bin")) == (200, data)


def test_a_headers_sidecar_adds_its_headers_to_every_answer_for_its_file(
    server: modelserver.ModelServer, models: Path
) -> None:
    """What a Hub stand-in needs (`tests.support.hubstandin`): its resolve answers carry
    `X-Repo-Commit` and the ETags huggingface_hub reads."""
    (models / "hub.bin").write_bytes(b"0123456789")
    sidecar = {"X-Repo-Commit": "c0ffee", "X-Linked-Etag": '"abc"'}
    (models / "hub.bin.headers").write_text(json.dumps(sidecar))
    url = server.url("hub.bin")
    for method, headers in (("HEAD", {}), ("GET", {}), ("GET", {"Range": "bytes=2-"})):
        parts = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)
        try:
            conn.request(method, parts.path, headers=headers)
            response = conn.getresponse()
            response.read()
            got = {name: response.getheader(name) for name in sidecar}
        finally:
            conn.close()
        assert got == sidecar, (method, headers)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)
    try:
        conn.request("HEAD", urllib.parse.urlsplit(server.url("big.bin")).path)
        assert conn.getresponse().getheader("X-Repo-Commit") is None
    finally:
        conn.close()
