"""The test bed's ReadWriteMany volume: one directory that both nodes mount.

Why not NFS: the machine's kernel has no NFS client (`/proc/filesystems` lists no `nfs` or
`nfs4`, there are no modules to load, `mount -t nfs4` fails with "unknown filesystem type
'nfs4'"), so kubelet's `nfs` volume plugin cannot mount an export, whoever serves it; Debian
packages a userspace NFS server (nfs-ganesha) but no FUSE NFS client. The closest real shared
filesystem is one directory of the machine's filesystem that every node sees: each node's
private mount namespace replaces only `/var/lib`, `/run`, `/var/log`, `/mnt` and `/models`,
and the test bed's run directory is at the same path on the host and on every node (kubelet
reads its configuration from there). So `<run dir>/shared-volume` is the export: kubelet on
either node bind-mounts the same inode into a pod, a write on one node is read on the other.

`export(run_dir)` creates it (world-writable like a provisioner's NFS export: the pods of a
tenant run as any non-root user and kubelet applies no fsGroup to it); the bed empties it on
reset and removes it with its run directory. `volume()` and `claim()` are a PersistentVolume
on a folder of it, cluster-scoped, with no node affinity, `ReadWriteMany`, and the claim
pre-bound to it, as an administrator hands a tenant a share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

Obj = dict[str, Any]
EXPORT = "shared-volume"
STORAGE_CLASS = ""  # static binding: no provisioner, no default class


def export(run_dir: Path) -> Path:
    """The bed's export under `run_dir`, created if missing (idempotent)."""
    root = run_dir / EXPORT
    root.mkdir(exist_ok=True)
    root.chmod(0o777)
    return root


def share(root: Path, name: str) -> Path:
    """The export's folder for one volume, created world-writable like `root`."""
    folder = root / name
    folder.mkdir(exist_ok=True)
    folder.chmod(0o777)
    return folder


def volume(name: str, path: Path, *, namespace: str, claim: str, capacity: str) -> Obj:
    """A ReadWriteMany PersistentVolume on `path`, reserved for `namespace/claim`."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": capacity},
            "accessModes": ["ReadWriteMany"],
            "volumeMode": "Filesystem",
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": STORAGE_CLASS,
            "hostPath": {"path": str(path), "type": "Directory"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }


def claim(name: str, namespace: str, *, volume_name: str, size: str) -> Obj:
    """The tenant's ReadWriteMany claim on `volume_name`."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "volumeMode": "Filesystem",
            "storageClassName": STORAGE_CLASS,
            "volumeName": volume_name,
            "resources": {"requests": {"storage": size}},
        },
    }
