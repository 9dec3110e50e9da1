"""Adoption of a folder another agent downloaded (KServe's add-on, which writes no manifest):
`ModelDisk.adopt` (contract in `folders`)."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from localcache.agent.disk import layout, tree
from localcache.runtime import durable, fstree

if TYPE_CHECKING:
    from localcache.agent.disk import folders


def adopt(
    disk: folders.ModelDisk, storage_key: str, *, uri: str, job: str, completed_at: str
) -> layout.Adoption:
    """Record `models/<storage_key>`, downloaded by another agent (KServe's add-on writes no
    manifest), as complete: normalise it as `promote` does (modes this uid cannot change
    are tolerated and returned), then write its manifest (`adopted` set, `bytes` counted
    here) atomically and fsynced. Refused, with nothing written, unless the folder is a
    real directory holding a regular file, without a manifest or promotion record, every
    directory in it could be read and every entry normalisation drops could be removed."""
    final = disk.model_path(storage_key)
    kind = tree.not_a_directory(final)
    if kind is not None:
        return layout.Adoption(refused=f"{final} is {kind}")
    if not final.exists():
        return layout.Adoption(refused=f"{final} does not exist")
    records = {"a manifest": disk.manifest_path(storage_key)}
    records["a pending promotion"] = disk.record_path(storage_key)
    for what, path in records.items():
        if os.path.lexists(path):
            return layout.Adoption(refused=f"{storage_key} has {what} ({path.name})")
    if not _holds_a_regular_file(final):
        # empty, or a chain of empty directories such as the kubelet makes for a pod's
        # subPath below a folder that does not exist yet (security review finding 14)
        return layout.Adoption(refused=f"{final} holds no regular file")
    done = tree.normalise(final)
    if done.not_removed or done.unreadable:
        left = [*done.not_removed, *done.unreadable]
        return layout.Adoption(refused=f"could not check or clean {', '.join(left[:3])}")
    durable.fsync_tree(final)
    manifest = layout.Manifest(
        storage_key=storage_key,
        uri=uri,
        bytes=tree.folder_bytes(final),
        completed_at=completed_at,
        job=job,
        adopted=True,
        origin_unchecked=uri.startswith("s3://"),  # read by ranges: no checksum was checked
    )
    tree.plain_directory(disk.manifests)
    durable.write_json_atomic(disk.manifest_path(storage_key), manifest.to_json())
    return layout.Adoption(manifest=manifest, modes_not_fixed=tuple(done.modes_not_fixed))


def _holds_a_regular_file(folder: Path) -> bool:
    """Whether some regular file lies below `folder` (symlinks not followed)."""
    for path, is_dir in fstree.below(folder, skip_unlistable=True):
        with contextlib.suppress(OSError):
            if not is_dir and stat.S_ISREG(os.lstat(path).st_mode):
                return True
    return False
