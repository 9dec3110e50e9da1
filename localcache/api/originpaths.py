"""Where KServe's storage initializer writes an origin's files in a model folder: the mapping
a proof names each file's object by (`s3://`), the SHA-256 S3 stores for an object, and the
one file an `http(s)://` model is stored as (the origin a peer-mode fetch resumes from).
Pure functions on URIs.

`STAGED_SUMS` names the file the seed's `localcache origin-sums` step leaves in an `s3://`
origin Job's staging folder (`StagedSums`: the SHA-256 the origin stores per folder path,
`download.seedsums`); the agent takes it out before promotion (`agent.disk.originsums`).
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
import posixpath
import urllib.parse
from typing import Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

from localcache.api import peer

_UNPACKED: Final = frozenset({"application/x-tar", "application/zip"})
_SHA256_HEX: Final = frozenset("0123456789abcdef")

STAGED_SUMS: Final = ".localcache-origin-sums.json"
MAX_STAGED_SUMS: Final = 4096
"""Objects whose SHA-256 one download records at most (the sums go into the folder's manifest,
which every pass reads): a model of more objects records none."""
MAX_STAGED_SUMS_BYTES: Final = MAX_STAGED_SUMS * (peer.MAX_PATH + 80)
SUMS_DEADLINE_S: Final = 120
"""How long the step asks the origin at most (its default `--deadline`)."""


def is_staged_sums(name: str) -> bool:
    """Whether a top-level name of a staging folder is the sidecar's record or its temporary
    file (`<STAGED_SUMS>.<pid>.tmp`)."""
    if name == STAGED_SUMS:
        return True
    middle = name.removeprefix(f"{STAGED_SUMS}.").removesuffix(".tmp")
    return name.startswith(f"{STAGED_SUMS}.") and name.endswith(".tmp") and middle.isdigit()


class StagedSums(BaseModel):
    """The origin's SHA-256 (hex) per folder path, as `localcache origin-sums` stages them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: dict[str, str] = Field(max_length=MAX_STAGED_SUMS)

    @field_validator("sha256")
    @classmethod
    def _entries(cls, value: dict[str, str]) -> dict[str, str]:
        for path, sha in value.items():
            peer.check_path(path)
            if len(sha) != 64 or not set(sha) <= _SHA256_HEX:
                raise ValueError(f"not a SHA-256 in hex for {path[:80]!r}")
        return value


def parse_s3(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket/prefix` as KServe's storage initializer splits it (the
    prefix is the path without its leading "/"); `ValueError` with a one-line reason."""
    if len(uri) > peer.MAX_URI or not uri.startswith("s3://") or not uri.isprintable():
        raise ValueError(f"not an s3:// URI of at most {peer.MAX_URI} characters: {uri[:80]!r}")
    parts = urllib.parse.urlparse(uri)
    if not parts.netloc:
        raise ValueError(f"no bucket in {uri[:80]!r}")
    return parts.netloc, parts.path.lstrip("/")


def s3_folder_path(prefix: str, key: str) -> str:
    """The folder path KServe's storage initializer writes object `key` of `prefix` to: a
    proof names each file's object by this mapping (`POST .../proofs`)."""
    return key.rsplit("/", 1)[-1] if prefix == key else key.replace(prefix, "", 1).lstrip("/")


def http_origin_path(uri: str) -> str:
    """The folder path of the one file KServe's storage initializer stores for `uri` when it
    stores the origin's bytes as they are: an `http(s)://` URI without credentials whose name
    is no archive or compressed file (those it unpacks); `ValueError` with a reason else."""
    if len(uri) > peer.MAX_URI or not uri.isprintable():
        raise ValueError(f"not a URI of at most {peer.MAX_URI} printable characters")
    parts = urllib.parse.urlparse(uri)  # as the storage initializer: `;params` are no path
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s):// URI")
    if parts.username or parts.password:
        raise ValueError("a URI with credentials")
    kind, encoding = mimetypes.guess_type(parts.path)
    if kind is None and parts.query:  # the storage initializer's rule for the type
        kind, encoding = mimetypes.guess_type(parts.query)
    if kind in _UNPACKED or encoding is not None:
        raise ValueError("an archive or compressed file, which the origin Job unpacks")
    return peer.check_path(posixpath.basename(parts.path))


def s3_checksum_sha256(value: str | None, checksum_type: str | None) -> str | None:
    """The hex SHA-256 of a whole object from S3's `x-amz-checksum-sha256` (base64), when it is
    a full-object checksum (not a composite of parts); else None."""
    if not value or checksum_type not in (None, "FULL_OBJECT") or len(value) > 64:
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except binascii.Error:
        return None
    return raw.hex() if len(raw) == 32 else None
