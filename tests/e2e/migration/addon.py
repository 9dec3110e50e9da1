"""KServe's own local model cache add-on on real nodes, in use: the state a migration starts from.

`install(bed)` installs KServe v0.20.0's add-on the way KServe's kustomize install does
(`tests.support.kserve_addon`: its CRDs, its `inferenceservice-config` with the local model
cache enabled, its controller and node agent built locally), then uses it as KServe's
docs/samples/localmodelcache README does: a LocalModelNodeGroup over the test bed's workers on
KServe's default `/models`, two LocalModelCaches and one LocalModelNamespaceCache of three
`http://` models, and an InferenceService object whose local-model label makes KServe's
controller create the serving PV and PVC, which a pod mounts the way KServe's pod mutator
does and keeps reading. It returns once every cache is `NodeDownloaded` on both nodes, the
folders are on both nodes' disks and the pod has read the model; `KServeAddon` is what a
hand-over test needs of that state.

No KServe core controller or webhook runs: the InferenceService only exists, with the labels
and annotations KServe's defaulter would give it. Waits fail saying what never happened,
with KServe's controller and agent logs attached.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from localcache.caching import keys
from localcache.devenv import modelserver, realnodes, testbed
from tests.e2e.realnodes.cluster import Cluster
from tests.support import kserve_addon

Obj = dict[str, Any]

GROUP = "serving.kserve.io"
NAMESPACE = "kserve"
NODE_GROUP = "workers"
STORAGE_CLASS = "local-storage"  # as KServe's sample; no StorageClass object: binding is immediate
SERVING_NS = "serving"
SERVING_POD = "server"
ISVC_NAME = "iris"
TENANT_NS = "team-a"
LOCALMODEL_LABEL = "internal.serving.kserve.io/localmodel"
ROLLOUT_TIMEOUT_S = 300
DOWNLOAD_TIMEOUT_S = 300

# The serving pod's loop: every second, the sha256 of every file under /mnt/models, one JSON
# line each round ({"n": round, "files": {path: sha256}, "error": null or the OSError}).
READER = """
import hashlib, json, os, time
n = 0
while True:
    n += 1
    files, error = {}, None
    try:
        for d, _, names in os.walk("/mnt/models"):
            for name in names:
                path = os.path.join(d, name)
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                files[os.path.relpath(path, "/mnt/models")] = digest
    except OSError as exc:
        error = str(exc)
    print(json.dumps({"n": n, "files": files, "error": error}, sort_keys=True), flush=True)
    time.sleep(1)
