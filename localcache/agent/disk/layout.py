"""Names and records of the model-folder protocol on a node's models root. Pure: no I/O.

Layout under `root` (the agent's mount of the node group's PV, default `/mnt/models`):

    <root>/models/<storage key>/          final model folder; KServe's pod mutator mounts
                                          `models/<storage key>` from the serving PV (ref §2.1)
    <root>/models/<storage key>.<variant>/  a second credential scope's download of the same
                                          URI whose content differs (`variant`: 16 hex of
                                          that scope's id); the CSI view shows it to that
                                          scope's pods at `models/<storage key>`
    <root>/.staging/<storage key>-<job>/  where a download Job writes (its volume subPath)
    <root>/.manifests/<storage key>.json  manifest of a complete folder (kept OUTSIDE the folder)
    <root>/.manifests/<storage key>.promoting.json  intent record of an unfinished promotion
    <root>/.manifests/<folder>.files.json  a complete folder's peer file list and the scopes
                                          that may fetch it (`agent.disk.filelists`)
    <root>/.trash/                        folders on their way out
    <root>/.jobs/<job>.json               which namespace, cache and storage key a download
                                          Job was created for (written before the Job):
                                          localcache's CSI node plugin shows that Job's pods
                                          their staging folder only

This module names those paths (`staging_name`, `staging_subpath`, `model_subpath`), says which
names are storage keys (`is_storage_key`), and defines the records: `Manifest` (JSON shape of a
complete folder's manifest) and `Recovered` (what `folders.ModelDisk.recover()` did with one
unfinished promotion). The operations on the filesystem are `agent.disk.folders`.

Modes (spec §9, issue 13 risk 2): a staging folder is `STAGING_MODE` (owner and group only:
the download pod runs as the agent's uid with the node group's fsGroup); a promoted folder's
directories are `DIR_MODE` and its regular files `FILE_MODE`, nothing setuid, setgid or
world-writable.

Contract: a name that is not a storage key (16 lowercase hex) or a staging name that is not
`<storage key>-<job name>` raises `DiskError`; nothing else is validated here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pydantic

from localcache.api import originpaths

DEFAULT_ROOT = Path("/mnt/models")
MODELS_DIR = "models"
STAGING_DIR = ".staging"
MANIFESTS_DIR = ".manifests"
TRASH_DIR = ".trash"
JOBS_DIR = ".jobs"
MANIFEST_SUFFIX = ".json"
RECORD_SUFFIX = ".promoting.json"
FILES_SUFFIX = ".files.json"
QUARANTINE_SUFFIX = ".quarantined"
MAX_TREE_DEPTH = 64
"""Directory levels a model folder may have; deeper content is never checked, so never
published (model repositories have a handful)."""  # appended to a record recovery could not settle
STAGING_MODE = 0o2770
"""A staging folder: owner and group may write (setgid keeps the download group), others not."""
DIR_MODE = 0o755
FILE_MODE = 0o644

_KEY_RE = re.compile(r"[0-9a-f]{16}")
FOLDER_RE = re.compile(r"(?P<key>[0-9a-f]{16})(\.(?P<variant>[0-9a-f]{16}))?")
"""A model folder's name under `models/`: a storage key, or `<storage key>.<variant>`."""
STAGING_RE = re.compile(r"(?P<key>[0-9a-f]{16})-(?P<job>[a-z0-9]([-a-z0-9.]*[a-z0-9])?)")
"""A staging folder's name; groups `key` (the storage key) and `job` (the download Job)."""


Outcome = Literal[
    "promoted",
    "promoted-variant",
    "manifest-written",
    "finished",
    "kept-existing",
    "abandoned",
    "quarantined",
]


class DiskError(Exception):
    """A model-folder operation that cannot proceed; the message says why."""


class RootMismatch(DiskError):
    """The node group's PV path is not the directory the agent sees as its models root."""


def is_storage_key(name: str) -> bool:
    """True for names shaped like a storage key: exactly 16 lowercase hex characters."""
    return _KEY_RE.fullmatch(name) is not None


def require_key(storage_key: str) -> None:
    """Raise `DiskError` unless `storage_key` is shaped like a storage key."""
    if not is_storage_key(storage_key):
        raise DiskError(f"not a storage key: {storage_key!r}")


def job_record_path(root: Path, job_name: str) -> Path:
    """The agent's record of a download Job on `root` (`JOBS_DIR`; no pod reaches it)."""
    return root / JOBS_DIR / f"{job_name}{MANIFEST_SUFFIX}"


def folder_name(storage_key: str, variant: str | None = None) -> str:
    """The folder of `storage_key` under `models/`: the key, or `<key>.<variant>`."""
    require_key(storage_key)
    if variant is None:
        return storage_key
    name = f"{storage_key}.{variant}"
    if FOLDER_RE.fullmatch(name) is None:
        raise DiskError(f"not a folder variant: {variant!r}")
    return name


def key_of_folder(name: str) -> str | None:
    """The storage key of a model folder's name (`folder_name`), None for other names."""
    match = FOLDER_RE.fullmatch(name)
    return match["key"] if match else None


def variant_of_scope(scope_id: str) -> str:
    """A credential scope's folder variant: the first 16 hex characters of its id (SHA-256)."""
    return scope_id[:16]


