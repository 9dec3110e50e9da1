"""A complete model folder's peer file list: its verified manifest and who may fetch it.

`<root>/.manifests/<folder>.files.json` (`path`) holds a `FileList`: the folder's
`api.peer.PeerManifest` (every entry, each regular file with its size and sha256), the
`Stamp` of the promotion it was computed for (the folder manifest's `job` and
`completedAt`), and `scopes`, the credential scope digests (SHA-256 hex, as
`agent.downloads.scope_id`) whose downloads proved access to this content on this node (at
most `peer.MAX_SCOPES`).

Contract:
- `compute` walks the folder ONCE with `agent.disk.digest.listing`, so the manifest's
  `digest` is `digest.tree_digest(folder)`; it is bounded (`peer.MAX_FILES` entries,
  `peer.MAX_DEPTH` levels) and raises `Unservable` for a folder the wire cannot describe
  (too many entries or levels, a path longer than `peer.MAX_PATH` or not UTF-8), `OSError`
  when it cannot read it, `digest.Stopped` when `stop()` turned true. It blocks: call it in
  a thread. Each file's `originSha256` is the one its origin published (`originsums`: Hugging
  Face LFS files, an `s3://` seed's staged checksums); `OriginMismatch` (an `Unservable`) when
  a file's bytes are not that, `OriginUnchecked` (one too, before any I/O) for a seed whose
  checksums were never staged (`layout.Manifest.origin_unchecked`).
- `write` stores atomically (`runtime.durable`); `read` returns the stored list only when it
  is whole and consistent (schema, folder name, storage key, digest recomputed from the
  entries, scopes), else None; `current` also requires the stamp of the folder's manifest
  in force: a list computed for an earlier promotion of the folder is never returned, nor
  one stored before origin checksums were checked, of a model whose origin publishes them
  (it is made again, once).
- The list goes with its folder: `trash.Trash.delete_unreferenced` removes it before the
  folder's manifest, `folders.ModelDisk` before a folder is moved into place, and `prune`
  removes the lists whose folder is not complete.
- Not promised: thread safety; one task writes a root's lists (the agent's reconciler).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pydantic

from localcache.agent.disk import digest, layout, originsums, tree
from localcache.api import peer
from localcache.runtime import durable

FORMAT_VERSION: Final = 1


class Unservable(Exception):
    """The folder cannot be described by a peer manifest (the message says why)."""

    reason = peer.UnservableReason.UNSERVABLE
    event, alarm = "peer_file_list_failed", False
    """What the agent's log says of it, and whether as an error."""


class OriginMismatch(Unservable):
    """Files of the folder are not the SHA-256 their origin published (`originsums`)."""

    reason = peer.UnservableReason.ORIGIN_MISMATCH
    event, alarm = "peer_file_list_not_origin", True


class OriginUnchecked(Unservable):
    """The download was to record its origin's checksums and did not (`originsums`)."""

    reason = peer.UnservableReason.ORIGIN_UNCHECKED
    event = "peer_file_list_unchecked"


@dataclass(frozen=True, slots=True)
class Stamp:
    """Which promotion of a folder a list describes."""

    job: str
    completed_at: str

    @classmethod
    def of(cls, manifest: layout.Manifest) -> Stamp:
        return cls(manifest.job, manifest.completed_at)


@dataclass(frozen=True, slots=True)
class FileList:
    folder: str
    stamp: Stamp
    manifest: peer.PeerManifest
    scopes: tuple[str, ...]
    origin_checked: bool = True
    """Made by a version that checks the origin's checksums (`originsums`); a list stored
    before is read with False."""


def path(root: Path, folder: str) -> Path:
    """Where the list of `models/<folder>` lives on `root`."""
    if layout.key_of_folder(folder) is None:
        raise layout.DiskError(f"not a model folder: {folder!r}")
    return root / layout.MANIFESTS_DIR / f"{folder}{layout.FILES_SUFFIX}"


def _never() -> bool:
    return False


