"""A tenant's ReadWriteMany claim on the test bed's shared export, and the proof it is shared.

`create()` hands a namespace a claim the way an administrator hands out a share: a folder of
the bed's export (`tests.support.sharedvolume`), a cluster-scoped PersistentVolume on it and the
claim bound to it. `prove_shared()` writes random bytes through the claim from a pod on one
node and reads them back through the claim from a pod on the other node, and on the host.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import uuid
from pathlib import Path

import pytest

from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import LOCALCACHE_IMAGE, Cluster, Obj
from tests.support import sharedvolume

POD_TIMEOUT_S = 120.0
_WRITE = (
    "import base64, os\n"
    "folder = os.path.join('/mnt/shared', os.environ['FOLDER'])\n"
    "os.makedirs(folder)\n"
    "with open(os.path.join(folder, 'data.bin'), 'wb') as f:\n"
    "    f.write(base64.b64decode(os.environ['DATA']))\n"
    "    f.flush()\n"
    "    os.fsync(f.fileno())\n"
)


def create(
    cluster: Cluster, namespace: str, name: str, *, size: str = "1Gi", user: str | None = None
) -> Path:
    """A Bound ReadWriteMany claim `namespace/name` of `size` (made by `user`, the volume by
    the administrator); its folder on the host."""
    if cluster.shared_dir is None:
        pytest.skip("the ReadWriteMany export is provided by the real-node test bed")
    pv_name = f"{namespace}-{name}"
    folder = sharedvolume.share(cluster.shared_dir, pv_name)
    cluster.apply(
        sharedvolume.volume(pv_name, folder, namespace=namespace, claim=name, capacity=size)
    )
    create_as(cluster, sharedvolume.claim(name, namespace, volume_name=pv_name, size=size), user)
    cluster.wait_bound(name, namespace=namespace, timeout=60)
    return folder


def create_as(cluster: Cluster, obj: Obj, user: str | None) -> str:
    """Create `obj` as `user` (the administrator when None); what kubectl warned."""
    who = [f"--as={user}"] if user else []
    return cluster.kubectl(*who, "create", "-f", "-", input_text=json.dumps(obj)).stderr


def run_pod(
    cluster: Cluster, pod: Obj, *, user: str | None = None, timeout: float = POD_TIMEOUT_S
) -> str:
    """Create `pod` as `user`, wait until it Succeeded (failing at once if it Failed); its
    logs."""
    meta = pod["metadata"]
    create_as(cluster, pod, user)

    def finished() -> bool:
        found = cluster.get("pod", meta["name"], namespace=meta["namespace"]) or {}
        phase = (found.get("status") or {}).get("phase")
        assert phase != "Failed", f"pod {meta['name']} failed: {found.get('status')}"
        return phase == "Succeeded"

    cluster.wait(finished, timeout=timeout, what=f"pod {meta['name']} on {_node(pod)} succeeds")
    return cluster.kubectl("logs", "-n", meta["namespace"], meta["name"]).stdout


def read_digests(
    cluster: Cluster,
    namespace: str,
    *,
    claim: str,
    sub_path: str,
    node: str,
    user: str | None = None,
) -> Obj:
    """sha256 of every file below `sub_path` of `claim`, as a pod of `user` on `node` reads
    them through the claim (mounted read-only)."""
    name = f"read-{node}-{uuid.uuid4().hex[:5]}"
    pod = objects.digest_pod(name, namespace, claim=claim, sub_path=sub_path, node=node)
    found: Obj = json.loads(run_pod(cluster, pod, user=user))
    return found


def prove_shared(cluster: Cluster, namespace: str, *, claim: str, folder: Path) -> None:
    """Bytes written through `claim` on the first node are read through it on the second, and
    are in `folder` on the host."""
    writer_node, reader_node = cluster.node_names[0], cluster.node_names[-1]
    assert writer_node != reader_node, f"two nodes are needed: {cluster.node_names}"
    data = os.urandom(64 * 1024)
    want = {"data.bin": hashlib.sha256(data).hexdigest()}
    probe = f"probe-{uuid.uuid4().hex[:8]}"
    run_pod(cluster, _writer(namespace, claim=claim, node=writer_node, probe=probe, data=data))
    got = read_digests(cluster, namespace, claim=claim, sub_path=probe, node=reader_node)
    assert got == want, f"{reader_node} read {got} where {writer_node} wrote {want}"
    on_host = hashlib.sha256((folder / probe / "data.bin").read_bytes()).hexdigest()
    assert on_host == want["data.bin"], "the claim's bytes are not the export's"


def _writer(namespace: str, *, claim: str, node: str, probe: str, data: bytes) -> Obj:
    env = {"FOLDER": probe, "DATA": base64.b64encode(data).decode()}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"write-{probe}", "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
            "containers": [
                {
                    "name": "writer",
                    "image": LOCALCACHE_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", _WRITE],
                    "env": [{"name": k, "value": v} for k, v in env.items()],
                    "volumeMounts": [{"name": "shared", "mountPath": "/mnt/shared"}],
                }
            ],
            "volumes": [{"name": "shared", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }


def _node(pod: Obj) -> str:
    return str(pod["spec"].get("nodeSelector", {}).get("kubernetes.io/hostname", "any node"))
