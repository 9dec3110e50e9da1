"""The whole files of a download in progress, read from a folder a tenant's pod writes.

`scan(top, whole, known, previous, stop=...)` walks `top` with directory file descriptors
(`os.fwalk`: never through a symlink, and a directory swapped for one while walked is
skipped), at most `peer.MAX_FILES` entries and `peer.MAX_DEPTH` levels. A name that `whole`
accepts and that `lstat` (beneath its directory's descriptor) says is a regular file is
opened there with `O_NOFOLLOW`; the open file must be that same inode. Its identity is
(device, inode, size, mtime, ctime) from the descriptor: any write, truncation or `utime`
changes the ctime, which no process can set. A file is listed only when its identity is in
`previous` (unchanged since the last scan: a writer that writes in place is not mistaken for a
finished file between two of its writes) or in `known` (hashed before); its sha256 is then
`known`'s, or read from the descriptor (exactly `st_size` bytes) and kept only if the identity
is the same afterwards. Returns the files (sorted), every identity seen and the hashes used.
Unreadable entries are skipped; `digest.Stopped` when `stop()` turns true.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from localcache.agent.disk import digest
from localcache.api import peer

Identity = digest.Identity
_OPEN: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class Scanned:
    files: list[peer.ManifestFile]
    seen: frozenset[Identity]
    hashes: dict[Identity, str]


def scan(
    top: Path,
    whole: Callable[[str], bool],
    known: Mapping[Identity, str],
    previous: frozenset[Identity],
    *,
    stop: Callable[[], bool],
) -> Scanned:
    """The whole, settled files below `top` (module doc)."""
    files: list[peer.ManifestFile] = []
    seen: set[Identity] = set()
    hashes: dict[Identity, str] = {}
    count = 0
    for current, dirs, names, dir_fd in os.fwalk(top, follow_symlinks=False):
        rel_dir = os.path.relpath(current, top)
        depth = 0 if rel_dir == "." else rel_dir.count(os.sep) + 1
        if depth + 1 >= peer.MAX_DEPTH:
            dirs[:] = []
        count += len(dirs)
        for name in sorted(names):
            count += 1
            if count > peer.MAX_FILES:
                return Scanned(sorted(files, key=lambda f: f.path), frozenset(seen), hashes)
            if stop():
                raise digest.Stopped(str(top))
            rel = name if rel_dir == "." else f"{rel_dir}/{name}"
            if not whole(rel):
                continue
            try:
                found = _settled(dir_fd, name, known, previous, seen, stop)
                if found is not None:
                    files.append(peer.ManifestFile(path=rel, size=found[0][2], sha256=found[1]))
                    hashes[found[0]] = found[1]
            except (OSError, ValueError):
                continue  # moved, replaced or unreadable meanwhile; a name no manifest holds
    return Scanned(sorted(files, key=lambda f: f.path), frozenset(seen), hashes)


def _settled(
    dir_fd: int,
    name: str,
    known: Mapping[Identity, str],
    previous: frozenset[Identity],
    seen: set[Identity],
    stop: Callable[[], bool],
) -> tuple[Identity, str] | None:
    before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not stat.S_ISREG(before.st_mode):
        return None
    fd = os.open(name, _OPEN, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != (
            before.st_dev,
            before.st_ino,
        ):
            return None
        ident = digest.identity(info)
        seen.add(ident)
        sha = known.get(ident)
        if sha is not None:
            return ident, sha
        if ident not in previous:
            return None  # not settled yet: listed at the next scan if unchanged
        sha = digest.fd_sha256(fd, limit=info.st_size, stop=stop)
        if digest.identity(os.fstat(fd)) != ident:
            return None
        return ident, sha
    finally:
        os.close(fd)
