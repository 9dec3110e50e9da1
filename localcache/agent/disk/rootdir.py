"""Preparing a node's models root for the agent: `localcache prepare-models-root`.

The models root is a hostPath. A fresh node has none, or one that kubelet (`DirectoryOrCreate`)
or an administrator made: owned by root, mode 0755. The agent runs as a non-root uid and
download pods write with the node group's fsGroup, so neither could create a folder in it. The
agent DaemonSet's init container (root, with only CAP_CHOWN and CAP_FOWNER) runs this once
per pod start, instead of asking every user to `chmod 0777` their nodes.

Contract: `prepare(root, uid=, gid=)` creates `root` if missing (parents 0755) and gives it
owner uid:gid and mode 2775 (group-writable for download pods, setgid so new folders keep the
download group). Below `root` it changes one thing: whatever lies in `<root>/.trash` (folders
on their way out that the agent could not delete, e.g. written by a download pod under another
uid before download pods ran as the agent's uid) is given to uid:gid, so the agent deletes it
after this start; symlinks there are not followed, and a `.trash` that is not a plain
directory is left alone. Nothing else below `root` is touched. It refuses a symlink or a
non-directory at `root`, and is idempotent; it returns what it changed, one line each.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from localcache.agent.disk import layout
from localcache.runtime import fstree

ROOT_MODE = 0o2775


class RootError(Exception):
    """The models root cannot be prepared; the message names the path and why."""


def prepare(root: Path, *, uid: int, gid: int) -> list[str]:
    changed: list[str] = []
    if root.is_symlink():
        raise RootError(f"models root {root} is a symlink: refusing to follow it")
    if not root.exists():
        root.mkdir(mode=0o755, parents=True)
        changed.append(f"created {root}")
    info = os.lstat(root)
    if not stat.S_ISDIR(info.st_mode):
        raise RootError(f"models root {root} is not a directory")
    if (info.st_uid, info.st_gid) != (uid, gid):
        os.chown(root, uid, gid, follow_symlinks=False)
        changed.append(f"owner of {root} {info.st_uid}:{info.st_gid} -> {uid}:{gid}")
    mode = stat.S_IMODE(os.lstat(root).st_mode)
    if mode != ROOT_MODE:
        os.chmod(root, ROOT_MODE)
        changed.append(f"mode of {root} {mode:o} -> {ROOT_MODE:o}")
    count = _reown_trash(root / layout.TRASH_DIR, uid=uid, gid=gid)
    if count:
        changed.append(f"owner of {count} entries in {root / layout.TRASH_DIR} -> {uid}:{gid}")
    return changed


def _reown_trash(trash: Path, *, uid: int, gid: int) -> int:
    try:
        if not stat.S_ISDIR(os.lstat(trash).st_mode):
            return 0
    except FileNotFoundError:
        return 0
    count = 0
    for path, _ in fstree.below(trash, skip_unlistable=True):  # any depth, never following symlinks
        info = os.lstat(path)
        if (info.st_uid, info.st_gid) != (uid, gid):
            os.chown(path, uid, gid, follow_symlinks=False)
            count += 1
    return count


def parse_owner(text: str) -> tuple[int, int]:
    """`UID:GID` as two integers; ValueError names the expected form."""
    uid, sep, gid = text.partition(":")
    if not sep or not uid.isdigit() or not gid.isdigit():
        raise ValueError(f"--owner must be UID:GID (numbers), got {text!r}")
    return int(uid), int(gid)
