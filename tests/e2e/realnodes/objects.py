"""Objects the real-node tests create: caches, credentials, storage containers, pods."""

from __future__ import annotations

import json
from typing import Any

from localcache.api import groupversion
from tests.e2e.realnodes.cluster import LOCALCACHE_IMAGE

Obj = dict[str, Any]
LMC = groupversion.LOCAL_MODEL_CACHE
LMNC = groupversion.LOCAL_MODEL_NAMESPACE_CACHE
ISVC = groupversion.INFERENCE_SERVICE


def cache(
    name: str,
    uri: str,
    group: str,
    *,
    namespace: str | None = None,
    service_account: str | None = None,
    storage_key: str | None = None,
    size: str = "64Mi",
) -> Obj:
    """A LocalModelNamespaceCache in `namespace`, or a LocalModelCache when it is None."""
    kind = LMNC if namespace else LMC
    spec: Obj = {"sourceModelUri": uri, "modelSize": size, "nodeGroups": [group]}
    if service_account:
        spec["serviceAccountName"] = service_account
    if storage_key:
        spec["storage"] = {"key": storage_key}
    meta: Obj = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": meta, "spec": spec}


def s3_credentials(
    namespace: str, *, name: str, endpoint: str, key_id: str, secret: str
) -> list[Obj]:
    """A Secret annotated the KServe way for an S3 endpoint, and a ServiceAccount listing it."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": {
                    "serving.kserve.io/s3-endpoint": endpoint,
                    "serving.kserve.io/s3-usehttps": "0",
                    "serving.kserve.io/s3-region": "us-east-1",
                },
            },
            "type": "Opaque",
            "stringData": {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret},
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": namespace},
            "secrets": [{"name": name}],
        },
    ]


def storage_config(namespace: str, *, key: str, entry: Obj) -> Obj:
    """The `storage-config` Secret with one entry, as KServe's storage spec reads it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "storage-config", "namespace": namespace},
        "type": "Opaque",
        "stringData": {key: json.dumps(entry)},
    }


def localcache_downloader(name: str, prefix: str) -> Obj:
    """A ClusterStorageContainer that downloads URIs under `prefix` with `localcache download`."""
    return {
        "apiVersion": groupversion.CLUSTER_STORAGE_CONTAINER.api_version,
        "kind": groupversion.CLUSTER_STORAGE_CONTAINER.kind,
        "metadata": {"name": name},
        "spec": {
            "workloadType": "localModelDownloadJob",
            "supportedUriFormats": [{"prefix": prefix}],
            "container": {
                "name": "localcache-download",
                "image": LOCALCACHE_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["localcache", "download"],
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                },
            },
        },
    }


def isvc(name: str, namespace: str, uri: str, *, labels: dict[str, str] | None = None) -> Obj:
    """An ONNX InferenceService of `uri` (with `labels`, as if the webhook had set them)."""
    meta: Obj = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = labels
    return {
        "apiVersion": ISVC.api_version,
        "kind": ISVC.kind,
        "metadata": meta,
        "spec": {"predictor": {"model": {"modelFormat": {"name": "onnx"}, "storageUri": uri}}},
    }


def digest_pod(name: str, namespace: str, *, claim: str, sub_path: str, node: str) -> Obj:
    """A pod that mounts `claim` read-only at /mnt/models with `sub_path`, the way KServe's
    InferenceService pods mount a local model, and prints the sha256 of each file as JSON."""
    script = (
        "import hashlib, json, os\n"
        "root = '/mnt/models'\n"
        "out = {}\n"
        "for d, _, fs in os.walk(root):\n"
        "    for f in fs:\n"
        "        p = os.path.join(d, f)\n"
        "        out[os.path.relpath(p, root)] = hashlib.sha256(open(p, 'rb').read()).hexdigest()\n"
        "print(json.dumps(out, sort_keys=True))\n"
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
            "containers": [
                {
                    "name": "reader",
                    "image": LOCALCACHE_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", script],
                    "volumeMounts": [
                        {
                            "name": "model",
                            "mountPath": "/mnt/models",
                            "subPath": sub_path,
                            "readOnly": True,
                        }
                    ],
                }
            ],
            "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }
