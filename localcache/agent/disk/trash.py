"""Deleting on a models root: what no entry references goes through `.trash`, with retries.

`Trash` is the deletion half of one root's `folders.ModelDisk` (which delegates to it).

Contract:
- `delete_unreferenced` only ever removes storage-key-shaped names (16 lowercase hex) that the
  caller did not list, removes the peer file list and the manifest before the folder, and
  never touches anything else under `models/`. It returns only the keys whose bytes are
  really gone.
- Everything is first renamed into `.trash` (one rename, then an fsync of the directory it
  left), then removed there. A folder that cannot be moved or removed (e.g. written by a
  download pod under another uid) stays where it is or in `.trash`, is logged
  (`folder_delete_failed`, with the folder and the error) and retried on later calls with
  exponential backoff (`DELETE_RETRY_S` doubling up to `DELETE_RETRY_MAX_S`); `failures()`
  lists what is pending and `take_new_failures()` what the caller has not reported yet.
  Folders the agent owns are made writable before removal (`tree.remove`).
- Not promised: thread safety (one task per root, as for `ModelDisk`).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from localcache.agent.disk import layout, tree
from localcache.runtime import durable

log = structlog.get_logger(__name__)

DELETE_RETRY_S = 30.0
DELETE_RETRY_MAX_S = 3600.0


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


class Trash:
    """The deletions on the models root `root` (see the module contract)."""

    def __init__(self, root: Path, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.root = root
        self.models = root / layout.MODELS_DIR
        self.staging = root / layout.STAGING_DIR
        self.manifests = root / layout.MANIFESTS_DIR
        self.trash = root / layout.TRASH_DIR
        self._monotonic = monotonic
        self._failing: dict[str, _Failing] = {}  # by path under root: .trash/<name>, models/<key>
        self._origin: dict[str, tuple[str, str | None]] = {}  # trash name -> folder, key
        self._unreported: dict[str, layout.DeletionFailure] = {}

    def delete_unreferenced(
        self,
        referenced: Collection[str],
        *,
        folders: Iterable[str],
        live_jobs: Collection[str] | None = None,
    ) -> list[str]:
        """Delete the model `folders` (storage keys under `models/`) not in `referenced`, with
        their manifests, orphan manifests, and stale staging folders: those of unreferenced
        keys and, when `live_jobs` (names of the download Jobs that still exist) is given,
        those whose Job is gone. Returns the storage keys deleted."""
        trashed: dict[str, str] = {}
        for folder in folders:  # a storage key's folder and its variants go together
            key = layout.key_of_folder(folder)
            if key is None or key in referenced:
                continue
            (self.manifests / f"{folder}{layout.FILES_SUFFIX}").unlink(missing_ok=True)
            (self.manifests / f"{folder}{layout.MANIFEST_SUFFIX}").unlink(missing_ok=True)
            name = self.try_move(self.models / folder, storage_key=key)
            if name is not None:
                trashed[folder] = name
        for path in tree.listing(self.manifests):
            folder = path.name.removesuffix(layout.MANIFEST_SUFFIX)
            if path.name.endswith(layout.RECORD_SUFFIX) or not path.name.endswith(
                layout.MANIFEST_SUFFIX
            ):
                continue
            key = layout.key_of_folder(folder)
            if key is not None and key not in referenced and not (self.models / folder).exists():
                path.with_name(f"{folder}{layout.FILES_SUFFIX}").unlink(missing_ok=True)
                path.unlink(missing_ok=True)
        pending = {
            str(data.get("staging"))
            for p in tree.listing(self.manifests)
            if p.name.endswith(layout.RECORD_SUFFIX) and (data := durable.read_json(p)) is not None
        }
        for path in tree.listing(self.staging):
            match = layout.STAGING_RE.fullmatch(path.name)
            if match is None or path.name in pending or not path.is_dir():
                continue
            job_gone = live_jobs is not None and match["job"] not in live_jobs
            if match["key"] not in referenced or job_gone:
                self.try_move(path, storage_key=None)
        staged = {
            m["job"]
            for p in tree.listing(self.staging)
            if (m := layout.STAGING_RE.fullmatch(p.name))
        }
        for path in tree.listing(self.root / layout.JOBS_DIR):
            if path.name.removesuffix(layout.MANIFEST_SUFFIX) not in staged:
                path.unlink(missing_ok=True)  # its staging folder is gone: so are its pods
        self.empty()
        for where in [w for w in self._failing if not w.startswith(f"{layout.TRASH_DIR}/")]:
            key = layout.key_of_folder(where.removeprefix(f"{layout.MODELS_DIR}/"))
            if key in referenced or not os.path.lexists(self.root / where):
                self._forget(where)  # wanted again, or gone by other means
        deleted = [f for f, name in trashed.items() if not os.path.lexists(self.trash / name)]
        for folder in deleted:
            log.info("model_folder_deleted", folder=folder)
        return sorted({layout.key_of_folder(f) or f for f in deleted})

    def failures(self) -> list[layout.DeletionFailure]:
        """Folders whose deletion failed and is still pending (retried with backoff)."""
        now = self._monotonic()
        return [f.public(now) for _, f in sorted(self._failing.items())]

    def take_new_failures(self) -> list[layout.DeletionFailure]:
        """Failures not returned before: new ones, and ones whose error changed. The caller
        reports them (an Event), so a folder failing every pass is reported once."""
        taken = [f for _, f in sorted(self._unreported.items())]
        self._unreported.clear()
        return taken

    def move(self, path: Path, *, storage_key: str | None = None) -> str:
        """Rename `path` into `.trash` (raising `OSError`); returns its name there."""
        tree.plain_directory(self.models)
        tree.plain_directory(self.trash)
        name = f"{path.name}.{uuid.uuid4().hex}"
        os.rename(path, self.trash / name)
        self._origin[name] = (str(path.relative_to(self.root)), storage_key)
        durable.fsync_dir(path.parent)
        return name

    def try_move(self, path: Path, *, storage_key: str | None) -> str | None:
        """Move `path` into `.trash`; a failure (e.g. a folder of another uid, which only its
        owner may move) is recorded and retried after its backoff. Returns the trash name."""
        folder = str(path.relative_to(self.root))
        failing = self._failing.get(folder)
        if failing is not None and self._monotonic() < failing.next_at:
            return None
        try:
            name = self.move(path, storage_key=storage_key)
        except OSError as exc:
            self._failed(folder, folder, storage_key, exc)
            return None
        self._forget(folder)
        if storage_key is None:
            log.info("staging_folder_deleted", staging=path.name)
        return name

    def remove_tree(self, path: Path) -> None:
        """Move a directory into `.trash` and empty it (nothing when `path` is none)."""
        if path.is_dir():
            self.move(path)
            self.empty()

    def empty(self) -> None:
        """Remove what `.trash` holds; an entry that cannot be removed stays, is logged and
        reported (`take_new_failures`) and retried after its backoff."""
        tree.plain_directory(self.trash)
        now = self._monotonic()
        present = set()
        for path in tree.listing(self.trash):
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
