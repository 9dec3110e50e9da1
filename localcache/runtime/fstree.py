"""Directory trees on a local filesystem, walked without recursion.

A tree written by a tenant (a download, a `.trash` entry, a subPath the kubelet created) may
be thousands of levels deep: `os.walk` and `shutil.rmtree` recurse on Python 3.11 and raise
`RecursionError` there. Shared by the node agent and the download program; it imports
nothing of localcache.

- `below(top)` yields every entry below `top` as (path, is a directory), each directory after
  its children, never following symlinks. A directory that cannot be listed raises its
  `OSError`, or with `skip_unlistable` is passed over (as `os.walk` does).
- `remove_tree(path)` removes `path` and everything below it, or raises the first `OSError`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path


def below(top: Path, *, skip_unlistable: bool = False) -> Iterator[tuple[str, bool]]:
    """Every entry below `top`, children first, without recursion (module doc)."""
    stack: list[tuple[str, bool]] = [(str(top), False)]
    while stack:
        current, listed = stack.pop()
        if listed:
            if current != str(top):
                yield current, True
            continue
        stack.append((current, True))
        try:
            listing = os.scandir(current)
        except OSError:
            if not skip_unlistable:
                raise
            continue
        with listing as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((entry.path, False))
                else:
                    yield entry.path, False


def remove_tree(path: Path) -> None:
    """Remove `path` (a file, a symlink or a directory tree of any depth) (module doc)."""
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        os.unlink(path)
        return
    for entry, is_dir in below(path):
        if is_dir:
            os.rmdir(entry)
        else:
            os.unlink(entry)
    os.rmdir(path)
