"""The import pod's steps on the claim (`localcache import prepare|place`): stage the
download, then move it into place so that `models/<key>` is, at every instant and after a
crash at any point, the previous complete copy, absent (only while a copy with no
predecessor is being placed), or the new complete copy; never a mix.

Layout (`download.importlayout`, relative to `models`): `<key>`,
`.localcache-import/<key>/{data,old,placing}`.

- `prepare(models, key)`: creates the staging folder, finishes an interrupted placement
  (`finish`, when `placing` is there), removes a leftover `old`, then empties `data` (removed
  and made anew, empty). Run before the download container, whose mount is `data`.
- `place(models, key)`: when `placing` is absent, refuses an empty download (`EmptyDownload`:
  no regular file under `data`), measures it, and writes `placing` (fsynced: from then on the
  placement is decided and any later run finishes it); then `finish`. Returns the placed size.
- `finish(...)`: the idempotent rest, each step durable before the next (directories fsynced
  after every rename): `<key>` → `old` (when present and `data` is still there), `data` →
  `<key>`, remove `old`, remove `placing`. A run that finds `placing` resumes from whatever
  state the previous one reached, so `prepare` and `place` both recover.
- Folders this module creates get the permission bits of `models` (as the kubelet does for a
  subPath), so a download container of the same uid or of the claim's group can write `data`.

Errors: `StepError` subclasses with a one-line message (`EmptyDownload`, `BadLayout`);
`OSError` from the filesystem propagates (the command prints it). `hook(step)` is called after
each durable step (tests inject crashes there); steps are the `STEP_*` names.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from localcache.download import importlayout, importwalk
from localcache.runtime import durable, fstree

STEP_MARKED: Final = "marked"
STEP_MOVED_OLD: Final = "moved-old"
STEP_PLACED: Final = "placed"
STEP_REMOVED_OLD: Final = "removed-old"
STEP_UNMARKED: Final = "unmarked"
STEP_EMPTIED: Final = "emptied"
STEPS: Final = (STEP_MARKED, STEP_MOVED_OLD, STEP_PLACED, STEP_REMOVED_OLD, STEP_UNMARKED)
"""The placement's durable steps, in order (`prepare` adds `STEP_EMPTIED`)."""

MAX_FILES: Final = 10_000_000
MAX_DEPTH: Final = 4096

Hook = Callable[[str], None]


def _no_hook(step: str) -> None:
    del step


class StepError(Exception):
    """An import step cannot proceed; the message is one line."""


class EmptyDownload(StepError):
    """The download container succeeded but left no file in the staging folder."""


class BadLayout(StepError):
    """`models` is not a folder, or an entry of the layout has the wrong type."""


@dataclass(frozen=True)
class Paths:
    models: Path
    key: str

    @property
    def target(self) -> Path:
        return self.models / self.key

    @property
    def staging(self) -> Path:
        return self.models / importlayout.staging(self.key)

    @property
    def data(self) -> Path:
        return self.staging / importlayout.DATA

    @property
    def old(self) -> Path:
        return self.staging / importlayout.OLD

    @property
    def placing(self) -> Path:
        return self.staging / importlayout.PLACING


def paths(models: Path, key: str) -> Paths:
    """The layout for `key` under `models`; `ValueError` for an unsafe key, `BadLayout` when
    `models` is not an existing folder (a symlink is refused: it could point anywhere)."""
    importlayout.check_key(key)
    try:
        mode = os.lstat(models).st_mode
    except FileNotFoundError:
        raise BadLayout(f"{models} does not exist (is the claim mounted?)") from None
    if not stat.S_ISDIR(mode):
        raise BadLayout(f"{models} is not a folder")
    return Paths(models, key)


def _exists(path: Path) -> bool:
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    return True


def _mkdir(path: Path, like: Path) -> None:
    """`path` as a folder (created with `like`'s permission bits when missing); a symlink or
    file in its place is refused."""
    try:
        os.mkdir(path)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise BadLayout(f"{path} exists and is not a folder") from None
        return
    with contextlib.suppress(OSError):  # the parent's bits are a courtesy, not a need
        os.chmod(path, stat.S_IMODE(os.stat(like).st_mode))
    durable.fsync_dir(path.parent)


def _rename(src: Path, dst: Path) -> None:
    os.rename(src, dst)
    durable.fsync_dir(dst.parent)
    if src.parent != dst.parent:
        durable.fsync_dir(src.parent)


def _remove(path: Path) -> None:
    if _exists(path):
        fstree.remove_tree(path)
        durable.fsync_dir(path.parent)


def _ensure_staging(p: Paths) -> None:
    _mkdir(p.models / importlayout.STAGING, p.models)
    _mkdir(p.staging, p.models)


def finish(p: Paths, hook: Hook = _no_hook) -> bool:
    """Complete a decided placement (`placing` present) from wherever it stopped; False when
    there is none to complete (module docstring)."""
    if not _exists(p.placing):
        return False
    if _exists(p.data):
        if _exists(p.target):
            # `old` here can only be a leftover of an earlier placement: the copy being
            # replaced is still `<key>`.
            _remove(p.old)
            _rename(p.target, p.old)
            hook(STEP_MOVED_OLD)
        _rename(p.data, p.target)
        hook(STEP_PLACED)
    _remove(p.old)
    hook(STEP_REMOVED_OLD)
    os.unlink(p.placing)
    durable.fsync_dir(p.staging)
    hook(STEP_UNMARKED)
    return True


def prepare(models: Path, key: str, *, hook: Hook = _no_hook) -> bool:
    """Make `data` an empty folder, after finishing an interrupted placement; True when one
    was finished."""
    p = paths(models, key)
    _ensure_staging(p)
    recovered = finish(p, hook)
    _remove(p.old)
    _remove(p.data)
    _mkdir(p.data, p.models)
    hook(STEP_EMPTIED)
    return recovered


def place(models: Path, key: str, *, hook: Hook = _no_hook) -> importwalk.Size:
    """Move the download in `data` to `models/<key>` (module docstring); the size placed."""
    p = paths(models, key)
    _ensure_staging(p)
    if not _exists(p.placing):
        if not _exists(p.data) or not stat.S_ISDIR(os.lstat(p.data).st_mode):
            raise EmptyDownload(f"no staging folder {p.data}: nothing was downloaded")
        size = importwalk.measure(p.data, max_files=MAX_FILES, max_depth=MAX_DEPTH)
        if size.files == 0:
            raise EmptyDownload(
                "the download left no file in the staging folder: refusing to place an empty model"
            )
        with open(p.placing, "x", encoding="utf-8") as marker:
            marker.flush()
            os.fsync(marker.fileno())
        durable.fsync_dir(p.staging)
        hook(STEP_MARKED)
    finish(p, hook)
    placed = importwalk.measure(p.target, max_files=MAX_FILES, max_depth=MAX_DEPTH)
    if placed.files == 0:  # the staging folder vanished under a decided placement
        raise BadLayout(f"no file at {p.target} after the placement")
    return placed
