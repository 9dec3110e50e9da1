"""What the tests of this package share: the serving pods KServe's controllers render, and what
the stand-in model server (hack/runtime-standin) printed when it read the model files."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from localcache.api import inferenceservice as isvc_api
from tests.e2e.realnodes.cluster import Cluster

Obj = dict[str, Any]
LABELS = (isvc_api.LOCAL_MODEL_LABEL, isvc_api.LOCAL_MODEL_NAMESPACE_LABEL)
ANNOTATIONS = (
    isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION,
    isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION,
)
POD_TIMEOUT_S = 240


def local_model_keys(obj: Obj) -> dict[str, str]:
    """The four local-model keys on `obj` (labels and annotations), those present."""
    meta = obj.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    found = {k: labels[k] for k in LABELS if k in labels}
    found.update({k: annotations[k] for k in ANNOTATIONS if k in annotations})
    return found


def running_pod(cluster: Cluster, namespace: str, selector: str, *, what: str) -> Obj:
    """The first pod of `selector` whose containers all run; fails naming `what` (and the
    pods' states) when none does in time."""

    def running() -> Obj | None:
        pods = cluster.items("pods", namespace=namespace, selector=selector)
        for pod in pods:
            status = pod.get("status") or {}
            for c in status.get("containerStatuses") or []:
                waiting = (c.get("state") or {}).get("waiting") or {}
                assert waiting.get("reason") not in ("ErrImageNeverPull", "CrashLoopBackOff"), (
                    f"{pod['metadata']['name']}: {c}"
                )
            started = status.get("containerStatuses") or []
            if status.get("phase") == "Running" and all("running" in c["state"] for c in started):
                return pod
        # not yet: say why, for the timeout's message
        states = {p["metadata"]["name"]: _why_not_running(p) for p in pods}
        raise AssertionError(f"no pod of {selector} runs: {states}")

    return cluster.wait(running, timeout=POD_TIMEOUT_S, what=what)


def _why_not_running(pod: Obj) -> str:
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("status") == "False" and cond.get("message"):
            return f"{status.get('phase')}: {cond['type']}: {cond['message']}"
    return str(status.get("phase"))


def model_files_read(cluster: Cluster, namespace: str, pod: str, container: str) -> Obj:
    """The stand-in's `model-files` line: what it read at its model path on start."""

    def printed() -> Obj | None:
        logs = cluster.kubectl("logs", "-n", namespace, pod, "-c", container, check=False)
        for line in logs.stdout.splitlines():
            if line.startswith("{") and json.loads(line).get("event") == "model-files":
                found: Obj = json.loads(line)
                return found
        return None

    return cluster.wait(printed, timeout=60, what=f"{pod} prints the model files it read")


def volume_of(pod: Obj, container: str, mount_path: str) -> tuple[Obj, Obj]:
    """The mount at `mount_path` of `container` and the pod volume it mounts."""
    spec = pod["spec"]
    (found,) = [c for c in spec["containers"] if c["name"] == container]
    mounts = [m for m in found.get("volumeMounts") or [] if m["mountPath"] == mount_path]
    assert mounts, f"{container} mounts nothing at {mount_path}: {found.get('volumeMounts')}"
    (volume,) = [v for v in spec["volumes"] if v["name"] == mounts[0]["name"]]
    return mounts[0], volume


def delete_refused(cluster: Cluster, kind: str, name: str, namespace: str) -> str:
    """Delete the cache and return the refusal; fails when the delete is admitted."""
    done: subprocess.CompletedProcess[str] = cluster.kubectl(
        "delete", kind, name, "-n", namespace, "--wait=false", check=False
    )
    assert done.returncode != 0, f"deleting {kind} {namespace}/{name} was admitted: {done.stdout}"
    return done.stderr
