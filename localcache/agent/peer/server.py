"""The peer server: this node's complete, hashed model folders, and the whole files of its
downloads in progress (`manifest.complete` false), for trusted download pods.

Wire (`peer.WIRE_PREFIX` = /p2p/v1), `Authorization: Bearer <token>` on every request:
- `GET /p2p/v1/models/{storageKey}/manifest`: the folder's `PeerManifest` (JSON, camelCase).
- `GET /p2p/v1/models/{storageKey}/files/{path}`: one file listed in that manifest, whole
  (200) or one range (`Range: bytes=N-` or `bytes=N-M`: 206 with `Content-Range`).
- `GET .../proofs/nonce` (`peer.ProofNonce`): a single-use nonce for the caller's next proof;
  `POST .../proofs` (`peer.ProofRequest`): a download pod of a scope this node's folder does
  not list proves at the origin that it may read the model (`agent.peer.proofs`; answer
  `peer.ProofAnswer`); a scope that needs none is answered proven at once. A proven scope is
  then served that folder (same digest) like its own while the proof holds; without
  `prover`, both answer 403 `proof-disabled`.
Answers: 401 no/bad token, 403 not entitled, 404 unknown key/folder/file or a file on disk
that is not what the manifest lists (counted `stale`; 503 `moving` + `Retry-After` for a
download in progress, whose files move into place when it completes; 503 `nothing-yet` for
one without a whole file yet, `not-yet` for a file it does not list yet), 416 bad range,
429 + `Retry-After` (1..5 s) beyond the upload slots, 503 (+ `Retry-After`) while stopping
or when the apiserver cannot be asked. Order: stopping, key format, token presence, folder
lookup, authorization, file membership, upload slot, open, range.

Serving rules: only paths listed in `manifest.files` (never dirs, links, others, never
anything else); opened beneath the folder without following any symlink
(`files.open_beneath`), a regular file whose size equals the manifest's, streamed from that fd
in `chunk_size` pieces through the shared `TokenBucket`; each write must drain within
`stall_timeout_s` (a reader that stops reading loses its slot). Bodies are not read.

`FolderSource` is the agent's: `scopes(key)` (in memory) to authorize against, then
`lookup(key, scope)`: the `ServedFolder` (folder path, manifest, scope digests) that the
requester's scope proved, or None; `complete(key)`: the complete folder proofs are checked
against. `PeerServer.start(host, port, ssl_context)` binds (port
0: any; the bound port is returned and in `port`); `stop(grace_s=0)` refuses new requests
with 503, lets in-flight streams run for up to `grace_s`, then cancels and awaits them, then
closes the listener. Metrics: `metrics.PeerMetrics` (sent bytes by receiving node, refusals
by reason, uploads in flight). `on_refusal(reason, storage_key)` is called for every authorization
refusal (for Events). Tokens are never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NoReturn, Protocol

import structlog
from aiohttp import web

from localcache.agent.peer import auth, files, proofs, throttle
from localcache.api import peer
from localcache.runtime import metrics as metrics_mod
from localcache.runtime.serving import httpserver

log = structlog.get_logger(__name__)
KEY_PATTERN: Final = re.compile(r"[0-9a-f]{16}")
CHUNK_SIZE: Final = 256 * 1024
STALL_TIMEOUT_S: Final = 60.0
_INDEX_CACHE: Final = 16


@dataclass(frozen=True, slots=True)
class ServedFolder:
    """A folder this node serves: where it is, its manifest, the scopes entitled to it."""

    path: Path
    manifest: peer.PeerManifest
    scopes: frozenset[str]


class FolderSource(Protocol):
    def scopes(self, storage_key: str) -> frozenset[str]:
        """Every scope entitled to some folder of `storage_key` (in memory: cheap)."""
        ...

    def lookup(self, storage_key: str, scope: str) -> ServedFolder | None:
        """The folder `scope` is entitled to (its manifest may be read from disk)."""
        ...

    def complete(self, storage_key: str) -> ServedFolder | None:
        """The storage key's complete folder a proof is checked against (its own first)."""
        ...


class Authorize(Protocol):
    async def identify(
        self, token: str | None, storage_key: str
    ) -> auth.Requester | auth.Refusal: ...


