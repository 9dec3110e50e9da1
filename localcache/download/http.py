"""HTTP(S) fetching for `localcache download` (`download.program`), and the limits of one
download.

- `fetch` streams one URL into a file: every connect and read has a timeout (`io_timeout`
  seconds of silence); transient failures (connection errors, timeouts, a body shorter than its
  Content-Length, HTTP 408, 429 and 5xx) are retried up to `attempts` times in all with
  exponential backoff and jitter (honouring a numeric Retry-After); other HTTP errors fail at
  once. Redirects are followed by hand (at most `MAX_REDIRECTS`) so that each target is checked
  before it is asked: unless `internal_redirects`, a target whose host is or resolves to an
  internal address (`is_internal_address`: loopback, link-local, unspecified, cloud metadata)
  is refused. Not promised: protection against DNS rebinding between check and connection.
- `Limits` is the byte budget and the deadline of one download; passing either is a final
  (not retried) `DownloadError`. The caller applies the deadline to `fetch` as a whole.
- `DownloadError` is the one error type of a download: a one-line message for the user.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import random
import time
import urllib.parse
from pathlib import Path

import aiohttp
import structlog

from localcache.runtime import clock as clock_mod
from localcache.runtime import errors

log = structlog.get_logger(__name__)

MAX_BACKOFF_S = 30.0
CHUNK_BYTES = 1 << 20
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
DEFAULT_MAX_BYTES = 2 << 40  # 2 TiB: a generous cap when the model's size is not known
DEFAULT_DEADLINE_S = 24 * 3600.0
MAX_REDIRECTS = 10
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)


class DownloadError(errors.LocalcacheError):
    """A download that did not complete; the message is one line for the user. `transient`
    errors are worth retrying (network trouble, truncated body, 5xx)."""

    def __init__(self, message: str, *, transient: bool = False, retry_after: float = 0.0):
        super().__init__(message)
        self.transient = transient
        self.retry_after = retry_after


class Limits:
    """The byte budget and the deadline of one download, checked as bytes are written."""

    def __init__(self, uri: str, *, max_bytes: int, deadline: float) -> None:
        self.uri = uri
        self.max_bytes = max_bytes
        self.deadline = deadline
        self._ends_at = time.monotonic() + deadline
        self.used = 0

    def take(self, size: int) -> None:
        """Account for `size` more bytes; raise a final `DownloadError` past a limit."""
        self.used += size
        if self.used > self.max_bytes:
            raise DownloadError(
                f"{self.uri}: larger than the {self.max_bytes}-byte limit (--max-size)"
            )
        if time.monotonic() > self._ends_at:
            raise self.expired()

    def expired(self) -> DownloadError:
        return DownloadError(f"{self.uri}: did not finish within {self.deadline:g} s (--deadline)")


_NAT64_PREFIXES = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries to a gateway that unwraps them: mapped
    (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`, and the
    local-use `64:ff9b:1::/48` with the address in its last 32 bits), 6to4 (`2002:AABB:CCDD::`)
    and Teredo's client."""
    found = [a for a in (ip.ipv4_mapped, ip.sixtofour) if a is not None]
    if ip.teredo is not None:
        found.append(ip.teredo[1])
    if any(ip in prefix for prefix in _NAT64_PREFIXES) or (
        ip in _IPV4_COMPATIBLE and int(ip) > 1  # :: and ::1 are IPv6's own
    ):
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))  # the last 32 bits
    return found


