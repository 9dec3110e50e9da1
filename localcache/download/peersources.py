"""The peers a `localcache fetch` run may ask, and how it talks to them (`download.peerfetch`).

- `Source`: one peer, `NODE=https://IP:PORT` on the command line (`parse_source`), in rank
  order (the planner's: the first is the best).
- `Board`: the run's view of its sources: which are blacklisted (served bad bytes, refused us
  for good, or broke down too often) and how many bytes each delivered. One event loop; no
  locking needed.
- `Credentials`: the TLS context (the peer CA only; the certificate must name
  `peer.SERVER_NAME`, whatever the IP) and the bearer token, re-read from its file on every
  request (the kubelet rotates projected tokens). The token never appears in a message.
- `session`: the client session a run talks to its peers with.
- `retry_after`: a numeric Retry-After header, bounded.
- `SourceFailure`, `check_status`, `check_extent`: what one answer means for its source:
  "busy" (429, 503: ask the next, back off after a pass), "strike" (500, 502, 504, transport
  failures), "ban" (any other status, TLS failures, an extent other than the one asked).
- `FetchError`: how a run ends when it fails (`use_origin`, or a local failure).
"""

from __future__ import annotations

import dataclasses
import re
import ssl
import urllib.parse
from pathlib import Path
from typing import Final, Literal

import aiohttp

from localcache.api import peer
from localcache.download import http

MAX_NODE_NAME: Final = 253
MAX_TOKEN_BYTES: Final = 16 * 1024
MAX_CA_BYTES: Final = 256 * 1024
MAX_RETRY_AFTER_S: Final = 30.0
_CONTENT_RANGE: Final = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
MAX_STRIKES: Final = 3
FOLLOW_404_WAIT_S: Final = 1.0
"""Transport failures (refused, reset, stalled) after which a source is dropped for the run."""


class FetchError(http.DownloadError):
    """A fetch that did not complete. `use_origin`: no peer could serve (exit
    `peer.EXIT_USE_ORIGIN`); otherwise a local failure (arguments, disk: exit 1)."""

    def __init__(self, message: str, *, use_origin: bool) -> None:
        super().__init__(message)
        self.use_origin = use_origin


def use_origin(message: str) -> FetchError:
    return FetchError(message, use_origin=True)


def local_failure(message: str) -> FetchError:
    return FetchError(message, use_origin=False)


@dataclasses.dataclass(frozen=True)
class Source:
    """One peer: its node name and its base URL (`https://IP:PORT`, no path)."""

    node: str
    url: str

    def manifest_url(self, storage_key: str) -> str:
        return f"{self.url}{peer.WIRE_PREFIX}/models/{storage_key}/manifest"

    def file_url(self, storage_key: str, path: str) -> str:
        quoted = urllib.parse.quote(path, safe="/")
        return f"{self.url}{peer.WIRE_PREFIX}/models/{storage_key}/files/{quoted}"


def parse_source(value: str) -> Source:
    """`NODE=https://HOST:PORT` as a `Source`; `ValueError` with a one-line reason."""
    node, sep, url = value.partition("=")
    if not sep or not node or len(node) > MAX_NODE_NAME or not node.isprintable():
        raise ValueError(f"--source {value[:80]!r}: expected NODE=https://IP:PORT")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise ValueError(f"--source {value[:80]!r}: not a URL") from None
    if parts.scheme != "https" or not parts.hostname or port is None:
        raise ValueError(f"--source {value[:80]!r}: the URL must be https://IP:PORT")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"--source {value[:80]!r}: the URL must be https://IP:PORT, no path")
    return Source(node=node, url=f"https://{parts.netloc}")


class Board:
    """Sources in rank order, the blacklist and the bytes each source delivered."""

    def __init__(self, sources: list[Source]) -> None:
        self.sources = list(sources)
        self.bytes: dict[str, int] = {s.node: 0 for s in sources}
        self._banned: dict[str, str] = {}
        self._strikes: dict[str, int] = {}
        self.corrupt: dict[str, str] = {}
        """Sources banned because bytes they served failed verification, with why."""
        self.origin_bytes = 0
        """Bytes the origin sent to finish a file the peers broke off (`peerorigin`)."""

    def live(self) -> list[Source]:
        """Sources not blacklisted, best first."""
        return [s for s in self.sources if s.node not in self._banned]

    def ban(self, source: Source, reason: str) -> None:
        """Never ask `source` again in this run."""
        self._banned.setdefault(source.node, reason)

    def corrupted(self, source: Source, reason: str) -> None:
        """`source` served bytes that fail verification: banned, and named in the report."""
        self.ban(source, reason)
        self.corrupt.setdefault(source.node, reason)

    def strike(self, source: Source, reason: str) -> None:
        """A transport failure; `MAX_STRIKES` of them ban the source."""
        self._strikes[source.node] = self._strikes.get(source.node, 0) + 1
        if self._strikes[source.node] >= MAX_STRIKES:
            self.ban(source, f"unreliable ({reason})")

    def received(self, source: Source, size: int) -> None:
        self.bytes[source.node] = self.bytes.get(source.node, 0) + size

    def why_banned(self) -> str:
        """The reasons of the blacklist, short, for a report."""
        return "; ".join(f"{node}: {why}" for node, why in self._banned.items())


