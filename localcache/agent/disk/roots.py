"""The agent's models roots: which one serves a node group, and which folders may go.

An agent serves one or more models roots: each is a node directory (the DaemonSet's hostPath,
e.g. `/mnt/models`, or `/models` as KServe's manifests and samples use) mounted somewhere in
the agent's container, with its own `folders.ModelDisk`. A node group is served on the root whose
host path equals its PV path (`local.path`, else `hostPath.path`); a group whose path is not
mounted gets `layout.RootMismatch`, naming the mounted paths and how to add one.

The keep rule (`retention`): editing a node group's path never deletes the models at the old
path. A model folder on a root is deleted only when no entry of this node (on any root) has
its storage key any more, and only on a root that some node group of the cluster still
declares as its PV path. Folders on a root that no node group declares (the group moved away)
are all kept, and so are folders whose entries are now served on another root: the agent
reports them (`Retention.kept`) and an operator deletes them by hand (README, "Node group
paths"). A node that leaves a group (spec §4, node membership) still loses the group's models
when the group's path is unchanged.

Pure except for `ModelDisk` objects it holds: no I/O here.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from localcache.agent.disk import folders, layout

ADD_ROOT_HINT = (
    "mount that path into the agent (the DaemonSet's hostPath and `--models-roots "
    "<host path>=<container path>`, or the chart's `modelsRoots` value), or set the node "
    "group's PV path to a mounted one"
)


def normalise(path: str | Path) -> str:
    """A host path as compared with node groups' PV paths (`os.path.normpath`, POSIX)."""
    return str(PurePosixPath(os.path.normpath(str(path))))


def served_path(disk: folders.ModelDisk) -> str:
    """The node path `disk` serves: its host path, else its root."""
    return normalise(disk.host_path or str(disk.root))


@dataclass(frozen=True, slots=True)
class Root:
    """One models root: `host_path` on the node, mounted at `container_path`."""

    host_path: str
    container_path: Path


def check_unique(roots: Sequence[Root]) -> None:
    """ValueError when two roots share a host path or a container path."""
    hosts = [r.host_path for r in roots]
    containers = [normalise(r.container_path) for r in roots]
    for what, values in (("host path", hosts), ("container path", containers)):
        dup = sorted({v for v in values if values.count(v) > 1})
        if dup:
            raise ValueError(f"--models-roots: {what} given twice: {', '.join(dup)}")


class Disks:
    """The agent's `ModelDisk`s, one per models root (at least one, distinct host paths)."""

    def __init__(self, disks: Sequence[folders.ModelDisk]) -> None:
        if not disks:
            raise ValueError("the agent needs at least one models root")
        paths = [served_path(d) for d in disks]
        if len(set(paths)) != len(paths):
            raise ValueError(f"models roots share a host path: {paths}")
        self.all: tuple[folders.ModelDisk, ...] = tuple(disks)

    def mounted(self) -> list[str]:
        """The host paths served, each with where the agent sees it when that differs."""
        out = []
        for disk in self.all:
            path = served_path(disk)
            where = normalise(disk.root)
            out.append(path if where == path else f"{path} (mounted at {where})")
        return out

    def for_path(self, pv_path: str | None) -> folders.ModelDisk:
        """The disk serving a node group whose PV path is `pv_path` (the first one when the
        PV names no path); `layout.RootMismatch` when no root has that host path."""
        if pv_path is None:
            return self.all[0]
        wanted = normalise(pv_path)
        for disk in self.all:
            if served_path(disk) == wanted:
                return disk
        noun = "models root" if len(self.all) == 1 else "models roots"
        raise layout.RootMismatch(
            f"node group PV path {wanted} differs from the agent's {noun} "
            f"{', '.join(self.mounted())}; {ADD_ROOT_HINT}"
        )


@dataclass(frozen=True, slots=True)
class Retention:
    """What one root keeps: `referenced` goes to `ModelDisk.delete_unreferenced` (folders
    not in it are deleted), `kept` are folders kept although no entry is served from them."""

    referenced: frozenset[str]
    kept: frozenset[str]


def retention(
    *,
    path: str,
    folders: Iterable[str],
    here: Collection[str],
    anywhere: Collection[str],
    declared: Collection[str],
) -> Retention:
    """The keep rule for the root at host path `path` holding model `folders`: `here` are the
    storage keys of entries served on it, `anywhere` those of all this node's entries,
    `declared` the (normalised) PV paths of every node group of the cluster."""
    present = set(folders)
    referenced = set(anywhere) | set(here)
    if normalise(path) not in declared:
        referenced |= present  # no group uses this root any more: keep everything on it
    kept = (present & referenced) - set(here)
    return Retention(frozenset(referenced), frozenset(kept))
