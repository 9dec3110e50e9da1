"""What the peer server reads from disk, and how: byte ranges and safe opens beneath a folder.

- `byte_range(header, size)`: the single range a `Range` header asks for, `(first, last)`
  inclusive, or None for the whole file. Only `bytes=N-` and `bytes=N-M` are accepted (`M` is
  clipped to the end); anything else (suffix ranges, several ranges, other units, a start at
  or past the end, an oversized header) raises `BadRange` (416).
- `open_beneath(folder, relpath)`: a read-only fd of the regular file `relpath` inside
  `folder`, walking component by component with `openat` (`dir_fd`) and `O_NOFOLLOW`, every
  parent opened `O_DIRECTORY`: a symlink anywhere (even in a parent) or a non-directory parent
  fails, so nothing outside the folder is ever opened. The last component is opened
  `O_NONBLOCK` (a FIFO put in a file's place cannot block the open) and then `fstat`ed:
  it must be a regular file of exactly `size` bytes, else `Stale`. `folder` itself is opened
  with `O_NOFOLLOW` too (its parents are the agent's own models root).
- `read_at(fd, offset, length)`: `os.pread`, for a worker thread.

Blocking: call `open_beneath` and `read_at` in a thread (`asyncio.to_thread`).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path
from typing import Final

from localcache.api import peer

MAX_RANGE_HEADER: Final = 64
_RANGE = re.compile(r"bytes=([0-9]{1,19})-([0-9]{0,19})")
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


class BadRange(ValueError):
    """A Range header this server does not satisfy (answer 416)."""


class Stale(Exception):
    """The file on disk is not what the manifest lists (gone, moved, replaced, resized)."""


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """See the module docstring."""
    if header is None:
        return None
    match = _RANGE.fullmatch(header.strip()) if len(header) <= MAX_RANGE_HEADER else None
    if match is None:
        raise BadRange("unsupported range")
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) else size - 1
    if first >= size or last < first:
        raise BadRange("unsatisfiable range")
    return first, min(last, size - 1)


def open_beneath(folder: Path, relpath: str, size: int) -> int:
    """See the module docstring; raises `Stale` for anything but the expected file."""
    try:
        parts = peer.check_path(relpath).split("/")
    except ValueError as exc:
        raise Stale("unsafe path") from exc
    fds: list[int] = []
    try:
        fds.append(os.open(folder, _DIR_FLAGS))
        for part in parts[:-1]:
            fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
        fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=fds[-1])
    except OSError as exc:
        raise Stale(f"cannot open: {exc.strerror}") from None
    finally:
        for parent in fds:
            os.close(parent)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise Stale("not a regular file")
        if info.st_size != size:
            raise Stale("size differs from the manifest")
        os.set_blocking(fd, True)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    return fd


def read_at(fd: int, offset: int, length: int) -> bytes:
    return os.pread(fd, length, offset)
