"""Security review finding 12 on real pods: with localcache's InferenceService webhook down
(its `failurePolicy: Ignore` admits the ISVC unmutated), a tenant with ordinary rights labels
its InferenceService with a cluster cache's name, though its storage URI is another. The
controller used to plan a serving claim from the label alone, and the tenant's pod, mounted
the way KServe mounts a local model, read the admin's model. Now the controller checks the
ISVC's storage URI against the cache the label names: no claim, and the pod never starts.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import yaml

from localcache.api import inferenceservice as isvc_api
from localcache.caching import keys, names
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import Cluster, Sources
from tests.e2e.realnodes.objects import LMC

Obj = dict[str, Any]
MUTATING = "localmodel.inferenceservice.serving.kserve.io"

pytestmark = pytest.mark.timeout(420)


@contextmanager
def _webhook_down_for(cluster: Cluster, *namespaces: str) -> Iterator[None]:
    """localcache's ISVC webhook is not called for `namespaces` (as when it is down: its
    failurePolicy Ignore admits the object unmutated), and is restored afterwards."""
    selector = {
        "matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": list(namespaces)}
        ]
    }
    add = [{"op": "add", "path": "/webhooks/0/namespaceSelector", "value": selector}]
    cluster.kubectl("patch", "mutatingwebhookconfiguration", MUTATING, "--type=json",
                    "-p", json.dumps(add))  # fmt: skip
    try:
        yield
    finally:
        back = [{"op": "replace", "path": "/webhooks/0/namespaceSelector", "value": {}}]
        cluster.kubectl("patch", "mutatingwebhookconfiguration", MUTATING, "--type=json",
                        "-p", json.dumps(back))  # fmt: skip


def test_a_tenant_labelling_its_isvc_with_a_cluster_cache_gets_no_claim_and_reads_nothing(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    group = f"g-{run}"
    node = cluster.node_names[0]
    sources.add_file(f"label-{run}/admin/model.onnx", os.urandom(16 * 1024))
    sources.add_file(f"label-{run}/own/model.onnx", os.urandom(1024))
    admin_uri = f"{sources.http_base}/label-{run}/admin/model.onnx"
    own_uri = f"{sources.http_base}/label-{run}/own/model.onnx"
    cache = f"admin-{run}"
    cluster.apply(cluster.node_group(group), objects.cache(cache, admin_uri, group))
    cluster.wait_ready(LMC.plural, cache, timeout=180)

    thief = cluster.namespace("thief")
    honest = cluster.namespace("honest")
    user = cluster.tenant(thief)
    claim = names.serving_pvc(cache, group)
    with _webhook_down_for(cluster, thief, honest):
        forged = objects.isvc("stolen", thief, own_uri, labels={isvc_api.LOCAL_MODEL_LABEL: cache})
        cluster.kubectl(f"--as={user}", "create", "-f", "-", input_text=yaml.safe_dump(forged))
        # an honest user of the cache created after it: once its claim exists, the cache was
        # reconciled with the thief's ISVC in the store
        cluster.create(
            objects.isvc("honest", honest, admin_uri, labels={isvc_api.LOCAL_MODEL_LABEL: cache})
        )
        cluster.wait_bound(claim, namespace=honest, timeout=120)
    assert cluster.get("pvc", claim, namespace=thief) is None, (
        f"the controller made serving claim {claim} in {thief} from the label alone"
    )
    reader = objects.digest_pod(
        "reader", thief, claim=claim, sub_path=f"models/{keys.storage_key(admin_uri)}", node=node
    )
    cluster.kubectl(f"--as={user}", "create", "-f", "-", input_text=yaml.safe_dump(reader))

    def unschedulable() -> str | None:
        pod = cluster.get("pod", "reader", namespace=thief) or {}
        phase = (pod.get("status") or {}).get("phase")
        assert phase in (None, "Pending"), f"the thief's pod reached {phase}"
        for event in cluster.items("events", namespace=thief):
            message = str(event.get("message") or "")
            if event.get("reason") == "FailedScheduling" and claim in message:
                return message
        return None

    message = cluster.wait(
        unschedulable, timeout=120, what=f"the thief's pod is not scheduled: no claim {claim}"
    )
    assert "not found" in message, message
    assert cluster.get("pvc", claim, namespace=thief) is None
    status = (cluster.get(LMC.plural, cache) or {}).get("status") or {}
    listed = [
        f"{i.get('namespace')}/{i.get('name')}" for i in status.get("inferenceServices") or []
    ]
    assert f"{thief}/stolen" not in listed, listed
