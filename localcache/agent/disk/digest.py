"""The content digest of a model folder: what decides that two downloads are the same.

`tree_digest(folder)` is `sha256:` and the SHA-256 of a listing of the folder, one line per
entry in sorted order: a directory as `d <path>`, a regular file as `f <path> <size> <sha256
of its bytes>`, a symlink as `l <path> <target>`; anything else as `o <path>`. Modes, owners
and times are left out (promotion sets the modes), so two downloads of the same bytes have the
same digest wherever and whenever they were made. The walk uses explicit stacks and never
follows a symlink (`runtime.fstree`); files are read in chunks, without loading them whole.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Final

from localcache.api import peer
from localcache.runtime import fstree

PREFIX: Final = "sha256:"
_CHUNK: Final = 1 << 20


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        while chunk := os.read(fd, _CHUNK):
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def tree_digest(folder: Path) -> str:
    """The folder's content digest (module doc); `OSError` when something cannot be read."""
    files: list[tuple[str, int, str]] = []
    dirs: list[str] = []
    links: list[tuple[str, str]] = []
    others: list[str] = []
    top = str(folder)
    for path, is_dir in fstree.below(folder):
        rel = os.path.relpath(path, top)
        if is_dir:
            dirs.append(rel)
            continue
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode):
            files.append((rel, info.st_size, file_sha256(path)))
        elif stat.S_ISLNK(info.st_mode):
            links.append((rel, os.readlink(path)))
        else:
            others.append(rel)
    return peer.manifest_digest(files=files, dirs=dirs, links=links, others=others)
