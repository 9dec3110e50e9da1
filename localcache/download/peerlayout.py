"""The tree a peer manifest describes, checked before anything is fetched and laid out in a
staging directory after every file verified (`download.peerfetch`).

Contract:
- `check(manifest, max_bytes)`: a manifest is usable when its files sum to at most
  `max_bytes` and it lists no special file (`others`), no path
  twice, no path ending in `peer.PART_SUFFIX` (the name of a file being fetched), nothing
  below a file or a link, and only links whose target is relative and stays inside the model
  folder (lexically, from the link's directory). Otherwise
  `peersources.FetchError` with `use_origin` (the origin's own download decides about such
  content; a peer never makes us write it).
- `make_dirs(manifest, staging)` creates every listed directory; `make_links` creates the
  links last (after every file), then checks each with `os.path.realpath` against `staging`,
  so a chain of links cannot lead outside either; `fsync_tree` fsyncs every directory, deepest
  first. Entry paths are already safe relative paths (`api.peer.check_path`).
"""

from __future__ import annotations

import os
import posixpath
from pathlib import Path

from localcache.api import peer
from localcache.download import peersources
from localcache.runtime import durable


def check(manifest: peer.PeerManifest, *, max_bytes: int) -> None:
    """Refuse a manifest larger than `max_bytes` or whose tree we will not lay out (module
    doc)."""
    if manifest.bytes > max_bytes:
        raise peersources.use_origin(
            f"the model ({manifest.bytes} bytes) is larger than the {max_bytes}-byte "
            "limit (--max-size)"
        )
    if manifest.others:
        raise peersources.use_origin(
            f"the manifest lists {len(manifest.others)} special file(s), e.g. "
            f"{manifest.others[0][:80]!r}"
        )
    kinds: dict[str, str] = {}
    entries = [(d, "dir") for d in manifest.dirs]
    entries += [(f.path, "file") for f in manifest.files]
    entries += [(link.path, "link") for link in manifest.links]
    for path, kind in entries:
        if path in kinds:
            raise peersources.use_origin(f"the manifest lists {path[:80]!r} twice")
        kinds[path] = kind
    for path in kinds:
        if path.endswith(peer.PART_SUFFIX):  # the name a file has while being fetched
            raise peersources.use_origin(f"the manifest lists {path[:80]!r}")
        parts = path.split("/")
        for depth in range(1, len(parts)):
            ancestor = "/".join(parts[:depth])
            if kinds.get(ancestor, "dir") != "dir":
                raise peersources.use_origin(
                    f"the manifest lists {path[:80]!r} below the {kinds[ancestor]} "
                    f"{ancestor[:80]!r}"
                )
    for link in manifest.links:
        if not inside(link.path, link.target):
            raise peersources.use_origin(
                f"the link {link.path[:80]!r} points outside the model ({link.target[:80]!r})"
            )


def inside(path: str, target: str) -> bool:
    """True when the link at `path` with `target` stays inside the folder, lexically."""
    if not target or "\0" in target or target.startswith("/"):
        return False
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return resolved != ".." and not resolved.startswith("../")


def make_dirs(manifest: peer.PeerManifest, staging: Path) -> None:
    for d in manifest.dirs:
        (staging / d).mkdir(parents=True, exist_ok=True)


def make_links(manifest: peer.PeerManifest, staging: Path) -> None:
    """Create the links, then refuse (use origin) any whose real path leaves `staging`."""
    for link in manifest.links:
        path = staging / link.path
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(link.target, path)
    root = os.path.realpath(staging)
    for link in manifest.links:
        real = os.path.realpath(staging / link.path)
        if real != root and not real.startswith(root + os.sep):
            raise peersources.use_origin(f"the link {link.path[:80]!r} resolves outside the model")


def fsync_tree(staging: Path) -> None:
    """fsync every directory under `staging` (deepest first), then `staging` itself."""
    for current, _dirs, _files in os.walk(staging, topdown=False):
        durable.fsync_dir(Path(current))
