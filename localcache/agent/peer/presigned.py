"""What a cross-scope proof's presigned HEAD may be, and whether an origin's ETag is this
node's bytes: the pure checks of `agent.peer.proofs`.

`check_head(url, path, origin, now=)` accepts a URL only when it is a SigV4 presigned
request (query auth) for exactly the object of `path` in `origin.bucket` at one of
`origin.endpoints` (path-style `scheme://host[:port]/<bucket>/<key>`, or virtual-hosted
`scheme://<bucket>.host[:port]/<key>` for an endpoint named by a DNS name), printable ASCII,
carrying only `X-Amz-*` parameters (and botocore's `x-id`, `HeadObject`), each once,
`X-Amz-Expires` at most `peer.PROOF_EXPIRES_S`, not yet expired at `now` and dated at most
`CLOCK_SKEW_S` ahead, signing the `host` and `if-none-match` headers (the proof's nonce: the
HEAD sends it, so the presign is good for this node's one proof) and at most
`x-amz-checksum-mode` (then `Head.checksum`: the HEAD sends `CHECKSUM_HEADERS`, and S3
answers the object's stored checksum). It answers the URL to run (`Head`), or a `Bad` with a
reason from a fixed vocabulary: `proof-origin` (an endpoint the node group does not name),
`proof-object` (another bucket or object), `proof-expired`, `proof-malformed`. Signatures
are not checked here: the origin checks them when the HEAD runs.

`originpaths.s3_checksum_sha256(value, type)`: the object's SHA-256 from S3's full-object
checksum, which is compared with the manifest's directly (no hashing). `etag_matches(fd, size,
etag)`: whether an S3 ETag is the MD5 of the open file's bytes: `"<md5>"` for a single-part
upload, `"<md5 of the parts' md5s>-<n>"` for a multipart one, tried with the part sizes in
`PART_SIZES` (and the size the part count implies, rounded to MiB) that give `n` parts, at most
`MAX_PART_TRIES`. False also when the ETag cannot be checked (not an MD5 shape, such as
SSE-KMS's, or no part size fits): the copy is then not provably the origin's. Blocking: run it
in a thread.

Object keys map to folder paths as KServe's storage initializer writes them
(`originpaths.s3_folder_path`).
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

from localcache.api import originpaths, peer

CLOCK_SKEW_S: Final = 15
MIB: Final = 1024 * 1024
PART_SIZES: Final = (8 * MIB, 5 * MIB, 16 * MIB, 64 * MIB, 100 * MIB)
MAX_PART_TRIES: Final = 3
READ_BYTES: Final = 1024 * 1024
ALLOWED_PARAMS: Final = frozenset(
    {
        "X-Amz-Algorithm",
        "X-Amz-Credential",
        "X-Amz-Date",
        "X-Amz-Expires",
        "X-Amz-SignedHeaders",
        "X-Amz-Signature",
        "X-Amz-Security-Token",
        "x-id",
    }
)
NONCE_SIGNED: Final = "host;if-none-match"
CHECKSUM_SIGNED: Final = "host;if-none-match;x-amz-checksum-mode"
SIGNED_HEADERS: Final = frozenset({NONCE_SIGNED, CHECKSUM_SIGNED})
CHECKSUM_HEADERS: Final = {"x-amz-checksum-mode": "ENABLED"}
REQUIRED_PARAMS: Final = ALLOWED_PARAMS - {"X-Amz-Security-Token", "x-id"}
BadReason = Literal["proof-origin", "proof-object", "proof-expired", "proof-malformed"]
_ETAG: Final = re.compile(r'"?([0-9a-f]{32})(?:-([0-9]{1,5}))?"?')
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class Origin:
    """The model's object store as the node group trusts it (`Origin.at`)."""

    endpoints: tuple[tuple[str, str, int | None], ...]
    """(scheme, lower-case host, port) of each `scheme://host[:port]` the node groups name."""
    bucket: str
    prefix: str

    @classmethod
    def at(cls, endpoints: Sequence[str], bucket: str, prefix: str) -> Origin:
        """`endpoints` (`proofOrigins`) parsed once, for every head of a proof."""
        parsed = []
        for endpoint in endpoints:
            parts = urllib.parse.urlsplit(endpoint)
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
            parsed.append((parts.scheme, (parts.hostname or "").lower(), port))
        return cls(tuple(parsed), bucket, prefix)


@dataclass(frozen=True, slots=True)
class Head:
    url: str
    expires: float
    """When its signature stops being valid (epoch seconds)."""
    checksum: bool = False
    """The presign signed `x-amz-checksum-mode: ENABLED`: the HEAD must send it, and the
    origin then answers the object's own checksum (`x-amz-checksum-sha256`)."""


@dataclass(frozen=True, slots=True)
class Bad:
    reason: BadReason


