"""One file of a model being written by `localcache fetch`: the bytes so far, their running
sha256, and the peers that sent them (`download.peerfetch`, `download.peerorigin`)."""

from __future__ import annotations

import hashlib
from typing import IO

import structlog

from localcache.api import peer
from localcache.download import peersources

log = structlog.get_logger(__name__)


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


def blame(board: peersources.Board, path: str, sources: set[peersources.Source]) -> None:
    """`sources` sent bytes of `path` that fail its sha256: each is `Board.corrupted` (which
    one sent the bad bytes is unknown when several did: all are left)."""
    shown, count = path[:80], len(sources)
    why = f"served bytes that fail the sha256 of {shown!r}"
    if count > 1:
        why = f"one of {count} sources of {shown!r}, whose sha256 failed"
    for bad in sources:
        board.corrupted(bad, why)
        log.warning("fetch.bad_bytes", source=bad.node, path=path[:200])