def is_internal_address(address: str) -> bool:
    """True for loopback, link-local, unspecified and cloud-metadata IP addresses, and IPv6
    addresses that carry one (`_embedded_ipv4`): where a redirect must not lead a download."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    candidates: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        candidates += _embedded_ipv4(ip)
    return any(
        a.is_loopback or a.is_link_local or a.is_unspecified or a in _METADATA_ADDRESSES
        for a in candidates
    )


async def _addresses(host: str, port: int) -> list[str]:
    """The IP addresses `host` stands for (itself when it is one); empty when unresolvable."""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return [host]
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port)
    except OSError:
        return []
    return [str(info[4][0]) for info in infos]


async def is_internal_url(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return any(is_internal_address(a) for a in await _addresses(parts.hostname or "", port))


async def fetch(
    url: str,
    target: Path,
    *,
    io_timeout: float,
    attempts: int,
    backoff: float,
    clock: clock_mod.Clock,
    limits: Limits,
    internal_redirects: bool,
) -> int:
    client_timeout = aiohttp.ClientTimeout(
        total=None, connect=io_timeout, sock_connect=io_timeout, sock_read=io_timeout
    )
    async with aiohttp.ClientSession(timeout=client_timeout) as session:
        for attempt in range(1, attempts + 1):
            try:
                return await _fetch_once(
                    session, url, target, io_timeout=io_timeout, limits=limits,
                    internal_redirects=internal_redirects,
                )  # fmt: skip
            except DownloadError as exc:
                if not exc.transient or attempt == attempts:
                    if attempt > 1:
                        raise DownloadError(f"{exc} (after {attempt} attempts)") from None
                    raise
                delay = min(backoff * 2 ** (attempt - 1), MAX_BACKOFF_S)
                delay = max(delay * random.uniform(0.5, 1.0), min(exc.retry_after, MAX_BACKOFF_S))
                log.warning(
                    "download.retry", url=url, attempt=attempt, delay_s=delay, error=str(exc)
                )
                await clock.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


async def follow(
    session: aiohttp.ClientSession,
    url: str,
    *,
    internal_redirects: bool,
    headers: dict[str, str] | None = None,
) -> aiohttp.ClientResponse:
    """GET `url` with `headers`, following redirects by hand so each target is checked before
    it is asked."""
    current = url
    for _ in range(MAX_REDIRECTS + 1):
        response = await session.get(current, allow_redirects=False, headers=headers)
        location = response.headers.get("Location")
        if response.status not in REDIRECT_STATUSES or not location:
            return response
        response.release()
        try:
            target = urllib.parse.urljoin(current, location)
            parts = urllib.parse.urlsplit(target)
            parts.port  # noqa: B018 (a port out of range raises here, not in the check below)
        except ValueError:
            raise DownloadError(f"{url}: redirect to {location[:200]!r} refused: no URL") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise DownloadError(f"{url}: redirect to {target!r} refused: not an http(s) URL")
        if not internal_redirects and await is_internal_url(target):
            raise DownloadError(
                f"{url}: redirect to {target} refused: {parts.hostname} is a loopback, "
                "link-local or metadata address"
            )
        current = target
    raise DownloadError(f"{url}: more than {MAX_REDIRECTS} redirects")


async def _fetch_once(
    session: aiohttp.ClientSession,
    url: str,
    target: Path,
    *,
    io_timeout: float,
    limits: Limits,
    internal_redirects: bool,
) -> int:
    limits.used = 0  # a retry starts the file again
    try:
        async with await follow(session, url, internal_redirects=internal_redirects) as response:
            _check_status(url, response)
            encoded = response.headers.get("Content-Encoding", "identity").lower() != "identity"
            expected = None if encoded else response.content_length
            if expected is not None and expected > limits.max_bytes:
                raise DownloadError(
                    f"{url}: Content-Length {expected} is over the {limits.max_bytes}-byte "
                    "limit (--max-size)"
                )
            fd = await asyncio.to_thread(
                os.open, target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644
            )
            try:
                written = 0
                async for chunk in response.content.iter_chunked(CHUNK_BYTES):
                    limits.take(len(chunk))
                    await asyncio.to_thread(_write_all, fd, chunk)
                    written += len(chunk)
                await asyncio.to_thread(os.fsync, fd)
            finally:
                os.close(fd)
    except aiohttp.ClientPayloadError:
        raise DownloadError(f"{url}: the body ended early (truncated)", transient=True) from None
    except aiohttp.ClientSSLError as exc:
        raise DownloadError(f"{url}: TLS error: {exc}") from None
    except TimeoutError:
        raise DownloadError(
            f"{url}: timed out (no data for {io_timeout:g} s)", transient=True
        ) from None
    except aiohttp.ClientConnectionError as exc:
        raise DownloadError(f"{url}: connection failed: {exc}", transient=True) from None
    except aiohttp.ClientError as exc:
        raise DownloadError(f"{url}: {type(exc).__name__}: {exc}") from None
    if expected is not None and written != expected:
        raise DownloadError(
            f"{url}: the body is truncated: got {written} of {expected} bytes", transient=True
        )
    return written


def _check_status(url: str, response: aiohttp.ClientResponse) -> None:
    if response.status == 200:
        return
    message = f"{url}: HTTP {response.status} {response.reason or ''}".rstrip()
    if response.status not in TRANSIENT_STATUSES:
        raise DownloadError(message)
    retry_after = response.headers.get("Retry-After", "")
    seconds = float(retry_after) if retry_after.isdigit() else 0.0  # a date: our own backoff
    raise DownloadError(message, transient=True, retry_after=seconds)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
