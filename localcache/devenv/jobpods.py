"""Pure rules of the local Job runner (`jobrunner`, a TEST AND DEMO HARNESS): no I/O.

- `target_node`: which of the runner's nodes should play a pod now (a Job's Pending pod pinned
  by `nodeSelector` `kubernetes.io/hostname`).
- `plan_download`: the download a pod's first container asks for (`DownloadPlan`: storage-
  initializer args `[<uri>, <dest>]`, the PVC whose mount holds `<dest>`, subPath, env).
- `host_destination`: where that download lands in the node's host folder, given the PV.
- `running_status` / `finished_status`: the pod status patches the runner sends.

Contract: a pod that cannot be played raises `PodError` saying why; a path that would leave its
volume (absolute, `..`) is refused. Not promised: any volume type but local, hostPath and
localcache's CSI PVs.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcache.csi import DRIVER_NAME, entitlement

Obj = dict[str, Any]

HOSTNAME_LABEL = "kubernetes.io/hostname"
MESSAGE_TAIL = 1024


class PodError(Exception):
    """The pod cannot be played (bad args, no such volume, path outside the volume...)."""


@dataclass(frozen=True, slots=True)
class DownloadPlan:
    """What one download pod asks for: `uri` into `relative` below the `sub_path` of claim
    `claim` (all taken from the pod's first container and volumes)."""

    uri: str
    container: str
    image: str
    claim: str
    sub_path: str
    relative: str
    env: tuple[tuple[str, str], ...] = ()


def metadata(obj: Obj) -> Obj:
    """A copy of `obj`'s metadata (empty when absent)."""
    return dict(obj.get("metadata") or {})


def target_node(pod: Obj, nodes: Mapping[str, Path]) -> str | None:
    """The node among `nodes` that should run this pod now, or None (not a Job's pod, not
    Pending, being deleted, pinned elsewhere or to no node)."""
    meta = metadata(pod)
    if meta.get("deletionTimestamp"):
        return None
    if not any(ref.get("kind") == "Job" for ref in meta.get("ownerReferences") or []):
        return None
    if ((pod.get("status") or {}).get("phase") or "Pending") != "Pending":
        return None
    spec = pod.get("spec") or {}
    node = (spec.get("nodeSelector") or {}).get(HOSTNAME_LABEL)
    if node not in nodes:
        return None
    bound = spec.get("nodeName")
    return str(node) if not bound or bound == node else None


def plan_download(pod: Obj) -> DownloadPlan:
    """The download the pod's first container asks for; `PodError` says why there is none."""
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        raise PodError("the pod has no container")
    container = containers[0]
    args = [str(a) for a in container.get("args") or []]
    if len(args) != 2:
        raise PodError(f"expected args [<uri>, <dest>], got {args}")
    uri, dest = args
    dest = posixpath.normpath(dest)
    best: Obj | None = None
    for mount in container.get("volumeMounts") or []:
        path = posixpath.normpath(str(mount.get("mountPath") or "/"))
        if (dest == path or dest.startswith(path.rstrip("/") + "/")) and (
            best is None or len(path) > len(posixpath.normpath(best["mountPath"]))
        ):
            best = mount
    if best is None:
        raise PodError(f"no volume mount holds {dest}")
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    volume = volumes.get(best.get("name"))
    claim = ((volume or {}).get("persistentVolumeClaim") or {}).get("claimName")
    if not claim:
        raise PodError(f"volume {best.get('name')!r} is not a PersistentVolumeClaim")
    relative = posixpath.relpath(dest, posixpath.normpath(str(best["mountPath"])))
    env = tuple(
        (str(e["name"]), str(e["value"]))
        for e in container.get("env") or []
        if "name" in e and isinstance(e.get("value"), str)
    )
    return DownloadPlan(
        uri=uri,
        container=str(container.get("name") or "main"),
        image=str(container.get("image") or ""),
        claim=str(claim),
        sub_path=str(best.get("subPath") or ""),
        relative="" if relative == "." else relative,
        env=env,
    )


def _inside(path: str, what: str) -> str:
    """`path` as a relative path that cannot leave its base (no `..`, not absolute)."""
    norm = posixpath.normpath(path) if path else "."
    if posixpath.isabs(norm) or norm == ".." or norm.startswith("../"):
        raise PodError(f"{what} {path!r} leaves the volume")
    return "" if norm == "." else norm


def host_destination(
    plan: DownloadPlan, pv: Obj, *, host_root: Path, pv_path: str | None = None
) -> Path:
    """Where `plan` writes on the node whose local PV path is the folder `host_root`.
    With `pv_path`, a PV whose path differs is refused (it is not the node's local volume)."""
    source = pv.get("spec") or {}
    path = (source.get("local") or {}).get("path") or (source.get("hostPath") or {}).get("path")
    csi = source.get("csi") or {}
    if not path and csi.get("driver") == DRIVER_NAME:
        # localcache's CSI view shows the Job's staging folder at the same subPath
        path = (csi.get("volumeAttributes") or {}).get(entitlement.ROOT)
    if not path:
        raise PodError(
            f"PV {metadata(pv).get('name')} is not a local, hostPath or localcache volume"
        )
    if pv_path is not None and posixpath.normpath(path) != posixpath.normpath(pv_path):
        raise PodError(f"PV path {path} is not the node's local volume {pv_path}")
    dest = host_root
    for part in (_inside(plan.sub_path, "subPath"), _inside(plan.relative, "destination")):
        if part:
            dest = dest / part
    return dest


def running_status(plan: DownloadPlan, *, started_at: str) -> Obj:
    """The pod status patch of a started download."""
    return {
        "status": {
            "phase": "Running",
            "startTime": started_at,
            "containerStatuses": [
                {
                    "name": plan.container,
                    "image": plan.image,
                    "imageID": "",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": started_at}},
                }
            ],
        }
    }


def finished_status(
    *, container: str, image: str, exit_code: int, message: str, started_at: str, finished_at: str
) -> Obj:
    """The pod status patch of a finished download: Succeeded for exit code 0, else Failed
    with `message` on the pod and the container."""
    terminated: Obj = {
        "exitCode": exit_code,
        "reason": "Completed" if exit_code == 0 else "Error",
        "startedAt": started_at,
        "finishedAt": finished_at,
    }
    status: Obj = {"phase": "Succeeded" if exit_code == 0 else "Failed"}
    if exit_code != 0:
        terminated["message"] = message[-MESSAGE_TAIL:]
        status["message"] = message.strip().splitlines()[-1][:MESSAGE_TAIL] if message else ""
        status["reason"] = "DownloadFailed"
    status["containerStatuses"] = [
        {
            "name": container,
            "image": image,
            "imageID": "",
            "ready": False,
            "started": False,
            "restartCount": 0,
            "state": {"terminated": terminated},
        }
    ]
    return {"status": status}
