"""Model sources and node-disk reads on any cluster, through pods (`LOCALCACHE_E2E_KUBECONFIG`).

On a cluster that is not the test bed (kind, say), the tests cannot run servers in a hub
namespace or read node disks from the host. Instead:
- `InClusterHttp` runs the project's model server (the standard-library program
  `devenv.fileserver`, from a ConfigMap, on the operator's own image, which holds no devenv) as
  one pod with two containers over one emptyDir: a plain server and a throttled one; files are
  written into it with `kubectl exec`; pods reach it by pod IP.
- `PodDisk` reads a node's models root with a short-lived pod that mounts it read-only
  (hostPath) and prints the sha256 of each file.
The S3 store (moto) runs only in the test bed; tests that need it say so when they skip.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from localcache.devenv import fileserver
from tests.e2e.realnodes.cluster import SYSTEM_NS, Cluster

Obj = dict[str, Any]
SOURCES_NS = "localcache-e2e-sources"
HTTP_PORT, SLOW_PORT = 8000, 8001
SERVER_FILE = "fileserver.py"

_WRITE = (
    "import os, sys\n"
    "path = os.path.join('/data', sys.argv[1])\n"
    "os.makedirs(os.path.dirname(path), exist_ok=True)\n"
    "with open(path + '.part', 'wb') as f: f.write(sys.stdin.buffer.read())\n"
    "os.rename(path + '.part', path)\n"
)
_DIGESTS = (
    "import hashlib, json, os, sys\n"
    "root = os.path.join('/mnt/models', sys.argv[1])\n"
    "out = {}\n"
    "for d, _, fs in os.walk(root):\n"
    "    for f in fs:\n"
    "        p = os.path.join(d, f)\n"
    "        if os.path.isfile(p) and not os.path.islink(p):\n"
    "            out[os.path.relpath(p, root)] = hashlib.sha256(open(p, 'rb').read()).hexdigest()\n"
    "print(json.dumps(out))\n"
)


def operator_image(cluster: Cluster) -> str:
    """The image the deployed controller runs (its Python runs the test servers)."""
    deployment = cluster.get("deployment", "kserve-localmodel-controller-manager",
                             namespace=SYSTEM_NS) or {}  # fmt: skip
    image: str = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    return image


class InClusterHttp:
    def __init__(self, cluster: Cluster, *, slow_rate: int) -> None:
        self.cluster = cluster
        self.image = operator_image(cluster)
        cluster.kubectl("create", "namespace", SOURCES_NS, check=False)

        def server(name: str, port: int, *extra: str) -> Obj:
            return {
                "name": name,
                "image": self.image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["python3", f"/srv/{SERVER_FILE}",
                            "--dir", "/data", "--host", "0.0.0.0", "--port", str(port), *extra],
                "ports": [{"containerPort": port}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"},
                                 {"name": "server", "mountPath": "/srv", "readOnly": True}],
            }  # fmt: skip

        program = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "fileserver", "namespace": SOURCES_NS},
            "data": {SERVER_FILE: Path(fileserver.__file__).read_text()},
        }
        cluster.apply(program)

        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "models", "namespace": SOURCES_NS},
            "spec": {
                "containers": [
                    server("http", HTTP_PORT),
                    server("slow", SLOW_PORT, "--rate", str(slow_rate)),
                ],
                "volumes": [
                    {"name": "data", "emptyDir": {}},
                    {"name": "server", "configMap": {"name": "fileserver"}},
                ],
            },
        }
        cluster.apply(pod)
        found = cluster.wait(self._ip, timeout=120, what="the in-cluster model server runs")
        self.http_base = f"http://{found}:{HTTP_PORT}"
        self.slow_base = f"http://{found}:{SLOW_PORT}"

    def _ip(self) -> str | None:
        pod = self.cluster.get("pod", "models", namespace=SOURCES_NS) or {}
        status = pod.get("status") or {}
        ready = all(c.get("ready") for c in status.get("containerStatuses") or [{}])
        ip: str | None = status.get("podIP") if ready else None
        return ip

    def add_file(self, path: str, data: bytes) -> None:
        self.cluster.kubectl_bytes(
            "exec", "-i", "-n", SOURCES_NS, "models", "-c", "http", "--",
            "python3", "-c", _WRITE, path, data=data,
        )  # fmt: skip

    def close(self) -> None:
        self.cluster.kubectl("delete", "namespace", SOURCES_NS, "--wait=false", check=False)


class PodDisk:
    """Reads `<models root>/<rel>` on a node with a pod that mounts the root read-only."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.image = operator_image(cluster)

    def digests(self, node: str, rel: str) -> dict[str, str]:
        name = f"disk-{uuid.uuid4().hex[:8]}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": SOURCES_NS},
            "spec": {
                "nodeName": node,
                "restartPolicy": "Never",
                "containers": [{
                    "name": "read",
                    "image": self.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", _DIGESTS, rel],
                    "volumeMounts": [
                        {"name": "root", "mountPath": "/mnt/models", "readOnly": True}
                    ],
                }],
                "volumes": [{"name": "root", "hostPath": {"path": "/mnt/models"}}],
            },
        }  # fmt: skip
        self.cluster.kubectl("create", "namespace", SOURCES_NS, check=False)
        self.cluster.apply(pod)
        try:

            def finished() -> bool:
                got = self.cluster.get("pod", name, namespace=SOURCES_NS) or {}
                phase = (got.get("status") or {}).get("phase")
                assert phase != "Failed", f"the disk reader on {node} failed: {got.get('status')}"
                return phase == "Succeeded"

            self.cluster.wait(finished, timeout=60, what=f"the disk reader on {node} finishes")
            logs = self.cluster.kubectl("logs", "-n", SOURCES_NS, name).stdout
            found: dict[str, str] = json.loads(logs)
            return found
        finally:
            self.cluster.kubectl("delete", "pod", "-n", SOURCES_NS, name, "--wait=false",
                                 check=False)  # fmt: skip
