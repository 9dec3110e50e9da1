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
- `promote` first normalises the download (`tree.normalise`): directories `layout.DIR_MODE`,
  regular files `layout.FILE_MODE` (no setuid, setgid or world-write), symlinks that are
  absolute or lead out of the folder and special files (FIFOs, sockets, devices) removed, each
  with a warning (one it cannot remove fails the promotion with `DiskError`). Nothing in the
  tree is followed or opened blocking.
- `adopt` records a folder another agent downloaded (KServe's add-on, which writes no
  manifest) as complete, after the same normalisation; it refuses (writing nothing) anything
  but a real, non-empty directory with neither manifest nor promotion record whose tree it
  could fully check and clean. Modes it cannot change (another uid's files) are tolerated.
- `delete_unreferenced` only ever removes storage-key-shaped names (16 lowercase hex) that the
  caller did not list, removes the manifest before the folder, and never touches anything else
  under `models/`. It returns only the keys whose bytes are really gone. A folder that cannot
  be removed (e.g. written by a download pod under another uid) stays in `.trash`, is logged
  (`folder_delete_failed`, with the folder and the error) and retried on later calls with
  exponential backoff (`DELETE_RETRY_S` doubling up to `DELETE_RETRY_MAX_S`);
  `deletion_failures()` lists what is pending and `take_new_deletion_failures()` what the
  caller has not reported yet. Folders the agent owns are made writable before removal.
- Not promised: thread safety. One agent process owns a root; call these methods from one task
  (they block on the filesystem: run them with `asyncio.to_thread`).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import time
import uuid
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from localcache.agent import layout, tree

log = structlog.get_logger(__name__)

folder_bytes = tree.folder_bytes

DELETE_RETRY_S = 30.0
DELETE_RETRY_MAX_S = 3600.0


def _checkpoint(step: str) -> None:
    """Marks a step of the promotion protocol; tests replace it to simulate a crash there."""


@dataclass(slots=True)
class _Failing:
    folder: str
    storage_key: str | None
    error: str
    attempts: int
    next_at: float

    def public(self, now: float) -> layout.DeletionFailure:
        return layout.DeletionFailure(
            folder=self.folder,
            storage_key=self.storage_key,
            error=self.error,
            attempts=self.attempts,
            retry_in=max(0.0, self.next_at - now),
        )


def _not_a_directory(path: Path) -> str | None:
    """What `path` is when it exists and is not a directory ("a symlink", "not a directory")."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(mode):
        return None
    return "a symlink" if stat.S_ISLNK(mode) else "not a directory"


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
    tree.fsync_dir(path.parent)


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

    def __init__(
        self,
        root: Path = layout.DEFAULT_ROOT,
        *,
        host_path: str | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.host_path = host_path
        self.models = root / layout.MODELS_DIR
        self.staging = root / layout.STAGING_DIR
        self.manifests = root / layout.MANIFESTS_DIR
        self.trash = root / layout.TRASH_DIR
        self.download_uid: int | None = os.geteuid() or None
        """The uid download pods run as, so that the agent owns (and can delete) what they
        write: the agent's own; None when the agent is root (it may delete anything, and a
        download pod is never made to run as root)."""
        self._monotonic = monotonic
        self._failing: dict[str, _Failing] = {}  # by path under root: .trash/<name>, models/<key>
        self._origin: dict[str, tuple[str, str | None]] = {}  # trash name -> folder, key
        self._unreported: dict[str, layout.DeletionFailure] = {}

    # ---- layout -------------------------------------------------------------------------
    def ensure_layout(self) -> list[str]:
        """Create the root's sub-directories (idempotent); raise `DiskError` when one of them
        is a symlink or not a directory (a `.trash` linked to `models` would make one pass
        delete every model): nothing is moved or deleted through it.

        `.staging` and `.trash` hold nothing that outlives a pass unreported, so one that is a
        symlink or a file is unlinked (never followed) and made a directory again; the returned
        messages say what was repaired. `models` and `.manifests` are never repaired: they
        hold the node's models and their records, and an operator must look first."""
        repaired: list[str] = []
        for path in (self.staging, self.trash):
            kind = _not_a_directory(path)
            if kind is not None:
                path.unlink()
                repaired.append(
                    f"{path} was {kind}: removed without following it and recreated as a "
                    "directory; nothing was moved or deleted through it"
                )
        for path in (self.models, self.staging, self.manifests, self.trash):
            _plain_directory(path)
        return repaired

    def model_path(self, storage_key: str) -> Path:
        layout.require_key(storage_key)
        return self.models / storage_key

    def staging_path(self, storage_key: str, job_name: str) -> Path:
        return self.staging / layout.staging_name(storage_key, job_name)

    def prepare_staging(
        self,
        storage_key: str,
        job_name: str,
        *,
        group: int | None = None,
        mode: int = layout.STAGING_MODE,
    ) -> Path:
        """Create an empty staging folder (idempotent) that the download pod can write and
        nobody else: owned by the agent (the pod's uid, `download_uid`), group `group` (the
        Job's fsGroup) when given, `mode` (not world-writable)."""
        path = self.staging_path(storage_key, job_name)
        _plain_directory(self.staging)
        with contextlib.suppress(FileExistsError):
            path.mkdir()
        info = os.lstat(path)
        if not stat.S_ISDIR(info.st_mode):
            raise layout.DiskError(f"staging folder {path} is not a directory")
        if group is not None and info.st_gid != group:
            try:
                os.chown(path, -1, group, follow_symlinks=False)
            except OSError as exc:
                log.warning("staging_group_not_set", staging=path.name, gid=group, error=str(exc))
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
            left = tree.normalise(staging).not_removed
            if left:
                raise layout.DiskError(f"{staging}: could not remove {', '.join(left[:3])}")
            tree.fsync_tree(staging)
            os.rename(staging, final)
            tree.fsync_dir(self.models)
            tree.fsync_dir(self.staging)
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
        tree.fsync_dir(self.manifests)
        _checkpoint("record-removed")
        self._empty_trash()
        return outcome, in_force

    # ---- adoption -----------------------------------------------------------------------
    def adopt(self, storage_key: str, *, uri: str, job: str, completed_at: str) -> layout.Adoption:
        """Record `models/<storage_key>`, downloaded by another agent (KServe's add-on writes no
        manifest), as complete: normalise it as `promote` does (modes this uid cannot change
        are tolerated and returned), then write its manifest (`adopted` set, `bytes` counted
        here) atomically and fsynced. Refused, with nothing written, unless the folder is a
        real non-empty directory without a manifest or promotion record, every directory in
        it could be read and every entry normalisation drops could be removed."""
        final = self.model_path(storage_key)
        kind = _not_a_directory(final)
        if kind is not None:
            return layout.Adoption(refused=f"{final} is {kind}")
        if not final.exists():
            return layout.Adoption(refused=f"{final} does not exist")
        records = {"a manifest": self._manifest_path(storage_key)}
        records["a pending promotion"] = self._record_path(storage_key)
        for what, path in records.items():
            if os.path.lexists(path):
                return layout.Adoption(refused=f"{storage_key} has {what} ({path.name})")
        if not any(final.iterdir()):
            return layout.Adoption(refused=f"{final} is empty")
        done = tree.normalise(final)
        if done.not_removed or done.unreadable:
            left = [*done.not_removed, *done.unreadable]
            return layout.Adoption(refused=f"could not check or clean {', '.join(left[:3])}")
        tree.fsync_tree(final)
        manifest = layout.Manifest(
            storage_key=storage_key,
            uri=uri,
            bytes=tree.folder_bytes(final),
            completed_at=completed_at,
            job=job,
            adopted=True,
        )
        _plain_directory(self.manifests)
        _write_json_atomic(self._manifest_path(storage_key), manifest.to_json())
        return layout.Adoption(manifest=manifest, modes_not_fixed=tuple(done.modes_not_fixed))

    # ---- deletion -----------------------------------------------------------------------
    def delete_unreferenced(
        self, referenced: Collection[str], *, live_jobs: Collection[str] | None = None
    ) -> list[str]:
        """Delete model folders whose storage key is not in `referenced`, with their manifests,
        and stale staging folders: those of unreferenced keys and, when `live_jobs` (names of
        the download Jobs that still exist) is given, those whose Job is gone. Names that are
        not storage-key shaped are never touched. Returns the storage keys deleted."""
        trashed: dict[str, str] = {}
        for key in self.list_model_folders():
            if key in referenced:
                continue
            self._manifest_path(key).unlink(missing_ok=True)
            name = self._try_move_to_trash(self.models / key, storage_key=key)
            if name is not None:
                trashed[key] = name
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
                self._try_move_to_trash(path, storage_key=None)
        self._empty_trash()
        for where in [w for w in self._failing if not w.startswith(f"{layout.TRASH_DIR}/")]:
            key = where.removeprefix(f"{layout.MODELS_DIR}/")
            if key in referenced or not os.path.lexists(self.root / where):
                self._forget(where)  # wanted again, or gone by other means
        deleted = [k for k, name in trashed.items() if not os.path.lexists(self.trash / name)]
        for key in deleted:
            log.info("model_folder_deleted", storage_key=key)
        return deleted

    def deletion_failures(self) -> list[layout.DeletionFailure]:
        """Folders whose deletion failed and is still pending (retried with backoff)."""
        now = self._monotonic()
        return [f.public(now) for _, f in sorted(self._failing.items())]

    def take_new_deletion_failures(self) -> list[layout.DeletionFailure]:
        """Failures not returned before: new ones, and ones whose error changed. The caller
        reports them (an Event), so a folder failing every pass is reported once."""
        taken = [f for _, f in sorted(self._unreported.items())]
        self._unreported.clear()
        return taken

    def remove_staging(self, storage_key: str, job_name: str) -> None:
        """Discard one staging folder (e.g. of a failed download before its retry)."""
        self._remove_tree(self.staging_path(storage_key, job_name))

    @staticmethod
    def _list(directory: Path) -> list[Path]:
        try:
            return sorted(directory.iterdir())
        except FileNotFoundError:
            return []

    def _move_to_trash(self, path: Path, *, storage_key: str | None = None) -> str:
        _plain_directory(self.models)
        _plain_directory(self.trash)
        name = f"{path.name}.{uuid.uuid4().hex}"
        os.rename(path, self.trash / name)
        self._origin[name] = (str(path.relative_to(self.root)), storage_key)
        tree.fsync_dir(path.parent)
        return name

    def _try_move_to_trash(self, path: Path, *, storage_key: str | None) -> str | None:
        """Move `path` into `.trash`; a failure (e.g. a folder of another uid, which only its
        owner may move) is recorded and retried after its backoff. Returns the trash name."""
        folder = str(path.relative_to(self.root))
        failing = self._failing.get(folder)
        if failing is not None and self._monotonic() < failing.next_at:
            return None
        try:
            name = self._move_to_trash(path, storage_key=storage_key)
        except OSError as exc:
            self._failed(folder, folder, storage_key, exc)
            return None
        self._forget(folder)
        if storage_key is None:
            log.info("staging_folder_deleted", staging=path.name)
        return name

    def _remove_tree(self, path: Path) -> None:
        if path.is_dir():
            self._move_to_trash(path)
            self._empty_trash()

    def _empty_trash(self) -> None:
        """Remove what `.trash` holds; an entry that cannot be removed stays, is logged and
        reported (`take_new_deletion_failures`) and retried after its backoff."""
        _plain_directory(self.trash)
        now = self._monotonic()
        present = set()
        for path in self._list(self.trash):
            where = f"{layout.TRASH_DIR}/{path.name}"
            present.add(where)
            failing = self._failing.get(where)
            if failing is not None and now < failing.next_at:
                continue
            try:
                tree.remove(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                folder, key = self._origin.get(path.name, (None, None))
                if folder is None:  # left by an earlier process
                    folder = where
                    head = path.name.split(".", 1)[0]
                    key = head if layout.is_storage_key(head) else None
                self._failed(where, folder, key, exc)
                continue
            present.discard(where)
            self._forget(where)
        for where in [w for w in self._failing if w.startswith(f"{layout.TRASH_DIR}/")]:
            if where not in present:  # removed by someone else meanwhile
                self._forget(where)

    def _forget(self, where: str) -> None:
        self._failing.pop(where, None)
        self._origin.pop(where.removeprefix(f"{layout.TRASH_DIR}/"), None)
        self._unreported.pop(where, None)

    def _failed(self, name: str, folder: str, storage_key: str | None, exc: OSError) -> None:
        now = self._monotonic()
        error = tree.describe_error(exc)
        before = self._failing.get(name)
        attempts = before.attempts + 1 if before is not None else 1
        delay = min(DELETE_RETRY_S * 2 ** (attempts - 1), DELETE_RETRY_MAX_S)
        failing = _Failing(folder, storage_key, error, attempts, now + delay)
        self._failing[name] = failing
        log.warning(
            "folder_delete_failed",
            folder=folder,
            storage_key=storage_key,
            error=error,
            attempts=attempts,
            retry_in_s=delay,
        )
        if before is None or before.error != error:
            self._unreported[name] = failing.public(now)
