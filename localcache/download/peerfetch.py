"""The transfer engine of `localcache fetch`: a model folder from peers, verified, atomically.

Contract (`fetch`):
- Follow mode (`digest` = `peer.FOLLOW`): the sources may still be downloading the model and
  serve manifests with `complete: false` (their whole files so far; 503 while they have none,
  waited for until the deadline); each manifest's files are fetched as they come and a source
  is asked again every `FOLLOW_POLL_S` once all known are taken, until a complete manifest
  ends the listing. A file whose entry changes between two manifests, or that the complete one
  does not list: "use origin"; a 404 is a strike (a source moves its folder into place).
- The manifest comes from the first live source (`peersources.Board`, rank order) that
  answers 200 with at most `MAX_MANIFEST_BYTES`; it is refused (that source banned, the next
  one asked) unless it parses (`api.peer.PeerManifest`: bounded, safe paths), names the
  storage key asked for and both its stated and its computed digest equal `digest`. Files
  summing past `max_bytes`, or a tree `peerlayout.check` refuses: "use origin".
- Files are fetched by at most `concurrency` workers, each from the best live source, into a
  staging directory under `dest` (`download.staging`), hashed (sha256) while streamed; never
  more bytes than the manifest's size are read (a Content-Length or Content-Range that
  disagrees bans the source). A broken or stalled stream (no byte for `stall_timeout`) is
  resumed by `Range: bytes=<written>-` from the next source, the running hash carried on
  (a 206 must start exactly there). 429/503 move on to the next source; after a full pass over
  the live sources without progress the worker backs off (Retry-After honoured, at most
  `peersources.MAX_RETRY_AFTER_S`). Each file is written as `<path>.localcache-part` and
  renamed once verified and fsynced. A file whose size or sha256 is wrong is discarded and
  every source that contributed to it banned for the run. 401, 403, 404, 416, TLS failures and
  protocol violations ban the source; transport failures and 500/502/504 strike it
  (`peersources.MAX_STRIKES` ban it). A file no live source can serve (`ROUNDS` passes without
  progress, or no source left) is finished from `origin` by Range (`download.peerorigin`,
  its bytes in `Board.origin_bytes`; still verified) when it is the origin's file, else the
  run ends with "use origin".
- Only after every file verified and fsynced are the links made (and checked against the
  staging directory's real path) and the tree committed into `dest` (`staging.commit`).
  On any failure nothing of this run remains in `dest`, and a `dest` it created is removed.
- Every connect has `connect_timeout`, every read `stall_timeout`, the whole run `deadline`
  (past it: "use origin").
- Errors: `peersources.FetchError` (`use_origin` or a local failure such as a full disk).
  The token is never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import ssl
from pathlib import Path
from typing import Final

import aiohttp
import pydantic
import structlog
import yarl

from localcache.api import peer
from localcache.download import (
    http,
    peerfile,
    peerfollow,
    peerlayout,
    peerorigin,
    peersources,
    staging,
)
from localcache.runtime import clock as clock_mod

log = structlog.get_logger(__name__)

DEFAULT_CONCURRENCY: Final = 4
DEFAULT_STALL_S: Final = 30.0
DEFAULT_CONNECT_S: Final = 10.0
MAX_MANIFEST_BYTES: Final = 32 << 20
ROUNDS: Final = 3
BACKOFF_S: Final = 0.5
FOLLOW_POLL_S: Final = 1.0
"""Follow mode: how often a source still downloading is asked for its manifest again."""
_Failure = peersources.SourceFailure
_NEW_FILE: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    """What to fetch, from whom, and the limits of the run."""

    storage_key: str
    digest: str
    credentials: peersources.Credentials
    server_name: str = peer.SERVER_NAME
    max_bytes: int
    deadline: float
    stall_timeout: float = DEFAULT_STALL_S
    connect_timeout: float = DEFAULT_CONNECT_S
    concurrency: int = DEFAULT_CONCURRENCY
    clock: clock_mod.Clock = dataclasses.field(default_factory=clock_mod.SystemClock)
    origin: peerorigin.Origin | None = None
    """The last source of the file it stores (`download.peerorigin`), when usable."""


async def fetch(request: Request, dest: Path, board: peersources.Board) -> int:
    """Fetch the model into `dest` (module doc); return its size in bytes."""
    if not board.live():
        raise peersources.use_origin("no peer source given")
    created = await asyncio.to_thread(staging.prepare_dest, dest)
    stage: Path | None = None
    try:
        try:
            async with asyncio.timeout(request.deadline), session(request) as client:
                run = _Run(request, client, board)
                first = await run.manifest()
                stage = await asyncio.to_thread(staging.new_staging, dest)
                await asyncio.to_thread(peerlayout.make_dirs, first, stage)
                manifest = await run.files(first, stage)
                await asyncio.to_thread(peerlayout.make_dirs, manifest, stage)
        except TimeoutError:
            raise peersources.use_origin(
                f"the peers did not finish within {request.deadline:g} s (--deadline)"
            ) from None
        await asyncio.to_thread(peerlayout.make_links, manifest, stage)
        await asyncio.to_thread(peerlayout.fsync_tree, stage)
        await asyncio.to_thread(staging.commit, stage, dest)
    except OSError as exc:
        await asyncio.to_thread(staging.clean_up, stage, dest if created else None)
        raise peersources.local_failure(f"{dest}: {staging.os_message(exc)}") from None
    except BaseException:
        staging.clean_up(stage, dest if created else None)  # also on cancellation
        raise
    await asyncio.to_thread(staging.clean_up, stage, None)
    log.info("fetch.done", dest=str(dest), bytes=manifest.bytes, sources=dict(board.bytes))
    return manifest.bytes


def session(request: Request) -> aiohttp.ClientSession:
    """A client session for the peers of `request` (`peersources.session`)."""
    return peersources.session(
        request.credentials, limit=request.concurrency + 1,
        connect_timeout=request.connect_timeout, stall_timeout=request.stall_timeout,
    )  # fmt: skip


class _Run:
    def __init__(
        self, request: Request, session: aiohttp.ClientSession, board: peersources.Board
    ) -> None:
        self.request = request
        self.session = session
        self.board = board
        self.following = request.digest == peer.FOLLOW

    # ------------------------------------------------------------------------- manifest

    async def manifest(self) -> peer.PeerManifest:
        reasons: list[str] = []
        attempt = 0
        while attempt < ROUNDS or self.following:  # a source still downloading is waited for
            attempt += 1
            waits: list[float] = []
            for source in self.board.live():
                try:
                    manifest = await self._manifest_from(source)
                except _Failure as failure:
                    self._failed(source, failure, what="manifest")
                    reasons = [*reasons[-2:], f"{source.node}: {failure.reason}"]
                    if failure.kind != "ban":
                        waits.append(failure.wait)
                    continue
                peerlayout.check(manifest, max_bytes=self.request.max_bytes)
                if manifest.complete:  # not every poll of a source still downloading
                    log.info(
                        "fetch.manifest", source=source.node, files=len(manifest.files),
                        bytes=manifest.bytes,
                    )  # fmt: skip
                return manifest
            if not waits:
                break
            if self.following:  # a source with nothing yet: ask again soon
                await self.request.clock.sleep(max(FOLLOW_POLL_S, min(max(waits), 5.0)))
            else:
                await self._back_off(attempt - 1, max(waits))
        raise peersources.use_origin("no peer served the manifest: " + "; ".join(reasons))

    async def _manifest_from(self, source: peersources.Source) -> peer.PeerManifest:
        url = source.manifest_url(self.request.storage_key)
        try:
            async with self._get(url, headers={}) as resp:
                peersources.check_status(resp, expected=200, lenient_404=self.following)
                if (resp.content_length or 0) > MAX_MANIFEST_BYTES:
                    raise _Failure("ban", f"manifest of {resp.content_length} bytes is too large")
                body = bytearray()
                async for chunk in resp.content.iter_chunked(http.CHUNK_BYTES):
                    body += chunk
                    if len(body) > MAX_MANIFEST_BYTES:
                        raise _Failure("ban", f"manifest larger than {MAX_MANIFEST_BYTES} bytes")
        except (ssl.SSLError, aiohttp.ClientSSLError) as exc:
            raise _Failure("ban", f"TLS: {peersources.short(exc)}") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _Failure("strike", peersources.short(exc) or "timed out") from None
        try:
            manifest = peer.PeerManifest.model_validate_json(body)
        except pydantic.ValidationError as exc:
            first = exc.errors()[0] if exc.errors() else {"msg": "invalid"}
            raise _Failure("ban", f"invalid manifest: {str(first.get('msg'))[:120]}") from None
        if manifest.storage_key != self.request.storage_key:
            raise _Failure("ban", "the manifest is of another storage key")
        if manifest.computed_digest() != manifest.digest:
            raise _Failure("ban", "the manifest's digest is not that of its listing")
        if not self.following and (not manifest.complete or manifest.digest != self.request.digest):
            raise _Failure("ban", "the manifest's digest is not the expected one")
        return manifest

    # ---------------------------------------------------------------------------- files

    async def files(self, first: peer.PeerManifest, stage: Path) -> peer.PeerManifest:
        """Fetch every file of `first`; while the sources still download the model (follow
        mode), also those of the manifests they serve later: the complete one is returned."""
        clock = self.request.clock
        queue: asyncio.Queue[peer.ManifestFile | None] = asyncio.Queue()
        offered = peerfollow.Offered(max_bytes=self.request.max_bytes, now=clock.now())

        async def worker() -> None:
            while (entry := await queue.get()) is not None:
                await self._file(entry, stage)

        workers = self.request.concurrency if not first.complete else len(first.files)
        workers = max(1, min(self.request.concurrency, workers))
        manifest = first
        try:
            async with asyncio.TaskGroup() as group:
                for i in range(workers):
                    group.create_task(worker(), name=f"localcache-fetch-worker-{i}")
                for entry in offered.add(manifest, now=clock.now()):
                    queue.put_nowait(entry)
                while not manifest.complete:
                    await clock.sleep(FOLLOW_POLL_S)
                    offered.progress(sum(self.board.bytes.values()), now=clock.now())
                    if offered.stalled(clock.now()):
                        raise peersources.use_origin(
                            f"the sources listed no new file for {peerfollow.FOLLOW_PATIENCE_S:g} s"
                        )
                    if queue.empty():  # every file known is taken: ask for more
                        manifest = await self.manifest()
                        for entry in offered.add(manifest, now=clock.now()):
                            queue.put_nowait(entry)
                for _ in range(workers):
                    queue.put_nowait(None)
        except BaseExceptionGroup as errors:
            raise peersources.first_error(errors) from None
        gone = offered.missing(manifest)
        if gone is not None:
            raise peersources.use_origin(f"{gone[:80]!r} is not in the sources' complete manifest")
        return manifest

    async def _file(self, entry: peer.ManifestFile, stage: Path) -> None:
        path = stage / entry.path
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + peer.PART_SUFFIX)
        fd = os.open(part, _NEW_FILE, 0o644)
        with os.fdopen(fd, "wb") as out:
            job = peerfile.FileWrite(entry, out)
            if entry.size > 0:
                await self._transfer(job)
            elif not job.verified():
                raise peersources.use_origin(f"{entry.path[:80]!r}: sha256 of an empty file")
            out.flush()
            # off the loop: a multi-GB fsync must not stall the other streams in flight
            await asyncio.to_thread(os.fsync, out.fileno())
        # under its name only once verified: the agent serves complete names to other peers
        os.rename(part, path)
        log.info("fetch.file", path=entry.path[:200], bytes=entry.size)

    async def _transfer(self, job: peerfile.FileWrite) -> None:
        """Complete `job` from the live sources, best first, in passes (module doc)."""
        rank = {s.node: i for i, s in enumerate(self.board.sources)}
        previous: peersources.Source | None = None
        idle = passes = 0  # attempts, and whole passes, without progress
        progressed = False
        waits: list[float] = []
        last = "no source tried"
        while True:
            live = self.board.live()
            if not live or idle >= ROUNDS * len(live):
                banned = self.board.why_banned()
                why = f"no peer could serve {job.entry.path[:80]!r} ({last}" + (
                    f"; banned: {banned})" if banned else ")"
                )
                return await self._from_origin(job, why)
            after = -1 if previous is None else rank[previous.node]
            source = next((s for s in live if rank[s.node] > after), live[0])
            if previous is not None and rank[source.node] <= after:  # a new pass
                if not progressed:
                    await self._back_off(passes, max(waits, default=0.0))
                    passes += 1
                progressed = False
                waits.clear()
            previous, before = source, job.written
            try:
                await self._stream(source, job)
            except _Failure as failure:
                last = f"{source.node}: {failure.reason}"
                self._failed(source, failure, what=job.entry.path)
                waits.append(failure.wait)
                if job.written > before:
                    idle = passes = 0
                    progressed = True
                else:
                    idle += 1
                continue
            if job.verified():
                return
            peerfile.blame(self.board, job.entry.path, job.contributors)
            last = "sha256 mismatch"
            job.reset()
            previous, idle, passes = None, 0, 0

    async def _stream(self, source: peersources.Source, job: peerfile.FileWrite) -> None:
        """Fetch the rest of `job` from `source`; `_Failure` unless the file is complete."""
        size = job.entry.size
        headers = {"Range": f"bytes={job.written}-"} if job.written else {}
        url = source.file_url(self.request.storage_key, job.entry.path)
        try:
            async with self._get(url, headers=headers) as resp:
                expected = 206 if job.written else 200
                peersources.check_status(resp, expected=expected, lenient_404=self.following)
                peersources.check_extent(resp, offset=job.written, size=size)
                async for chunk in resp.content.iter_chunked(http.CHUNK_BYTES):
                    if len(chunk) > size - job.written:
                        raise _Failure("ban", "sent more bytes than the manifest's size")
                    job.absorb(chunk, source)
                    self.board.received(source, len(chunk))
        except (ssl.SSLError, aiohttp.ClientSSLError) as exc:
            raise _Failure("ban", f"TLS: {peersources.short(exc)}") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _Failure("strike", peersources.short(exc) or "stalled") from None
        if job.written < size:
            raise _Failure("strike", f"stream ended at {job.written} of {size} bytes")

    async def _from_origin(self, job: peerfile.FileWrite, why: str) -> None:
        await peerorigin.complete(
            self.request.origin, job, self.board, why,
            connect_timeout=self.request.connect_timeout,
            io_timeout=self.request.stall_timeout, clock=self.request.clock,
        )  # fmt: skip

    # -------------------------------------------------------------------------- helpers

    def _get(
        self, url: str, *, headers: dict[str, str]
    ) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]:
        return self.session.get(
            yarl.URL(url, encoded=True),
            headers={
                **self.request.credentials.headers(),
                "Accept-Encoding": "identity",
                **headers,
            },
            ssl=self.request.credentials.ssl,
            server_hostname=self.request.server_name,
            allow_redirects=False,
        )

    def _failed(self, source: peersources.Source, failure: _Failure, *, what: str) -> None:
        if failure.kind == "ban":
            self.board.ban(source, failure.reason)
        elif failure.kind == "strike":
            self.board.strike(source, failure.reason)
        log.info(
            "fetch.source_failed", source=source.node, what=what[:200], kind=failure.kind,
            reason=failure.reason,
        )  # fmt: skip

    async def _back_off(self, attempt: int, wait: float) -> None:
        delay = max(wait, BACKOFF_S * 2 ** min(attempt, 6))
        await self.request.clock.sleep(min(delay, peersources.MAX_RETRY_AFTER_S))
