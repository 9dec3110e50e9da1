"""The model-folder operations on a node's models root: staging, promotion, recovery, deletion.

The layout of the models root, its names and its records (`Manifest`, `Recovered`,
`DiskError`) are `agent.layout`; `ModelDisk` here does the filesystem work on them.

Contract:
- A model folder is complete iff the folder and its manifest both exist and the manifest names
  the same storage key. A folder without a manifest is never complete (partial, legacy, or
  half-promoted), so `is_complete` never reports a download that did not finish.
- `promote` writes an intent record first, then moves the staging folder into place with one
  rename, then writes the manifest (temp file + rename), then drops the record. Each file write
  is fsynced and every rename is followed by an fsync of the directories involved. A crash at
  any point leaves a state that `recover()` completes from the intent record; running
  `promote` or `recover` twice is harmless.
- `delete_unreferenced` only ever removes storage-key-shaped names (16 lowercase hex) that the
  caller did not list, removes the manifest before the folder, and never touches anything else
  under `models/`.
- Not promised: thread safety. One agent process owns a root; call these methods from one task
  (they block on the filesystem: run them with `asyncio.to_thread`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from localcache.agent import layout

log = structlog.get_logger(__name__)


def folder_bytes(path: Path) -> int:
    """Total size of the regular files under `path` (symlinks not followed). Files that vanish
    or cannot be read while a download is writing are skipped; a missing `path` counts 0."""
    total = 0
    stack = [path]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except (FileNotFoundError, PermissionError):
                continue
    return total


def _checkpoint(step: str) -> None:
    """Marks a step of the promotion protocol; tests replace it to simulate a crash there."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """Best effort: flush every regular file and directory a download wrote before it is
    published. Files are opened non-blocking and only regular ones are flushed: a download
    pod may leave a FIFO or a device node, whose blocking open would hang the agent."""
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            with contextlib.suppress(OSError):
                flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                fd = os.open(os.path.join(dirpath, name), flags)
                try:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        os.fsync(fd)
                finally:
                    os.close(fd)
        with contextlib.suppress(OSError):
            _fsync_dir(Path(dirpath))


def _plain_directory(path: Path) -> None:
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


def _write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):  # absent, unreadable or not JSON
        return None
    return data if isinstance(data, dict) else None


class ModelDisk:
    """The models root of one node. `host_path` is the node directory mounted at `root` (the
    DaemonSet's hostPath, `/models` in KServe's manifests); None means `root` is that path."""

    def __init__(self, root: Path = layout.DEFAULT_ROOT, *, host_path: str | None = None) -> None:
        self.root = root
        self.host_path = host_path
        self.models = root / layout.MODELS_DIR
        self.staging = root / layout.STAGING_DIR
        self.manifests = root / layout.MANIFESTS_DIR
        self.trash = root / layout.TRASH_DIR

    # ---- layout -------------------------------------------------------------------------
    def ensure_layout(self) -> None:
        """Create the root's sub-directories (idempotent); raise `DiskError` when one of them
        is a symlink or not a directory (a `.trash` linked to `models` would make one pass
        delete every model): nothing is moved or deleted through it."""
        for path in (self.models, self.staging, self.manifests, self.trash):
            _plain_directory(path)

    def check_root(self, pv_path: str) -> None:
        """Raise `layout.RootMismatch` when a node group's PV path is not the agent's models root:
        downloads would land where the agent never sees them (KServe #4151, #5156)."""
        mine = PurePosixPath(os.path.normpath(self.host_path or str(self.root)))
        theirs = PurePosixPath(os.path.normpath(pv_path))
        if mine != theirs:
            mounted = f" (mounted at {self.root})" if self.host_path else ""
            raise layout.RootMismatch(
                f"node group PV path {theirs} differs from the agent's models root "
                f"{mine}{mounted}; set the node group's PV path or the agent's models root "
                "so they are the same directory"
            )

    def model_path(self, storage_key: str) -> Path:
        layout.require_key(storage_key)
        return self.models / storage_key

    def staging_path(self, storage_key: str, job_name: str) -> Path:
        return self.staging / layout.staging_name(storage_key, job_name)

    def prepare_staging(self, storage_key: str, job_name: str, *, mode: int = 0o777) -> Path:
        """Create an empty staging folder writable by the download pod's user (idempotent)."""
        path = self.staging_path(storage_key, job_name)
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, mode)
        return path

    def _manifest_path(self, storage_key: str) -> Path:
        return self.manifests / f"{storage_key}{layout.MANIFEST_SUFFIX}"

    def _record_path(self, storage_key: str) -> Path:
        return self.manifests / f"{storage_key}{layout.RECORD_SUFFIX}"

    # ---- queries ------------------------------------------------------------------------
    def manifest(self, storage_key: str) -> layout.Manifest | None:
        """The manifest of `storage_key`, or None when absent or unreadable."""
        data = _read_json(self._manifest_path(storage_key))
        if data is None:
            return None
        try:
            return layout.Manifest.from_json(data)
        except layout.DiskError:
            return None

    def is_complete(self, storage_key: str) -> bool:
        """The folder AND its manifest exist and the manifest is for this storage key."""
        if not self.model_path(storage_key).is_dir():
            return False
        manifest = self.manifest(storage_key)
        return manifest is not None and manifest.storage_key == storage_key

    def list_model_folders(self) -> list[str]:
        """Storage-key-shaped directories under `models/` (other names are not ours)."""
        try:
            entries = list(os.scandir(self.models))
        except FileNotFoundError:
            return []
        return sorted(
            e.name
            for e in entries
            if layout.is_storage_key(e.name) and e.is_dir(follow_symlinks=False)
        )

    # ---- promotion ----------------------------------------------------------------------
    def promote(
        self, staging: Path, storage_key: str, manifest: layout.Manifest
    ) -> layout.Manifest:
        """Move a finished download into `models/<storage_key>` and record its manifest; returns
        the manifest in force. When a complete folder for the same URI is already there, the
        new download is discarded and the existing folder (and manifest) kept."""
        layout.require_key(storage_key)
        if manifest.storage_key != storage_key:
            raise layout.DiskError(f"manifest is for {manifest.storage_key}, not {storage_key}")
        if staging.parent != self.staging:
            raise layout.DiskError(f"{staging} is not a staging folder of {self.root}")
        if not staging.is_dir():
            raise layout.DiskError(f"staging folder {staging} does not exist")
        self.ensure_layout()
        record = {"staging": staging.name, "manifest": manifest.to_json()}
        _write_json_atomic(self._record_path(storage_key), record)
        _checkpoint("record-written")
        _outcome, in_force = self._settle(storage_key, staging.name, manifest)
        return in_force

    def recover(self) -> list[layout.Recovered]:
        """Finish every promotion interrupted by a crash (call at start-up, before reconciling)."""
        done: list[layout.Recovered] = []
        for tmp in self._list(self.manifests):
            if tmp.name.startswith(".") and tmp.name.endswith(".tmp"):
                tmp.unlink(missing_ok=True)  # a temp file whose atomic write never finished
        records = [p for p in self._list(self.manifests) if p.name.endswith(layout.RECORD_SUFFIX)]
        for path in records:
            storage_key = path.name.removesuffix(layout.RECORD_SUFFIX)
            data = _read_json(path)
            try:
                if not layout.is_storage_key(storage_key) or data is None:
                    raise layout.DiskError("unreadable promotion record")
                staging = str(data["staging"])
                manifest = layout.Manifest.from_json(data["manifest"])
                match = layout.STAGING_RE.fullmatch(staging)
                keys = {storage_key, manifest.storage_key, match["key"] if match else ""}
                if len(keys) != 1:
                    raise layout.DiskError("inconsistent promotion record")
            except (layout.DiskError, KeyError, TypeError) as exc:
                log.warning("promotion_record_dropped", path=str(path), error=str(exc))
                path.unlink(missing_ok=True)
                continue
            outcome, _ = self._settle(storage_key, staging, manifest)
            log.info("promotion_recovered", storage_key=storage_key, outcome=outcome)
            done.append(layout.Recovered(storage_key=storage_key, staging=staging, outcome=outcome))
        return done

    def _settle(
        self, storage_key: str, staging_name_: str, manifest: layout.Manifest
    ) -> tuple[layout.Outcome, layout.Manifest]:
        """Idempotently drive one promotion to its end state, from wherever it stopped."""
        staging = self.staging / staging_name_
        final = self.model_path(storage_key)
        existing = self.manifest(storage_key)
        in_force = manifest
        outcome: layout.Outcome
        if final.is_dir() and existing is not None and existing.storage_key == storage_key:
            if existing.uri != manifest.uri:
                raise layout.DiskError(
                    f"storage key {storage_key} already holds {existing.uri!r}, "
                    f"not {manifest.uri!r}"
                )
            # Complete already: either this promotion got that far, or another download of the
            # same URI won. The folder in place stays; a leftover staging folder goes.
            outcome = "kept-existing" if existing != manifest else "finished"
            in_force = existing
            self._remove_tree(staging)
        elif staging.is_dir():
            if final.exists():
                # An incomplete folder (no manifest): partial, legacy, or a stale leftover.
                self._move_to_trash(final)
                _checkpoint("old-moved-aside")
            self._manifest_path(storage_key).unlink(missing_ok=True)  # orphan of a lost folder
            _fsync_tree(staging)
            os.rename(staging, final)
            _fsync_dir(self.models)
            _fsync_dir(self.staging)
            _checkpoint("renamed")
            _write_json_atomic(self._manifest_path(storage_key), manifest.to_json())
            _checkpoint("manifest-written")
            outcome = "promoted"
        elif final.is_dir():
            # The rename happened, the manifest did not.
            _write_json_atomic(self._manifest_path(storage_key), manifest.to_json())
            _checkpoint("manifest-written")
            outcome = "manifest-written"
        else:
            outcome = "abandoned"
        self._record_path(storage_key).unlink(missing_ok=True)
        _fsync_dir(self.manifests)
        _checkpoint("record-removed")
        self._empty_trash()
        return outcome, in_force

    # ---- deletion -----------------------------------------------------------------------
    def delete_unreferenced(
        self, referenced: Collection[str], *, live_jobs: Collection[str] | None = None
    ) -> list[str]:
        """Delete model folders whose storage key is not in `referenced`, with their manifests,
        and stale staging folders: those of unreferenced keys and, when `live_jobs` (names of
        the download Jobs that still exist) is given, those whose Job is gone. Names that are
        not storage-key shaped are never touched. Returns the storage keys deleted."""
        deleted: list[str] = []
        for key in self.list_model_folders():
            if key in referenced:
                continue
            self._manifest_path(key).unlink(missing_ok=True)
            self._move_to_trash(self.models / key)
            log.info("model_folder_deleted", storage_key=key)
            deleted.append(key)
        for path in self._list(self.manifests):
            key = path.name.removesuffix(layout.MANIFEST_SUFFIX)
            if path.name.endswith(layout.RECORD_SUFFIX) or not path.name.endswith(
                layout.MANIFEST_SUFFIX
            ):
                continue
            if (
                layout.is_storage_key(key)
                and key not in referenced
                and not (self.models / key).exists()
            ):
                path.unlink(missing_ok=True)
        pending = {
            str(data.get("staging"))
            for p in self._list(self.manifests)
            if p.name.endswith(layout.RECORD_SUFFIX) and (data := _read_json(p)) is not None
        }
        for path in self._list(self.staging):
            match = layout.STAGING_RE.fullmatch(path.name)
            if match is None or path.name in pending or not path.is_dir():
                continue
            job_gone = live_jobs is not None and match["job"] not in live_jobs
            if match["key"] not in referenced or job_gone:
                self._move_to_trash(path)
                log.info("staging_folder_deleted", staging=path.name)
        self._empty_trash()
        return deleted

    def remove_staging(self, storage_key: str, job_name: str) -> None:
        """Discard one staging folder (e.g. of a failed download before its retry)."""
        self._remove_tree(self.staging_path(storage_key, job_name))

    @staticmethod
    def _list(directory: Path) -> list[Path]:
        try:
            return sorted(directory.iterdir())
        except FileNotFoundError:
            return []

    def _move_to_trash(self, path: Path) -> None:
        _plain_directory(self.models)
        _plain_directory(self.trash)
        os.rename(path, self.trash / f"{path.name}.{uuid.uuid4().hex}")
        _fsync_dir(path.parent)

    def _remove_tree(self, path: Path) -> None:
        if path.is_dir():
            self._move_to_trash(path)
            self._empty_trash()

    def _empty_trash(self) -> None:
        _plain_directory(self.trash)
        for path in self._list(self.trash):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
