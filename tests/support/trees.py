"""Directory trees that tests build on a local filesystem."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from localcache.runtime import fstree


@contextlib.contextmanager
def deep_tree(top: Path, depth: int) -> Iterator[Path]:
    """`top/d/d/.../d/model.bin`, `depth` levels below `top`, made without os.makedirs (which
    recurses, as a tenant's own tools need not); removed afterwards whatever is left of it, so
    that pytest's own clean-up of old temporary directories (shutil.rmtree) never meets it."""
    os.mkdir(top)
    try:
        current = str(top)
        for _ in range(depth):
            current = os.path.join(current, "d")
            os.mkdir(current)
        Path(current, "model.bin").write_bytes(b"x")
        yield top
    finally:
        if os.path.lexists(top):
            fstree.remove_tree(top)
