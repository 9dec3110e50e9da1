"""The node group follows the workload, on real nodes (issue 21 item 3, KServe #5914).

A cache on two node groups, one per node. An InferenceService (KServe's CRD; its manager is
not running here) whose predictor's nodeSelector matches only the second node gets the second
group's claim from the mutating webhook, not `nodeGroups[0]`'s; the controller creates that
claim in the ISVC's namespace; a pod rendered as KServe's pod mutator would (the claim mounted
read-only at /mnt/models with subPath models/<key>, the predictor's nodeSelector) runs on
that node and reads the model's files.
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
from localcache.caching import keys, names
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import Cluster, Sources
from tests.e2e.realnodes.objects import LMNC

pytestmark = pytest.mark.timeout(360)
ISVC = groupversion.INFERENCE_SERVICE
HOSTNAME = "kubernetes.io/hostname"


def test_a_predictor_pinned_to_the_second_groups_node_gets_its_claim_and_reads_there(
    cluster: Cluster, sources: Sources
) -> None:
    assert len(cluster.node_names) >= 2, cluster.node_names
    first_node, second_node = cluster.node_names[0], cluster.node_names[1]
    run = uuid.uuid4().hex[:6]
    data = os.urandom(64 * 1024)
    sources.add_file(f"fit-{run}/model.onnx", data)
    uri = f"{sources.http_base}/fit-{run}/model.onnx"
    namespace = cluster.namespace("groupfit")
    first, second = f"first-{run}", f"second-{run}"
    cluster.apply(
        cluster.node_group(first, selector={HOSTNAME: first_node}),
        cluster.node_group(second, selector={HOSTNAME: second_node}),
    )
    cache = objects.cache("llm", uri, first, namespace=namespace)
    cache["spec"]["nodeGroups"] = [first, second]
    cluster.apply(cache)
    cluster.wait_ready(LMNC.plural, "llm", namespace=namespace, timeout=180)

    selector = {HOSTNAME: second_node}
    predictor = {
        "nodeSelector": selector,
        "model": {"modelFormat": {"name": "onnx"}, "storageUri": uri},
    }
    cluster.create(
        {
            "apiVersion": ISVC.api_version,
            "kind": ISVC.kind,
            "metadata": {"name": "pinned", "namespace": namespace},
            "spec": {"predictor": predictor},
        }
    )
    meta = (cluster.get(ISVC.plural, "pinned", namespace=namespace) or {}).get("metadata") or {}
    claim = (meta.get("annotations") or {}).get(isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION)
    assert claim == names.serving_pvc("llm", second), meta
    cluster.wait_bound(claim, namespace=namespace, timeout=120)

    pod = objects.digest_pod(
        "reader",
        namespace,
        claim=claim,
        sub_path=layout.model_subpath(keys.storage_key(uri)),
        node=second_node,
    )
    pod["spec"]["nodeSelector"] = dict(selector)  # as KServe renders the predictor
    cluster.create(pod)

    def finished() -> str | None:
        found = cluster.get("pod", "reader", namespace=namespace) or {}
        phase = (found.get("status") or {}).get("phase")
        assert phase != "Failed", f"the reader pod failed: {found.get('status')}"
        return phase if phase == "Succeeded" else None

    cluster.wait(finished, timeout=120, what="the pod reading the model on the second node ends")
    ran_on = ((cluster.get("pod", "reader", namespace=namespace) or {}).get("spec") or {}).get(
        "nodeName"
    )
    assert ran_on == second_node
    logs = cluster.kubectl("logs", "-n", namespace, "reader").stdout
    assert json.loads(logs) == {"model.onnx": hashlib.sha256(data).hexdigest()}
