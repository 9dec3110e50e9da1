"""Durable writes on a local filesystem: what survives a crash once a call returns.

Shared by the node agent (model folders, manifests, promotion records) and the download
program inside download Jobs; it imports nothing of localcache but `runtime.fstree`.

- `fsync_dir(path)` flushes a directory, so renames and creations in it are on disk; it
  raises `OSError` (e.g. `path` is missing or not a directory).
- `fsync_tree(path)` is best effort: it flushes every regular file and directory under
  `path` and ignores what it cannot open. Files are opened non-blocking, without following
  symlinks, and only regular ones are flushed: a tree written by someone else may hold a
  FIFO or a device node, whose blocking open would hang the caller, or be deeper than the
  interpreter's recursion limit (it walks with `runtime.fstree`).
- `write_json_atomic(path, data)` writes `data` as JSON (sorted keys) to a hidden temporary
  file next to `path` (`.<name>.<random>.tmp`), fsyncs it, renames it over `path` and fsyncs
  the directory: readers see the old content or the new one, never a part. A crash may leave
  the temporary file behind; callers that own the directory remove such leftovers.
- `read_json(path)` is the JSON object at `path`, or None when it is absent, unreadable, not
  JSON or not an object.

Not promised: durability on filesystems that ignore fsync, or of anything the caller did not
write through these functions.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import stat
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from localcache.runtime import fstree


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """Best effort: flush every regular file and directory under `path` (module doc)."""
    entries = fstree.below(path, skip_unlistable=True)
    for entry, is_dir in itertools.chain(entries, [(str(path), True)]):
        with contextlib.suppress(OSError):
            if is_dir:
                fsync_dir(Path(entry))
                continue
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
            fd = os.open(entry, flags)
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.fsync(fd)
            finally:
                os.close(fd)


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Replace `path` with `data` as JSON, atomically and durably (module doc)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object at `path`, or None (absent, unreadable, not JSON, not an object)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
