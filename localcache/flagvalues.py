"""Values of the process flags that need more than a type: the error every bad value raises
(`SettingsError`) and `--models-roots` (`parse_root_mounts` into `RootMount`s). Imports
nothing of localcache; `localcache.settings` re-exports these names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


class SettingsError(ValueError):
    """A flag or environment variable has an unusable value (the message names it)."""


@dataclass(frozen=True, slots=True)
class RootMount:
    """One models root of `--models-roots`: `host_path` on the node (normalised), mounted at
    `container_path` in the agent's container."""

    host_path: str
    container_path: Path


def _normalised(path: str | Path) -> str:
    return str(PurePosixPath(os.path.normpath(str(path))))


def parse_root_mounts(text: str) -> tuple[RootMount, ...]:
    """`--models-roots`: comma-separated `<host path>=<container path>` (or a single path,
    mounted at the same path), no host or container path twice; SettingsError names the
    bad part."""
    mounts: list[RootMount] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        host, sep, container = part.partition("=")
        host, container = host.strip(), (container.strip() if sep else host.strip())
        if not host.startswith("/") or not container.startswith("/"):
            raise SettingsError(
                f"--models-roots: want <host path>=<container path>, both absolute, got {part!r}"
            )
        mounts.append(RootMount(_normalised(host), Path(container)))
    hosts = [m.host_path for m in mounts]
    containers = [_normalised(m.container_path) for m in mounts]
    for what, values in (("host path", hosts), ("container path", containers)):
        if dup := sorted({v for v in values if values.count(v) > 1}):
            raise SettingsError(f"--models-roots: {what} given twice: {', '.join(dup)}")
    return tuple(mounts)
