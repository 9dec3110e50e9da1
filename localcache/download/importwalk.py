"""A bounded size count of a folder a tenant's download wrote: how many bytes and regular
files, without following symlinks, without recursion, within caps on files and depth.

`measure(top, max_files=..., max_depth=..., stop=...)` returns `Size(bytes, files,
truncated)`: the sum of the apparent sizes (`st_size`) of regular files below `top` and their
number; symlinks, devices and FIFOs are counted as nothing; directories deeper than
`max_depth` below `top` are not entered; the walk ends after `max_files` regular files, or
as soon as `stop()` answers True (checked every `STOP_EVERY` entries); `truncated` says a cap
or `stop` ended it early. A missing `top` measures zero; entries that vanish or cannot be
read while walking (the download is still writing) are skipped.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

STOP_EVERY: Final = 256


@dataclass(frozen=True)
class Size:
    bytes: int
    files: int
    truncated: bool = False


def measure(
    top: Path,
    *,
    max_files: int,
    max_depth: int,
    stop: Callable[[], bool] = lambda: False,
) -> Size:
    """The size of the tree at `top` (module docstring)."""
    total = files = seen = 0
    truncated = False
    stack: list[tuple[str, int]] = [(str(top), 0)]
    while stack:
        current, depth = stack.pop()
        try:
            listing = os.scandir(current)
        except OSError:
            continue
        with listing as entries:
            for entry in entries:
                seen += 1
                if seen % STOP_EVERY == 0 and stop():
                    return Size(total, files, truncated=True)
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    if depth + 1 < max_depth:
                        stack.append((entry.path, depth + 1))
                    else:
                        truncated = True
                elif stat.S_ISREG(info.st_mode):
                    total += info.st_size
                    files += 1
                    if files >= max_files:
                        return Size(total, files, truncated=True)
    return Size(total, files, truncated)
