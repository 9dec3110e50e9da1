"""The SHA-256 the origin published for a model folder's files, where the download left it:
Hugging Face's LFS checksums in the folder, and the SHA-256 an `s3://` origin stores for its
objects, staged by the seed's `localcache origin-sums` step (`download.seedsums`).

KServe's storage initializer downloads an `hf://` model with huggingface_hub's
`snapshot_download(local_dir=...)`, which writes, for each file it downloads,
`.cache/huggingface/download/<path>.metadata`: the commit, the file's ETag and a time, one per
line. The Hub's ETag of an LFS file (every weight file) is the file's SHA-256, which the Hub
publishes (`X-Linked-Etag`, `siblings[].lfs.sha256`); a file stored in git has its git blob
SHA-1 there instead, which is not one.

Contract:
- `publishes(uri)`: whether a download of `uri` leaves such checksums (`hf://`).
- `published(folder, uri, files)`: for an `hf://` `uri`, the SHA-256 per path of `files` (the
  folder's regular files, `(path, size, sha256)` as `digest.listing` gives them) whose
  metadata file is among `files`, at most `MAX_METADATA_BYTES`, and names a 64-hex-digit
  ETag in its second line; `{}` for any other scheme (a folder of another scheme that holds
  such files says nothing about its origin). A metadata file that cannot be read without
  following a symlink, or that has another shape, is skipped: the file is then not attested.
- `read_staged(staging)`: the SHA-256s `localcache origin-sums` left in a finished seed's
  staging folder (`originpaths.STAGED_SUMS`), as sorted (path, hex) pairs (`()`: the origin
  stores none); None when there is no record (the sidecar had no answer from the origin), or
  it is not a regular file of at most `originpaths.MAX_STAGED_SUMS_BYTES` holding
  `originpaths.StagedSums`, or cannot be read: the copy is then unchecked
  (`layout.Manifest.origin_unchecked`), and served to no peer. `drop_staged(staging)` removes
  it, and the temporary file of a sidecar stopped while it wrote (`originpaths.is_staged_sums`),
  from the folder: it is no file of the model (a directory of that name is left: the model's
  own).
  The promotion keeps the sums in the folder's manifest (`with_staged(manifest, staging)`:
  `layout.Manifest.origin_sums`, or `origin_unchecked` without a record), and
  `published(..., staged=...)` answers them for an `s3://` `uri`, for the paths among `files`.
  `staged_bytes(staging)`: the size of what `drop_staged` removes (the download's own size
  leaves it out).
- `mismatches(files, sums)`: the paths whose own SHA-256 is not the published one.
Who wrote the metadata: the download pod, like every byte of the folder. The record says what
the download reported the origin published, checked against the bytes; it catches a download
that is not what the Hub sent (a truncated or altered file). It is never taken as proof of
access (`agent.peer.proofs` asks the origin itself). Blocking: call it in a thread.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import pydantic
import structlog

from localcache.agent.disk import layout
from localcache.agent.peer.files import Stale, open_beneath
from localcache.api import originpaths
from localcache.runtime import durable

log = structlog.get_logger(__name__)

HF_SCHEME: Final = "hf://"
S3_SCHEME: Final = "s3://"
METADATA_DIR: Final = ".cache/huggingface/download"
METADATA_SUFFIX: Final = ".metadata"
MAX_METADATA_BYTES: Final = 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")

File = tuple[str, int, str]
"""(path, size, sha256 hex), as `digest.Listing.files`."""


def publishes(uri: str) -> bool:
    """Whether a download of `uri` leaves its origin's checksums in the folder."""
    return uri.startswith(HF_SCHEME)


def published(
    folder: Path, uri: str, files: Iterable[File], *, staged: Iterable[tuple[str, str]] = ()
) -> dict[str, str]:
    """The published SHA-256 per file path (module contract)."""
    sizes = {path: size for path, size, _ in files}
    if uri.startswith(S3_SCHEME):
        return {path: sha for path, sha in staged if path in sizes}
    if not publishes(uri):
        return {}
    sums: dict[str, str] = {}
    for path in sizes:
        if path.startswith(".cache/huggingface/"):
            continue
        metadata = f"{METADATA_DIR}/{path}{METADATA_SUFFIX}"
        if not 0 < sizes.get(metadata, 0) <= MAX_METADATA_BYTES:
            continue
        text = _read(folder, metadata, sizes[metadata])
        lines = text.splitlines() if text is not None else []
        if len(lines) >= 2 and _SHA256.fullmatch(lines[1].strip()):
            sums[path] = lines[1].strip()
    return sums


def read_staged(staging: Path) -> tuple[tuple[str, str], ...] | None:
    """The staged origin SHA-256s of a finished download in `staging`, None when there is no
    usable record (module contract). Blocking."""
    path = staging / originpaths.STAGED_SUMS
    try:
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_size > originpaths.MAX_STAGED_SUMS_BYTES:
            log.warning("origin_sums_unreadable", staging=staging.name, error="not a small file")
            return None
        text = _read(staging, path.name, info.st_size)
        return tuple(sorted(originpaths.StagedSums.model_validate_json(text or "").sha256.items()))
    except FileNotFoundError:
        log.warning("origin_sums_missing", staging=staging.name)
        return None
    except (OSError, pydantic.ValidationError) as exc:  # the pod's bytes: any shape, any mode
        log.warning("origin_sums_unreadable", staging=staging.name, error=type(exc).__name__)
        return None


def with_staged(manifest: layout.Manifest, staging: Path) -> layout.Manifest:
    """`manifest` recording what `read_staged(staging)` found. Blocking."""
    sums = read_staged(staging)
    return dataclasses.replace(manifest, origin_sums=sums or (), origin_unchecked=sums is None)


def staged_bytes(staging: Path) -> int:
    """The bytes of the regular files `drop_staged(staging)` removes (none of the model's).
    Blocking."""
    total = 0
    try:
        for name in _staged_names(staging):
            info = os.lstat(staging / name)
            total += info.st_size if stat.S_ISREG(info.st_mode) else 0
    except OSError:  # gone, or its modes taken away: the promotion says so
        pass
    return total


def drop_staged(staging: Path) -> None:
    """Remove the sidecar's record and temporary files from `staging` (module contract),
    durably; idempotent. Blocking."""
    try:
        names = _staged_names(staging)
        for name in names:
            if not stat.S_ISDIR(os.lstat(staging / name).st_mode):
                os.unlink(staging / name)
        if names:
            durable.fsync_dir(staging)
    except FileNotFoundError:
        return
    except OSError as exc:  # a pod that took the folder's modes away: left in its own model
        log.warning("origin_sums_not_removed", staging=staging.name, error=type(exc).__name__)


def mismatches(files: Iterable[File], sums: Mapping[str, str]) -> list[str]:
    """The paths of `files` whose SHA-256 is not the one `sums` holds for them."""
    return sorted(path for path, _, sha in files if sums.get(path, sha) != sha)


def _read(folder: Path, relative: str, size: int) -> str | None:
    """The `size` bytes of the regular file `folder/relative` as text (`peer.files.open_beneath`:
    no symlink followed); None when it is not that file or not UTF-8."""
    try:
        fd = open_beneath(folder, relative, size)
    except Stale:
        return None
    try:
        return os.read(fd, size).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def _staged_names(staging: Path) -> list[str]:
    """The names in `staging` of the sidecar's record and temporary files. Blocking."""
    return [n for n in os.listdir(staging) if originpaths.is_staged_sums(n)]