def check_head(url: str, path: str, origin: Origin, *, now: float) -> Head | Bad:
    """See the module docstring."""
    if not (url.isascii() and url.isprintable()) or " " in url:
        return Bad("proof-malformed")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return Bad("proof-malformed")
    host = (parts.hostname or "").lower()
    if parts.fragment or parts.username or parts.password or port is None:
        return Bad("proof-malformed")
    located = _locate(parts.scheme, host, port, parts.path, origin)
    if isinstance(located, Bad):
        return located
    bucket, key = located
    if bucket != origin.bucket or not key.startswith(origin.prefix):
        return Bad("proof-object")
    if key.endswith("/") or originpaths.s3_folder_path(origin.prefix, key) != path:
        return Bad("proof-object")
    query = _check_query(parts.query, now)
    return query if isinstance(query, Bad) else Head(url, *query)


def _locate(
    scheme: str, host: str, port: int, raw_path: str, origin: Origin
) -> tuple[str, str] | Bad:
    """(bucket, object key) of a URL at one of the origin's endpoints."""
    path = urllib.parse.unquote(raw_path)
    for allowed_scheme, allowed_host, allowed_port in origin.endpoints:
        if (scheme, port) != (allowed_scheme, allowed_port):
            continue
        if not path.startswith("/"):
            return Bad("proof-malformed")
        if host == allowed_host:  # path-style
            bucket, _, key = path[1:].partition("/")
            return bucket, key
        if not _is_ip(allowed_host) and host == f"{origin.bucket.lower()}.{allowed_host}":
            return origin.bucket, path[1:]
    return Bad("proof-origin")


def _is_ip(host: str) -> bool:
    """An IP address names no bucket by its subdomains (and may route them elsewhere)."""
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _check_query(query: str, now: float) -> Bad | tuple[float, bool]:
    """A `Bad`, else when the presign expires and whether it signed the checksum mode."""
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        return Bad("proof-malformed")
    names = [name for name, _ in pairs]
    params = dict(pairs)
    if len(names) != len(params) or not set(names) <= ALLOWED_PARAMS:
        return Bad("proof-malformed")
    if not set(names) >= REQUIRED_PARAMS or params["X-Amz-Algorithm"] != "AWS4-HMAC-SHA256":
        return Bad("proof-malformed")
    if params.get("x-id", "HeadObject") != "HeadObject":
        return Bad("proof-malformed")
    expires = params["X-Amz-Expires"]
    if not expires.isdigit() or not 1 <= int(expires) <= peer.PROOF_EXPIRES_S:
        return Bad("proof-malformed")
    try:
        signed = datetime.datetime.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ")
    except ValueError:
        return Bad("proof-malformed")
    start = signed.replace(tzinfo=datetime.UTC).timestamp()
    if start > now + CLOCK_SKEW_S:
        return Bad("proof-malformed")
    if start + int(expires) <= now:
        return Bad("proof-expired")
    signed_headers = params["X-Amz-SignedHeaders"]
    if signed_headers not in SIGNED_HEADERS:  # no nonce, or headers the HEAD would not send
        return Bad("proof-malformed")
    return start + int(expires), signed_headers == CHECKSUM_SIGNED


def etag_matches(fd: int, size: int, etag: str) -> bool:
    """See the module docstring."""
    match = _ETAG.fullmatch(etag.strip())
    if match is None:
        return False
    want, count = match.group(1), match.group(2)
    if count is None:
        return _md5s(fd, size, max(size, 1)) == [want]
    for part_size in _part_sizes(size, int(count)):
        digests = _md5s(fd, size, part_size)
        combined = hashlib.md5(b"".join(bytes.fromhex(d) for d in digests), usedforsecurity=False)
        if combined.hexdigest() == want:
            return True
    return False


def _part_sizes(size: int, parts: int) -> list[int]:
    if parts < 1 or size < parts:
        return []
    if parts == 1:  # any part size from the file's on gives the one part
        return [max(size, 1)]
    per_part = -(-size // parts)  # ceil
    implied = -(-per_part // MIB) * MIB  # rounded up to MiB
    found: list[int] = []
    for part_size in (*PART_SIZES, implied):
        if part_size not in found and -(-size // part_size) == parts:
            found.append(part_size)
    return found[:MAX_PART_TRIES]


def _md5s(fd: int, size: int, part_size: int) -> list[str]:
    """The MD5 of each `part_size` piece of the file (one piece for a single part)."""
    digests: list[str] = []
    offset = 0
    if size == 0:
        return [hashlib.md5(usedforsecurity=False).hexdigest()]
    while offset < size:
        md5 = hashlib.md5(usedforsecurity=False)
        end = min(size, offset + part_size)
        while offset < end:
            chunk = os.pread(fd, min(READ_BYTES, end - offset), offset)
            if not chunk:
                raise OSError("the file shrank while hashed")
            md5.update(chunk)
            offset += len(chunk)
        digests.append(md5.hexdigest())
    return digests
