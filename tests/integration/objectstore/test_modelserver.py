"""The model file server serves exact bytes, throttles when asked, and counts requests."""

from __future__ import annotations

import http.client
import os
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
