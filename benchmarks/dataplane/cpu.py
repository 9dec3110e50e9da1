"""CPU seconds of the bed's pods, from their cgroups (cgroup v1 cpuacct or v2 cpu.stat).

Each test-bed node's kubelet puts its pods below the node's own cgroup
(`kubepods/<qos>/pod<uid>`), and a cgroup's usage counts its descendants', including those
already removed (the kernel charges every ancestor as it runs). So between two snapshots:

- a long-lived pod's CPU is the change of its own `pod<uid>` counter;
- the download pods' CPU is the change of the node's counter less the changes of every pod
  present in both snapshots (the download pods come and go within the run; a pod cgroup seen
  only afterwards started within it, so it is counted in the remainder too).

`snapshot` reads the counters (I/O); `split` is pure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

POD_PREFIX = "pod"
MAX_DEPTH = 4  # node cgroup / kubepods / qos / pod<uid>


def usage_seconds(folder: Path) -> float | None:
    """CPU seconds a cgroup (and its descendants) used; None where it has no counter."""
    v1 = folder / "cpuacct.usage"
    if v1.is_file():
        return int(v1.read_text()) / 1e9
    v2 = folder / "cpu.stat"
    if v2.is_file():
        for line in v2.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "usage_usec":
                return int(value) / 1e6
    return None


def pod_folders(node_folder: Path) -> dict[str, Path]:
    """pod UID -> its cgroup folder below a node's cgroup."""
    found: dict[str, Path] = {}
    level = [node_folder]
    for _ in range(MAX_DEPTH):
        following: list[Path] = []
        for folder in level:
            for child in folder.iterdir() if folder.is_dir() else ():
                if not child.is_dir():
                    continue
                if child.name.startswith(POD_PREFIX) and len(child.name) > 30:
                    found[child.name.removeprefix(POD_PREFIX).replace("_", "-")] = child
                else:
                    following.append(child)
        level = following
    return found


@dataclass(frozen=True)
class Snapshot:
    """CPU seconds per node (all its pods) and per pod UID, at one moment."""

    nodes: Mapping[str, float]
    pods: Mapping[str, float]


def snapshot(node_folders: Mapping[str, Path]) -> Snapshot:
    """Read every node's and every pod's counter (folders gone meanwhile are skipped)."""
    nodes: dict[str, float] = {}
    pods: dict[str, float] = {}
    for name, folder in node_folders.items():
        total = usage_seconds(folder)
        if total is None:
            raise FileNotFoundError(f"no CPU counter in {folder}")
        nodes[name] = total
        for uid, pod in pod_folders(folder).items():
            try:
                used = usage_seconds(pod)
            except (FileNotFoundError, ValueError):
                continue  # removed while read
            if used is not None:
                pods[uid] = used
    return Snapshot(nodes, pods)


def split(before: Snapshot, after: Snapshot, *, agents: Collection[str]) -> tuple[float, float]:
    """(CPU seconds of the pods `agents` (UIDs), of the pods that came and went) between
    the snapshots; see the module docstring."""
    kept = set(before.pods) & set(after.pods)
    agent_s = sum(after.pods[uid] - before.pods[uid] for uid in kept if uid in agents)
    others_s = sum(after.pods[uid] - before.pods[uid] for uid in kept)
    total_s = sum(after.nodes[n] - before.nodes.get(n, after.nodes[n]) for n in after.nodes)
    return agent_s, max(0.0, total_s - others_s)
