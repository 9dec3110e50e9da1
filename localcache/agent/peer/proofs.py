"""Cross-scope proofs: a download pod of another credential scope shows, at the origin, that it
may read every file of an `s3://` model; this node runs the proof and then serves it.

`Prover.prove(folder, requester_scope, read)` (the peer server calls it for
`POST /p2p/v1/models/{key}/proofs` from an identified download pod whose scope this node's
folder does not list; `read(limit)` reads and parses the body, `read_request`) answers
`(status, ProofAnswer)`:
- 429 `proof-busy` (nothing read) while a proof of the same (requester scope, storage key)
  runs, or `PROOFS_PER_SCOPE` of that scope (one scope never holds all the node's slots), or
  `PROOFS_AT_ONCE` proofs run on this node;
- 400 `proof-malformed`: a body over `body_limit(files)` (a bound by the folder's file count,
  at most `MAX_BODY_BYTES`), not read within the server's body timeout, or no `ProofRequest`;
- 403 `proof-nonce`: its `nonce` is not one this node issued to that requester scope for that
  storage key (`Nonces.issue`, `GET .../proofs/nonce`), unused, within `NONCE_TTL_S`; it is
  used up by the attempt, whatever its outcome;
- 403 `proof-disabled`: the node groups name no `proofOrigins`; 403 `proof-scheme`: the
  request's `uri` is not `s3://`, or its storage key is not the folder's;
- 409 `proof-files`: the folder holds links or other entries, or directories no file implies
  (what S3 and the storage initializer never make: not provable), or the heads do not name
  exactly the folder's files, each once (the copy differs from the origin's listing);
- 403 with a `presigned.Bad` reason for any head that is not a presigned HEAD of that file's
  object at an allowed origin, unexpired;
- each head is then run (HEAD, no redirects, `HEAD_TIMEOUT_S`, at most `HEADS_AT_ONCE` per
  proof and `MAX_HEADS` in all on this node; a head that expired while it waited for its
  turn -> 403 `proof-expired`); any answer but 200 -> 403 `proof-denied` (the origin refused
  the requester), a transport failure -> 503 `proof-unavailable`;
- 409 `proof-mismatch` unless each 200's `Content-Length` is the manifest's size and, once
  every HEAD answered (the signatures live 60 s), the object's full-object SHA-256 the origin
  answers (`x-amz-checksum-sha256`, for a presign that signed the checksum mode and an object
  stored with one) is the manifest's, or else its `ETag` is the MD5 of this node's file
  (`presigned.etag_matches`, at most `HASHING_AT_ONCE` files at once on this node, one
  hashing per folder digest, path and ETag however many proofs wait for it, which goes on
  when they give up, its result kept for `MD5_CACHE` files: a model is hashed once);
- else 200 `proven` with the folder's digest (the SHA-256s the origin answered go to
  `on_origin_sums(folder path, digest, {path: sha256})`, for the file list); `ProofBook`
  records (requester scope, storage key) -> (the folder's scope, digest), at most
  `MAX_PROOFS` (LRU); `proven(scope, key)` answers it for `PROOF_TTL_S` after its last use,
  at most `MAX_PROOF_LIFE_S` after the proof (a long transfer keeps it; a scope that stops
  fetching must prove again).
Nothing of the request is logged but counts and reasons (presigned URLs carry signatures).
No node's or pod's word is taken: the origin answers for the requester's credentials, and
its checksum or ETag is checked against this node's own bytes. `close()` cancels and awaits
the hashing still running (the threads finish their file).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import aiohttp
import pydantic
import structlog
import yarl
from aiohttp import web

from localcache.agent.peer import files, presigned
from localcache.api import originpaths, peer
from localcache.caching import keys
from localcache.runtime import clock as clock_mod

log = structlog.get_logger(__name__)

PROOF_TTL_S: Final = 600.0
MAX_PROOF_LIFE_S: Final = 6 * 3600.0
PROOFS_AT_ONCE: Final = 4
PROOFS_PER_SCOPE: Final = 2
NONCE_TTL_S: Final = 120.0
NONCES_PER_REQUESTER: Final = 8
NONCES_PER_SCOPE: Final = 64
MAX_NONCES: Final = 4096
MAX_PROOFS: Final = 4096
HEAD_TIMEOUT_S: Final = 10.0
HEADS_AT_ONCE: Final = 4
MAX_HEADS: Final = 16
HASHING_AT_ONCE: Final = 2
MD5_CACHE: Final = 4096
MAX_BODY_BYTES: Final = 16 * 1024 * 1024
BODY_BYTES_PER_FILE: Final = peer.MAX_PROOF_URL + peer.MAX_PATH + 64


@dataclass(frozen=True, slots=True)
class Proven:
    scope: str
    """The scope of the folder the requester proved (the one to serve it)."""
    digest: str
    expires: float
    since: float


@dataclass(frozen=True, slots=True)
class Folder:
    """The complete folder a proof is checked against (the peer server's `ServedFolder`)."""

    path: Path
    manifest: peer.PeerManifest
    scope: str


class ProofBook:
    """Proofs that passed, per (requester scope, storage key), bounded and expiring."""

    def __init__(self, clock: clock_mod.Clock, *, ttl_s: float = PROOF_TTL_S) -> None:
        self._clock, self._ttl = clock, ttl_s
        self._proofs: collections.OrderedDict[tuple[str, str], Proven] = collections.OrderedDict()

    def proven(self, scope: str, storage_key: str) -> Proven | None:
        """The proof of `scope` for `storage_key`, extended by its use; None when none holds."""
        key, now = (scope, storage_key), self._clock.now()
        found = self._proofs.get(key)
        if found is None or found.expires <= now:
            self._proofs.pop(key, None)
            return None
        expires = min(now + self._ttl, found.since + MAX_PROOF_LIFE_S)
        self._proofs[key] = found = dataclasses.replace(found, expires=expires)
        self._proofs.move_to_end(key)
        return found

    def record(self, scope: str, storage_key: str, folder: Folder) -> None:
        key, now = (scope, storage_key), self._clock.now()
        self._proofs[key] = Proven(folder.scope, folder.manifest.digest, now + self._ttl, now)
        self._proofs.move_to_end(key)
        while len(self._proofs) > MAX_PROOFS:
            self._proofs.popitem(last=False)


class Nonces:
    """Single-use proof nonces, each for `NONCE_TTL_S`: at most `NONCES_PER_REQUESTER`
    outstanding per (requester scope, storage key) and `NONCES_PER_SCOPE` per requester scope
    (that scope's oldest dropped: one scope asking without end never pushes out another's),
    `MAX_NONCES` in all (expired ones go first, then the oldest)."""

    def __init__(self, clock: clock_mod.Clock) -> None:
        self._clock = clock
        self._issued: collections.OrderedDict[str, tuple[str, str, float]] = (
            collections.OrderedDict()
        )

    def issue(self, scope: str, storage_key: str) -> str:
        now = self._clock.now()
        while self._issued and next(iter(self._issued.values()))[2] <= now:
            self._issued.popitem(last=False)  # issued in order, so expiring in order
        mine = [n for n, (sc, k, _) in self._issued.items() if (sc, k) == (scope, storage_key)]
        for stale in mine[: max(0, len(mine) - NONCES_PER_REQUESTER + 1)]:
            del self._issued[stale]
        ours = [n for n, (sc, _, _) in self._issued.items() if sc == scope]
        for stale in ours[: max(0, len(ours) - NONCES_PER_SCOPE + 1)]:
            del self._issued[stale]
        nonce = "lc-" + secrets.token_hex(16)
        self._issued[nonce] = (scope, storage_key, now + NONCE_TTL_S)
        while len(self._issued) > MAX_NONCES:
            self._issued.popitem(last=False)
        return nonce

    def take(self, nonce: str, scope: str, storage_key: str) -> bool:
        issued = self._issued.pop(nonce, None)
        return (
            issued is not None
            and issued[:2] == (scope, storage_key)
            and issued[2] > self._clock.now()
        )


class _Failed(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


class Prover:
    """See the module docstring."""

    def __init__(
        self,
        *,
        clock: clock_mod.Clock,
        origins: Callable[[], Sequence[str]],
        wall: Callable[[], float],
        session: Callable[[], aiohttp.ClientSession] | None = None,
        on_origin_sums: Callable[[Path, str, dict[str, str]], None] | None = None,
    ) -> None:
        self.book = ProofBook(clock)
        self._on_origin_sums = on_origin_sums
        self.nonces = Nonces(clock)
        self._origins, self._wall = origins, wall
        self._session_factory = session or _default_session
        self._heads = asyncio.Semaphore(MAX_HEADS)
        self._hashing = asyncio.Semaphore(HASHING_AT_ONCE)
        self._running: set[tuple[str, str]] = set()  # (requester scope, key) being proven
        self._md5: collections.OrderedDict[tuple[str, str, str], bool] = collections.OrderedDict()
        self._pending: dict[tuple[str, str, str], asyncio.Task[bool]] = {}

    async def prove(
        self,
        folder: Folder,
        requester_scope: str,
        read: Callable[[int], Awaitable[peer.ProofRequest | None]],
    ) -> tuple[int, peer.ProofAnswer]:
        key = folder.manifest.storage_key
        running = (requester_scope, key)
        of_scope = sum(1 for scope, _ in self._running if scope == requester_scope)
        if (
            running in self._running
            or of_scope >= PROOFS_PER_SCOPE
            or len(self._running) >= PROOFS_AT_ONCE
        ):
            return 429, peer.ProofAnswer(proven=False, reason="proof-busy")
        self._running.add(running)
        files = 0
        try:
            request = await read(body_limit(len(folder.manifest.files)))
            if request is None:
                raise _Failed(400, "proof-malformed")
            files = len(request.heads)
            if not self.nonces.take(request.nonce, requester_scope, key):
                raise _Failed(403, "proof-nonce")
            await self._check(folder, request)
        except _Failed as failed:
            log.info("peer.proof_refused", storage_key=key, reason=failed.reason, files=files)
            return failed.status, peer.ProofAnswer(proven=False, reason=failed.reason)
        finally:
            self._running.discard(running)
        self.book.record(requester_scope, key, folder)
        log.info("peer.proven", storage_key=key, files=files)
        return 200, peer.ProofAnswer(proven=True, digest=folder.manifest.digest)

    async def close(self) -> None:
        pending = list(self._pending.values())
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def _check(self, folder: Folder, request: peer.ProofRequest) -> None:
        endpoints = tuple(self._origins())
        if not endpoints:
            raise _Failed(403, "proof-disabled")
        try:
            located = originpaths.parse_s3(request.uri)
        except ValueError:
            raise _Failed(403, "proof-scheme") from None
        if keys.storage_key(request.uri) != folder.manifest.storage_key:
            raise _Failed(403, "proof-scheme")
        manifest = folder.manifest
        wanted = {f.path: f for f in manifest.files}
        implied = {"/".join(p.split("/")[:i]) for p in wanted for i in range(1, p.count("/") + 1)}
        if manifest.links or manifest.others or not set(manifest.dirs) <= implied:
            raise _Failed(409, "proof-files")  # the origin has objects, nothing else
        paths = [h.path for h in request.heads]
        if len(set(paths)) != len(paths) or set(paths) != set(wanted):
            raise _Failed(409, "proof-files")
        origin = presigned.Origin.at(endpoints, *located)
        now = self._wall()
        heads: list[tuple[peer.ManifestFile, presigned.Head]] = []
        for given in request.heads:
            checked = presigned.check_head(given.url, given.path, origin, now=now)
            if isinstance(checked, presigned.Bad):
                raise _Failed(403, checked.reason)
            heads.append((wanted[given.path], checked))
        gate = asyncio.Semaphore(HEADS_AT_ONCE)
        answers: dict[str, _Answer] = {}
        async with self._session_factory() as session:

            async def one(entry: peer.ManifestFile, head: presigned.Head) -> None:
                async with gate, self._heads:
                    if head.expires <= self._wall():  # waited past its life for a turn
                        raise _Failed(403, "proof-expired")
                    answers[entry.path] = await _head(session, head, entry.size, request.nonce)

            failed: list[_Failed] = []
            try:  # every HEAD first, while the signatures live; this node's bytes after
                async with asyncio.TaskGroup() as group:
                    for entry, head in heads:
                        group.create_task(one(entry, head))
            except* _Failed as failures:  # raised here, it would be grouped again
                failed = [f for f in failures.exceptions if isinstance(f, _Failed)]
            if failed:
                raise failed[0]
        for entry, _ in heads:
            answer = answers[entry.path]
            if answer.sha256 is not None:  # the origin's own checksum: no hashing
                same = answer.sha256 == entry.sha256
            else:
                same = await self._same_bytes(folder, entry, answer.etag)
            if not same:
                raise _Failed(409, "proof-mismatch")
        answered = {e.path: (e, answers[e.path].sha256) for e, _ in heads}
        sums = {p: sha for p, (e, sha) in answered.items() if sha and e.origin_sha256 != sha}
        if sums and self._on_origin_sums is not None:  # only what the list does not hold
            self._on_origin_sums(folder.path, manifest.digest, sums)

    async def _same_bytes(self, folder: Folder, entry: peer.ManifestFile, etag: str) -> bool:
        cache_key = (folder.manifest.digest, entry.path, etag)
        known = self._md5.get(cache_key)
        if known is not None:
            return known
        task = self._pending.get(cache_key)
        if task is None:  # one hashing per file, which outlives a proof that gives up
            task = asyncio.create_task(self._hash(folder, entry, etag, cache_key))
            self._pending[cache_key] = task
        return await asyncio.shield(task)

    async def _hash(
        self, folder: Folder, entry: peer.ManifestFile, etag: str, cache_key: tuple[str, str, str]
    ) -> bool:
        try:
            async with self._hashing:
                known = await asyncio.to_thread(_etag_of_file, folder.path, entry, etag)
            self._md5[cache_key] = known
            while len(self._md5) > MD5_CACHE:
                self._md5.popitem(last=False)
            return known
        finally:
            self._pending.pop(cache_key, None)


def body_limit(files: int) -> int:
    """The largest proof body for a folder of `files` files."""
    return min(MAX_BODY_BYTES, 4096 + files * BODY_BYTES_PER_FILE)


async def read_request(
    request: web.Request, limit: int, *, timeout_s: float
) -> peer.ProofRequest | None:
    """The request's `ProofRequest` body (at most `limit` bytes, read within `timeout_s`),
    else None."""
    if request.content_length is None or request.content_length > limit:
        return None
    try:
        async with asyncio.timeout(timeout_s):
            body = await request.content.readexactly(request.content_length)
    except (TimeoutError, asyncio.IncompleteReadError):
        return None
    try:
        return peer.ProofRequest.model_validate_json(body)
    except pydantic.ValidationError:
        return None


@dataclass(frozen=True, slots=True)
class _Answer:
    etag: str
    sha256: str | None
    """The object's full-object SHA-256 (hex), when the origin said it."""


async def _head(
    session: aiohttp.ClientSession, head: presigned.Head, size: int, nonce: str
) -> _Answer:
    """What a 200 answer whose length is `size` says of the object; `_Failed` otherwise."""
    headers = {"If-None-Match": peer.nonce_header(nonce)}
    if head.checksum:
        headers |= presigned.CHECKSUM_HEADERS
    url = yarl.URL(head.url, encoded=True)
    try:
        async with session.head(url, headers=headers, allow_redirects=False) as resp:
            if resp.status != 200:
                raise _Failed(403, "proof-denied")
            length = resp.headers.get("Content-Length")
            etag = resp.headers.get("ETag") or ""
            sha256 = originpaths.s3_checksum_sha256(
                resp.headers.get("x-amz-checksum-sha256"),
                resp.headers.get("x-amz-checksum-type"),
            )
    except (aiohttp.ClientError, TimeoutError):
        raise _Failed(503, "proof-unavailable") from None
    except ValueError:  # a URL or header aiohttp will not send
        raise _Failed(403, "proof-malformed") from None
    if length is None or not length.isdigit() or int(length) != size:
        raise _Failed(409, "proof-mismatch")
    return _Answer(etag, sha256)


def _etag_of_file(folder: Path, entry: peer.ManifestFile, etag: str) -> bool:
    try:
        fd = files.open_beneath(folder, entry.path, entry.size)
    except files.Stale:
        return False
    try:
        return presigned.etag_matches(fd, entry.size, etag)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def _default_session() -> aiohttp.ClientSession:
    timeout = aiohttp.ClientTimeout(total=HEAD_TIMEOUT_S, connect=HEAD_TIMEOUT_S)
    return aiohttp.ClientSession(timeout=timeout, trust_env=False, auto_decompress=False)
