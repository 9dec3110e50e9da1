"""Peer file lists of the agent's model folders, hashed in the background, and the
`status.peer` they publish (peer distribution, `api.peer`).

`PeerFiles` has two halves:
- `publish(units, placements, outcomes)`, called once per reconcile pass after the units were
  evaluated and the roots cleaned, before the status write: for every unit reported
  Downloaded whose node group has `spec.peerDistribution.enabled`, its folder (the storage
  key's, or the variant its progress names) is wanted, with the unit's scope digest
  (`downloads.scope_id`): the downloading Job's scope, a scope whose download of the same
  content was kept-existing, and every scope that reuses the folder having proven access
  (`plan.Downloaded`) all report it Downloaded. It writes the file lists hashed since the last
  pass, brings the stored scopes in line (`filelists.merge_scopes`), drops lists computed for
  an earlier promotion, queues the folders lacking a current list (after a promotion and, at
  start-up, complete folders without one), replaces the peer server's index
  (`peersource.PeerFolders`) and returns the status fields to merge: `{"peer": {endpoint,
  models}}` (`models` sorted, at most `peer.MAX_PEER_MODELS`; a unit still downloading in
  an enabled group, from the origin for `s3://` or from peers, is listed `complete: false`
  with its scope, and tracked by `agent.peerprogress`, whose hashes the folder's list reuses
  after promotion), or `{}` when no node group of the pass enables peer distribution: then
  it does nothing at all (no file read or written, no hashing), and a `status.peer` written
  before is removed by the status write.
- `run()`, the worker (a manager runnable): hashes one queued folder at a time in a thread
  (`filelists.compute`), keeps the result in memory and calls `on_ready` (which enqueues the
  node), so the list is stored and published by the next pass: every file-list write happens
  in the reconciler's own sequence, never racing a promotion or a deletion. Hashing never
  delays a status: the pass that promotes reports Downloaded at once. Cancelled, it tells the
  hashing thread to stop (between chunks) and awaits it.

`origin_sums(folder, digest, sums)`: the origin's own SHA-256s a proof saw, recorded in the
folder's list by the next pass (`originSha256`, only where they are the file's own).

A folder that cannot be hashed (unservable, unreadable) is logged, not tried again for that
promotion in this process, and published in `status.peer.unservable` with why (the planners
of other nodes then never wait for this node to seed it). Not promised: order of hashing
beyond first come, first served; publishing a folder whose group disabled peer distribution
since.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from localcache.agent import downloads, peerprogress, peersource, status
from localcache.agent.disk import filelists, folders, layout
from localcache.agent.jobs import launcher
from localcache.api import modelnode, nodegroup, peer

log = structlog.get_logger(__name__)

Placement = tuple[nodegroup.LocalModelNodeGroup, folders.ModelDisk] | launcher.NotLaunched
_Key = tuple[Path, str]  # (models root, folder name)


def endpoint(pod_ip: str, port: int) -> str | None:
    """`https://<pod IP>:<port>` of the peer server; None when not serving (port 0, no or a
    malformed IP)."""
    if port <= 0 or not pod_ip:
        return None
    try:
        address = ipaddress.ip_address(pod_ip)
    except ValueError:
        return None
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"https://{host}:{port}"


@dataclass(frozen=True, slots=True)
class Want:
    """A folder to publish and the scopes that proved access to it in this pass."""

    disk: folders.ModelDisk
    folder: str
    storage_key: str
    variant: str | None
    scopes: frozenset[str]


def wanted(
    units: Sequence[downloads.Unit],
    placements: Mapping[str, Placement],
    outcomes: Mapping[str, status.Outcome],
) -> list[Want] | None:
    """The folders to publish (module doc); None when no group of the pass enables peer
    distribution. Pure."""
    enabled = False
    found: dict[_Key, Want] = {}
    for unit in units:
        where = placements.get(unit.leader.node_group or "")
        if where is None or isinstance(where, launcher.NotLaunched):
            continue
        group, disk = where
        if not (group.spec.peer_distribution and group.spec.peer_distribution.enabled):
            continue
        enabled = True
        outcome = outcomes.get(unit.status_keys[0])
        if outcome is None or outcome.status is not modelnode.ModelStatus.DOWNLOADED:
            continue
        folder = outcome.progress.folder or unit.storage_key
        variant = folder.partition(".")[2] or None
        key = (disk.root, folder)
        before = found.get(key)
        scopes = (before.scopes if before else frozenset()) | {unit.scope_id}
        found[key] = Want(disk, folder, unit.storage_key, variant, scopes)
    return [found[k] for k in sorted(found)] if enabled else None


@dataclass(frozen=True, slots=True)
class Stats:
    queued: int
    ready: int
    served: int
    hashed: int
    failed: int


@dataclass(frozen=True, slots=True)
class _Hash:
    root: Path
    folder: str
    storage_key: str
    manifest: layout.Manifest

    @property
    def stamp(self) -> filelists.Stamp:
        return filelists.Stamp.of(self.manifest)


@dataclass(slots=True)
class _Survey:
    served: dict[_Key, peersource.Served]
    manifests: dict[_Key, peer.PeerManifest]
    to_hash: list[_Hash]


class PeerFiles:
    """File lists and `status.peer` of one agent (module doc)."""

    def __init__(self, *, endpoint: str | None, on_ready: Callable[[], None]) -> None:
        self.endpoint = endpoint
        self.source = peersource.PeerFolders()
        self._on_ready = on_ready
        self._queue: asyncio.Queue[_Hash] = asyncio.Queue()
        self._queued: set[_Key] = set()
        self._ready: dict[_Key, tuple[filelists.Stamp, peer.PeerManifest]] = {}
        self._failed: dict[_Key, tuple[filelists.Stamp, peer.UnservableReason]] = {}
        self._served: dict[_Key, peersource.Served] = {}
        self._attested: dict[_Key, tuple[str, dict[str, str]]] = {}
        self._pruned: set[Path] = set()
        self._stop = threading.Event()
        self._hashed = 0
        self.progress = peerprogress.Progress(on_change=self.source.set_partials)

    def stats(self) -> Stats:
        return Stats(
            len(self._queued), len(self._ready), len(self._served), self._hashed, len(self._failed)
        )

    def origin_sums(self, folder: Path, digest: str, sums: Mapping[str, str]) -> None:
        """The origin answered these SHA-256s for the files of `folder` (at `digest`) to a
        proof this node ran (`agent.peer.proofs`): the next pass records them in its list
        (if that pass does not publish the folder, they wait for the next proof)."""
        self._attested[(folder.parent.parent, folder.name)] = (digest, dict(sums))
        while len(self._attested) > peer.MAX_PEER_MODELS:
            self._attested.pop(next(iter(self._attested)))
        self._on_ready()

    # ---- publishing (the reconciler's pass) -----------------------------------------
    async def publish(
        self,
        units: Sequence[downloads.Unit],
        placements: Mapping[str, Placement],
        outcomes: Mapping[str, status.Outcome],
    ) -> dict[str, Any]:
        wants = wanted(units, placements, outcomes)
        if wants is None:
            self._forget()
            return {}
        roots = _peer_roots(placements)
        downloading = peerprogress.in_flight(units, roots, outcomes)
        finished = peerprogress.in_flight(units, roots, outcomes, states=peerprogress.DONE)
        self.progress.track(downloading, finished=finished)
        ready, served, attested = dict(self._ready), dict(self._served), dict(self._attested)
        survey = await asyncio.to_thread(self._survey, wants, ready, served, attested)
        for consumed, done in ((self._ready, ready), (self._attested, attested)):
            for key, result in done.items():
                if consumed.get(key) is result:  # consumed (or outdated); not a newer one
                    del consumed[key]
        self._served = survey.served
        self.source.replace(survey.served.values(), survey.manifests)
        unservable: dict[str, peer.UnservableReason] = {}
        for job in survey.to_hash:
            key = (job.root, job.folder)
            failed = self._failed.get(key)
            if failed is not None and failed[0] == job.stamp:
                unservable.setdefault(job.storage_key, failed[1])
            elif key not in self._queued:
                self._queued.add(key)
                self._queue.put_nowait(job)
        models = [s.model() for s in survey.served.values()]
        complete = {(m.storage_key, sc) for m in models for sc in m.scopes}
        partial: dict[str, set[str]] = {}
        for item in downloading:
            if (item.storage_key, item.scope) not in complete:
                partial.setdefault(item.storage_key, set()).add(item.scope)
        models += [
            peer.PeerModel(
                storage_key=k, complete=False, scopes=sorted(v)[: peer.MAX_SCOPES], bytes=0
            )
            for k, v in partial.items()
        ]
        models.sort(key=_order)
        served_keys = {m.storage_key for m in models if m.whole}
        refused = [
            peer.PeerUnservable(storage_key=k, reason=why)
            for k, why in sorted(unservable.items())
            if k not in served_keys  # another variant of it is served
        ]
        body = peer.PeerStatus(
            endpoint=self.endpoint,
            models=models[: peer.MAX_PEER_MODELS],
            unservable=refused[: peer.MAX_PEER_MODELS] or None,
        )
        return {"peer": body.to_dict()}

    def _forget(self) -> None:
        """Peer distribution is off: serve nothing, drop what is queued or ready (a hash in
        progress finishes; a pass that publishes again stores it only if still current)."""
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queued.clear()
        self._ready.clear()
        self.progress.forget()
        if self._served:
            self._served = {}
            self.source.replace(())

    def _survey(
        self,
        wants: list[Want],
        ready: Mapping[_Key, tuple[filelists.Stamp, peer.PeerManifest]],
        served: Mapping[_Key, peersource.Served],
        attested: Mapping[_Key, tuple[str, dict[str, str]]],
    ) -> _Survey:
        """In a thread: store what is ready, check what is published, find what to hash."""
        out = _Survey({}, {}, [])
        for root in {w.disk.root for w in wants} - self._pruned:
            for folder in filelists.prune(root):
                log.info("peer_file_list_pruned", root=str(root), folder=folder)
            self._pruned.add(root)
        for want in wants:
            root, key = want.disk.root, (want.disk.root, want.folder)
            manifest = want.disk.manifest(want.storage_key, want.variant)
            if (
                manifest is None
                or not want.disk.model_path(want.storage_key, want.variant).is_dir()
            ):
                continue  # not complete (any more): nothing to publish
            stamp, before = filelists.Stamp.of(manifest), served.get(key)
            files: filelists.FileList | None
            if key in ready and ready[key][0] == stamp:
                files, dirty = filelists.FileList(want.folder, stamp, ready[key][1], ()), True
            elif (
                before is not None
                and before.stamp == stamp
                and before.scopes == _scopes(before.scopes, want)
                and key not in attested
            ):
                out.served[key] = before  # unchanged since the last pass: no I/O
                continue
            else:
                files, dirty = filelists.current(root, want.folder, manifest), False
            if files is None:  # none yet, or computed for an earlier promotion
                filelists.remove(root, want.folder)
                out.to_hash.append(_Hash(root, want.folder, want.storage_key, manifest))
                continue
            scopes, sums = _scopes(files.scopes, want), attested.get(key)
            if sums is not None and sums[0] == files.manifest.digest:
                recorded = _with_origin_sums(files.manifest, sums[1])
                dirty = dirty or recorded != files.manifest
                files = filelists.FileList(want.folder, stamp, recorded, files.scopes)
            if dirty or scopes != files.scopes:
                files = filelists.FileList(want.folder, stamp, files.manifest, scopes)
                filelists.write(root, files)
            out.manifests[key] = files.manifest
            out.served[key] = peersource.Served(
                root=root,
                folder=want.folder,
                storage_key=want.storage_key,
                digest=files.manifest.digest,
                bytes=files.manifest.bytes,
                scopes=scopes,
                stamp=stamp,
            )
        return out

    # ---- the worker -------------------------------------------------------------------
    async def run(self) -> None:
        """Hash queued folders one at a time, and watch downloads in progress
        (`peerprogress.Progress.run`), until cancelled (module doc)."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self.progress.run(), name="localcache-peer-progress")
            group.create_task(self._hash_queued(), name="localcache-peer-hashing")

    async def _hash_queued(self) -> None:
        while True:
            job = await self._queue.get()
            key = (job.root, job.folder)
            why: peer.UnservableReason | None = None
            try:
                manifest = await self._hash(job)
            except filelists.Unservable as exc:  # origin-mismatch (corrupt), -unchecked, ...
                why, say = exc.reason, log.error if exc.alarm else log.warning
                say(exc.event, folder=job.folder, error=str(exc)[:300])
            except (OSError, layout.DiskError) as exc:
                log.warning("peer_file_list_failed", folder=job.folder, error=str(exc)[:300])
                why = peer.UnservableReason.UNREADABLE
            except Exception:  # a bug must not end the agent: the folder is not published
                log.exception("peer_file_list_failed", folder=job.folder)
                why = peer.UnservableReason.ERROR
            finally:
                self._queued.discard(key)
            if why is not None:
                self._failed[key] = (job.stamp, why)
                self.progress.unservable(job.root, job.storage_key)  # followers leave it
                self._on_ready()  # published as unservable: its followers stop waiting
                continue
            self._hashed += 1
            self._ready[key] = (job.stamp, manifest)
            log.info("peer_file_list_hashed", folder=job.folder, digest=manifest.digest)
            self._on_ready()

    async def _hash(self, job: _Hash) -> peer.PeerManifest:
        folder = job.root / layout.MODELS_DIR / job.folder
        work = asyncio.ensure_future(
            asyncio.to_thread(
                filelists.compute,
                folder,
                job.storage_key,
                uri=job.manifest.uri,
                staged=job.manifest.origin_sums,
                unchecked=job.manifest.origin_unchecked,
                stop=self._stop.is_set,
                known=self.progress.known(_staging_of(job)),
            )
        )
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            self._stop.set()  # the thread stops at its next chunk or entry
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await work
            raise


