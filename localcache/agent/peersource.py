"""The folders this agent's peer server may serve: an in-memory index of the published file
lists (`agent.disk.filelists`), answering one lookup per peer request without touching the
apiserver.

`PeerFolders` is the peer server's `FolderSource` (`agent.peer.server`):
`lookup(storage_key, scope=None)` returns a `Found` (folder path, `PeerManifest`, scope
digests) of a complete, hashed folder of that storage key, or None. With `scope`, the folder
whose scopes contain it (the storage key's own folder `models/<key>` first, then its
variants `models/<key>.<v>`, by name): a requester is served the content its own scope
proved, never another scope's variant. Without `scope`, the storage key's own folder, else
its first variant (the caller then checks the requester's scope against `Found.scopes`).

Contract:
- The index is replaced as a whole (`replace`) by `agent.peerfiles.PeerFiles` after each
  reconcile pass that published file lists, so it lists exactly what `status.peer.models`
  says (a folder deleted or re-promoted leaves it in the same pass).
- The manifests of the last `CACHED_MANIFESTS` folders looked up are kept in memory; a miss
  reads the folder's file list (one JSON file, at most `peer.MAX_FILES` entries) and returns
  it only when its digest is the one indexed. Lookups and `replace` run on the event loop.
- Downloads in progress (`agent.peerprogress`) are served too, after the complete folders:
  `set_partials` replaces them as a whole; `lookup` answers a partial folder (its whole files,
  `manifest.complete` false) only to its own scope, when no complete folder serves it.
- Not promised: that the folder is still on disk when the caller opens a file (it may be
  deleted meanwhile: the open fails and the server answers 404; 503 for a partial folder,
  whose files move when it completes).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from localcache.agent import peerprogress
from localcache.agent.disk import filelists, layout
from localcache.api import peer

CACHED_MANIFESTS: Final = 16


@dataclass(frozen=True, slots=True)
class Served:
    """One folder the node serves: complete, hashed, its file list current."""

    root: Path
    folder: str
    storage_key: str
    digest: str
    bytes: int
    scopes: tuple[str, ...]
    stamp: filelists.Stamp
    """The promotion its file list was computed for."""

    @property
    def path(self) -> Path:
        return self.root / layout.MODELS_DIR / self.folder

    def model(self) -> peer.PeerModel:
        return peer.PeerModel(
            storage_key=self.storage_key,
            digest=self.digest,
            scopes=list(self.scopes),
            bytes=self.bytes,
        )


@dataclass(frozen=True, slots=True)
class Found:
    """What `lookup` answers: the folder, its manifest, the scopes entitled to it (the same
    fields as the peer server's `ServedFolder`)."""

    path: Path
    manifest: peer.PeerManifest
    scopes: frozenset[str]


class PeerFolders:
    """The peer server's folder index (module contract)."""

    def __init__(self) -> None:
        self._by_key: dict[str, tuple[Served, ...]] = {}
        self._manifests: collections.OrderedDict[tuple[Path, str, str], peer.PeerManifest] = (
            collections.OrderedDict()
        )
        self._partials: dict[str, tuple[peerprogress.Partial, ...]] = {}

    def set_partials(self, partials: Iterable[peerprogress.Partial]) -> None:
        """Serve exactly `partials` (downloads in progress) from now on."""
        by_key: dict[str, list[peerprogress.Partial]] = {}
        for partial in partials:
            by_key.setdefault(partial.item.storage_key, []).append(partial)
        self._partials = {
            k: tuple(sorted(v, key=lambda p: p.item.staging)) for k, v in by_key.items()
        }

    def replace(
        self,
        served: Iterable[Served],
        manifests: Mapping[tuple[Path, str], peer.PeerManifest] | None = None,
    ) -> None:
        """Serve exactly `served` from now on; `manifests` (by root and folder) are just
        computed or read, and go into the cache."""
        by_key: dict[str, list[Served]] = {}
        for item in served:
            by_key.setdefault(item.storage_key, []).append(item)
        # the storage key's own folder sorts before its variants (`<key>` < `<key>.<v>`)
        self._by_key = {k: tuple(sorted(v, key=lambda s: s.folder)) for k, v in by_key.items()}
        live = {(s.root, s.folder, s.digest) for v in self._by_key.values() for s in v}
        for cached in [c for c in self._manifests if c not in live]:
            del self._manifests[cached]
        for (root, folder), manifest in (manifests or {}).items():
            if (root, folder, manifest.digest) in live:
                self._remember((root, folder, manifest.digest), manifest)

    def served(self) -> list[Served]:
        return [s for v in self._by_key.values() for s in v]

    def scopes(self, storage_key: str) -> frozenset[str]:
        """Every scope proved for some folder of `storage_key` (no disk read)."""
        complete = {sc for s in self._by_key.get(storage_key, ()) for sc in s.scopes}
        partial = {p.item.scope for p in self._partials.get(storage_key, ())}
        return frozenset(complete | partial)

    def lookup(self, storage_key: str, scope: str | None = None) -> Found | None:
        """The folder to serve for `storage_key` (to a requester of `scope`), or None."""
        candidates = self._by_key.get(storage_key, ())
        if scope is not None:
            candidates = tuple(s for s in candidates if scope in s.scopes)
        if not candidates:
            return self._partial(storage_key, scope)
        item = candidates[0]
        manifest = self._manifest(item)
        if manifest is None:
            return None
        return Found(item.path, manifest, frozenset(item.scopes))

    def _partial(self, storage_key: str, scope: str | None) -> Found | None:
        for partial in self._partials.get(storage_key, ()):
            if scope is None or partial.item.scope == scope:
                return Found(partial.top, partial.manifest, frozenset({partial.item.scope}))
        return None

    def _manifest(self, item: Served) -> peer.PeerManifest | None:
        key = (item.root, item.folder, item.digest)
        manifest = self._manifests.get(key)
        if manifest is not None:
            self._manifests.move_to_end(key)
            return manifest
        files = filelists.read(item.root, item.folder)
        if files is None or files.manifest.digest != item.digest:
            return None
        self._remember(key, files.manifest)
        return files.manifest

    def _remember(self, key: tuple[Path, str, str], manifest: peer.PeerManifest) -> None:
        self._manifests[key] = manifest
        self._manifests.move_to_end(key)
        while len(self._manifests) > CACHED_MANIFESTS:
            self._manifests.popitem(last=False)
