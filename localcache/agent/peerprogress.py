"""The verified files of downloads still in progress, served to peers: the pipelining half
of peer distribution (a node fetching a model is a source for the files it has finished).

Which downloads (`in_flight`, pure): the units of a pass in a node group with peer
distribution enabled whose entry is Pending or Downloading by a Job of
- the origin, for an `s3://` URI: KServe's storage initializer downloads each object to a
  temporary name (`<name>.<8 hex digits>`, boto3's s3transfer) and renames it when complete,
  so a regular file under any other name is whole; temporary names are never listed (a model
  file whose own name looks like one is served once the model is complete). Other schemes
  write files in place (nothing tells a whole file from a growing one): not listed;
- peers (`localcache fetch`): it writes `<path>.localcache-part` and renames it once verified
  (`api.peer.PART_SUFFIX`), in its staging directory (`download.staging.PARTIAL_PREFIX`), then
  moves the whole tree into the Job's staging folder; both places are looked at.

`Progress` tracks them (`track`, once per reconcile pass) and `run()` looks at each tracked
staging folder every `WATCH_S` (in a thread: a bounded walk, `peer.MAX_FILES` entries and
`peer.MAX_DEPTH` levels, never following a symlink), hashes the files it has not hashed yet
(by device, inode, size and mtime) and hands the partial manifests (`complete: false`, only
whole files, their own digest) to `on_change`. The bytes are the download pod's: a receiver
verifies every file against the sha256 hashed here, and only pods of the same credential
scope are ever served (a tenant can only spoil its own fetch, which then falls back).

`known()` returns the hashes of files seen in tracked folders and in the last untracked ones
(at most `peer.MAX_FILES`): the complete folder's file list reuses them after promotion (a
rename: same inode, size and mtime), so a model is not hashed twice and its complete
manifest follows the partial one at once. Not promised: that a listed file is still there
when served (the server answers 503 for a partial folder's missing file: it moves).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import stat
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import structlog

from localcache.agent import downloads, peerplan, status
from localcache.agent.disk import digest, layout
from localcache.api import modelnode, peer
from localcache.download import staging as staging_mod
from localcache.runtime import fstree

log = structlog.get_logger(__name__)

WATCH_S: Final = 1.0
_S3_TEMP: Final = re.compile(r".*\.[0-9a-fA-F]{8}")
_IN_FLIGHT: Final = frozenset(
    {modelnode.ModelStatus.DOWNLOAD_PENDING, modelnode.ModelStatus.DOWNLOADING}
)
Identity = tuple[int, int, int, int]
"""(device, inode, size, mtime in ns) of a hashed file."""


@dataclass(frozen=True, slots=True)
class InFlight:
    """A download in progress whose whole files this node serves."""

    root: Path
    """The models root."""
    staging: str
    """The Job's staging folder name (`layout.staging_name`)."""
    storage_key: str
    scope: str
    kind: Literal["origin", "peer"]

    @property
    def folder(self) -> Path:
        return self.root / layout.STAGING_DIR / self.staging


@dataclass(frozen=True, slots=True)
class Partial:
    """What a tracked download can serve now: where its files are, and their manifest."""

    item: InFlight
    top: Path
    manifest: peer.PeerManifest


def in_flight(
    units: Sequence[downloads.Unit],
    roots: Mapping[str, Path],
    outcomes: Mapping[str, status.Outcome],
) -> list[InFlight]:
    """The downloads of the pass to track (module doc); `roots` maps the node groups with peer
    distribution enabled to their models root. Pure."""
    found: dict[tuple[Path, str], InFlight] = {}
    for unit in units:
        root = roots.get(unit.leader.node_group or "")
        outcome = outcomes.get(unit.status_keys[0])
        if root is None or outcome is None or outcome.status not in _IN_FLIGHT:
            continue
        job, source = outcome.progress.job_name, outcome.progress.source or ""
        kind: Literal["origin", "peer"]
        if source == peerplan.SOURCE_ORIGIN and unit.leader.source_model_uri.startswith("s3://"):
            kind = "origin"
        elif source.startswith(peerplan.SOURCE_PEER_PREFIX):
            kind = "peer"
        else:
            continue
        if not job:
            continue
        try:
            name = layout.staging_name(unit.storage_key, job)
        except layout.DiskError:
            continue
        found[(root, name)] = InFlight(root, name, unit.storage_key, unit.scope_id, kind)
    return [found[k] for k in sorted(found)]


