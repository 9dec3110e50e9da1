"""The origin as the last source of a peer-mode fetch (`download.peerfetch`): a file whose
peer transfer broke off is finished from the origin by Range instead of starting over.

Only for an `http(s)://` model that KServe's storage initializer stores as it is: one file
named after the URL's last path segment, no archive, no compression (`Origin.of`), read
without credentials (the agent passes `--resume-origin` only to Jobs that carry none).

Contract:
- `Origin.of(uri)` is that origin (`api.peer.http_origin_path`), or `ValueError` saying why
  the URI is not one.
- `resume(origin, why, entry=, offset=, write=, ...)`: `finish`es the file that the peers
  broke off (`why`); `peersources.use_origin` with `why` (and the origin's answer) when there
  is no origin, it is not the origin's file, or the origin refuses.
- `finish(origin, path, offset=, size=, write=, ...)`: asks the origin for bytes
  `offset`..`size`-1 of `path` (no request when `path` is not the origin's file: `Refused`),
  `Range: bytes=<offset>-` (none from 0), `Accept-Encoding: identity`; the answer must be 206
  (200 from offset 0) with exactly that extent (`peersources.check_extent`) and no content
  encoding, else `Refused`. Each chunk goes to `write` as it comes; a transport failure is
  retried from where it stopped, with backoff, `ATTEMPTS` times in all. Redirects are checked
  as `download.http` checks them. Verification is the caller's: it holds the running hash.
- Every connect and read has `io_timeout`; the caller's deadline bounds the whole.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import aiohttp
import structlog

from localcache.api import peer
from localcache.download import http, peersources
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
        return cls(url=uri, path=peer.http_origin_path(uri))


async def resume(
    origin: Origin | None,
    why: str,
    *,
    entry: peer.ManifestFile,
    offset: int,
    write: Callable[[bytes], None],
    io_timeout: float,
    clock: clock_mod.Clock,
) -> None:
    """`finish` the file the peers broke off (`why`), else `peersources.use_origin`."""
    if origin is None or origin.path != entry.path:
        raise peersources.use_origin(why)
    log.info("fetch.origin_resume", path=entry.path[:200], offset=offset, why=why)
    try:
        await finish(
            origin, entry.path, offset=offset, size=entry.size, write=write,
            io_timeout=io_timeout, clock=clock,
        )  # fmt: skip
    except Refused as exc:
        raise peersources.use_origin(f"{why}; the origin did not finish it: {exc}") from None


async def finish(
    origin: Origin,
    path: str,
    *,
    offset: int,
    size: int,
    write: Callable[[bytes], None],
    io_timeout: float,
    clock: clock_mod.Clock,
) -> int:
    """Fetch bytes `offset`..`size`-1 of `path` from the origin (module doc); the count."""
    if path != origin.path:
        raise Refused(f"{path[:80]!r} is not the origin's file")
    timeout = aiohttp.ClientTimeout(
        total=None, connect=io_timeout, sock_connect=io_timeout, sock_read=io_timeout
    )
    internal = await http.is_internal_url(origin.url)
    got, last = 0, ""
    async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
        for attempt in range(ATTEMPTS):
            if attempt:
                await clock.sleep(BACKOFF_S * 2 ** (attempt - 1))
            start = offset + got
            try:
                got += await _once(session, origin, start, size, write, internal=internal)
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
    if response.status in (429, 500, 502, 503, 504):
        raise _Broken(f"HTTP {response.status}", 0)
    if response.status != expected:
        raise Refused(f"HTTP {response.status} (expected {expected})")
    if response.headers.get("Content-Encoding", "identity").lower() != "identity":
        raise Refused("the origin sent an encoded body")
    try:
        peersources.check_extent(response, offset=start, size=size)
    except peersources.SourceFailure as failure:
        raise Refused(failure.reason) from None
