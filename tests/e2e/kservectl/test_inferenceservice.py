"""An InferenceService served through KServe's own InferenceService controller and pod mutator.

KServe v0.20.0's `cmd/manager` (Standard deployment mode) renders the predictor Deployment of
an InferenceService whose storageUri a LocalModelNamespaceCache of its namespace holds; its pod
mutator turns the local-model keys into a read-only mount of the cache's serving claim at
/mnt/models (subPath `models/<storage key>`), with no storage initializer; the ServingRuntime's
stand-in model server reads the files there. The cache lists the InferenceService, and deleting
the cache is refused while it exists.
"""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest

from localcache.api import groupversion
from localcache.api import inferenceservice as isvc_api
from localcache.caching import keys
from tests.e2e.kservectl import serving
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import Cluster, Sources
from tests.support import kserve_controllers

pytestmark = pytest.mark.timeout(600)
ISVC = groupversion.INFERENCE_SERVICE
LMNC = groupversion.LOCAL_MODEL_NAMESPACE_CACHE


def test_kserve_renders_an_isvc_whose_pod_reads_the_cached_model_read_only(
    cluster: Cluster, sources: Sources, kserve: kserve_controllers.KServeControllers
) -> None:
    run = uuid.uuid4().hex[:6]
    data = os.urandom(128 * 1024)
    sources.add_file(f"kservectl-{run}/model.onnx", data)
    uri = f"{sources.http_base}/kservectl-{run}/model.onnx"
    namespace = cluster.namespace("kserve-isvc")
    group = f"g{run}"  # one word: the claim keeps KServe's plain `<cache>-<group>` name
    cluster.apply(cluster.node_group(group), objects.cache("onnx", uri, group, namespace=namespace))
    cluster.wait_ready(LMNC.plural, "onnx", namespace=namespace, timeout=240)
    cluster.apply(kserve_controllers.serving_runtime(namespace, kserve.runtime_image))

    cluster.create(objects.isvc("classifier", namespace, uri))
    created = cluster.get(ISVC.plural, "classifier", namespace=namespace) or {}
    claim = serving.local_model_keys(created).get(isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION)
    assert serving.local_model_keys(created) == {
        isvc_api.LOCAL_MODEL_LABEL: "onnx",
        isvc_api.LOCAL_MODEL_NAMESPACE_LABEL: namespace,
        isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION: uri,
        isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION: claim,
    }, created["metadata"]
    assert claim

    pod = serving.running_pod(
        cluster, namespace, "serving.kserve.io/inferenceservice=classifier",
        what="KServe's controller renders the predictor and its pod runs",
    )  # fmt: skip
    mount, volume = serving.volume_of(pod, "kserve-container", "/mnt/models")
    assert volume.get("persistentVolumeClaim", {}).get("claimName") == claim, volume
    assert mount.get("readOnly") is True, mount
    assert mount.get("subPath", "").rstrip("/") == f"models/{keys.storage_key(uri)}", mount
    init = [c["name"] for c in pod["spec"].get("initContainers") or []]
    assert "storage-initializer" not in init, f"KServe downloads the model itself: {init}"

    read = serving.model_files_read(cluster, namespace, pod["metadata"]["name"], "kserve-container")
    assert read["error"] is None, read
    assert read["files"] == {"model.onnx": hashlib.sha256(data).hexdigest()}, read

    def listed() -> bool:
        cache = cluster.get(LMNC.plural, "onnx", namespace=namespace) or {}
        users = (cache.get("status") or {}).get("inferenceServices") or []
        return {"namespace": namespace, "name": "classifier"} in users

    cluster.wait(listed, timeout=60, what="the cache lists the InferenceService in its status")
    refusal = serving.delete_refused(cluster, LMNC.plural, "onnx", namespace)
    assert f"{namespace}/classifier" in refusal, refusal
    assert cluster.get(LMNC.plural, "onnx", namespace=namespace) is not None