"""


@dataclass(frozen=True)
class CacheSpec:
    """One of the caches KServe's add-on downloaded: its object and what is on the disks."""

    kind: str  # LocalModelCache | LocalModelNamespaceCache
    plural: str
    name: str
    namespace: str | None  # None for a cluster cache
    uri: str
    path: str  # URL path on the model server, e.g. /kserve/iris/model.joblib
    storage_key: str
    files: dict[str, str]  # sha256 by path below models/<storage_key>

    @property
    def status_key(self) -> str:
        """The key of the model in a LocalModelNode's status (KServe's GetStatusKey)."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    def manifest(self) -> Obj:
        meta: Obj = {"name": self.name}
        if self.namespace:
            meta["namespace"] = self.namespace
        return {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": self.kind,
            "metadata": meta,
            "spec": {"sourceModelUri": self.uri, "modelSize": "1Mi", "nodeGroups": [NODE_GROUP]},
        }


@dataclass(frozen=True)
class DownloadCounts:
    jobs: int  # Jobs in all namespaces
    pods: int  # pods of Jobs in all namespaces


@dataclass
class KServeAddon:
    """KServe's add-on installed and in use on the test bed (see the module docstring)."""

    bed: testbed.TestBed
    cluster: Cluster  # kubectl and waits; its node_models_dir is the nodes' /models
    node_names: list[str]
    node_models_dirs: dict[str, Path]  # each node's /models (KServe's root) from the host
    node_group: str
    caches: list[CacheSpec]
    model_server: modelserver.ModelServer
    serving_namespace: str
    serving_pod: str
    serving_claim: str  # the serving PVC KServe's controller made for the first cache
    serving_cache: CacheSpec
    serving_node: str = ""  # where the scheduler put the serving pod
    job_namespace: str = ""  # KServe's localModel.jobNamespace (made here: KServe does not)
    images: dict[str, str] = field(default_factory=dict)  # image name -> ref

    def request_counts(self) -> dict[str, int]:
        """Requests per URL path the model server answered so far (they only grow)."""
        return dict(self.model_server.stats().requests)

    def download_counts(self) -> DownloadCounts:
        jobs = self.cluster.items("jobs")
        pods = self.cluster.items("pods", selector="batch.kubernetes.io/job-name")
        return DownloadCounts(jobs=len(jobs), pods=len(pods))

    def disk_files(self, node: str, cache: CacheSpec) -> dict[str, str]:
        """sha256 of the files in `models/<storage key>` on `node`'s /models (empty: absent)."""
        return self.cluster.model_files(node, cache.storage_key)

    def serving_reads(self) -> list[Obj]:
        """The serving pod's read rounds so far, oldest first (none while it starts)."""
        logs = self.cluster.kubectl(
            "logs", "-n", self.serving_namespace, self.serving_pod, check=False
        )
        if logs.returncode != 0:
            assert "waiting to start" in logs.stderr, f"kubectl logs: {logs.stderr.strip()}"
            return []
        return [json.loads(line) for line in logs.stdout.splitlines() if line.startswith("{")]

    def wait_fresh_read(self, *, timeout: float = 60) -> Obj:
        """A read round that started after this call and read the model's exact files."""
        done = self.serving_reads()
        after = done[-1]["n"] if done else 0

        def fresh() -> Obj | None:
            for read in self.serving_reads():
                if read["n"] > after + 1:  # round after+1 may have begun before this call
                    assert read["error"] is None, f"the serving pod failed a read: {read}"
                    assert read["files"] == self.serving_cache.files, read
                    return read
            return None

        return self.cluster.wait(fresh, timeout=timeout, what="the serving pod reads the model")


@dataclass
class ModelFiles:
    """The model server's directory on the host and the URLs pods use for it."""

    root: Path
    http_base: str

    def add(self, path: str, data: bytes) -> str:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        return f"{self.http_base}/{path}"


PLURALS = {
    "LocalModelCache": "localmodelcaches",
    "LocalModelNamespaceCache": "localmodelnamespacecaches",
}


def cache_spec(
    files: ModelFiles,
    name: str,
    path: str,
    *,
    size: int,
    kind: str = "LocalModelCache",
    namespace: str | None = None,
) -> CacheSpec:
    """A cache of a new random model of `size` bytes served at `path` by the model server."""
    data = os.urandom(size)
    uri = files.add(path, data)
    return CacheSpec(
        kind=kind,
        plural=PLURALS[kind],
        name=name,
        namespace=namespace,
        uri=uri,
        path=f"/{path}",
        storage_key=keys.storage_key(uri),
        files={path.rsplit("/", 1)[1]: hashlib.sha256(data).hexdigest()},
    )  # fmt: skip


def cache_specs(files: ModelFiles) -> list[CacheSpec]:
    """Three small models on the model server and the caches of them: two cluster caches and
    a namespace cache of `TENANT_NS`."""
    size = 64 * 1024
    return [
        cache_spec(files, "iris", "kserve/iris/model.joblib", size=size),
        cache_spec(files, "bert", "kserve/bert/model.bin", size=size),
        cache_spec(files, "llm", "kserve/llm/weights.bin", size=size,
                   kind="LocalModelNamespaceCache", namespace=TENANT_NS),
    ]  # fmt: skip


