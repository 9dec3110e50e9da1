"""The content digest of a model folder: what decides that two downloads are the same.

`tree_digest(folder)` is `sha256:` and the SHA-256 of a listing of the folder, one line per
entry in sorted order: a directory as `d <path>`, a regular file as `f <path> <size> <sha256
of its bytes>`, a symlink as `l <path> <target>`; anything else as `o <path>`. Modes, owners
and times are left out (promotion sets the modes), so two downloads of the same bytes have the
same digest wherever and whenever they were made. The walk uses explicit stacks and never
follows a symlink (`runtime.fstree`); files are read in chunks, without loading them whole.

`listing(folder)` is that ONE walk: the entries (`Listing`), whose `digest()` is
`tree_digest` and from which `agent.disk.filelists` builds the folder's peer file manifest
(`api.peer.PeerManifest`), so both always agree. Bounded on request (`max_entries`,
`max_depth`: `TooLarge`) and stoppable between chunks (`stop`: `Stopped`, for a hashing
thread whose owner shuts down). `OSError` when something cannot be read.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from localcache.api import peer
from localcache.runtime import fstree

PREFIX: Final = "sha256:"
_CHUNK: Final = 1 << 20
Identity = tuple[int, int, int, int, int]
"""(device, inode, size, mtime in ns, ctime in ns) of a file: any write, truncation or `utime`
changes the ctime, which no process can set."""


def identity(info: os.stat_result) -> Identity:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


class TooLarge(Exception):
    """The folder has more entries or levels than the walk was allowed."""


class Stopped(Exception):
    """The walk was asked to stop (`stop()` became true)."""


@dataclass(frozen=True, slots=True)
class Listing:
    """Every entry below a folder, by kind (relative paths, in walk order)."""

    files: tuple[tuple[str, int, str], ...]
    """(path, size, sha256 hex) of each regular file."""
    dirs: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    """(path, target) of each symlink (never followed)."""
    others: tuple[str, ...]

    def digest(self) -> str:
        return peer.manifest_digest(
            files=self.files, dirs=self.dirs, links=self.links, others=self.others
        )


def _never() -> bool:
    return False


def file_sha256(path: str, *, stop: Callable[[], bool] = _never) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        return fd_sha256(fd, stop=stop)
    finally:
        os.close(fd)


def fd_sha256(fd: int, *, limit: int | None = None, stop: Callable[[], bool] = _never) -> str:
    """The sha256 of what `fd` reads from its offset to EOF, or of at most `limit` bytes."""
    digest = hashlib.sha256()
    left = limit
    while left is None or left > 0:
        chunk = os.read(fd, _CHUNK if left is None else min(_CHUNK, left))
        if not chunk:
            break
        if stop():
            raise Stopped(str(fd))
        digest.update(chunk)
        if left is not None:
            left -= len(chunk)
    return digest.hexdigest()


def listing(
    folder: Path,
    *,
    max_entries: int | None = None,
    max_depth: int | None = None,
    stop: Callable[[], bool] = _never,
    known: Mapping[Identity, str] | None = None,
) -> Listing:
    """The folder's entries, files hashed (module doc); `known` maps the `identity` of files
    hashed before (a download's, before its promotion) to their sha256, which is then not
    computed again."""
    files: list[tuple[str, int, str]] = []
    dirs: list[str] = []
    links: list[tuple[str, str]] = []
    others: list[str] = []
    top = str(folder)
    for count, (path, is_dir) in enumerate(fstree.below(folder), start=1):
        rel = os.path.relpath(path, top)
        if max_entries is not None and count > max_entries:
            raise TooLarge(f"{folder}: more than {max_entries} entries")
        if max_depth is not None and rel.count(os.sep) >= max_depth:
            raise TooLarge(f"{folder}: deeper than {max_depth} levels")
        if stop():
            raise Stopped(str(folder))
        if is_dir:
            dirs.append(rel)
            continue
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode):
            sha = (known or {}).get(identity(info)) or file_sha256(path, stop=stop)
            files.append((rel, info.st_size, sha))
        elif stat.S_ISLNK(info.st_mode):
            links.append((rel, os.readlink(path)))
        else:
            others.append(rel)
    return Listing(tuple(files), tuple(dirs), tuple(links), tuple(others))


def tree_digest(folder: Path) -> str:
    """The folder's content digest (module doc); `OSError` when something cannot be read."""
    return listing(folder).digest()