class Credentials:
    """The peer CA as an SSL context, and the bearer token file (re-read per request)."""

    def __init__(self, *, ca_pem: str, token_file: Path) -> None:
        if not ca_pem.strip() or len(ca_pem) > MAX_CA_BYTES:
            raise local_failure("the peer CA is empty or too large")
        try:
            context = ssl.create_default_context(cafile=None, cadata=ca_pem)
        except (ssl.SSLError, ValueError):
            raise local_failure("the peer CA is not a valid PEM certificate") from None
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = True
        context.verify_mode = ssl.CERT_REQUIRED
        self.ssl = context
        self.token_file = token_file
        self.token()  # fail early when unreadable

    def token(self) -> str:
        """The current token, read from its file now."""
        try:
            with self.token_file.open("rb") as f:
                raw = f.read(MAX_TOKEN_BYTES + 1)
        except OSError as exc:
            raise local_failure(
                f"reading the token file {self.token_file}: {exc.strerror}"
            ) from None
        token = raw.decode("ascii", "replace").strip()
        if not token or len(raw) > MAX_TOKEN_BYTES or not token.isprintable() or " " in token:
            raise local_failure(f"the token file {self.token_file} holds no usable token")
        return token

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token()}"}


def session(
    credentials: Credentials, *, limit: int, connect_timeout: float, stall_timeout: float
) -> aiohttp.ClientSession:
    """A client session for peers: their CA, these timeouts, no proxies from the environment,
    no decompression; the caller closes it (`async with`)."""
    connector = aiohttp.TCPConnector(ssl=credentials.ssl, limit=limit, enable_cleanup_closed=True)
    timeout = aiohttp.ClientTimeout(
        total=None, connect=connect_timeout, sock_connect=connect_timeout, sock_read=stall_timeout
    )
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, trust_env=False
    )


def retry_after(value: str | None, *, fallback: float) -> float:
    """A numeric Retry-After in seconds, at most `MAX_RETRY_AFTER_S`; `fallback` otherwise."""
    try:
        seconds = float(value) if value is not None else fallback
    except ValueError:
        seconds = fallback
    if seconds != seconds or seconds < 0:  # NaN or negative
        seconds = fallback
    return min(seconds, MAX_RETRY_AFTER_S)


class SourceFailure(Exception):
    """One request that did not deliver: what it means for its source."""

    def __init__(
        self, kind: Literal["ban", "strike", "busy"], reason: str, *, wait: float = 0.0
    ) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason
        self.wait = wait


def check_status(resp: aiohttp.ClientResponse, *, expected: int, lenient_404: bool = False) -> None:
    """`SourceFailure` unless `expected`; with `lenient_404` (follow mode: a source still
    downloading moves its folder into place) a 404 is a strike after `FOLLOW_404_WAIT_S`."""
    status = resp.status
    if status == expected:
        return
    if status == 404 and lenient_404:
        raise SourceFailure("strike", "HTTP 404 (still downloading?)", wait=FOLLOW_404_WAIT_S)
    if status in (429, 503):
        wait = retry_after(resp.headers.get("Retry-After"), fallback=0.0)
        raise SourceFailure("busy", f"HTTP {status}", wait=wait)
    if status in (500, 502, 504):
        raise SourceFailure("strike", f"HTTP {status}")
    raise SourceFailure("ban", f"HTTP {status} (expected {expected})")


def check_extent(resp: aiohttp.ClientResponse, *, offset: int, size: int) -> None:
    """The answer must carry exactly bytes `offset`..`size`-1 of the file."""
    length = resp.content_length
    if length is not None and length != size - offset:
        raise SourceFailure("ban", f"Content-Length {length}, expected {size - offset}")
    if resp.status != 206:
        return
    match = _CONTENT_RANGE.fullmatch(resp.headers.get("Content-Range", "").strip())
    if match is None:
        raise SourceFailure("ban", "a 206 without a valid Content-Range")
    start, end, total = match.groups()
    if int(start) != offset or int(end) != size - 1 or total not in ("*", str(size)):
        raise SourceFailure("ban", f"Content-Range {match.group(0)!r}, expected start {offset}")


def short(value: object) -> str:
    """One printable line of at most 160 characters of `value` (an error, a peer's text):
    control characters become spaces; an error with no text is named by its type."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())[:160]
    return line or (type(value).__name__ if isinstance(value, BaseException) else "")


def first_error(errors: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error a fetch ends with: a local failure first (the origin would hit it too)."""
    leaves = list(_leaves(errors))
    for leaf in leaves:
        if isinstance(leaf, OSError) and not isinstance(leaf, TimeoutError):
            return leaf
        if isinstance(leaf, FetchError) and not leaf.use_origin:
            return leaf
    return leaves[0]


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]
