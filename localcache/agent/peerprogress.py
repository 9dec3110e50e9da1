"""The verified files of downloads still in progress, served to peers: the pipelining half
of peer distribution (a node fetching a model is a source for the files it has finished).

Which downloads (`in_flight`, pure): the units of a pass in a node group with peer
distribution enabled whose entry is Pending or Downloading by a Job of
- the origin, for an `s3://` URI: KServe's storage initializer downloads each object to a
  temporary name (`<name>.<8 hex digits>`, boto3's s3transfer) and renames it when complete,
  so a regular file under any other name is whole; temporary names are never listed (a model
  file whose own name looks like one is served once the model is complete), nor the
  origin's checksums the seed staged (`originpaths.STAGED_SUMS`, taken out before
  promotion). Other schemes
  write files in place (nothing tells a whole file from a growing one): not listed;
- peers (`localcache fetch`): it writes `<path>.localcache-part` and renames it once verified
  (`api.peer.PART_SUFFIX`), in its staging directory (`download.staging.PARTIAL_PREFIX`), then
  moves the whole tree into the Job's staging folder; both places are looked at.

`Progress` tracks them (`track`, once per reconcile pass) and `run()` looks at each tracked
staging folder every `WATCH_S`, one at a time in a thread (`wholefiles.scan`: descriptors,
no symlink followed, bounded), hashes the files whole by name and unchanged since the previous
look (a file written in place is not taken between two writes), and hands the partial
manifests (`complete: false`, their own digest) to `on_change` after each folder. A folder
just tracked is served at once with no file (the server answers 503 "nothing yet", never
404); a promoted one (`track(finished=...)`) keeps its last manifest for `TOMBSTONE_S` (its
files moved: 503) while its complete list is made, so its followers never see it vanish,
unless that list cannot be made (`unservable(root, storage_key)`: served no more at once). An
`s3://` download holding an archive serves nothing before it completes (KServe unpacks it in
place). The bytes are the download pod's: a receiver verifies every file against the sha256
hashed here, and only pods of the same credential scope are ever served (a tenant can only
spoil its own fetch, which then falls back).

`known(staging)` returns the hashes taken in that staging folder (the last `KEPT_HASHES`
folders no longer tracked are kept): the complete folder's file list after promotion reuses
them for files whose identity (device, inode, size, mtime, ctime) is unchanged (a rename keeps
it; a rewrite or `utime` changes the ctime), so a model is hashed once per node and its
complete manifest follows the partial one quickly. Not promised: that a listed file is still
there when served (the server answers 503 for a partial folder's missing file: it moves).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import structlog

from localcache.agent import downloads, peerplan, status
from localcache.agent.disk import digest, layout, wholefiles
from localcache.api import modelnode, originpaths, peer
from localcache.download import staging as staging_mod
from localcache.runtime import clock as clock_mod

log = structlog.get_logger(__name__)

WATCH_S: Final = 1.0
TOMBSTONE_S: Final = 300.0
KEPT_HASHES: Final = 32
_S3_TEMP: Final = re.compile(r".*\.[0-9a-fA-F]{8}")
_ARCHIVES: Final = (".tar", ".tar.gz", ".tgz", ".zip")
_IN_FLIGHT: Final = frozenset(
    {modelnode.ModelStatus.DOWNLOAD_PENDING, modelnode.ModelStatus.DOWNLOADING}
)
Identity = digest.Identity
_Key = tuple[Path, str]


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
    *,
    states: frozenset[modelnode.ModelStatus] = _IN_FLIGHT,
) -> list[InFlight]:
    """The downloads of the pass to track (module doc); `roots` maps the node groups with peer
    distribution enabled to their models root. With `states={DOWNLOADED}`: those that
    finished. Pure."""
    found: dict[tuple[Path, str], InFlight] = {}
    for unit in units:
        root = roots.get(unit.leader.node_group or "")
        outcome = outcomes.get(unit.status_keys[0])
        if root is None or outcome is None or outcome.status not in states:
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


DONE: Final = frozenset({modelnode.ModelStatus.DOWNLOADED})


def scan(
    item: InFlight,
    known: Mapping[Identity, str],
    previous: frozenset[Identity],
    *,
    stop: Callable[[], bool],
) -> tuple[Partial, wholefiles.Scanned] | None:
    """The whole files of `item` now (None: no folder yet; `wholefiles.scan`)."""
    top = item.folder
    try:
        names = os.listdir(top)
    except FileNotFoundError:
        return None
    if item.kind == "peer":
        inner = [n for n in names if n.startswith(staging_mod.PARTIAL_PREFIX)]
        if len(inner) == 1:
            top = top / inner[0]  # a symlink there is not walked (`wholefiles`)
    elif any(n.endswith(_ARCHIVES) for n in names):
        names = []  # KServe unpacks an archive in place: nothing is whole before the end
    if not names:
        scanned = wholefiles.Scanned([], frozenset(), {})
    else:
        scanned = wholefiles.scan(top, _whole_by(item.kind), known, previous, stop=stop)
    return Partial(item, top, _manifest(item.storage_key, scanned.files)), scanned


def _manifest(storage_key: str, files: list[peer.ManifestFile]) -> peer.PeerManifest:
    return peer.PeerManifest(
        storage_key=storage_key,
        digest=peer.manifest_digest(files=((f.path, f.size, f.sha256) for f in files)),
        complete=False,
        files=files,
    )


def _whole_by(kind: str) -> Callable[[str], bool]:
    def whole(rel: str) -> bool:
        """Whether the file at `rel` is whole by its name (module doc)."""
        name = os.path.basename(rel)
        if kind == "peer":
            if rel.startswith(staging_mod.PARTIAL_PREFIX):
                return False  # a leftover or backup of the fetcher's staging
            return not name.endswith(peer.PART_SUFFIX)
        return _S3_TEMP.fullmatch(name) is None and not originpaths.is_staged_sums(rel)

    return whole


class Progress:
    """The partial manifests of this node's tracked downloads (module doc)."""

    def __init__(
        self,
        *,
        on_change: Callable[[list[Partial]], None],
        clock: clock_mod.Clock | None = None,
    ) -> None:
        self._on_change = on_change
        self._clock = clock or clock_mod.SystemClock()
        self._tracked: dict[_Key, InFlight] = {}
        self._partials: dict[_Key, Partial] = {}
        self._seen: dict[_Key, frozenset[Identity]] = {}
        self._hashes: dict[_Key, dict[Identity, str]] = {}
        self._retired: collections.OrderedDict[str, dict[Identity, str]] = collections.OrderedDict()
        self._tombstones: dict[_Key, tuple[Partial, float]] = {}
        self._stop = threading.Event()
        self._wake = asyncio.Event()

    def track(self, items: Sequence[InFlight], *, finished: Sequence[InFlight] = ()) -> None:
        """Look at exactly `items` from now on. A folder no longer tracked stops being served,
        except one in `finished` (promoted: its files move into the model folder), whose last
        manifest is still served for `TOMBSTONE_S` (its files answer 503) until the complete
        folder is served; its hashes are kept for `known()`."""
        wanted = {(i.root, i.staging): i for i in items}
        done = {(i.root, i.staging) for i in finished}
        now = self._clock.now()
        gone, new = self._tracked.keys() - wanted.keys(), wanted.keys() - self._tracked.keys()
        for key in gone:
            self._retire(key)
            partial = self._partials.pop(key, None)
            if key in done and partial is not None:
                self._tombstones[key] = (partial, now + TOMBSTONE_S)
            self._seen.pop(key, None)
        for key in new:  # served at once: "nothing yet", never 404
            item = wanted[key]
            self._partials[key] = Partial(item, item.folder, _manifest(item.storage_key, []))
        self._tracked = wanted
        live = {(i.storage_key, i.scope) for i in wanted.values()}
        tombstones = {  # a new download of the same model and scope replaces it
            k: v
            for k, v in self._tombstones.items()
            if v[1] > now and (v[0].item.storage_key, v[0].item.scope) not in live
        }
        if gone or new or tombstones.keys() != self._tombstones.keys():
            self._tombstones = tombstones
            self._publish()
        if new:
            self._wake.set()

    def unservable(self, root: Path, storage_key: str) -> None:
        """The complete folder of `storage_key` on `root` will not be served (`peerfiles`:
        its list cannot be made, or the origin's checksums refuse it): the last manifest of
        its finished download stops being served at once, so that its followers leave it
        (404) rather than wait for a complete manifest that never comes."""
        kept = {
            key: kept
            for key, kept in self._tombstones.items()
            if key[0] != root or kept[0].item.storage_key != storage_key
        }
        if kept.keys() != self._tombstones.keys():
            self._tombstones = kept
            self._publish()

    def forget(self) -> None:
        """Peer distribution is off: track and serve nothing (hashes are kept)."""
        self.track(())
        if self._tombstones:
            self._tombstones.clear()
            self._publish()

    def known(self, staging: str) -> dict[Identity, str]:
        """The hashes taken in the staging folder `staging` (tracked or retired)."""
        for key, hashes in self._hashes.items():
            if key[1] == staging:
                return dict(hashes)
        return dict(self._retired.get(staging, {}))

    async def run(self) -> None:
        """Look at the tracked folders every `WATCH_S` until cancelled."""
        self._stop.clear()
        while True:
            for key in list(self._tracked):
                await self._look(key)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WATCH_S if self._tracked else None):
                    await self._wake.wait()
            self._wake.clear()

    def _retire(self, key: _Key) -> None:
        self._retired[key[1]] = self._hashes.pop(key, {})
        self._retired.move_to_end(key[1])
        while len(self._retired) > KEPT_HASHES:
            self._retired.popitem(last=False)

    def _publish(self) -> None:
        self._on_change([*self._partials.values(), *(p for p, _ in self._tombstones.values())])

    async def _look(self, key: _Key) -> None:
        item = self._tracked.get(key)
        if item is None:
            return
        known, previous = self._hashes.get(key, {}), self._seen.get(key, frozenset())
        work = asyncio.ensure_future(asyncio.to_thread(self._scan, item, known, previous))
        try:
            result = await asyncio.shield(work)
        except asyncio.CancelledError:
            self._stop.set()  # the thread stops at its next chunk or entry
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await work
            raise
        if result is None:
            return
        partial, scanned = result
        if self._tracked.get(key) is not item:  # untracked while the thread ran
            self._retired.setdefault(key[1], {}).update(scanned.hashes)
            return
        self._hashes[key], self._seen[key] = scanned.hashes, scanned.seen
        before = self._partials.get(key)
        if before is None or (before.manifest, before.top) != (partial.manifest, partial.top):
            self._partials[key] = partial
            self._publish()

    def _scan(
        self, item: InFlight, known: Mapping[Identity, str], previous: frozenset[Identity]
    ) -> tuple[Partial, wholefiles.Scanned] | None:
        try:
            return scan(item, known, previous, stop=self._stop.is_set)
        except digest.Stopped:
            raise
        except Exception as exc:  # an unreadable folder is not served; the agent goes on
            log.warning("peer_progress_scan_failed", folder=item.staging, error=str(exc)[:300])
            return None
