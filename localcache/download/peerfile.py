"""One file of a model being written by `localcache fetch`: the bytes so far, their running
sha256, and the peers that sent them (`download.peerfetch`, `download.peerorigin`)."""

from __future__ import annotations

import hashlib
from typing import IO

from localcache.api import peer
from localcache.download import peersources


class FileWrite:
    """`entry`'s bytes written to `out` so far; `contributors`: the peers that sent them (the
    origin's bytes have none)."""

    def __init__(self, entry: peer.ManifestFile, out: IO[bytes]) -> None:
        self.entry = entry
        self.out = out
        self.written = 0
        self.hasher = hashlib.sha256()
        self.contributors: set[peersources.Source] = set()

    def absorb(self, chunk: bytes, source: peersources.Source | None) -> None:
        self.out.write(chunk)
        self.hasher.update(chunk)
        self.written += len(chunk)
        if source is not None:
            self.contributors.add(source)

    def verified(self) -> bool:
        """Whole, with the manifest's sha256."""
        return self.written == self.entry.size and self.hasher.hexdigest() == self.entry.sha256

    def reset(self) -> None:
        self.out.seek(0)
        self.out.truncate(0)
        self.written = 0
        self.hasher = hashlib.sha256()
        self.contributors.clear()
