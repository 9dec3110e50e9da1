"""Directory trees that tests build on a local filesystem."""

from __future__ import annotations

import os
from pathlib import Path


def deep_tree(top: Path, depth: int) -> Path:
    """`top/d/d/.../d/model.bin`, `depth` levels below `top`, made without os.makedirs (which
    recurses, as a tenant's own tools need not)."""
    os.mkdir(top)
    current = str(top)
    for _ in range(depth):
        current = os.path.join(current, "d")
        os.mkdir(current)
    Path(current, "model.bin").write_bytes(b"x")
    return top
