"""The origin as the last source of a peer-mode fetch (`download.peerfetch`): a file whose
peer transfer broke off is finished from the origin where the peers stopped, instead of
starting over.

Only for an `http(s)://` model that KServe's storage initializer stores as it is: one file
named after the URL's last path segment, no archive, no compression (`Origin.of`), read
without credentials (the agent passes `--resume-origin` only to Jobs that carry none).

Contract:
- `Origin.of(uri)` is that origin (`api.originpaths.http_origin_path`), or `ValueError` saying why
  the URI is not one.
- `complete(origin, file, board, why, ...)`: the rest of `file` (which no peer could finish:
  `why`) from the origin (`finish`), its bytes counted in `board.origin_bytes`; the file must
  then verify (`FileWrite.verified`). When it does not and peers sent part of it, the origin
  is asked once more for the whole file: if that verifies, the peers that sent the first part
  are `Board.corrupted` (named in the report); else the origin's bytes are not the manifest's.
  `peersources.use_origin` (carrying `why` and the origin's answer) when there is no origin,
  the file is not the origin's, the origin refuses, or the bytes do not verify.
- `finish(origin, path, offset=, size=, write=, ...)`: asks the origin for bytes
  `offset`..`size`-1 of `path` (no request when `path` is not the origin's file: `Refused`;
  none when nothing is left), `Range: bytes=<offset>-` (none from 0), `Accept-Encoding:
  identity`; the answer must be 206 (200 from offset 0) with exactly that extent
  (`peersources.check_extent`) and no content encoding, else `Refused`. Each chunk goes to
  `write` as it comes; a transport failure, 429 or 5xx is retried from where it stopped, with
  backoff, `ATTEMPTS` times in all. Redirects are checked as `download.http.follow` checks
  them. Proxies come from the environment, as for the storage initializer's requests.
- Every connect (and the name lookup of the redirect check) has `connect_timeout`, every read
  `io_timeout`; the caller's deadline bounds the whole.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import aiohttp
import structlog

from localcache.api import originpaths
from localcache.download import http, peerfile, peersources
from localcache.runtime import clock as clock_mod

log = structlog.get_logger(__name__)

ATTEMPTS: Final = 3
BACKOFF_S: Final = 1.0


class Refused(Exception):
    """The origin cannot finish the file (the message says why, one line, no secret)."""


@dataclass(frozen=True, slots=True)
class Origin:
    url: str
    path: str
    """The file's path in the model folder (the storage initializer's name for it)."""

    @classmethod
    def of(cls, uri: str) -> Origin:
        return cls(url=uri, path=originpaths.http_origin_path(uri))


async def complete(
    origin: Origin | None,
    file: peerfile.FileWrite,
    board: peersources.Board,
    why: str,
    *,
    connect_timeout: float,
    io_timeout: float,
    clock: clock_mod.Clock,
) -> None:
    """Finish `file` from the origin, verified (module doc), else "use origin"."""
    if origin is None or origin.path != file.entry.path:
        raise peersources.use_origin(why)

    def write(chunk: bytes) -> None:
        file.absorb(chunk, None)
        board.origin_bytes += len(chunk)

    suspects = set(file.contributors)
    for again in (False, True):
        if again:
            if not suspects:
                break
            file.reset()  # which peer bytes were bad is unknown: the whole file once more
        log.info("fetch.origin_finish", path=file.entry.path[:200], offset=file.written, why=why)
        try:
            await finish(
                origin, file.entry.path, offset=file.written, size=file.entry.size, write=write,
                connect_timeout=connect_timeout, io_timeout=io_timeout, clock=clock,
            )  # fmt: skip
        except Refused as exc:
            raise peersources.use_origin(f"{why}; the origin did not finish it: {exc}") from None
        if file.verified():
            if again:
                peerfile.blame(board, file.entry.path, suspects)
            return
    raise peersources.use_origin(f"{why}; the origin's bytes fail the manifest's sha256")


async def finish(
    origin: Origin,
    path: str,
    *,
    offset: int,
    size: int,
    write: Callable[[bytes], None],
    connect_timeout: float,
    io_timeout: float,
    clock: clock_mod.Clock,
) -> int:
    """Fetch bytes `offset`..`size`-1 of `path` from the origin (module doc); the count."""
    if path != origin.path:
        raise Refused(f"{path[:80]!r} is not the origin's file")
    if offset >= size:
        return 0
    timeout = aiohttp.ClientTimeout(
        total=None, connect=connect_timeout, sock_connect=connect_timeout, sock_read=io_timeout
    )
    try:
        async with asyncio.timeout(connect_timeout):
            internal = await http.is_internal_url(origin.url)
    except TimeoutError:
        raise Refused("resolving the origin's name timed out") from None
    got, last = 0, ""
    # the storage initializer's requests honour HTTP(S)_PROXY: so does this
    session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False, trust_env=True)
    async with session:
        for attempt in range(ATTEMPTS):
            if attempt:
                await clock.sleep(BACKOFF_S * 2 ** (attempt - 1))
            try:
                got += await _once(session, origin, offset + got, size, write, internal=internal)
                return got
            except _Broken as exc:
                got += exc.got
                last = exc.reason
                log.info("fetch.origin_broke", at=offset + got, reason=last)
    raise Refused(f"the origin broke off {ATTEMPTS} times ({last})")


class _Broken(Exception):
    def __init__(self, reason: str, got: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.got = got


async def _once(
    session: aiohttp.ClientSession,
    origin: Origin,
    start: int,
    size: int,
    write: Callable[[bytes], None],
    *,
    internal: bool,
) -> int:
    headers = {"Accept-Encoding": "identity"}
    if start:
        headers["Range"] = f"bytes={start}-"
    got = 0
    try:
        response = await http.follow(
            session, origin.url, internal_redirects=internal, headers=headers
        )
        async with response:
            _check(response, start=start, size=size)
            async for chunk in response.content.iter_chunked(http.CHUNK_BYTES):
                if len(chunk) > size - start - got:
                    raise Refused("the origin sent more bytes than the file's size")
                write(chunk)
                got += len(chunk)
    except http.DownloadError as exc:  # a redirect refused
        raise Refused(peersources.short(exc)) from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise _Broken(peersources.short(exc) or "stalled", got) from None
    if start + got < size:
        raise _Broken(f"the stream ended at {start + got} of {size} bytes", got)
    return got


def _check(response: aiohttp.ClientResponse, *, start: int, size: int) -> None:
    expected = 206 if start else 200
    if response.status in http.TRANSIENT_STATUSES:
        raise _Broken(f"HTTP {response.status}", 0)
    if response.status != expected:
        raise Refused(f"HTTP {response.status} (expected {expected})")
    if response.headers.get("Content-Encoding", "identity").lower() != "identity":
        raise Refused("the origin sent an encoded body")
    try:
        peersources.check_extent(response, offset=start, size=size)
    except peersources.SourceFailure as failure:
        raise Refused(failure.reason) from None
