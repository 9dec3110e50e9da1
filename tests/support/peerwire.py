"""A peer server for tests: the wire protocol of `api.peer` over real TLS on 127.0.0.1, with
faults to inject (cut or stalled streams, flipped bytes, busy answers, a forged manifest).

`Peer.running()` serves `GET /p2p/v1/models/{key}/manifest` and `.../files/{path}` (whole,
200, or `Range: bytes=N-`, 206) and records every request (`Peer.requests`).
`tls_material(tmp, names)` issues a CA and a serving certificate for `names`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import hashlib
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from aiohttp import web

from localcache.api import peer
from localcache.download import peerfetch, peersources
from localcache.runtime import clock as clock_mod
from localcache.runtime.serving import certgen

KEY = "0123456789abcdef"


@dataclasses.dataclass(frozen=True)
class Tls:
    """A CA (PEM) and a server context presenting a certificate it signed."""

    ca_pem: str
    server: ssl.SSLContext


def tls_material(tmp: Path, names: list[str]) -> Tls:
    bundle = certgen.issue_bundle(names, now=datetime.datetime.now(datetime.UTC))
    cert, key = tmp / f"{names[0]}-{id(bundle)}.crt", tmp / f"{names[0]}-{id(bundle)}.key"
    cert.write_bytes(bundle.cert_pem)
    key.write_bytes(bundle.key_pem)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    return Tls(ca_pem=bundle.ca_cert_pem.decode(), server=server)


def manifest_for(
    files: dict[str, bytes],
    *,
    dirs: list[str] | None = None,
    links: dict[str, str] | None = None,
    others: list[str] | None = None,
) -> peer.PeerManifest:
    """The manifest of a folder with these files, directories, links and special files."""
    entries = [
        peer.ManifestFile(path=p, size=len(b), sha256=hashlib.sha256(b).hexdigest())
        for p, b in sorted(files.items())
    ]
    links_ = [peer.ManifestLink(path=p, target=t) for p, t in sorted((links or {}).items())]
    digest = peer.manifest_digest(
        files=((f.path, f.size, f.sha256) for f in entries),
        dirs=dirs or [],
        links=((link.path, link.target) for link in links_),
        others=others or [],
    )
    return peer.PeerManifest(
        storage_key=KEY,
        digest=digest,
        files=entries,
        dirs=dirs or [],
        links=links_,
        others=others or [],
    )


@dataclasses.dataclass
class Request:
    path: str
    range: str | None
    token: str | None


@dataclasses.dataclass
class Faults:
    cut_at: dict[str, int] = dataclasses.field(default_factory=dict)
    """file -> bytes sent before the connection is dropped (first request only)."""
    stall_at: dict[str, int] = dataclasses.field(default_factory=dict)
    """file -> bytes sent before the stream goes silent (first request only)."""
    flip: set[str] = dataclasses.field(default_factory=set)
    """files served with one byte flipped."""
    shifted_range: set[str] = dataclasses.field(default_factory=set)
    """files whose ranged answers claim (Content-Range) to start one byte early."""
    busy: int = 0
    """file requests answered 429 (Retry-After: `retry_after`) before serving."""
    retry_after: str = "7"
    manifest_body: bytes | None = None
    """served instead of the real manifest."""
    status: int | None = None
    """every request answered with this status."""
    status_after_cut: int | None = None
    """`status` from the first cut on (the peer goes down mid-file)."""


def fetch_request(
    tls: Tls, token_file: Path, *, digest: str, clock: clock_mod.Clock, **overrides: object
) -> peerfetch.Request:
    """A fetch of the model `KEY` from peers of `tls`'s CA: a 1 GiB bound, 60 s to finish,
    0.5 s of silence to stall, `overrides` on top."""
    values: dict[str, object] = {
        "storage_key": KEY,
        "digest": digest,
        "credentials": peersources.Credentials(ca_pem=tls.ca_pem, token_file=token_file),
        "max_bytes": 1 << 30,
        "deadline": 60.0,
        "stall_timeout": 0.5,
        "connect_timeout": 2.0,
        "clock": clock,
        **overrides,
    }
    return peerfetch.Request(**values)  # type: ignore[arg-type]


class Peer:
    """One peer: a manifest and its files over TLS, with `faults`."""

    def __init__(
        self,
        name: str,
        files: dict[str, bytes],
        tls: Tls,
        *,
        manifest: peer.PeerManifest | None = None,
        faults: Faults | None = None,
    ) -> None:
        self.name = name
        self.files = files
        self.tls = tls
        self.manifest = manifest or manifest_for(files)
        self.faults = faults or Faults()
        self.requests: list[Request] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.port = 0
        self.on_manifest: Callable[[], None] | None = None
        self._stalled = asyncio.Event()
        app = web.Application()
        base = f"{peer.WIRE_PREFIX}/models/{{key}}"
        app.router.add_get(f"{base}/manifest", self._manifest)
        app.router.add_get(f"{base}/files/{{path:.+}}", self._file)
        self.app = app

    @property
    def source(self) -> str:
        return f"{self.name}=https://127.0.0.1:{self.port}"

    def file_requests(self, path: str) -> list[Request]:
        return [r for r in self.requests if r.path == path]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Peer]:
        runner = web.AppRunner(self.app, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=self.tls.server)
        await site.start()
        self.port = runner.addresses[0][1]
        try:
            yield self
        finally:
            self._stalled.set()
            await runner.cleanup()

    def _record(self, request: web.Request, path: str) -> None:
        self.requests.append(
            Request(path, request.headers.get("Range"), request.headers.get("Authorization"))
        )

    async def _manifest(self, request: web.Request) -> web.StreamResponse:
        self._record(request, "manifest")
        if self.on_manifest is not None:
            self.on_manifest()
        if self.faults.status is not None:
            return web.Response(status=self.faults.status)
        if request.match_info["key"] != self.manifest.storage_key:
            return web.Response(status=404)
        body = self.faults.manifest_body
        if body is None:
            body = self.manifest.model_dump_json(by_alias=True).encode()
        return web.Response(body=body, content_type="application/json")

    async def _file(self, request: web.Request) -> web.StreamResponse:
        path = request.match_info["path"]
        self._record(request, path)
        if self.faults.status is not None:
            return web.Response(status=self.faults.status)
        if self.faults.busy > 0:
            self.faults.busy -= 1
            return web.Response(status=429, headers={"Retry-After": self.faults.retry_after})
        if path not in self.files:
            return web.Response(status=404)
        body = self.files[path]
        if path in self.faults.flip:
            body = body[:-1] + bytes([body[-1] ^ 0x01])
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._send(request, path, body)
        finally:
            self.in_flight -= 1

    async def _send(self, request: web.Request, path: str, body: bytes) -> web.StreamResponse:
        start, status = 0, 200
        headers: dict[str, str] = {}
        ranged = request.headers.get("Range")
        if ranged is not None:
            start = int(ranged.removeprefix("bytes=").removesuffix("-"))
            if start >= len(body):
                return web.Response(status=416)
            status = 206
            shown = start - 1 if path in self.faults.shifted_range else start
            headers["Content-Range"] = f"bytes {shown}-{len(body) - 1}/{len(body)}"
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = len(body) - start
        await response.prepare(request)
        await asyncio.sleep(0)  # let other requests overlap, so concurrency shows
        cut = self.faults.cut_at.pop(path, None)
        stall = self.faults.stall_at.pop(path, None)
        if cut is not None:
            self.faults.status = self.faults.status_after_cut or self.faults.status
            await response.write(body[start:cut])
            assert request.transport is not None
            request.transport.abort()
            return response
        if stall is not None:
            await response.write(body[start:stall])
            await self._stalled.wait()  # silent until the server stops
            return response
        await response.write(body[start:])
        await response.write_eof()
        return response


@dataclasses.dataclass
class HttpOrigin:
    """A plain HTTP origin serving `body` at /models/model.bin, honouring Range (unless
    `ignore_range`); `ranges`: the Range of each GET. Faults: the first GETs answered
    `statuses` (in turn), the first one cut after `cut_first_at` bytes, `headers` added to
    every answer (e.g. a Content-Encoding, a Content-Range), `extra` bytes sent past the
    body, every GET redirected to `redirect` (a Location)."""

    body: bytes
    ignore_range: bool = False
    cut_first_at: int | None = None
    statuses: list[int] = dataclasses.field(default_factory=list)
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    extra: bytes = b""
    redirect: str | None = None
    ranges: list[str | None] = dataclasses.field(default_factory=list)
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/models/model.bin"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ranged = request.headers.get("Range")
        self.ranges.append(ranged)
        if self.redirect is not None:
            return web.Response(status=302, headers={"Location": self.redirect})
        if self.statuses:
            return web.Response(status=self.statuses.pop(0))
        start = 0
        if ranged is not None and not self.ignore_range:
            start = int(ranged.removeprefix("bytes=").removesuffix("-"))
        headers = {}
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(self.body) - 1}/{len(self.body)}"
        response = web.StreamResponse(
            status=206 if start else 200, headers={**headers, **self.headers}
        )
        if not self.extra:  # else chunked: no Content-Length gives the excess away
            response.content_length = len(self.body) - start
        await response.prepare(request)
        cut, self.cut_first_at = self.cut_first_at, None
        if cut is not None:
            await response.write(self.body[start:cut])
            assert request.transport is not None
            request.transport.abort()
            return response
        await response.write(self.body[start:] + self.extra)
        await response.write_eof()
        return response

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[HttpOrigin]:
        app = web.Application()
        app.router.add_get("/models/model.bin", self.handle)
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = runner.addresses[0][1]
        try:
            yield self
        finally:
            await runner.cleanup()