def node_group() -> Obj:
    """KServe's sample LocalModelNodeGroup on `/models`, over the test bed's workers."""
    affinity = {"key": "kserve/localmodel", "operator": "In", "values": ["worker"]}
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "LocalModelNodeGroup",
        "metadata": {"name": NODE_GROUP},
        "spec": {
            "storageLimit": "1Gi",
            "persistentVolumeClaimSpec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": STORAGE_CLASS,
            },
            "persistentVolumeSpec": {
                "accessModes": ["ReadWriteOnce"],
                "capacity": {"storage": "1Gi"},
                "local": {"path": "/models"},
                "storageClassName": STORAGE_CLASS,
                "nodeAffinity": {"required": {"nodeSelectorTerms": [
                    {"matchExpressions": [affinity]}
                ]}},
            },
        },
    }  # fmt: skip


def inference_service(cache: CacheSpec, claim: str) -> Obj:
    """An InferenceService of `cache`'s model with what KServe's defaulter would add."""
    return {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": ISVC_NAME,
            "namespace": SERVING_NS,
            "labels": {LOCALMODEL_LABEL: cache.name},
            "annotations": {
                "internal.serving.kserve.io/localmodel-sourceuri": cache.uri,
                "internal.serving.kserve.io/localmodel-pvc-name": claim,
            },
        },
        "spec": {
            "predictor": {"model": {"modelFormat": {"name": "sklearn"}, "storageUri": cache.uri}}
        },
    }