def _with_origin_sums(manifest: peer.PeerManifest, sums: Mapping[str, str]) -> peer.PeerManifest:
    """`manifest` with `originSha256` set where `sums` holds the file's own SHA-256."""
    files = [
        f.model_copy(update={"origin_sha256": f.sha256}) if sums.get(f.path) == f.sha256 else f
        for f in manifest.files
    ]
    return manifest.model_copy(update={"files": files})


def _scopes(stored: Sequence[str], want: Want) -> tuple[str, ...]:
    return filelists.merge_scopes(stored, want.scopes)


def _order(model: peer.PeerModel) -> tuple[str, bool, str]:
    return model.storage_key, not model.whole, model.digest or ""


def _staging_of(job: _Hash) -> str:
    """The staging folder the folder of `job` was promoted from ("" when none)."""
    try:
        return layout.staging_name(job.storage_key, job.stamp.job)
    except layout.DiskError:
        return ""


def _peer_roots(placements: Mapping[str, Placement]) -> dict[str, Path]:
    """The models root of each node group of the pass that enables peer distribution."""
    roots: dict[str, Path] = {}
    for name, where in placements.items():
        if isinstance(where, launcher.NotLaunched):
            continue
        group, disk = where
        if group.spec.peer_distribution and group.spec.peer_distribution.enabled:
            roots[name] = disk.root
    return roots
