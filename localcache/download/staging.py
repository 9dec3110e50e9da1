"""Staging and atomic commit into a destination directory, shared by `localcache download`
(`download.program`) and `localcache fetch` (`download.peerfetch`).

Contract:
- `prepare_dest(dest)` makes sure `dest` is a directory and says whether this call created it
  (so a failed run can remove it again); anything else at `dest` is a `DownloadError`.
- A run writes into `new_staging(dest)`: a hidden directory inside `dest` (same filesystem,
  so renames are atomic even when `dest` is a mount point) named with `PARTIAL_PREFIX`.
- `commit(staging, dest)` renames every staged entry into `dest`, replacing an entry of the
  same name; when one rename fails, the renames already done are undone (replaced entries
  restored) and the error re-raised. `dest` is fsynced after the renames. Not promised:
  atomicity of the whole set against a crash in the middle (leftovers carry `PARTIAL_PREFIX`).
- `clean_up(staging, created_dest)` removes the staging directory and, when given, an empty
  `dest` this run created; it never raises `OSError` and never removes anyone else's files.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Final

from localcache.download import http
from localcache.runtime import durable, fstree

PARTIAL_PREFIX: Final = ".localcache-partial-"


def prepare_dest(dest: Path) -> bool:
    """Make sure `dest` is a directory; True when this call created it."""
    if dest.is_dir():
        return False
    if dest.exists() or dest.is_symlink():
        raise http.DownloadError(f"destination {dest} exists and is not a directory")
    try:
        dest.mkdir(parents=True)
    except FileExistsError:
        return False  # created concurrently
    except OSError as exc:
        raise http.DownloadError(f"creating {dest}: {os_message(exc)}") from None
    return True


def new_staging(dest: Path) -> Path:
    """A fresh, empty staging directory inside `dest`."""
    staging = dest / f"{PARTIAL_PREFIX}{uuid.uuid4().hex[:12]}"
    staging.mkdir()
    return staging


def commit(staging: Path, dest: Path) -> None:
    """Rename every staged entry into `dest`; on failure undo the renames already done."""
    backup = dest / f"{PARTIAL_PREFIX}old-{uuid.uuid4().hex[:8]}"
    done: list[tuple[str, bool]] = []
    try:
        for name in sorted(os.listdir(staging)):
            target = dest / name
            moved_old = False
            if os.path.lexists(target):
                backup.mkdir(exist_ok=True)
                os.rename(target, backup / name)
                moved_old = True
            try:
                os.rename(staging / name, target)
            except OSError:
                if moved_old:
                    os.rename(backup / name, target)
                raise
            done.append((name, moved_old))
        durable.fsync_dir(dest)
    except BaseException:
        for name, moved_old in reversed(done):
            with contextlib.suppress(OSError):
                remove(dest / name)
                if moved_old:
                    os.rename(backup / name, dest / name)
        raise
    finally:
        with contextlib.suppress(OSError):
            remove(backup)


def clean_up(staging: Path | None, created_dest: Path | None) -> None:
    """Remove `staging` and, when given, the empty `created_dest`; errors are ignored."""
    with contextlib.suppress(OSError):
        if staging is not None:
            remove(staging)
    with contextlib.suppress(OSError):
        if created_dest is not None:
            created_dest.rmdir()  # only when empty: never removes anyone else's files


def remove(path: Path) -> None:
    """Remove a file, link or tree at `path` when there is one."""
    if os.path.lexists(path):
        fstree.remove_tree(path)


def os_message(exc: OSError) -> str:
    return exc.strerror or str(exc)