class _Refused(Exception):
    def __init__(self, status: int, reason: str, *, retry_after: int | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.retry_after = status, reason, retry_after


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, else None."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


class PeerServer:
    """See the module docstring."""

    def __init__(
        self,
        *,
        folders: FolderSource,
        authorizer: Authorize,
        slots: throttle.UploadSlots,
        bucket: throttle.TokenBucket,
        metrics: metrics_mod.PeerMetrics,
        on_refusal: Callable[[str, str], None] | None = None,
        prover: proofs.Prover | None = None,
        chunk_size: int = CHUNK_SIZE,
        stall_timeout_s: float = STALL_TIMEOUT_S,
        limits: httpserver.ServerLimits = httpserver.DEFAULT_LIMITS,
    ) -> None:
        self._folders = folders
        self._authorizer = authorizer
        self._slots = slots
        self._bucket = bucket
        self._metrics = metrics
        self._on_refusal = on_refusal
        self._prover = prover
        self._chunk = chunk_size
        self._stall_s = stall_timeout_s
        self._limits = limits
        self._closing = False
        self._streams: set[asyncio.Task[object]] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._runner: web.AppRunner | None = None
        self._index: dict[tuple[str, str], dict[str, peer.ManifestFile]] = {}
        self.port: int | None = None
        self.app = self.make_app()

    def make_app(self) -> web.Application:
        app = web.Application()
        base = f"{peer.WIRE_PREFIX}/models/{{key}}"
        app.router.add_get(f"{base}/manifest", self._manifest, allow_head=False)
        app.router.add_get(f"{base}/files/{{path:.+}}", self._file, allow_head=False)
        app.router.add_post(f"{base}/proofs", self._proof)
        app.router.add_get(f"{base}/proofs/nonce", self._nonce, allow_head=False)
        return app

    @property
    def closing(self) -> bool:
        return self._closing

    @property
    def streams_in_flight(self) -> int:
        return len(self._streams)

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> int:
        if self._runner is not None:
            raise RuntimeError("the peer server is already started")
        self._closing = False
        runner = httpserver.runner(self.app, limits=self._limits, shutdown_timeout=1.0)
        await runner.setup()
        try:
            site = httpserver.LimitedTCPSite(
                runner, host, port, ssl_context=ssl_context, limits=self._limits
            )
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = int(runner.addresses[0][1])
        log.info("peer.serving", host=host, port=self.port, tls=ssl_context is not None)
        return self.port

    async def stop(self, *, grace_s: float = 0.0) -> None:
        self._closing = True
        if grace_s > 0 and self._streams:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):
                    await self._idle.wait()
        streams = list(self._streams)
        for task in streams:
            task.cancel()
        if streams:
            await asyncio.wait(streams)
        if self._prover is not None:
            await self._prover.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        log.info("peer.stopped", cancelled=len(streams))

    # ------------------------------------------------------------------ handlers

    async def _manifest(self, request: web.Request) -> web.StreamResponse:
        try:
            served, _ = await self._admit(request)
        except _Refused as refused:
            return self._refused(refused)
        body = served.manifest.wire_json()
        return web.Response(text=body, content_type="application/json")

    async def _nonce(self, request: web.Request) -> web.StreamResponse:
        try:
            requester, _ = await self._identify(request)
            if self._prover is None:
                raise _Refused(403, "proof-disabled")
        except _Refused as refused:
            return self._refused(refused)
        nonce = self._prover.nonces.issue(requester.scope, request.match_info["key"])
        return web.json_response(text=peer.ProofNonce(nonce=nonce).model_dump_json())

    async def _proof(self, request: web.Request) -> web.StreamResponse:
        try:
            requester, _ = await self._identify(request)
            key = request.match_info["key"]
            folder = self._folders.complete(key)
            if folder is None:
                raise _Refused(404, "not-here")
            if requester.scope in folder.scopes:  # nothing to prove
                answer = peer.ProofAnswer(proven=True, digest=folder.manifest.digest)
                return web.json_response(text=answer.model_dump_json(by_alias=True))
            if self._prover is None or not folder.scopes:
                raise _Refused(403, "proof-disabled")
        except _Refused as refused:
            return self._refused(refused)
        timeout_s = self._limits.body_timeout_s
        status, answer = await self._prover.prove(
            proofs.Folder(folder.path, folder.manifest, min(folder.scopes)),
            requester.scope,
            lambda limit: proofs.read_request(request, limit, timeout_s=timeout_s),
        )
        if not answer.proven:
            self._metrics.refusals.inc(reason=answer.reason or "proof")
        text = answer.model_dump_json(by_alias=True, exclude_none=True)
        return web.json_response(text=text, status=status)

    async def _file(self, request: web.Request) -> web.StreamResponse:
        try:
            served, requester = await self._admit(request)
            entry = self._entry(served, request.match_info["path"])
            slot = self._slots.try_acquire((requester.namespace, requester.pod))
            if slot is None:
                raise _Refused(429, "busy", retry_after=self._slots.retry_after())
        except _Refused as refused:
            return self._refused(refused)
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        self._idle.clear()
        self._metrics.uploads_in_flight.inc()
        try:
            with slot:
                return await self._stream(request, served, entry, requester)
        finally:
            self._metrics.uploads_in_flight.dec()
            self._streams.discard(task)
            if not self._streams:
                self._idle.set()

    async def _identify(self, request: web.Request) -> tuple[auth.Requester, frozenset[str]]:
        if self._closing:
            raise _Refused(503, "shutting-down", retry_after=self._slots.retry_after())
        key = request.match_info["key"]
        if KEY_PATTERN.fullmatch(key) is None:
            raise _Refused(404, "not-here")
        token = bearer(request.headers.get("Authorization"))
        if token is None:
            self._refusal(auth.refusal("no-token"), key)
        # authorized before any manifest is read from disk: an unauthenticated caller costs
        # an in-memory lookup and (for a JWT-shaped token) one bounded TokenReview
        scopes = self._folders.scopes(key)
        if not scopes:
            raise _Refused(404, "not-here")
        try:
            decision = await self._authorizer.identify(token, key)
        except auth.Unavailable as exc:
            log.warning("peer.authorization_unavailable", storage_key=key, error=str(exc))
            raise _Refused(503, "unavailable", retry_after=self._slots.retry_after()) from None
        if isinstance(decision, auth.Refusal):
            self._refusal(decision, key)
        return decision, scopes

    async def _admit(self, request: web.Request) -> tuple[ServedFolder, auth.Requester]:
        requester, scopes = await self._identify(request)
        key = request.match_info["key"]
        own = requester.scope in scopes
        served = self._folders.lookup(key, requester.scope) if own else None
        if served is None or not served.manifest.complete:
            # what its scope proved at the origin, while the proof holds: rather than its
            # own download in progress on this node (which it would not follow)
            proven = self._prover.book.proven(requester.scope, key) if self._prover else None
            found = self._folders.lookup(key, proven.scope) if proven is not None else None
            if found is not None and proven is not None and found.manifest.digest == proven.digest:
                served = found
            elif not own:
                self._refusal(auth.refusal("other-scope"), key)
        if served is None or served.manifest.storage_key != key:
            raise _Refused(404, "not-here")
        if not served.manifest.complete and not served.manifest.files:
            raise _Refused(503, "nothing-yet", retry_after=1)  # its download has no file yet
        return served, requester

    def _refusal(self, refusal: auth.Refusal, key: str) -> NoReturn:
        log.info("peer.refused", storage_key=key, reason=refusal.reason)
        if self._on_refusal is not None:
            self._on_refusal(refusal.reason, key)
        raise _Refused(refusal.status, refusal.reason)

    def _entry(self, served: ServedFolder, path: str) -> peer.ManifestFile:
        manifest = served.manifest
        cache_key = (manifest.storage_key, manifest.digest)
        index = self._index.get(cache_key)
        if index is None or len(index) != len(manifest.files):
            index = {f.path: f for f in manifest.files}
            if len(self._index) >= _INDEX_CACHE:
                self._index.pop(next(iter(self._index)))
            self._index[cache_key] = index
        entry = index.get(path)
        if entry is None and not manifest.complete:  # perhaps whole at the next look
            raise _Refused(503, "not-yet", retry_after=1)
        if entry is None:
            raise _Refused(404, "not-listed")
        return entry

    def _refused(self, refused: _Refused) -> web.Response:
        self._metrics.refusals.inc(reason=refused.reason)
        headers = {"Retry-After": str(refused.retry_after)} if refused.retry_after else None
        return web.Response(status=refused.status, text=refused.reason + "\n", headers=headers)

    async def _stream(
        self,
        request: web.Request,
        served: ServedFolder,
        entry: peer.ManifestFile,
        requester: auth.Requester,
    ) -> web.StreamResponse:
        try:
            fd = await asyncio.to_thread(files.open_beneath, served.path, entry.path, entry.size)
        except files.Stale as exc:
            if not served.manifest.complete:  # a download in progress moves its files
                return self._refused(_Refused(503, "moving", retry_after=1))
            log.warning("peer.stale_file", storage_key=served.manifest.storage_key, error=str(exc))
            return self._refused(_Refused(404, "stale"))
        try:
            try:
                span = files.byte_range(request.headers.get("Range"), entry.size)
            except files.BadRange:
                response = self._refused(_Refused(416, "bad-range"))
                response.headers["Content-Range"] = f"bytes */{entry.size}"
                return response
            return await self._send(request, fd, entry, span, requester)
        finally:
            await asyncio.to_thread(_close, fd)

    async def _send(
        self,
        request: web.Request,
        fd: int,
        entry: peer.ManifestFile,
        span: tuple[int, int] | None,
        requester: auth.Requester,
    ) -> web.StreamResponse:
        first, last = span if span is not None else (0, entry.size - 1)
        response = web.StreamResponse(status=200 if span is None else 206)
        response.content_type = "application/octet-stream"
        response.content_length = last - first + 1
        response.headers["Accept-Ranges"] = "bytes"
        if span is not None:
            response.headers["Content-Range"] = f"bytes {first}-{last}/{entry.size}"
        await response.prepare(request)
        offset = first
        while offset <= last:
            length = min(self._chunk, last - offset + 1)
            data = await asyncio.to_thread(files.read_at, fd, offset, length)
            if not data:  # truncated under us: end the connection short, the reader verifies
                log.warning("peer.file_shrank", path_len=len(entry.path))
                raise ConnectionResetError("file shrank while served")
            await self._bucket.take(len(data))
            async with asyncio.timeout(self._stall_s):
                await response.write(data)
            self._metrics.bytes.inc(len(data), direction="sent", source=requester.node)
            offset += len(data)
        await response.write_eof()
        return response


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
