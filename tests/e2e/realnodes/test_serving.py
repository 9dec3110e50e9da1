"""Serving from the node-local copy, the way KServe's InferenceService pods do.

An InferenceService (KServe's CRD) of the cache's namespace gets the local-model labels and
the serving PVC annotation from the mutating webhook; a real pod then mounts that PVC with the
subPath KServe uses, `models/<storage key>`, read-only, and reads the model's files.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid

import pytest

from localcache.agent.disk import layout
from localcache.api import groupversion
from localcache.api import inferenceservice as isvc_api
from localcache.caching import keys
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import Cluster, Sources
from tests.e2e.realnodes.objects import LMNC

pytestmark = pytest.mark.timeout(300)
ISVC = groupversion.INFERENCE_SERVICE


def test_an_inference_service_pod_reads_the_model_through_the_serving_pvc(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    data = os.urandom(200 * 1024)
    sources.add_file(f"serve-{run}/model.onnx", data)
    uri = f"{sources.http_base}/serve-{run}/model.onnx"
    namespace = cluster.namespace("serving")
    group = f"g-{run}"
    cluster.apply(cluster.node_group(group), objects.cache("onnx", uri, group, namespace=namespace))
    cluster.wait_ready(LMNC.plural, "onnx", namespace=namespace, timeout=180)

    isvc = {
        "apiVersion": ISVC.api_version,
        "kind": ISVC.kind,
        "metadata": {"name": "classifier", "namespace": namespace},
        "spec": {"predictor": {"model": {"modelFormat": {"name": "onnx"}, "storageUri": uri}}},
    }
    cluster.create(isvc)
    created = cluster.get(ISVC.plural, "classifier", namespace=namespace) or {}
    meta = created.get("metadata") or {}
    labels = meta.get("labels") or {}
    assert labels.get(isvc_api.LOCAL_MODEL_LABEL) == "onnx", meta
    assert labels.get(isvc_api.LOCAL_MODEL_NAMESPACE_LABEL) == namespace, meta
    claim = (meta.get("annotations") or {}).get(isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION)
    assert claim, f"no serving PVC annotation: {meta}"
    cluster.wait_bound(claim, namespace=namespace, timeout=60)

    sub_path = layout.model_subpath(keys.storage_key(uri))
    node = cluster.node_names[-1]
    cluster.create(
        objects.digest_pod("reader", namespace, claim=claim, sub_path=sub_path, node=node)
    )

    def finished() -> str | None:
        pod = cluster.get("pod", "reader", namespace=namespace) or {}
        phase = (pod.get("status") or {}).get("phase")
        assert phase != "Failed", f"the reader pod failed: {pod.get('status')}"
        return phase if phase == "Succeeded" else None

    cluster.wait(finished, timeout=120, what="the pod reading the model finishes")
    logs = cluster.kubectl("logs", "-n", namespace, "reader").stdout
    assert json.loads(logs) == {"model.onnx": hashlib.sha256(data).hexdigest()}
