"""The test bed's cgroup tree, always below the cgroup of the process that starts it.

Every mounted hierarchy (cgroup v1 controllers, or the v2 unified mount) gets the same
relative path `<own>/<name>/...`, where `<own>` is the deepest cgroup this process is in:
kubelet takes one `cgroupRoot` for all hierarchies, so the path must be valid in each. When
this process sits in cgroups that are not nested along one path (say `cpu:/a` and
`memory:/b`), no such path exists and `CgroupTree.below_own` raises `CgroupError`.

Contract:
- `create(rel)` makes `rel` (and its parents) in every hierarchy; v1 cpuset children inherit
  their parent's cpus and mems, since an empty cpuset refuses processes.
- `join(rel)` moves the calling process there: used as a `preexec_fn`, so a child starts in
  the test bed's tree and everything it forks (shims, pods) stays inside it.
- `kill_all()` SIGKILLs every process in the tree until none is left (with a deadline);
  `remove()` removes every directory, deepest first. Both are safe to repeat.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KILL_TIMEOUT_S = 20.0


class CgroupError(RuntimeError):
    """The test bed's cgroups could not be placed, made or emptied."""


@dataclass(frozen=True)
class Hierarchy:
    mount: Path  # where the hierarchy is mounted
    own: str  # this process's cgroup in it, "/" rooted
    cpuset: bool


def _mounted_hierarchies() -> list[tuple[frozenset[str], Path]]:
    """(super options, mount point) of each cgroup mount; v2 has the empty option set."""
    mounts: list[tuple[frozenset[str], Path]] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fields = post.split(" ")
        mount_point = Path(pre.split(" ")[4])
        if fields[0] == "cgroup2":
            mounts.append((frozenset(), mount_point))
        elif fields[0] == "cgroup" and len(fields) > 2:
            mounts.append((frozenset(fields[2].split(",")), mount_point))
    return mounts


def own_hierarchies() -> list[Hierarchy]:
    """This process's place in every mounted hierarchy."""
    mounted = _mounted_hierarchies()
    found: list[Hierarchy] = []
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        wanted = frozenset(controllers.split(",")) if controllers else frozenset()
        for options, mount_point in mounted:
            if (wanted and wanted <= options) or (not wanted and not options):
                found.append(Hierarchy(mount_point, path or "/", "cpuset" in wanted))
                break
    if not found:
        raise CgroupError("no mounted cgroup hierarchy found in /proc/self/mountinfo")
    return found


def _is_within(path: str, base: str) -> bool:
    return base == "/" or path == base or path.startswith(base.rstrip("/") + "/")


@dataclass(frozen=True)
class CgroupTree:
    """`<own cgroup>/<name>` in every hierarchy."""

    hierarchies: tuple[Hierarchy, ...]
    root: str  # absolute cgroup path, the same in every hierarchy

    @classmethod
    def below_own(cls, name: str) -> CgroupTree:
        found = own_hierarchies()
        deepest = max((h.own for h in found), key=len)
        for h in found:
            if not _is_within(deepest, h.own):
                raise CgroupError(
                    f"this process's cgroups are not nested along one path ({h.mount}: {h.own} "
                    f"vs {deepest}); kubelet needs one cgroupRoot valid in every hierarchy"
                )
        return cls(tuple(found), f"{deepest.rstrip('/')}/{name}")

    def path(self, rel: str = "") -> str:
        """The absolute cgroup path of `rel` below the root (what kubelet's cgroupRoot takes)."""
        return f"{self.root}/{rel}".rstrip("/")

    def _dir(self, hierarchy: Hierarchy, rel: str = "") -> Path:
        return hierarchy.mount / self.path(rel).lstrip("/")

    def create(self, rel: str = "") -> None:
        for h in self.hierarchies:
            target = self._dir(h, rel)
            parts = target.relative_to(h.mount).parts
            current = h.mount
            for part in parts:
                parent, current = current, current / part
                if current.is_dir():
                    continue
                current.mkdir()
                if h.cpuset:
                    for knob in ("cpuset.cpus", "cpuset.mems"):
                        source = parent / knob
                        if source.exists():
                            (current / knob).write_text(source.read_text())

    def join(self, rel: str) -> None:
        pid = str(os.getpid())
        for h in self.hierarchies:
            (self._dir(h, rel) / "cgroup.procs").write_text(pid)

    def pids(self, rel: str = "") -> set[int]:
        """The processes in `rel` below the root and its descendants."""
        found: set[int] = set()
        for h in self.hierarchies:
            top = self._dir(h, rel)
            if not top.is_dir():
                continue
            for dirpath, _dirs, files in os.walk(top):
                if "cgroup.procs" in files:
                    with contextlib.suppress(OSError):
                        text = (Path(dirpath) / "cgroup.procs").read_text()
                        found.update(int(p) for p in text.split())
        return found

    def kill_all(self) -> None:
        kill_until_none(self.pids, f"in {self.root}")

    def remove(self) -> None:
        leftovers: list[str] = []
        for h in self.hierarchies:
            top = self._dir(h)
            if not top.is_dir():
                continue
            for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
                try:
                    os.rmdir(dirpath)
                except OSError as exc:
                    leftovers.append(f"{dirpath}: {exc.strerror}")
        if leftovers:
            raise CgroupError("cgroups left behind: " + "; ".join(leftovers))


def kill_until_none(find: Callable[[], set[int]], where: str) -> None:
    """SIGKILL the processes `find` returns until it returns none; CgroupError (naming
    `where`) when some survive `KILL_TIMEOUT_S`."""
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while pids := find():
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise CgroupError(f"processes {sorted(pids)} survive {where}")
        time.sleep(0.05)
