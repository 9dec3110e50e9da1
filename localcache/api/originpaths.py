"""Where KServe's storage initializer writes an origin's files in a model folder: the mapping
a proof names each file's object by (`s3://`), and the one file an `http(s)://` model is
stored as (the origin a peer-mode fetch resumes from). Pure functions on URIs.
"""

from __future__ import annotations

import mimetypes
import posixpath
import urllib.parse
from typing import Final

from localcache.api import peer

_UNPACKED: Final = frozenset({"application/x-tar", "application/zip"})


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