def serving_pod(claim: str, storage_key: str) -> Obj:
    """The predictor pod as KServe's pod mutator shapes it for a local model: the serving
    PVC read-only at /mnt/models with subPath `models/<storage key>`, no init container."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": SERVING_POD, "namespace": SERVING_NS},
        "spec": {
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "kserve-container",
                    "image": realnodes.LOCALCACHE_IMAGE,  # any image with python3
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", READER],
                    "volumeMounts": [
                        {
                            "name": "kserve-pvc-source",
                            "mountPath": "/mnt/models",
                            "subPath": f"models/{storage_key}",
                            "readOnly": True,
                        }
                    ],
                }
            ],
            "volumes": [
                {"name": "kserve-pvc-source", "persistentVolumeClaim": {"claimName": claim}}
            ],
        },
    }


def _install_kserve(cluster: Cluster, images: dict[str, str]) -> str:
    """KServe's CRDs, config and add-on; returns KServe's job namespace."""
    kubectl = cluster.kubectl_bin
    for namespace in (NAMESPACE, TENANT_NS, SERVING_NS):
        cluster.kubectl("create", "namespace", namespace)
    crds = kserve_addon.crd_documents(kubectl=kubectl)
    cluster.kubectl("apply", "--server-side", "-f", "-", input_text=yaml.safe_dump_all(crds))
    # polled: `kubectl wait` fails at once on a CRD whose status has no conditions yet
    names = [doc["metadata"]["name"] for doc in crds]
    cluster.wait(lambda: _established(cluster, names), timeout=60, what="KServe's CRDs served")
    config = kserve_addon.inferenceservice_config(realnodes.STORAGE_INITIALIZER_IMAGE)
    job_ns: str = json.loads(config["data"]["localModel"])["jobNamespace"]
    cluster.kubectl("create", "namespace", job_ns)  # KServe's manifests do not make it
    addon = kserve_addon.addon_documents(
        images["kserve-localmodel"], images["kserve-localmodelnode"], kubectl=kubectl
    )
    cluster.apply(config, *addon)
    for workload in (f"deployment/{kserve_addon.CONTROLLER}", f"daemonset/{kserve_addon.AGENT}"):
        cluster.kubectl(
            "-n", NAMESPACE, "rollout", "status", workload, f"--timeout={ROLLOUT_TIMEOUT_S}s",
            timeout=ROLLOUT_TIMEOUT_S + 30,
        )  # fmt: skip
    return job_ns


def _established(cluster: Cluster, names: list[str]) -> bool:
    template = '{range .items[*]}{.status.conditions[?(@.type=="Established")].status}{"\\n"}{end}'
    done = cluster.kubectl("get", "crd", *names, "-o", f"jsonpath={template}", check=False)
    return done.returncode == 0 and done.stdout.split() == ["True"] * len(names)


def _downloaded(addon: KServeAddon) -> bool:
    for cache in addon.caches:
        obj = addon.cluster.get(cache.plural, cache.name, namespace=cache.namespace) or {}
        states = (obj.get("status") or {}).get("nodeStatus") or {}
        if any(states.get(node) != "NodeDownloaded" for node in addon.node_names):
            return False
        if any(addon.disk_files(node, cache) != cache.files for node in addon.node_names):
            return False
    return True


def _bound(cluster: Cluster, claim: str) -> bool:
    pvc = cluster.get("pvc", claim, namespace=SERVING_NS) or {}
    return (pvc.get("status") or {}).get("phase") == "Bound"


def install(
    bed: testbed.TestBed,
    cluster: Cluster,
    *,
    images: dict[str, str],
    files: ModelFiles,
    model_server: modelserver.ModelServer,
) -> KServeAddon:
    """KServe's add-on installed, three caches downloaded on every node, a pod serving one."""
    dirs = {name: bed.node(name).kserve_models_dir for name in cluster.node_names}
    for models in dirs.values():
        models.chmod(0o777)  # as KServe's CI prepares /models on its workers
    caches = cache_specs(files)
    first = caches[0]
    claim = f"{first.name}-{NODE_GROUP}"  # KServe's serving PVC: {cache}-{node group}
    addon = KServeAddon(
        bed=bed,
        cluster=cluster,
        node_names=list(cluster.node_names),
        node_models_dirs=dirs,
        node_group=NODE_GROUP,
        caches=caches,
        model_server=model_server,
        serving_namespace=SERVING_NS,
        serving_pod=SERVING_POD,
        serving_claim=claim,
        serving_cache=first,
        images=images,
    )
    try:
        addon.job_namespace = _install_kserve(cluster, images)
        cluster.apply(node_group(), *(cache.manifest() for cache in caches))
        cluster.wait(
            lambda: _downloaded(addon),
            timeout=DOWNLOAD_TIMEOUT_S,
            what="every cache NodeDownloaded on every node, its files on every node's /models",
        )
        cluster.create(inference_service(first, claim))
        cluster.wait(
            lambda: _bound(cluster, claim), timeout=60, what=f"PVC {SERVING_NS}/{claim} Bound"
        )
        cluster.create(serving_pod(claim, first.storage_key))
        addon.wait_fresh_read(timeout=120)
        pod = cluster.get("pod", SERVING_POD, namespace=SERVING_NS) or {}
        addon.serving_node = pod["spec"]["nodeName"]
    except AssertionError as exc:  # WaitTimeout is one too
        raise AssertionError(f"{exc}\n\n{diagnostics(cluster)}") from exc
    return addon


def diagnostics(cluster: Cluster) -> str:
    """What KServe's add-on and the cluster say, for a failure message."""
    commands = [
        ("get", "localmodelcaches,localmodelnamespacecaches,localmodelnodegroups", "-A"),
        ("get", "localmodelnodes", "-o", "yaml"),
        ("get", "jobs,pods,pvc,pv", "-A", "-o", "wide"),
        ("get", "events", "-A", "--field-selector", "type=Warning"),
        ("logs", "-n", NAMESPACE, f"deployment/{kserve_addon.CONTROLLER}", "--tail=60"),
        ("logs", "-n", NAMESPACE, "-l", "control-plane=" + kserve_addon.AGENT, "--tail=40",
         "--prefix"),
    ]  # fmt: skip
    return cluster.report(commands)
