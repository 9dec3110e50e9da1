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
- `take_staged(staging)`: the SHA-256s `localcache origin-sums` left in a finished download's
  staging folder (`originpaths.STAGED_SUMS`), as (path, hex) pairs; the file is removed from
  the folder (it is no file of the model), with the temporary file of a step stopped while
  it wrote (`<name>.<pid>.tmp`). None staged, or not a regular file of at most
  `originpaths.MAX_STAGED_SUMS_BYTES` that holds `originpaths.StagedSums`: `()` (a directory
  of that name is left: the model's own). The promotion keeps them in the folder's manifest
  (`layout.Manifest.origin_sums`), and `published(..., staged=...)` answers them for an
  `s3://` `uri`, for the paths among `files`.
- `mismatches(files, sums)`: the paths whose own SHA-256 is not the published one.
Who wrote the metadata: the download pod, like every byte of the folder. The record says what
the download reported the origin published, checked against the bytes; it catches a download
that is not what the Hub sent (a truncated or altered file). It is never taken as proof of
access (`agent.peer.proofs` asks the origin itself). Blocking: call it in a thread.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import pydantic
import structlog

from localcache.agent.peer.files import Stale, open_beneath
from localcache.api import originpaths

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


def take_staged(staging: Path) -> tuple[tuple[str, str], ...]:
    """The staged origin SHA-256s of a finished download, taken out of `staging` (module
    contract). Blocking."""
    for leftover in staging.glob(f"{originpaths.STAGED_SUMS}.*.tmp"):  # a sidecar stopped
        if leftover.is_symlink() or leftover.is_file():
            leftover.unlink()
    path = staging / originpaths.STAGED_SUMS
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return ()
    if stat.S_ISDIR(info.st_mode):
        return ()
    size = info.st_size if stat.S_ISREG(info.st_mode) else 0
    text = (
        _read(staging, path.name, size) if 0 < size <= originpaths.MAX_STAGED_SUMS_BYTES else None
    )
    path.unlink()
    try:
        sums = originpaths.StagedSums.model_validate_json(text or "")
    except pydantic.ValidationError:
        log.warning("origin_sums_unreadable", staging=staging.name)
        return ()
    return tuple(sorted(sums.sha256.items()))


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
