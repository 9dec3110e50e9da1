"""The mount view a pod gets of a models root: one folder, at its usual place, nothing else.

`publish(target, root, grant, work)` builds, in a private tmpfs under `work` (the plugin's own
mount namespace), a read-only tree holding the empty directories of `grant.subpath` and, at
its end, a bind mount of that folder of the models root (read-only unless the grant is
writable); then binds the whole tree onto `target`, the kubelet's publish path. The per-mount
read-only flag is set before the tree reaches `target`: a mount is copied with its flags when
it propagates to the kubelet's mount namespace, while a remount made afterwards would stay in
the plugin's namespace and leave the kubelet's copy writable.

The folder is opened component by component with `O_NOFOLLOW` (no symlink, written by anyone,
is followed) and bound through its `/proc/self/fd` path, so what is checked is what is mounted.
A pod that mounts the volume without `subPath` sees `models/<key>/` (or `.staging/<name>/`);
with KServe's `subPath: models/<key>` it sees the folder itself, as before.

`unpublish(target)` detaches the tree (lazily, so an open file never blocks it) and removes the
directory. Both are idempotent, as CSI asks. Needs CAP_SYS_ADMIN (the plugin's container).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import os
from pathlib import Path
from typing import Final

from localcache.csi import entitlement

MS_RDONLY: Final = 1
MS_NOSUID: Final = 2
MS_NODEV: Final = 4
MS_NOEXEC: Final = 8
MS_REMOUNT: Final = 32
MS_BIND: Final = 4096
MS_REC: Final = 16384
MS_PRIVATE: Final = 1 << 18
MNT_DETACH: Final = 2
_SAFE: Final = MS_NOSUID | MS_NODEV
_TMPFS_OPTIONS: Final = b"size=64k,nr_inodes=64,mode=0755"
_MAX_STACKED: Final = 8

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


class ViewError(Exception):
    """The view could not be built; the message names the step and the error."""


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: bytes | None
) -> None:
    rc = _libc.mount(
        source.encode() if source else None,
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise ViewError(f"mount {source or ''} on {target}: {os.strerror(err)}")


def _umount(target: str) -> None:
    if _libc.umount2(target.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
            raise ViewError(f"unmount {target}: {os.strerror(err)}")


def is_mount(path: Path) -> bool:
    try:
        return os.path.ismount(path)
    except OSError:
        return False


def open_folder(root: Path, subpath: str) -> int:
    """An `O_PATH` descriptor of `root/subpath`, every component a directory and no symlink;
    `ViewError` when any is not."""
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        for part in subpath.split("/"):
            if part in ("", ".", ".."):
                raise ViewError(f"{subpath!r} is not a plain relative path")
            try:
                child = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise ViewError(f"{root / subpath}: {exc.strerror}") from exc
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def publish(target: Path, root: Path, grant: entitlement.Grant, work: Path) -> None:
    """Mount the view of `grant` (module doc) on `target`; nothing when it is mounted."""
    if is_mount(target):
        return
    target.mkdir(mode=0o750, parents=False, exist_ok=True)
    folder = open_folder(root, grant.folder)
    stage = work / hashlib.sha256(str(target).encode()).hexdigest()[:32]
    stage.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        _mount("localcache-view", str(stage), "tmpfs", _SAFE | MS_NOEXEC, _TMPFS_OPTIONS)
        try:
            _mount(None, str(stage), None, MS_PRIVATE, None)
            inner = stage / grant.subpath
            inner.mkdir(mode=0o755, parents=True)
            _mount(f"/proc/self/fd/{folder}", str(inner), None, MS_BIND, None)
            ro = 0 if grant.writable else MS_RDONLY
            _mount(None, str(inner), None, MS_REMOUNT | MS_BIND | _SAFE | ro, None)
            tmpfs_ro = MS_REMOUNT | MS_RDONLY | _SAFE | MS_NOEXEC
            _mount(None, str(stage), None, tmpfs_ro, _TMPFS_OPTIONS)
            _mount(str(stage), str(target), None, MS_BIND | MS_REC, None)
        finally:
            _umount(str(stage))
    finally:
        os.close(folder)
        with contextlib.suppress(OSError):
            stage.rmdir()


def unpublish(target: Path) -> None:
    """Detach whatever is mounted on `target` and remove it; nothing when it is gone."""
    for _ in range(_MAX_STACKED):
        if not is_mount(target):
            break
        _umount(str(target))
    else:
        raise ViewError(f"{target} is still mounted after {_MAX_STACKED} unmounts")
    with contextlib.suppress(FileNotFoundError):
        target.rmdir()
