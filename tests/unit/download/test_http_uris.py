"""`download` of http(s):// URIs against local servers on 127.0.0.1 (loopback only).

Matrix: a body is streamed into dest under the URL's file name (and replaces an older file);
404 fails at once; 503 is retried with growing, jittered backoff, and Retry-After is
honoured; a body shorter than its Content-Length, a silent server and a refused connection
are retried and then fail; a cancelled download leaves nothing. In every failure dest never
holds the file (an older one is kept) and no staging directory is left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import test_utils, web

from localcache.devenv.waiting import wait_until
from localcache.download import program

BODY = os.urandom(3 * 1024 * 1024 + 17)


class RecordingClock:
    """A clock whose sleeps return at once and are recorded, so backoff is observable."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def now(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        await asyncio.sleep(0)


class Site:
    """An aiohttp app on 127.0.0.1 whose handlers count their hits."""

    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self.app = web.Application()
        self.app.router.add_get("/models/model.bin", self._model)
        self.app.router.add_get("/flaky/model.bin", self._flaky)
        self.app.router.add_get("/busy/model.bin", self._busy)
        self.app.router.add_get("/redirect/model.bin", self._redirect)
        self.server: test_utils.BaseTestServer | None = None

    def url(self, path: str) -> str:
        assert self.server is not None
        return str(self.server.make_url(path))

    def _hit(self, request: web.Request) -> int:
        self.hits[request.path] = self.hits.get(request.path, 0) + 1
        return self.hits[request.path]

    async def _model(self, request: web.Request) -> web.Response:
        self._hit(request)
        return web.Response(body=BODY, content_type="application/octet-stream")

    async def _flaky(self, request: web.Request) -> web.Response:
        if self._hit(request) <= 2:
            return web.Response(status=503)
        return web.Response(body=b"at last")

    async def _busy(self, request: web.Request) -> web.Response:
        if self._hit(request) == 1:
            return web.Response(status=429, headers={"Retry-After": "7"})
        return web.Response(body=b"ok")

    async def _redirect(self, request: web.Request) -> web.Response:
        self._hit(request)
        raise web.HTTPFound("/models/model.bin")


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    site = Site()
    async with test_utils.TestServer(site.app, host="127.0.0.1") as server:
        site.server = server
        yield site


class RawServer:
    """A loopback TCP server that answers with raw bytes, to misbehave on purpose."""

    def __init__(self, script: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> None:
        self.script = script
        self.connections = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            await reader.readuntil(b"\r\n\r\n")
            await self.script(writer)
            await reader.read()  # hold the connection until the client gives up
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[RawServer]:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


async def _truncated(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"y" * 10)
    await writer.drain()
    writer.close()


async def _headers_then_silence(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"y" * 10)
    await writer.drain()


async def _silence(writer: asyncio.StreamWriter) -> None:
    return


def _entries(dest: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in dest.iterdir()} if dest.exists() else {}


async def test_a_body_is_streamed_into_dest_under_the_url_file_name(
    site: Site, tmp_path: Path
) -> None:
    dest = tmp_path / "models"
    written = await program.download(site.url("/models/model.bin"), dest)
    assert written == len(BODY)
    assert _entries(dest) == {"model.bin": BODY}


async def test_a_redirect_is_followed_and_an_older_file_replaced(
    site: Site, tmp_path: Path
) -> None:
    (tmp_path / "model.bin").write_bytes(b"old")
    await program.download(site.url("/redirect/model.bin"), tmp_path)
    assert _entries(tmp_path) == {"model.bin": BODY}


async def test_404_fails_at_once_and_keeps_the_older_file(site: Site, tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"old")
    clock = RecordingClock()
    with pytest.raises(program.DownloadError, match=r"HTTP 404 Not Found$"):
        await program.download(site.url("/missing/model.bin"), tmp_path, clock=clock)
    assert clock.sleeps == []
    assert _entries(tmp_path) == {"model.bin": b"old"}


async def test_503_is_retried_with_growing_backoff(site: Site, tmp_path: Path) -> None:
    clock = RecordingClock()
    written = await program.download(
        site.url("/flaky/model.bin"), tmp_path, clock=clock, backoff=2.0
    )
    assert written == len(b"at last")
    assert site.hits["/flaky/model.bin"] == 3
    assert len(clock.sleeps) == 2
    assert 1.0 <= clock.sleeps[0] <= 2.0
    assert 2.0 <= clock.sleeps[1] <= 4.0


async def test_retry_after_is_honoured(site: Site, tmp_path: Path) -> None:
    clock = RecordingClock()
    await program.download(site.url("/busy/model.bin"), tmp_path, clock=clock, backoff=0.1)
    assert clock.sleeps == [7.0]


async def test_a_truncated_body_is_retried_then_fails_leaving_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    clock = RecordingClock()
    async with RawServer(_truncated).running() as raw:
        with pytest.raises(program.DownloadError, match=r"truncated.*after 3 attempts"):
            await program.download(raw.url("/m.bin"), dest, attempts=3, clock=clock)
        assert raw.connections == 3
    assert len(clock.sleeps) == 2
    assert not dest.exists()


@pytest.mark.parametrize("script", [_headers_then_silence, _silence], ids=["body", "headers"])
async def test_a_silent_server_times_out_leaving_nothing(
    tmp_path: Path, script: Callable[[asyncio.StreamWriter], Awaitable[None]]
) -> None:
    (tmp_path / "keep.txt").write_bytes(b"mine")
    async with RawServer(script).running() as raw:
        with pytest.raises(program.DownloadError, match=r"timed out \(no data for 0.2 s\)"):
            await program.download(raw.url("/m.bin"), tmp_path, timeout=0.2, attempts=1)
    assert _entries(tmp_path) == {"keep.txt": b"mine"}


async def test_a_refused_connection_is_retried_then_fails(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    clock = RecordingClock()
    with pytest.raises(program.DownloadError, match="connection failed"):
        await program.download(
            f"http://127.0.0.1:{port}/m.bin", tmp_path / "d", attempts=2, clock=clock
        )
    assert len(clock.sleeps) == 1
    assert not (tmp_path / "d").exists()


async def test_a_cancelled_download_leaves_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    async with RawServer(_headers_then_silence).running() as raw:
        task = asyncio.create_task(program.download(raw.url("/m.bin"), dest, timeout=30))
        await wait_until(lambda: raw.connections == 1, timeout=10, what="the download connects")
        await wait_until(
            lambda: any(dest.iterdir()), timeout=10, what="the download stages its file"
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert _entries(dest) == {}


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("http://127.0.0.1:9/models/", "cannot derive a file name"),
        ("https:///model.bin", "no host"),
        ("gs://bucket/model", "unsupported URI scheme 'gs'"),
        ("/plain/path", "unsupported URI scheme none"),
    ],
)
async def test_unusable_uris_fail_before_touching_dest(
    tmp_path: Path, uri: str, message: str
) -> None:
    with pytest.raises(program.DownloadError, match=message):
        await program.download(uri, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