def staging_name(storage_key: str, job_name: str) -> str:
    """The staging folder's name for a download Job: `<storage key>-<job name>`."""
    require_key(storage_key)
    name = f"{storage_key}-{job_name}"
    if STAGING_RE.fullmatch(name) is None:
        raise DiskError(f"not a valid job name for a staging folder: {job_name!r}")
    return name


def staging_subpath(storage_key: str, job_name: str) -> str:
    """The staging folder relative to the PV root: the download Job's volume `subPath`."""
    return f"{STAGING_DIR}/{staging_name(storage_key, job_name)}"


def model_subpath(storage_key: str) -> str:
    """The final folder relative to the PV root, as KServe's pod mutator mounts it."""
    require_key(storage_key)
    return f"{MODELS_DIR}/{storage_key}"


@dataclass(frozen=True, slots=True)
class Manifest:
    """What is recorded about a complete model folder.

    `job` is the download Job that wrote it; for a folder the agent adopted (downloaded by
    KServe's add-on, which writes no manifest: `agent.adoption`), `adopted` is set and `job`
    is the bare tag (`lmd-<storage key>-<digest>`) of the download unit it was adopted for,
    since no Job of ours ran. `adopted` is written only when set, so manifests of earlier
    versions read as not adopted and earlier versions read adopted ones (ignoring the field;
    they do not reuse them, as the bare tag is no Job name of theirs)."""

    storage_key: str
    uri: str
    bytes: int
    completed_at: str  # RFC 3339, UTC
    job: str
    adopted: bool = False
    digest: str = ""
    """`agent.disk.digest` of the folder, once computed (when another scope's download of the
    URI was compared with it); empty until then."""
    variant: str = ""
    """Set for a folder variant (`models/<key>.<variant>`): the scope it was downloaded in."""
    origin_sums: tuple[tuple[str, str], ...] = ()
    """(path, SHA-256 hex) the origin stores, as the download staged them (`originsums`)."""
    origin_unchecked: bool = False
    """The download was to stage the origin's checksums and left no record of them
    (`originsums.read_staged`): the copy is served to no peer. Written only when set."""

    def to_json(self) -> dict[str, Any]:
        data = {json_name: getattr(self, attr) for attr, json_name in _MANIFEST_JSON.items()}
        if self.adopted:
            data["adopted"] = True
        if self.digest:
            data["digest"] = self.digest
        if self.variant:
            data["variant"] = self.variant
        if self.origin_sums:
            data["originSha256"] = dict(self.origin_sums)
        if self.origin_unchecked:
            data["originUnchecked"] = True
        return data

    @property
    def folder(self) -> str:
        """The folder's name under `models/` (`folder_name`)."""
        return folder_name(self.storage_key, self.variant or None)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Manifest:
        try:
            return cls(
                storage_key=str(data["storageKey"]), uri=str(data["uri"]),
                bytes=int(data["bytes"]), completed_at=str(data["completedAt"]),
                job=str(data["job"]), adopted=data.get("adopted") is True,
                digest=str(data.get("digest") or ""), variant=str(data.get("variant") or ""),
                origin_sums=_origin_sums(data.get("originSha256")),
                origin_unchecked=data.get("originUnchecked") is True,
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise DiskError(f"malformed manifest: {exc}") from exc


def _origin_sums(data: object) -> tuple[tuple[str, str], ...]:
    """The recorded origin SHA-256s, none when they are not `originpaths.StagedSums`."""
    if data is None:
        return ()
    try:
        return tuple(sorted(originpaths.StagedSums.model_validate({"sha256": data}).sha256.items()))
    except pydantic.ValidationError:
        return ()


_MANIFEST_JSON = {
    "storage_key": "storageKey", "uri": "uri", "bytes": "bytes",
    "completed_at": "completedAt", "job": "job",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Recovered:
    """One unfinished promotion that `folders.ModelDisk.recover()` settled; `outcome` says how."""

    storage_key: str
    staging: str
    # "promoted": moved and recorded; "manifest-written": was moved, manifest added;
    # "finished": only the record was left; "kept-existing": another download of the same URI
    # was already complete with the same content (digest), this one was discarded;
    # "promoted-variant": the content differed, so it became the scope's own folder variant;
    # "abandoned": staging and folder both gone;
    # "quarantined": it could not be settled (`error`), its record was set aside.
    outcome: Outcome
    error: str = ""


@dataclass(frozen=True, slots=True)
class Adoption:
    """What `folders.ModelDisk.adopt` did: the manifest it wrote, or `refused` saying why not;
    `modes_not_fixed` lists the paths whose mode it could not change (another uid's)."""

    manifest: Manifest | None = None
    refused: str = ""
    modes_not_fixed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeletionFailure:
    """A folder the agent could not delete: it stays in `.trash` and is retried with backoff.

    `folder` is where it was (`models/<key>`, `.staging/<name>`) or, after a restart, where it
    is (`.trash/<name>`); `storage_key` is set for model folders; `retry_in` is seconds."""

    folder: str
    storage_key: str | None
    error: str
    attempts: int
    retry_in: float

    @property
    def message(self) -> str:
        return (
            f"could not delete {self.folder}: {self.error} (attempt {self.attempts}, "
            f"retrying in {self.retry_in:.0f}s; its bytes stay on the node until then)"
        )