def compute(
    folder: Path,
    storage_key: str,
    *,
    uri: str = "",
    staged: Iterable[tuple[str, str]] = (),
    unchecked: bool = False,
    stop: Callable[[], bool] = _never,
    known: Mapping[digest.Identity, str] | None = None,
) -> peer.PeerManifest:
    """The folder's peer manifest (module contract) of a download of `uri`; `staged`: the
    origin checksums its promotion recorded (`layout.Manifest.origin_sums`), `unchecked`: it
    recorded none though it was to (`layout.Manifest.origin_unchecked`); `known`: see
    `digest.listing`."""
    if unchecked:
        raise OriginUnchecked(
            f"{folder}: the origin's checksums of this download were not recorded"
        )
    try:
        found = digest.listing(
            folder, max_entries=peer.MAX_FILES, max_depth=peer.MAX_DEPTH, stop=stop, known=known
        )
    except digest.TooLarge as exc:
        raise Unservable(str(exc)) from exc
    texts = [*found.dirs, *found.others]
    texts += [p for p, _, _ in found.files] + [t for link in found.links for t in link]
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise Unservable(f"{folder}: a name is not UTF-8") from None
    sums = originsums.published(folder, uri, found.files, staged=staged)
    differ = originsums.mismatches(found.files, sums)
    if differ:
        raise OriginMismatch(
            f"{folder}: {len(differ)} file(s) are not the SHA-256 the origin published, "
            f"first {differ[0][:200]!r}"
        )
    try:
        return peer.PeerManifest(
            storage_key=storage_key,
            digest=found.digest(),
            files=[
                peer.ManifestFile(path=p, size=size, sha256=sha, origin_sha256=sums.get(p))
                for p, size, sha in sorted(found.files)
            ],
            dirs=sorted(found.dirs),
            links=[peer.ManifestLink(path=p, target=t) for p, t in sorted(found.links)],
            others=sorted(found.others),
        )
    except pydantic.ValidationError as exc:
        raise Unservable(f"{folder}: {exc.errors()[0]['msg']}") from exc


def merge_scopes(stored: Sequence[str], wanted: Iterable[str]) -> tuple[str, ...]:
    """`stored` scopes still wanted, in their order, then the new ones sorted; at most
    `peer.MAX_SCOPES` (the first kept: a scope never displaces an earlier one)."""
    want = set(wanted)
    kept = [s for s in stored if s in want]
    kept += sorted(want - set(kept))
    return tuple(kept[: peer.MAX_SCOPES])


def write(root: Path, files: FileList) -> None:
    data: dict[str, Any] = {
        "version": FORMAT_VERSION,
        "folder": files.folder,
        "stamp": {"job": files.stamp.job, "completedAt": files.stamp.completed_at},
        "scopes": list(files.scopes),
        "manifest": files.manifest.to_dict(),
        "originChecked": files.origin_checked,
    }
    durable.write_json_atomic(path(root, files.folder), data)


def read(root: Path, folder: str) -> FileList | None:
    """The stored list of `folder` when whole and consistent (module contract), else None."""
    data = durable.read_json(path(root, folder))
    if data is None or data.get("version") != FORMAT_VERSION or data.get("folder") != folder:
        return None
    try:
        manifest = peer.PeerManifest.model_validate(data.get("manifest"))
        stamp_data = data["stamp"]
        stamp = Stamp(str(stamp_data["job"]), str(stamp_data["completedAt"]))
        scopes = tuple(str(s) for s in data["scopes"])
    except (pydantic.ValidationError, KeyError, TypeError):
        return None
    if (
        not _scopes_ok(scopes)
        or layout.key_of_folder(folder) != manifest.storage_key
        or manifest.computed_digest() != manifest.digest
    ):
        return None
    return FileList(folder, stamp, manifest, scopes, data.get("originChecked") is True)


def _scopes_ok(scopes: Sequence[str]) -> bool:
    hexdigits = set("0123456789abcdef")
    return len(scopes) <= peer.MAX_SCOPES and all(
        len(s) == 64 and set(s) <= hexdigits for s in scopes
    )


def current(root: Path, folder: str, manifest: layout.Manifest) -> FileList | None:
    """`read`, only when computed for the promotion `manifest` records (and, for a model
    whose origin publishes checksums, by a version that checks them); never for a copy
    left unchecked (`layout.Manifest.origin_unchecked`), which `compute` refuses."""
    if manifest.origin_unchecked:
        return None
    files = read(root, folder)
    if files is None or files.stamp != Stamp.of(manifest):
        return None
    unchecked = not files.origin_checked and originsums.publishes(manifest.uri)
    return None if unchecked else files


def remove(root: Path, folder: str) -> None:
    path(root, folder).unlink(missing_ok=True)


def prune(root: Path) -> list[str]:
    """Remove the lists whose folder is not complete (no folder or no manifest); returns
    the folders whose list was removed."""
    removed = []
    for entry in tree.listing(root / layout.MANIFESTS_DIR):
        if not entry.name.endswith(layout.FILES_SUFFIX):
            continue
        folder = entry.name.removesuffix(layout.FILES_SUFFIX)
        manifest = root / layout.MANIFESTS_DIR / f"{folder}{layout.MANIFEST_SUFFIX}"
        if layout.key_of_folder(folder) is None:
            continue
        if not (root / layout.MODELS_DIR / folder).is_dir() or not manifest.is_file():
            entry.unlink(missing_ok=True)
            removed.append(folder)
    return removed
