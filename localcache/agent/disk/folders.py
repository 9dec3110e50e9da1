"""The model folders of one models root: layout, staging, promotion, recovery, adoption.

The layout of the models root, its names and its records (`Manifest`, `Recovered`,
`DiskError`) are `layout`; `ModelDisk` here does the filesystem work on them, and hands
deletions to its `trash.Trash` (`delete_unreferenced`, `deletion_failures`,
`take_new_deletion_failures`, `remove_staging`: contract in `trash`).

Contract:
- A model folder is complete iff the folder and its manifest both exist and the manifest names
  the same storage key. A folder without a manifest is never complete (partial, legacy, or
  half-promoted), so `is_complete` never reports a download that did not finish.
- `promote` writes an intent record first, then moves the staging folder into place with one
  rename, then writes the manifest (temp file + rename), then drops the record. Each file write
  is fsynced and every rename is followed by an fsync of the directories involved
  (`runtime.durable`). A crash at any point leaves a state that `recover()` completes from the
  intent record; running `promote` or `recover` twice is harmless.
- `promote` first normalises the download (`tree.normalise`): directories `layout.DIR_MODE`,
  regular files `layout.FILE_MODE` (no setuid, setgid or world-write), symlinks that are
  absolute or lead out of the folder and special files (FIFOs, sockets, devices) removed, each
  with a warning (one it cannot remove fails the promotion with `DiskError`). Nothing in the
  tree is followed or opened blocking.
- `adopt` records a folder another agent downloaded (KServe's add-on, which writes no
  manifest) as complete, after the same normalisation; it refuses (writing nothing) anything
  but a real, non-empty directory with neither manifest nor promotion record whose tree it
  could fully check and clean. Modes it cannot change (another uid's files) are tolerated.
- Not promised: thread safety. One agent process owns a root; call these methods from one task
  (they block on the filesystem: run them with `asyncio.to_thread`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
import time
from collections.abc import Callable, Collection
from pathlib import Path

import structlog

from localcache.agent.disk import adopt, digest, layout, originsums, trash, tree
from localcache.runtime import durable

log = structlog.get_logger(__name__)


def _checkpoint(step: str) -> None:
    """Marks a step of the promotion protocol; tests replace it to simulate a crash there."""


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
        self.jobs = root / layout.JOBS_DIR
        self.download_uid: int | None = os.geteuid() or None
        """The uid download pods run as, so that the agent owns (and can delete) what they
        write: the agent's own; None when the agent is root (it may delete anything, and a
        download pod is never made to run as root)."""
        self._trash = trash.Trash(root, monotonic=monotonic)

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
            kind = tree.not_a_directory(path)
            if kind is not None:
                path.unlink()
                repaired.append(
                    f"{path} was {kind}: removed without following it and recreated as a "
                    "directory; nothing was moved or deleted through it"
                )
        for path in (self.models, self.staging, self.manifests, self.trash, self.jobs):
            tree.plain_directory(path)
        return repaired

    def model_path(self, storage_key: str, variant: str | None = None) -> Path:
        return self.models / layout.folder_name(storage_key, variant)

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
        tree.plain_directory(self.staging)
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

    def record_job(
        self, job_name: str, *, namespace: str, status_key: str, storage_key: str
    ) -> None:
        """Record, before the Job exists, what its pods may mount (`layout.JOBS_DIR`)."""
        layout.staging_name(storage_key, job_name)  # DiskError unless a valid pair
        tree.plain_directory(self.jobs)
        record = {"namespace": namespace, "statusKey": status_key, "storageKey": storage_key}
        durable.write_json_atomic(layout.job_record_path(self.root, job_name), record)

    def forget_job(self, job_name: str) -> None:
        layout.job_record_path(self.root, job_name).unlink(missing_ok=True)

    def manifest_path(self, storage_key: str, variant: str | None = None) -> Path:
        return (
            self.manifests / f"{layout.folder_name(storage_key, variant)}{layout.MANIFEST_SUFFIX}"
        )

    def record_path(self, storage_key: str) -> Path:
        return self.manifests / f"{storage_key}{layout.RECORD_SUFFIX}"

    # ---- queries ------------------------------------------------------------------------
    def manifest(self, storage_key: str, variant: str | None = None) -> layout.Manifest | None:
        """The manifest of `storage_key` (its `variant`), or None when absent or unreadable."""
        data = durable.read_json(self.manifest_path(storage_key, variant))
        if data is None:
            return None
        try:
            return layout.Manifest.from_json(data)
        except layout.DiskError:
            return None

    def is_complete(self, storage_key: str, variant: str | None = None) -> bool:
        """The folder AND its manifest exist and the manifest is for this storage key."""
        if not self.model_path(storage_key, variant).is_dir():
            return False
        manifest = self.manifest(storage_key, variant)
        return manifest is not None and manifest.storage_key == storage_key

    def list_model_folders(self) -> list[str]:
        """Model folders under `models/` (`layout.folder_name`; other names are not ours)."""
        try:
            entries = list(os.scandir(self.models))
        except FileNotFoundError:
            return []
        return sorted(
            e.name
            for e in entries
            if layout.key_of_folder(e.name) and e.is_dir(follow_symlinks=False)
        )

    # ---- promotion ----------------------------------------------------------------------
    def promote(
        self,
        staging: Path,
        storage_key: str,
        manifest: layout.Manifest,
        *,
        variant: str | None = None,
        seeded: bool = False,
    ) -> layout.Manifest:
        """Move a finished download into `models/<storage_key>` and record its manifest;
        returns the manifest in force (its `variant` says which folder). When a complete
        folder of another download of the same URI is there already, the two are compared
        (`digest`): the same content is shared (the new download is discarded), different
        content becomes the folder `variant` of the downloading scope
        (`models/<key>.<variant>`), never a silent discard. `seeded`: the Job had the
        checksum sidecar, whose record goes from the folder into the manifest (`originsums`)."""
        layout.require_key(storage_key)
        if manifest.storage_key != storage_key:
            raise layout.DiskError(f"manifest is for {manifest.storage_key}, not {storage_key}")
        if staging.parent != self.staging:
            raise layout.DiskError(f"{staging} is not a staging folder of {self.root}")
        if not staging.is_dir():
            raise layout.DiskError(f"staging folder {staging} does not exist")
        self.ensure_layout()
        if seeded:
            manifest = originsums.with_staged(manifest, staging)
        record: dict[str, object] = {"staging": staging.name, "manifest": manifest.to_json()}
        if variant is not None:
            layout.folder_name(storage_key, variant)  # DiskError unless a variant
            record["variant"] = variant
        durable.write_json_atomic(self.record_path(storage_key), record | {"seeded": seeded})
        _checkpoint("record-written")
        return self._settle(storage_key, staging.name, manifest, variant, seeded)[1]

    def recover(self) -> list[layout.Recovered]:
        """Finish every promotion interrupted by a crash (call at start-up, before reconciling);
        a record that cannot be settled is renamed `<key>.promoting.json.quarantined`, logged
        and returned as "quarantined" with the error, and never read again."""
        done: list[layout.Recovered] = []
        for tmp in tree.listing(self.manifests):
            if tmp.name.startswith(".") and tmp.name.endswith(".tmp"):
                tmp.unlink(missing_ok=True)  # a temp file whose atomic write never finished
        records = [p for p in tree.listing(self.manifests) if p.name.endswith(layout.RECORD_SUFFIX)]
        for path in records:
            storage_key = path.name.removesuffix(layout.RECORD_SUFFIX)
            data = durable.read_json(path)
            try:
                if not layout.is_storage_key(storage_key) or data is None:
                    raise layout.DiskError("unreadable promotion record")
                staging = str(data["staging"])
                manifest = layout.Manifest.from_json(data["manifest"])
                variant = data.get("variant")
                if variant is not None:
                    variant = str(variant)
                    layout.folder_name(storage_key, variant)
                match = layout.STAGING_RE.fullmatch(staging)
                keys = {storage_key, manifest.storage_key, match["key"] if match else ""}
                if len(keys) != 1:
                    raise layout.DiskError("inconsistent promotion record")
            except (layout.DiskError, KeyError, TypeError) as exc:
                log.warning("promotion_record_dropped", path=str(path), error=str(exc))
                path.unlink(missing_ok=True)
                continue
            try:
                seeded = data.get("seeded") is True
                outcome, _ = self._settle(storage_key, staging, manifest, variant, seeded)
            except (layout.DiskError, OSError) as exc:
                # one promotion that cannot finish (a storage-key collision, content that
                # cannot be removed) must not stop every pass of the agent (security review
                # finding 8): its record is set aside, the others recover
                error = str(exc) if isinstance(exc, layout.DiskError) else tree.describe_error(exc)
                path.replace(path.with_name(path.name + layout.QUARANTINE_SUFFIX))
                log.warning("promotion_record_quarantined", storage_key=storage_key, error=error)
                done.append(layout.Recovered(storage_key, staging, "quarantined", error))
                continue
            log.info("promotion_recovered", storage_key=storage_key, outcome=outcome)
            done.append(layout.Recovered(storage_key=storage_key, staging=staging, outcome=outcome))
        return done

    def _settle(
        self,
        storage_key: str,
        staging_name_: str,
        manifest: layout.Manifest,
        variant: str | None = None,
        seeded: bool = False,
    ) -> tuple[layout.Outcome, layout.Manifest]:
        """Idempotently drive one promotion to its end state, from wherever it stopped."""
        staging = self.staging / staging_name_
        if seeded:  # after the record holds the sums: a crash never loses them
            originsums.drop_staged(staging)
        existing = self.manifest(storage_key)
        outcome: layout.Outcome
        in_force = manifest
        if self.is_complete(storage_key):
            assert existing is not None
            if existing.uri != manifest.uri:
                raise layout.DiskError(
                    f"storage key {storage_key} already holds {existing.uri!r}, "
                    f"not {manifest.uri!r}"
                )
            if existing.job == manifest.job:  # this promotion got that far before
                outcome, in_force = "finished", existing
                self._trash.remove_tree(staging)
            else:
                outcome, in_force = self._second_download(
                    storage_key, staging, manifest, existing, variant
                )
        else:
            outcome = self._into_place(staging, storage_key, None, manifest)
        self.record_path(storage_key).unlink(missing_ok=True)
        durable.fsync_dir(self.manifests)
        _checkpoint("record-removed")
        self._trash.empty()
        return outcome, in_force

    def _second_download(
        self,
        storage_key: str,
        staging: Path,
        manifest: layout.Manifest,
        existing: layout.Manifest,
        variant: str | None,
    ) -> tuple[layout.Outcome, layout.Manifest]:
        """Another download of a URI whose folder is complete: share it only when the content
        is the same, else keep this one apart as the scope's `variant` (security review
        finding 3: the first download to finish was served to every scope)."""
        if variant is not None and self.is_complete(storage_key, variant):
            self._trash.remove_tree(staging)  # got that far before, or a retry of it
            return "finished", self.manifest(storage_key, variant) or manifest
        if not staging.is_dir():
            if variant is not None and self.model_path(storage_key, variant).is_dir():
                folder = self.model_path(storage_key, variant)
                kept = dataclasses.replace(
                    manifest, digest=digest.tree_digest(folder), variant=variant
                )
                return self._into_place(staging, storage_key, variant, kept), kept
            return "kept-existing", existing  # discarded as the same content before
        tree.normalise_checked(staging)
        ours = digest.tree_digest(staging)
        if not existing.digest:
            existing = dataclasses.replace(
                existing, digest=digest.tree_digest(self.model_path(storage_key))
            )
            durable.write_json_atomic(self.manifest_path(storage_key), existing.to_json())
        if ours == existing.digest:
            self._trash.remove_tree(staging)
            return "kept-existing", existing
        if variant is None:
            raise layout.DiskError(
                f"a download of {manifest.uri!r} differs from the complete folder "
                f"{storage_key} and names no scope to keep it apart"
            )
        log.warning(
            "download_differs_from_folder",
            storage_key=storage_key,
            variant=variant,
            job=manifest.job,
            folder_job=existing.job,
        )
        kept = dataclasses.replace(manifest, digest=ours, variant=variant)
        self._into_place(staging, storage_key, variant, kept)
        return "promoted-variant", kept

    def _into_place(
        self, staging: Path, storage_key: str, variant: str | None, manifest: layout.Manifest
    ) -> layout.Outcome:
        """Rename `staging` to the folder (after checking it) and write its manifest."""
        final = self.model_path(storage_key, variant)
        if staging.is_dir():
            if final.exists():
                # An incomplete folder (no manifest): partial, legacy, or a stale leftover.
                self._trash.move(final)
                _checkpoint("old-moved-aside")
            for orphan in (layout.FILES_SUFFIX, layout.MANIFEST_SUFFIX):  # file list first
                (self.manifests / f"{final.name}{orphan}").unlink(missing_ok=True)
            tree.normalise_checked(staging)
            durable.fsync_tree(staging)
            os.rename(staging, final)
            durable.fsync_dir(self.models)
            durable.fsync_dir(self.staging)
            _checkpoint("renamed")
            outcome: layout.Outcome = "promoted"
        elif final.is_dir():
            outcome = "manifest-written"  # the rename happened, the manifest did not
        else:
            return "abandoned"
        durable.write_json_atomic(self.manifest_path(storage_key, variant), manifest.to_json())
        _checkpoint("manifest-written")
        return outcome

    # ---- adoption -----------------------------------------------------------------------
    def adopt(self, storage_key: str, *, uri: str, job: str, completed_at: str) -> layout.Adoption:
        """Record a folder another agent downloaded as complete (`adoption.adopt`)."""
        return adopt.adopt(self, storage_key, uri=uri, job=job, completed_at=completed_at)

    # ---- deletion (`trash`) -----------------------------------------------------------
    def delete_unreferenced(
        self, referenced: Collection[str], *, live_jobs: Collection[str] | None = None
    ) -> list[str]:
        """Delete model folders whose storage key is not in `referenced`, with their manifests,
        and stale staging folders (`trash.Trash.delete_unreferenced`); returns the keys
        deleted."""
        return self._trash.delete_unreferenced(
            referenced, folders=self.list_model_folders(), live_jobs=live_jobs
        )

    def deletion_failures(self) -> list[layout.DeletionFailure]:
        """Folders whose deletion failed and is still pending (retried with backoff)."""
        return self._trash.failures()

    def take_new_deletion_failures(self) -> list[layout.DeletionFailure]:
        """Failures not returned before (`trash.Trash.take_new_failures`)."""
        return self._trash.take_new_failures()

    def remove_staging(self, storage_key: str, job_name: str) -> None:
        """Discard one staging folder (e.g. of a failed download before its retry)."""
        self._trash.remove_tree(self.staging_path(storage_key, job_name))
