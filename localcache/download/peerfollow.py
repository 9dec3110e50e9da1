"""What a fetch in follow mode has been offered so far: the union of the manifests its sources
served while they still downloaded the model (`download.peerfetch`).

`Offered.add(manifest)` returns the entries not offered before. It ends the run with "use
origin" (`peersources.FetchError`) when an entry changed between two manifests, when the
union would not be a tree we lay out (`peerlayout.check`: a path twice, a file below a file,
more than `max_bytes` in all) or would list more than `peer.MAX_FILES` files.
`Offered.missing(complete)`: an entry offered that the complete manifest does not list.
`Offered.stalled(now)`: no new entry and no new byte (`progress(received)`) for
`FOLLOW_PATIENCE_S`: sources that follow each other without an origin download, or a source
stuck before its next file, are left for the origin.
"""

from __future__ import annotations

from typing import Final

from localcache.api import peer
from localcache.download import peerlayout, peersources

FOLLOW_PATIENCE_S: Final = 600.0


class Offered:
    def __init__(self, *, max_bytes: int, now: float) -> None:
        self._max_bytes = max_bytes
        self._entries: dict[str, peer.ManifestFile] = {}
        self._growth = now
        self._received = 0

    def add(self, manifest: peer.PeerManifest, *, now: float) -> list[peer.ManifestFile]:
        new: list[peer.ManifestFile] = []
        for entry in manifest.files:
            before = self._entries.get(entry.path)
            if before is None:
                new.append(entry)
            elif before != entry:
                raise peersources.use_origin(
                    f"{entry.path[:80]!r} changed between two manifests of the sources"
                )
        if not new:
            return []
        if len(self._entries) + len(new) > peer.MAX_FILES:
            raise peersources.use_origin(f"the sources list more than {peer.MAX_FILES} files")
        union = [*self._entries.values(), *new]
        peerlayout.check(
            peer.PeerManifest.model_construct(
                storage_key=manifest.storage_key,
                digest=manifest.digest,
                complete=False,
                files=union,
                dirs=list(manifest.dirs),
                links=list(manifest.links),
                others=list(manifest.others),
            ),
            max_bytes=self._max_bytes,
        )
        self._entries.update((e.path, e) for e in new)
        self._growth = now
        return new

    def missing(self, complete: peer.PeerManifest) -> str | None:
        listed = {f.path for f in complete.files}
        gone = sorted(self._entries.keys() - listed)
        return gone[0] if gone else None

    def progress(self, received: int, *, now: float) -> None:
        if received != self._received:
            self._received, self._growth = received, now

    def stalled(self, now: float) -> bool:
        return now - self._growth > FOLLOW_PATIENCE_S
