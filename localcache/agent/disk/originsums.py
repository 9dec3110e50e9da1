"""The SHA-256 the origin published for a model folder's files, where the download left it in
the folder: Hugging Face's LFS checksums.

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
- `mismatches(files, sums)`: the paths whose own SHA-256 is not the published one.
Who wrote the metadata: the download pod, like every byte of the folder. The record says what
the download reported the origin published, checked against the bytes; it catches a download
that is not what the Hub sent (a truncated or altered file). It is never taken as proof of
access (`agent.peer.proofs` asks the origin itself). Blocking: call it in a thread.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

HF_SCHEME: Final = "hf://"
METADATA_DIR: Final = ".cache/huggingface/download"
METADATA_SUFFIX: Final = ".metadata"
MAX_METADATA_BYTES: Final = 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")

File = tuple[str, int, str]
"""(path, size, sha256 hex), as `digest.Listing.files`."""


def publishes(uri: str) -> bool:
    """Whether a download of `uri` leaves its origin's checksums in the folder."""
    return uri.startswith(HF_SCHEME)


def published(folder: Path, uri: str, files: Iterable[File]) -> dict[str, str]:
    """The published SHA-256 per file path (module contract)."""
    if not publishes(uri):
        return {}
    sizes = {path: size for path, size, _ in files}
    sums: dict[str, str] = {}
    for path in sizes:
        if path.startswith(".cache/huggingface/"):
            continue
        metadata = f"{METADATA_DIR}/{path}{METADATA_SUFFIX}"
        if not 0 < sizes.get(metadata, 0) <= MAX_METADATA_BYTES:
            continue
        text = _read_beneath(folder, metadata, MAX_METADATA_BYTES)
        lines = text.splitlines() if text is not None else []
        if len(lines) >= 2 and _SHA256.fullmatch(lines[1].strip()):
            sums[path] = lines[1].strip()
    return sums


def mismatches(files: Iterable[File], sums: Mapping[str, str]) -> list[str]:
    """The paths of `files` whose SHA-256 is not the one `sums` holds for them."""
    return sorted(path for path, _, sha in files if sums.get(path, sha) != sha)


def _read_beneath(folder: Path, relative: str, limit: int) -> str | None:
    """At most `limit` bytes of `folder/relative` as text, opening each component without
    following a symlink; None when that fails or the bytes are not UTF-8."""
    *parents, name = relative.split("/")
    fds: list[int] = []
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        fds.append(fd)
        for part in parents:
            fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            fds.append(fd)
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        fds.append(fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        for opened in fds:
            with contextlib.suppress(OSError):
                os.close(opened)
