"""Issue 21 (3): a serving pod starts only on a node whose copy is downloaded, on real nodes.

Two nodes; the cache's node group first holds only the first, which downloads the model from
the throttled server. A Deployment shaped like the one KServe renders for an InferenceService
(KServe's local-model label on the pod template, the serving claim mounted read-only at
/mnt/models with subPath models/<key>; KServe's manager is not on the bed) runs its pod on the
first node. Then the second node joins the group and starts downloading; scaled to two replicas
(pod anti-affinity: one per node), the second pod stays Pending with a WaitingForModelCopy
Event naming the cache and the node still downloading, and starts there once the copy is
complete, reading the whole model. Turned off in the deployed ConfigMap, the labels go and new
pods are admitted without the requirement.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from typing import Any

import pytest

from localcache.agent.disk import layout
from localcache.api import inferenceservice as isvc_api
from localcache.caching import keys, names, readiness
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import LOCALCACHE_IMAGE, Cluster, Sources
from tests.e2e.realnodes.objects import LMC

Obj = dict[str, Any]
SIZE = 48 * 1024 * 1024  # about 24 s at the slow server's rate: time to see the pod wait
APP = "predictor"

pytestmark = pytest.mark.timeout(600)


def deployment(name: str, namespace: str, *, cache: str, claim: str, key: str, digest: str) -> Obj:
    """What KServe renders for a predictor, reduced to what matters here; its container
    checks the model's digest, then serves (sleeps)."""
    script = (
        "import hashlib, sys, time\n"
        "got = hashlib.sha256(open('/mnt/models/model.bin', 'rb').read()).hexdigest()\n"
        f"print('model', got, flush=True)\n"
        f"sys.exit(1) if got != {digest!r} else time.sleep(3600)\n"
    )
    labels = {
        "app": name,
        "component": APP,
        "serving.kserve.io/inferenceservice": name,
        isvc_api.LOCAL_MODEL_LABEL: cache,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{name}-predictor", "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                    "affinity": {
                        "podAntiAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "labelSelector": {"matchLabels": {"app": name}},
                                    "topologyKey": "kubernetes.io/hostname",
                                }
                            ]
                        }
                    },
                    "containers": [
                        {
                            "name": "kserve-container",
                            "image": LOCALCACHE_IMAGE,
                            "imagePullPolicy": "IfNotPresent",
                            "command": ["python3", "-c", script],
                            "volumeMounts": [
                                {
                                    "name": "kserve-local-model",
                                    "mountPath": "/mnt/models",
                                    "subPath": layout.model_subpath(key),
                                    "readOnly": True,
                                }
                            ],
                        }
                    ],
                    "volumes": [
                        {
                            "name": "kserve-local-model",
                            "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
                        }
                    ],
                },
            },
        },
    }


def pods(cluster: Cluster, namespace: str, name: str) -> list[Obj]:
    return cluster.items("pods", namespace=namespace, selector=f"app={name}")