def scan(
    item: InFlight, known: Mapping[Identity, str], *, stop: Callable[[], bool]
) -> tuple[Partial, dict[Identity, str]] | None:
    """The whole files of `item` now and the hashes behind them (None: no folder yet)."""
    top = item.folder
    try:
        names = os.listdir(top)
    except FileNotFoundError:
        return None
    if item.kind == "peer":
        inner = [n for n in names if n.startswith(staging_mod.PARTIAL_PREFIX)]
        if len(inner) == 1 and stat.S_ISDIR(os.lstat(top / inner[0]).st_mode):
            top = top / inner[0]
    files: list[peer.ManifestFile] = []
    hashes: dict[Identity, str] = {}
    base = str(top)
    for count, (path, is_dir) in enumerate(fstree.below(top, skip_unlistable=True), start=1):
        rel = os.path.relpath(path, base)
        if count > peer.MAX_FILES or rel.count(os.sep) >= peer.MAX_DEPTH:
            break
        if stop():
            raise digest.Stopped(base)
        if is_dir or not _whole(item.kind, rel):
            continue
        try:
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode):
                continue
            identity = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
            sha = known.get(identity) or digest.file_sha256(path, stop=stop)
            entry = peer.ManifestFile(path=rel, size=info.st_size, sha256=sha)
        except (OSError, ValueError):
            continue  # moved or renamed meanwhile, or a name no manifest may hold
        hashes[identity] = sha
        files.append(entry)
    files.sort(key=lambda f: f.path)
    manifest = peer.PeerManifest(
        storage_key=item.storage_key,
        digest=peer.manifest_digest(files=((f.path, f.size, f.sha256) for f in files)),
        complete=False,
        files=files,
    )
    return Partial(item, top, manifest), hashes


def _whole(kind: str, rel: str) -> bool:
    """Whether the file at `rel` is whole by its name (module doc)."""
    name = os.path.basename(rel)
    if kind == "peer":
        if rel.startswith(staging_mod.PARTIAL_PREFIX):
            return False  # a leftover or backup of the fetcher's staging
        return not name.endswith(peer.PART_SUFFIX)
    return _S3_TEMP.fullmatch(name) is None


class Progress:
    """The partial manifests of this node's tracked downloads (module doc)."""

    def __init__(self, *, on_change: Callable[[list[Partial]], None]) -> None:
        self._on_change = on_change
        self._tracked: dict[tuple[Path, str], InFlight] = {}
        self._partials: dict[tuple[Path, str], Partial] = {}
        self._hashes: dict[tuple[Path, str], dict[Identity, str]] = {}
        self._retired: collections.OrderedDict[Identity, str] = collections.OrderedDict()
        self._stop = threading.Event()
        self._wake = asyncio.Event()

    def track(self, items: Sequence[InFlight]) -> None:
        """Look at exactly `items` from now on; a folder no longer tracked keeps its hashes
        for `known()` and stops being served."""
        wanted = {(i.root, i.staging): i for i in items}
        gone = self._tracked.keys() - wanted.keys()
        for key in gone:
            for identity, sha in self._hashes.pop(key, {}).items():
                self._retired[identity] = sha
                self._retired.move_to_end(identity)
            while len(self._retired) > peer.MAX_FILES:
                self._retired.popitem(last=False)
            self._partials.pop(key, None)
        new = wanted.keys() - self._tracked.keys()
        self._tracked = wanted
        if gone:
            self._on_change(list(self._partials.values()))
        if new:
            self._wake.set()

    def known(self) -> dict[Identity, str]:
        merged = dict(self._retired)
        for hashes in self._hashes.values():
            merged.update(hashes)
        return merged

    def partials(self) -> list[Partial]:
        return list(self._partials.values())

    async def run(self) -> None:
        """Look at the tracked folders every `WATCH_S` until cancelled."""
        while True:
            if self._tracked:
                await self._look()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WATCH_S if self._tracked else None):
                    await self._wake.wait()
            self._wake.clear()

    async def _look(self) -> None:
        items, known = list(self._tracked.values()), self.known()
        work = asyncio.ensure_future(asyncio.to_thread(self._scan_all, items, known))
        try:
            results = await asyncio.shield(work)
        except asyncio.CancelledError:
            self._stop.set()  # the thread stops at its next chunk or entry
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await work
            raise
        changed = False
        for key, result in results.items():
            if key not in self._tracked:
                continue  # untracked while the thread ran
            if result is None:
                changed |= self._partials.pop(key, None) is not None
                continue
            partial, hashes = result
            self._hashes[key] = hashes
            before = self._partials.get(key)
            if before is None or before.manifest != partial.manifest or before.top != partial.top:
                self._partials[key] = partial
                changed = True
        if changed:
            self._on_change(list(self._partials.values()))

    def _scan_all(
        self, items: list[InFlight], known: Mapping[Identity, str]
    ) -> dict[tuple[Path, str], tuple[Partial, dict[Identity, str]] | None]:
        out: dict[tuple[Path, str], tuple[Partial, dict[Identity, str]] | None] = {}
        for item in items:
            try:
                out[(item.root, item.staging)] = scan(item, known, stop=self._stop.is_set)
            except digest.Stopped:
                raise
            except Exception as exc:  # an unreadable folder is not served; the agent goes on
                log.warning("peer_progress_scan_failed", folder=item.staging, error=str(exc)[:300])
                out[(item.root, item.staging)] = None
        return out
