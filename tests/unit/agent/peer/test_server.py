"""The peer server over real TLS on 127.0.0.1: what it serves, what it refuses, its caps and
its stop. The authorizer is a stand-in (its logic is test_auth's; the real one is exercised
against the apiserver in tests/integration/agent/test_peer_auth.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import hashlib
import os
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import yarl

from localcache.agent.peer import auth, server, throttle, tls
from localcache.api import peer
from localcache.devenv.waiting import wait_until
from localcache.runtime import clock, metrics
from localcache.runtime.serving import certgen

KEY = "0123456789abcdef"
SCOPE = "a" * 64
BIG = bytes(range(256)) * 64  # 16 KiB
REQUESTER = auth.Requester(namespace="jobs", pod="dl", job="job", node="node-b", scope=SCOPE)


class FakeAuthorizer:
    async def identify(self, token: str | None, storage_key: str) -> auth.Requester | auth.Refusal:
        if not token:
            return auth.refusal("no-token")
        if token == "good":
            return REQUESTER
        if token == "good-other-pod":
            return dataclasses.replace(REQUESTER, pod="dl-2")
        if token == "other-scope":  # a download pod of another scope that proved nothing
            return dataclasses.replace(REQUESTER, scope="c" * 64)
        return auth.refusal("bad-token")


class Folders:
    def __init__(self, served: server.ServedFolder) -> None:
        self.served = served

    def scopes(self, storage_key: str) -> frozenset[str]:
        return self.served.scopes if storage_key == KEY else frozenset()

    def lookup(self, storage_key: str, scope: str) -> server.ServedFolder | None:
        return self.served if storage_key == KEY and scope in self.served.scopes else None

    def complete(self, storage_key: str) -> server.ServedFolder | None:
        return self.served if storage_key == KEY and self.served.manifest.complete else None


def _file(path: str, data: bytes) -> peer.ManifestFile:
    return peer.ManifestFile(path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest())


@dataclass
class Bed:
    url: str
    server: server.PeerServer
    peer_metrics: metrics.PeerMetrics
    registry: metrics.Metrics
    clock: clock.FakeClock
    rate: list[int | None]
    session: aiohttp.ClientSession
    folder: Path
    manifest: peer.PeerManifest
    folders: Folders

    def get(
        self, path: str, *, token: str | None = "good", **headers: str
    ) -> aiohttp.client._RequestContextManager:
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        url = yarl.URL(self.url + path, encoded=True)  # sent as written: no client normalising
        return self.session.get(url, headers=headers, server_hostname=peer.SERVER_NAME)


@pytest.fixture
async def bed(tmp_path: Path) -> AsyncIterator[Bed]:
    bundle = certgen.issue_bundle([peer.SERVER_NAME], now=datetime.datetime.now(datetime.UTC))
    certs = tmp_path / "tls"
    certs.mkdir()
    (certs / "tls.crt").write_bytes(bundle.cert_pem)
    (certs / "tls.key").write_bytes(bundle.key_pem)
    folder = tmp_path / "models" / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "big.bin").write_bytes(BIG)
    (folder / "sub" / "small.txt").write_bytes(b"hello")
    (folder / "unlisted.bin").write_bytes(b"not in the manifest")
    (folder / "swapped").write_bytes(b"12345")
    (folder / "resized").write_bytes(b"1234")
    (tmp_path / "outside").write_bytes(b"secret")
    (folder / "link").symlink_to(tmp_path / "outside")
    files = [
        _file("big.bin", BIG),
        _file("sub/small.txt", b"hello"),
        _file("swapped", b"12345"),
        _file("resized", b"12345"),
    ]
    links = [peer.ManifestLink(path="link", target=str(tmp_path / "outside"))]
    digest = peer.manifest_digest(
        files=((f.path, f.size, f.sha256) for f in files),
        links=(("link", str(tmp_path / "outside")),),
    )
    manifest = peer.PeerManifest(storage_key=KEY, digest=digest, files=files, links=links)
    registry = metrics.Metrics()
    fake, rate = clock.FakeClock(), list[int | None]([None])
    peer_metrics = registry.peer()
    folders = Folders(server.ServedFolder(folder, manifest, frozenset({SCOPE})))
    srv = server.PeerServer(
        folders=folders,
        authorizer=FakeAuthorizer(),
        slots=throttle.UploadSlots(lambda: 1),
        bucket=throttle.TokenBucket(lambda: rate[0], clock=fake),
        metrics=peer_metrics,
        chunk_size=4096,
    )
    port = await srv.start("127.0.0.1", 0, tls.ssl_context_from_dir(certs))
    client_ctx = ssl.create_default_context(cadata=bundle.ca_cert_pem.decode())
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ctx))
    try:
        yield Bed(
            f"https://127.0.0.1:{port}{peer.WIRE_PREFIX}/models/",
            srv,
            peer_metrics,
            registry,
            fake,
            rate,
            session,
            folder,
            manifest,
            folders,
        )
    finally:
        await session.close()
        await srv.stop()


async def test_the_manifest_is_served_as_camel_case_json(bed: Bed) -> None:
    async with bed.get(f"{KEY}/manifest") as response:
        assert response.status == 200
        body = await response.json()
    wire = bed.manifest.model_dump(mode="json", by_alias=True)
    for entry in wire["files"]:
        del entry["originSha256"]  # this node's record, never served (`wire_json`)
    assert body == wire
    assert peer.PeerManifest.model_validate(body).computed_digest() == bed.manifest.digest


async def test_a_whole_file_is_served_and_counted(bed: Bed) -> None:
    async with bed.get(f"{KEY}/files/big.bin") as response:
        assert response.status == 200
        assert await response.read() == BIG
    async with bed.get(f"{KEY}/files/sub/small.txt") as response:
        assert await response.read() == b"hello"
    sent = bed.registry.value("localcache_p2p_bytes_total", direction="sent", source="node-b")
    assert sent == len(BIG) + 5


@pytest.mark.parametrize(
    ("header", "first", "last"),
    [
        ("bytes=100-", 100, len(BIG) - 1),
        ("bytes=5000-5099", 5000, 5099),
        ("bytes=0-999999", 0, len(BIG) - 1),
    ],
)
async def test_a_single_range_is_served_partially(
    bed: Bed, header: str, first: int, last: int
) -> None:
    async with bed.get(f"{KEY}/files/big.bin", Range=header) as response:
        assert response.status == 206
        assert response.headers["Content-Range"] == f"bytes {first}-{last}/{len(BIG)}"
        assert await response.read() == BIG[first : last + 1]


@pytest.mark.parametrize("header", ["bytes=-5", "bytes=0-1,5-6", f"bytes={len(BIG)}-"])
async def test_other_ranges_are_416(bed: Bed, header: str) -> None:
    async with bed.get(f"{KEY}/files/big.bin", Range=header) as response:
        assert response.status == 416
        assert response.headers["Content-Range"] == f"bytes */{len(BIG)}"


@pytest.mark.parametrize(
    "path",
    [
        "unlisted.bin",
        "link",
        "sub",
        "sub/../big.bin",
        "sub%2F..%2Fbig.bin",
        "..%2Foutside",
        "%2Fetc%2Fpasswd",
        "big.bin%00",
        "./big.bin",
    ],
)
async def test_nothing_but_listed_files_is_served(bed: Bed, path: str) -> None:
    async with bed.get(f"{KEY}/files/{path}") as response:
        assert response.status == 404


async def test_a_listed_file_replaced_by_a_symlink_or_resized_is_stale(bed: Bed) -> None:
    (bed.folder / "swapped").unlink()
    (bed.folder / "swapped").symlink_to(bed.folder / "sub" / "small.txt")  # same size
    for path in ("swapped", "resized"):
        async with bed.get(f"{KEY}/files/{path}") as response:
            assert response.status == 404
    assert bed.registry.value("localcache_p2p_refusals_total", reason="stale") == 2


@pytest.mark.parametrize("key", ["unknownkey000000", "0123456789ABCDEF", "short", "x" * 300])
async def test_unknown_or_malformed_keys_are_404(bed: Bed, key: str) -> None:
    async with bed.get(f"{key}/manifest") as response:
        assert response.status == 404


@pytest.mark.parametrize(
    ("token", "header", "status", "reason"),
    [
        (None, None, 401, "no-token"),
        (None, "Basic abc", 401, "no-token"),
        ("forged", None, 401, "bad-token"),
        ("other-scope", None, 403, "other-scope"),
    ],
)
async def test_unentitled_requests_are_refused(
    bed: Bed, token: str | None, header: str | None, status: int, reason: str
) -> None:
    extra = {"Authorization": header} if header else {}
    for path in ("manifest", "files/big.bin"):
        async with bed.get(f"{KEY}/{path}", token=token, **extra) as response:
            assert response.status == status
    assert bed.registry.value("localcache_p2p_refusals_total", reason=reason) == 2


async def _held_stream(bed: Bed) -> asyncio.Task[bytes]:
    """A stream of big.bin parked in the token bucket (rate 1 B/s on a fake clock)."""
    bed.rate[0] = 1

    async def fetch() -> bytes:
        async with bed.get(f"{KEY}/files/big.bin") as response:
            assert response.status == 200
            return await response.read()

    task = asyncio.create_task(fetch(), name="held-stream")
    await wait_until(lambda: bed.clock.sleepers == 1, timeout=10, what="a stream waits on the rate")
    return task


async def test_streams_beyond_the_cap_get_429_with_retry_after(bed: Bed) -> None:
    held = await _held_stream(bed)
    assert bed.registry.value("localcache_p2p_uploads_in_flight") == 1
    # the slot is the download pod's: another pod waits, the same pod's next file shares it
    async with bed.get(f"{KEY}/files/sub/small.txt", token="good-other-pod") as response:
        assert response.status == 429
        assert 1 <= int(response.headers["Retry-After"]) <= 5
    async with bed.get(f"{KEY}/files/sub/small.txt") as response:
        assert response.status == 200
    async with bed.get(f"{KEY}/manifest") as response:  # manifests take no slot
        assert response.status == 200
    bed.rate[0] = None
    await bed.clock.advance(10_000)
    assert await held == BIG
    # the client can hold the whole body a moment before the handler has returned its slot
    await wait_until(
        lambda: bed.registry.value("localcache_p2p_uploads_in_flight") == 0,
        timeout=10,
        what="the slot returned after the stream",
    )


async def test_stop_refuses_new_requests_and_lets_streams_finish_within_grace(bed: Bed) -> None:
    held = await _held_stream(bed)
    stopping = asyncio.create_task(bed.server.stop(grace_s=60), name="stop")
    await wait_until(lambda: bed.server.closing, timeout=10, what="the server is stopping")
    async with bed.get(f"{KEY}/manifest") as response:
        assert response.status == 503
        assert "Retry-After" in response.headers
    bed.rate[0] = None
    await bed.clock.advance(10_000)
    assert await held == BIG
    await stopping


async def test_stop_cancels_streams_past_the_grace(bed: Bed) -> None:
    held = await _held_stream(bed)
    await bed.server.stop()
    assert bed.server.streams_in_flight == 0
    with pytest.raises(aiohttp.ClientError):
        await held
    assert bed.registry.value("localcache_p2p_uploads_in_flight") == 0
    assert os.listdir(bed.folder)  # nothing touched on disk


async def test_a_download_in_progress_answers_503_until_it_has_a_file_and_for_moved_files(
    bed: Bed,
) -> None:
    def partial(files: list[peer.ManifestFile]) -> None:
        digest = peer.manifest_digest(files=((f.path, f.size, f.sha256) for f in files))
        manifest = peer.PeerManifest(storage_key=KEY, digest=digest, complete=False, files=files)
        bed.folders.served = server.ServedFolder(bed.folder, manifest, frozenset({SCOPE}))

    partial([])
    async with bed.get(f"{KEY}/manifest") as response:
        assert (response.status, await response.text()) == (503, "nothing-yet\n")
        assert response.headers["Retry-After"] == "1"
    partial([_file("big.bin", BIG), _file("moved.bin", b"whole once")])
    async with bed.get(f"{KEY}/manifest") as response:
        assert response.status == 200
        assert (await response.json())["complete"] is False
    async with bed.get(f"{KEY}/files/big.bin") as response:
        assert await response.read() == BIG
    async with bed.get(f"{KEY}/files/moved.bin") as response:  # moved into place meanwhile
        assert (response.status, await response.text()) == (503, "moving\n")
    async with bed.get(f"{KEY}/files/resized") as response:  # not listed yet: perhaps soon
        assert (response.status, await response.text()) == (503, "not-yet\n")
