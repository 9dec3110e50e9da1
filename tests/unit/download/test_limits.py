"""Issue 13 risk 6: the downloader's limits, against local aiohttp servers on 127.0.0.1.

A size cap (by Content-Length before any byte, while streaming, and for file:// trees), an
overall deadline (a server that drips bytes forever), and redirects that may not lead to
loopback, link-local or metadata addresses unless the original URL was one. Every failure is
final (no retry) and leaves nothing in dest.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import test_utils, web

from localcache.download import program

BODY = b"m" * 1000


class Site:
    def __init__(self) -> None:
        self.hits: dict[str, int] = {}
        self.app = web.Application()
        for path, handler in [
            ("/model.bin", self._model),
            ("/chunked/model.bin", self._chunked),
            ("/drip/model.bin", self._drip),
            ("/redirect/{to:.*}", self._redirect),
        ]:
            self.app.router.add_get(path, handler)
        self.server: test_utils.BaseTestServer | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        assert self.server.port is not None
        return self.server.port

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _hit(self, request: web.Request) -> None:
        self.hits[request.path] = self.hits.get(request.path, 0) + 1

    async def _model(self, request: web.Request) -> web.Response:
        self._hit(request)
        return web.Response(body=BODY, content_type="application/octet-stream")

    async def _chunked(self, request: web.Request) -> web.StreamResponse:
        self._hit(request)
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(3):
            await response.write(b"c" * 400)
        await response.write_eof()
        return response

    async def _drip(self, request: web.Request) -> web.StreamResponse:
        self._hit(request)
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        while True:  # never silent for the read timeout, never done
            await response.write(b"d")
            await asyncio.sleep(0.05)

    async def _redirect(self, request: web.Request) -> web.Response:
        self._hit(request)
        target = {
            "loopback": self.url("/model.bin"),
            "localhost": f"http://localhost:{self.port}/model.bin",
            "ipv6-loopback": f"http://[::1]:{self.port}/model.bin",
            "metadata": "http://169.254.169.254/latest/meta-data/iam/model.bin",
            "link-local-v6": "http://[fe80::1]/model.bin",
            "mapped": f"http://[::ffff:127.0.0.1]:{self.port}/model.bin",
        }[request.match_info["to"]]
        raise web.HTTPFound(target)


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    site = Site()
    async with test_utils.TestServer(site.app, host="127.0.0.1") as server:
        site.server = server
        yield site


def _assert_empty(dest: Path) -> None:
    assert not dest.exists() or os.listdir(dest) == []


# ---- size ---------------------------------------------------------------------------------


async def test_a_content_length_over_the_cap_fails_before_reading(
    site: Site, tmp_path: Path
) -> None:
    dest = tmp_path / "dest"
    with pytest.raises(program.DownloadError, match="over the 500-byte limit"):
        await program.download(site.url("/model.bin"), dest, max_bytes=500)
    assert site.hits["/model.bin"] == 1  # final, not retried
    _assert_empty(dest)


async def test_a_stream_without_length_is_cut_at_the_cap(site: Site, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    with pytest.raises(program.DownloadError, match="larger than the 500-byte limit"):
        await program.download(site.url("/chunked/model.bin"), dest, max_bytes=500)
    assert site.hits["/chunked/model.bin"] == 1
    _assert_empty(dest)


async def test_a_download_within_the_cap_succeeds(site: Site, tmp_path: Path) -> None:
    written = await program.download(site.url("/model.bin"), tmp_path, max_bytes=len(BODY))
    assert written == len(BODY)
    assert (tmp_path / "model.bin").read_bytes() == BODY


async def test_a_file_tree_over_the_cap_fails_and_leaves_nothing(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "a.bin").write_bytes(b"a" * 300)
    (source / "sub" / "b.bin").write_bytes(b"b" * 300)
    dest = tmp_path / "dest"
    with pytest.raises(program.DownloadError, match="larger than the 500-byte limit"):
        await program.download(f"file://{source}", dest, max_bytes=500)
    _assert_empty(dest)


def test_the_command_takes_a_max_size_quantity(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "model.bin"
    source.write_bytes(b"x" * 2048)
    assert program.main([f"file://{source}", str(tmp_path / "a"), "--max-size", "1Ki"]) == 1
    assert "1024-byte limit" in capsys.readouterr().err
    monkeypatch.setenv(program.MAX_SIZE_ENV, "1Ki")  # e.g. the cache's modelSize
    assert program.main([f"file://{source}", str(tmp_path / "b")]) == 1
    assert "1024-byte limit" in capsys.readouterr().err
    assert program.main([f"file://{source}", str(tmp_path / "c"), "--max-size", "2Ki"]) == 0
    assert program.main([f"file://{source}", str(tmp_path / "d"), "--max-size", "lots"]) == 1
    assert "invalid --max-size" in capsys.readouterr().err


# ---- deadline -----------------------------------------------------------------------------


async def test_a_download_that_never_ends_fails_at_the_deadline(site: Site, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    try:
        async with asyncio.timeout(15):
            with pytest.raises(program.DownloadError, match=r"did not finish within 0\.5 s"):
                await program.download(site.url("/drip/model.bin"), dest, deadline=0.5)
    except TimeoutError:
        pytest.fail("the download outlived its 0.5 s deadline by 15 s")
    assert site.hits["/drip/model.bin"] == 1
    _assert_empty(dest)


# ---- redirects ----------------------------------------------------------------------------


async def test_redirects_stay_free_when_the_original_url_is_loopback(
    site: Site, tmp_path: Path
) -> None:
    """Test servers live on 127.0.0.1: such an origin may redirect to its own kind."""
    await program.download(site.url("/redirect/loopback"), tmp_path)
    assert (tmp_path / "loopback").read_bytes() == BODY


@pytest.mark.parametrize(
    "to", ["loopback", "localhost", "ipv6-loopback", "metadata", "link-local-v6", "mapped"]
)
async def test_a_redirect_to_an_internal_address_is_refused(
    site: Site, tmp_path: Path, to: str
) -> None:
    """`internal_redirects=False` is what an origin that is not internal gets."""
    dest = tmp_path / "dest"
    with pytest.raises(program.DownloadError, match="refused"):
        await program.download(
            site.url(f"/redirect/{to}"), dest, internal_redirects=False, attempts=1
        )
    assert site.hits.get("/model.bin", 0) == 0
    assert site.hits[f"/redirect/{to}"] == 1
    _assert_empty(dest)


@pytest.mark.parametrize(
    ("address", "internal"),
    [
        ("127.0.0.1", True),
        ("127.9.8.7", True),
        ("::1", True),
        ("169.254.169.254", True),
        ("169.254.1.1", True),
        ("fe80::1", True),
        ("fe80::1%eth0", True),
        ("0.0.0.0", True),
        ("::", True),
        ("::ffff:127.0.0.1", True),
        ("fd00:ec2::254", True),
        ("100.100.100.200", True),
        # security review finding 13: IPv6 forms that a gateway unwraps to an IPv4 address
        ("64:ff9b::127.0.0.1", True),
        ("64:ff9b::a9fe:a9fe", True),  # NAT64 of 169.254.169.254
        ("64:ff9b:1::7f00:1", True),
        ("2002:7f00:1::", True),  # 6to4 of 127.0.0.1
        ("2002:a9fe:a9fe::1", True),
        ("::127.0.0.1", True),  # IPv4-compatible
        ("::169.254.169.254", True),
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", True),  # Teredo, client 127.0.0.1
        ("64:ff9b::93.184.216.34", False),
        ("2002:5db8:d822::", False),
        ("::93.184.216.34", False),
        ("10.0.0.1", False),
        ("93.184.216.34", False),
        ("2001:db8::1", False),
        ("example.com", False),
    ],
)
def test_internal_addresses(address: str, internal: bool) -> None:
    assert program.is_internal_address(address) is internal
