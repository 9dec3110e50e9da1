"""Walking a downloaded tree without trusting it: size, promoted modes, removal, and making
the root's own directories without following a link.

A download pod writes the tree; the agent must never follow a symlink out of it, block on a
FIFO or device, or leave a world-writable or setuid file in a folder it serves:
- `folder_bytes` sums regular files (symlinks not followed; vanishing files skipped);
  `folder_usage` does the same within a bound (entries listed, `layout.MAX_TREE_DEPTH`) and
  says whether it reached it: what a stall check of a running download may afford;
- `normalise` gives directories `layout.DIR_MODE` and regular files `layout.FILE_MODE`, and
  removes special files (FIFOs, sockets, devices) and symlinks that are absolute or lead
  outside the tree (where they resolve, or by their text), logging each; directories deeper
  than `layout.MAX_TREE_DEPTH` are not walked and count as unreadable. It never raises for
  one entry: a mode it cannot change (a file of another uid), an entry it cannot remove and
  a directory it cannot read are logged and returned (`Normalised`), and the caller decides
  what they mean;
- `remove` deletes a tree completely or raises the first `OSError`; directories this process
  owns are made writable first (archives may unpack 0555 folders). It never ignores errors
  and walks without recursion (`runtime.fstree`);
- `plain_directory` makes a directory or raises `layout.DiskError` when something else (a
  symlink, a file) is there; `not_a_directory` says what is there instead; `listing` lists a
  directory, empty when it is missing.
Flushing a tree before it is published is `runtime.durable.fsync_tree`.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from localcache.agent.disk import layout
from localcache.runtime import fstree

log = structlog.get_logger(__name__)


def folder_bytes(path: Path) -> int:
    """Total size of the regular files under `path` (symlinks not followed). Files that vanish
    or cannot be read while a download is writing are skipped; a missing `path` counts 0."""
    return _walk(path, max_entries=None, max_depth=None).bytes


@dataclass(frozen=True, slots=True)
class Usage:
    """What `folder_usage` found: bytes and entries of the part walked, and whether the walk
    stopped at its bound (then both undercount)."""

    bytes: int
    entries: int
    truncated: bool


def folder_usage(path: Path, *, max_entries: int) -> Usage:
    """`folder_bytes` within a bound: at most `max_entries` entries listed and no directory
    deeper than `layout.MAX_TREE_DEPTH` walked (either makes the result `truncated`)."""
    return _walk(path, max_entries=max_entries, max_depth=layout.MAX_TREE_DEPTH)


def _walk(path: Path, *, max_entries: int | None, max_depth: int | None) -> Usage:
    total = entries_seen = 0
    stack = [(path, 0)]
    while stack:
        current, depth = stack.pop()
        try:
            with os.scandir(current) as listing:
                entries = []
                for entry in listing:
                    if max_entries is not None and entries_seen >= max_entries:
                        return Usage(total, entries_seen, truncated=True)
                    entries_seen += 1
                    entries.append(entry)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    if max_depth is not None and depth + 1 > max_depth:
                        return Usage(total, entries_seen, truncated=True)
                    stack.append((Path(entry.path), depth + 1))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except (FileNotFoundError, PermissionError):
                continue
    return Usage(total, entries_seen, truncated=False)


@dataclass(slots=True)
class Normalised:
    """What `normalise` could not do (paths; all empty when the tree is as promised)."""

    modes_not_fixed: list[str] = field(default_factory=list)
    """Directories and regular files whose mode could not be changed (another uid's)."""
    not_removed: list[str] = field(default_factory=list)
    """Special files and escaping symlinks that could not be removed."""
    unreadable: list[str] = field(default_factory=list)
    """Directories that could not be listed (their content was not checked)."""


def _set_mode(path: str, mode: int, info: os.stat_result, done: Normalised) -> None:
    """chmod a path already lstat'ed as a directory or regular file; failures are logged (a
    file of another uid) and recorded, never raised."""
    if stat.S_IMODE(info.st_mode) == mode:
        return
    try:
        os.chmod(path, mode)
    except OSError as exc:
        log.warning("model_mode_not_fixed", path=path, mode=f"{mode:o}", error=str(exc))
        done.modes_not_fixed.append(path)


def _remove(path: str, event: str, done: Normalised) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        log.warning("model_entry_not_removed", path=path, error=str(exc))
        done.not_removed.append(path)
        return
    log.warning(event, path=path)


def _link_stays_inside(top: str, root: str, link: str) -> bool:
    """A relative link whose target stays inside the tree, both where it resolves now and by
    its text, read from where the link lies: the tree is renamed when it is promoted, so a
    link through the staging folder's own name (`../<staging>/f`) that resolves inside now
    would point outside then (security review finding 11)."""
    target = os.readlink(link)
    if os.path.isabs(target):
        return False
    lexical = os.path.normpath(os.path.join(os.path.relpath(os.path.dirname(link), root), target))
    if lexical == os.pardir or lexical.startswith(os.pardir + os.sep):
        return False
    resolved = os.path.realpath(link)
    return resolved == top or resolved.startswith(top + os.sep)


def normalise(path: Path) -> Normalised:
    """Give a finished download the promoted modes and drop what has no place in a model (see
    the module contract); returns what could not be done. Walks with lstat only: nothing is
    followed or opened."""
    done = Normalised()
    top, root = os.path.realpath(path), str(path)
    _set_mode(root, layout.DIR_MODE, os.lstat(path), done)
    stack = [(root, 0)]
    while stack:
        current, depth = stack.pop()
        if depth > layout.MAX_TREE_DEPTH:
            log.warning("model_tree_too_deep", path=current, levels=layout.MAX_TREE_DEPTH)
            done.unreadable.append(current)
            continue
        try:
            entries = list(os.scandir(current))
        except OSError as exc:
            log.warning("model_tree_unreadable", path=current, error=str(exc))
            done.unreadable.append(current)
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    _set_mode(entry.path, layout.DIR_MODE, info, done)
                    stack.append((entry.path, depth + 1))
                elif stat.S_ISREG(info.st_mode):
                    _set_mode(entry.path, layout.FILE_MODE, info, done)
                elif stat.S_ISLNK(info.st_mode):
                    if not _link_stays_inside(top, root, entry.path):
                        _remove(entry.path, "model_symlink_removed", done)
                else:
                    _remove(entry.path, "model_special_file_removed", done)
            except FileNotFoundError:
                continue
            except OSError as exc:  # e.g. a directory listable but not searchable
                log.warning("model_tree_unreadable", path=entry.path, error=str(exc))
                done.unreadable.append(entry.path)
    return done


def _grant_owner_access(path: Path) -> None:
    """Give the owner rwx on every directory below `path` that this process owns and that
    lacks it (an archive may unpack 0555 folders), so that they can be emptied."""
    uid = os.geteuid()
    stack = [str(path)]
    while stack:
        current = stack.pop()
        try:
            info = os.lstat(current)
            if not stat.S_ISDIR(info.st_mode):
                continue
            if info.st_uid == uid and info.st_mode & 0o700 != 0o700:
                os.chmod(current, stat.S_IMODE(info.st_mode) | 0o700)
            entries = list(os.scandir(current))
        except OSError:
            continue  # the removal reports it
        stack.extend(e.path for e in entries if e.is_dir(follow_symlinks=False))


def remove(path: Path) -> None:
    """Remove one entry of `.trash` completely, at any depth, or raise the first OSError."""
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        os.unlink(path)
        return
    _grant_owner_access(path)
    fstree.remove_tree(path)


def describe_error(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or type(exc).__name__}{where}"


def not_a_directory(path: Path) -> str | None:
    """What `path` is when it exists and is not a directory ("a symlink", "not a directory")."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(mode):
        return None
    return "a symlink" if stat.S_ISLNK(mode) else "not a directory"


def plain_directory(path: Path) -> None:
    """Make `path` a directory if it is missing; raise `DiskError` if it is anything else."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(parents=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "not a directory"
        raise layout.DiskError(
            f"{path} is {kind}: refusing to move or delete anything through it; "
            "remove it and the agent recreates it"
        )


def listing(directory: Path) -> list[Path]:
    """The entries of `directory`, sorted; none when it is missing."""
    try:
        return sorted(directory.iterdir())
    except FileNotFoundError:
        return []


def normalise_checked(staging: Path) -> None:
    """`normalise` the download, or `layout.DiskError` when something could not be checked or
    removed (content below a directory it could not list, past PATH_MAX or deeper than
    MAX_TREE_DEPTH, was never checked: security review finding 10)."""
    done = normalise(staging)
    if done.not_removed:
        raise layout.DiskError(f"{staging}: could not remove {', '.join(done.not_removed[:3])}")
    if done.unreadable:
        raise layout.DiskError(f"{staging}: could not check {', '.join(done.unreadable[:3])[:600]}")