def running_on(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    """Ready pods by node."""
    found: dict[str, str] = {}
    for pod in pods(cluster, namespace, name):
        ready = cluster.condition(pod, "Ready")
        if ready and ready.get("status") == "True":
            found[pod["spec"]["nodeName"]] = pod["metadata"]["name"]
    return found


def read_model(cluster: Cluster, namespace: str, pod: str) -> list[str]:
    """What the serving container printed about the model (it hashes it first: wait)."""
    return cluster.wait(
        lambda: cluster.kubectl("logs", "-n", namespace, pod).stdout.split() or None,
        timeout=60,
        what=f"serving pod {pod} reports the model it read",
    )


def test_serving_pods_start_only_where_the_copy_is_complete(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    first, second = cluster.node_names[:2]
    member = f"localcache.test/wait-{run}"
    cluster.kubectl("label", "node", first, f"{member}=yes")
    group = f"g-{run}"
    cluster.apply(cluster.node_group(group, selector={member: "yes"}))
    data = os.urandom(SIZE)
    digest = hashlib.sha256(data).hexdigest()
    sources.add_file(f"wait-{run}/model.bin", data)
    uri = f"{sources.slow_base}/wait-{run}/model.bin"
    key = keys.storage_key(uri)
    cache = f"wait-{run}"
    cluster.apply(objects.cache(cache, uri, group))
    cluster.wait_ready(LMC.plural, cache, timeout=240)
    label = readiness.label_key(cache)

    def labelled(node: str) -> bool:
        found = cluster.get("node", node) or {}
        return ((found.get("metadata") or {}).get("labels") or {}).get(label) == "true"

    cluster.wait(lambda: labelled(first), timeout=60, what=f"{first} is labelled ready")
    assert not labelled(second)

    namespace = cluster.namespace("serve")
    cluster.create(objects.isvc("llm", namespace, f"{uri}"))
    claim = names.serving_pvc(cache, group)
    cluster.wait_bound(claim, namespace=namespace, timeout=120)
    cluster.create(deployment("llm", namespace, cache=cache, claim=claim, key=key, digest=digest))
    on = cluster.wait(
        lambda: running_on(cluster, namespace, "llm") or None,
        timeout=180,
        what="the serving pod runs",
    )
    assert list(on) == [first], f"the serving pod runs on {list(on)}, not {first}"
    (pod,) = pods(cluster, namespace, "llm")
    assert readiness.required_keys(pod) == {label}
    assert read_model(cluster, namespace, on[first]) == ["model", digest]

    # the second node joins the group: it downloads (slowly); a second replica must wait
    cluster.kubectl("label", "node", second, f"{member}=yes")
    cluster.wait(
        lambda: cluster.node_status(second).get(cache) not in (None, "ModelDownloaded"),
        timeout=60,
        what=f"{second} starts downloading {cache}",
    )
    cluster.kubectl("scale", "deployment", "-n", namespace, "llm-predictor", "--replicas=2")

    def waiting_event() -> Obj | None:
        for event in cluster.items("events", namespace=namespace):
            if event.get("reason") == "WaitingForModelCopy" and second in str(event.get("message")):
                return event
        return None

    event = cluster.wait(
        waiting_event, timeout=60, what=f"a WaitingForModelCopy Event naming {second}"
    )
    if labelled(second):
        pytest.fail(f"{second} finished downloading before the wait could be seen; grow SIZE")
    assert f"LocalModelCache {cache}" in event["message"]
    waiting = [p for p in pods(cluster, namespace, "llm") if not p["spec"].get("nodeName")]
    assert len(waiting) == 1, "the second replica is not Pending"
    assert event["involvedObject"]["name"] == waiting[0]["metadata"]["name"]
    assert list(running_on(cluster, namespace, "llm")) == [first]

    # the copy completes: the second replica starts there and reads the whole model
    cluster.wait(lambda: labelled(second), timeout=240, what=f"{second} is labelled ready")
    on = cluster.wait(
        lambda: found if len(found := running_on(cluster, namespace, "llm")) == 2 else None,
        timeout=180,
        what="both replicas run",
    )
    assert set(on) == {first, second}
    logs = read_model(cluster, namespace, on[second])
    assert logs == ["model", digest], f"the second replica read {logs}"

    # servingPodsWaitForCopy off in the deployed ConfigMap (read live): the labels go, and a
    # new serving pod is admitted without the requirement (KServe's behaviour)
    with cluster.local_model(servingPodsWaitForCopy=False):
        cluster.wait(
            lambda: not labelled(first) and not labelled(second),
            timeout=60,
            what="both nodes lose their readiness label with servingPodsWaitForCopy off",
        )
        cluster.kubectl("scale", "deployment", "-n", namespace, "llm-predictor", "--replicas=3")
        third = cluster.wait(
            lambda: next(
                (
                    p
                    for p in pods(cluster, namespace, "llm")
                    if p["metadata"]["name"] not in on.values()
                ),
                None,
            ),
            timeout=60,
            what="a third replica is created",
        )
        assert readiness.required_keys(third) == set()
    cluster.wait(lambda: labelled(first), timeout=60, what=f"{first} labelled again once back on")
