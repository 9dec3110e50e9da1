"""Issue 21 (3): serving pods wait for their copy. Through the real apiserver and the shipped
mutating configuration (its Pod entry, scoped to the test's namespaces by the harness): a pod
that carries KServe's local-model label and mounts a cache's serving claim gets the cache's
readiness requirement in its required node affinity; a pod without the label is never sent to
us (objectSelector); with localcache's server down the pod is admitted unchanged (Ignore)."""

from __future__ import annotations

import uuid
from typing import Any

from localcache.api import inferenceservice as isvc_api
from localcache.caching import names, readiness
from localcache.runtime import kube
from localcache.webhooks import podwait
from tests.integration.webhooks.harness import Harness, Obj
from tests.support import webhooks as wh


def serving_pod(claim: str, *, cache: str | None, affinity: Obj | None = None) -> Obj:
    """A pod as KServe renders a predictor's: the ISVC's local-model label, the serving claim
    mounted read-only at /mnt/models."""
    labels = {"app": "predictor"}
    if cache is not None:
        labels[isvc_api.LOCAL_MODEL_LABEL] = cache
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "kserve-container",
                "image": "registry.invalid/server:1",
                "volumeMounts": [{"name": "models", "mountPath": "/mnt/models", "readOnly": True}],
            }
        ],
        "volumes": [
            {"name": "models", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        ],
    }
    if affinity is not None:
        spec["affinity"] = affinity
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{uuid.uuid4().hex[:8]}", "labels": labels},
        "spec": spec,
    }


async def create_pod(harness: Harness, pod: Obj) -> Obj:
    return await harness.client.create(kube.PODS, pod, namespace=harness.namespace)


async def test_a_serving_pod_gets_its_caches_readiness_requirement(harness: Harness) -> None:
    group = await harness.node_group()
    cache = harness.name("iris")
    await harness.cache(cache, "gs://bucket/iris")
    claim = names.serving_pvc(cache, group)

    async def probe() -> wh.ApiAnswer:
        pod = serving_pod(claim, cache=cache)
        return await wh.api_request(
            harness.plane, "POST", kube.PODS.path(namespace=harness.namespace), pod, dry_run=True
        )

    async with wh.installed(harness.plane, harness.configuration("mutating")):
        await wh.wait_until_called(harness.server, podwait.MUTATE_PATH, probe)
        gpu = {"key": "gpu", "operator": "In", "values": ["a100"]}
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [gpu]}]
                }
            }
        }
        created = await create_pod(harness, serving_pod(claim, cache=cache, affinity=affinity))
        terms = created["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [gpu, readiness.requirement(cache)]}]
        assert created["metadata"]["annotations"][readiness.WAITS_FOR_ANNOTATION] == cache

        # a pod mounting no serving claim is left alone
        other = await create_pod(harness, serving_pod("someone-elses-claim", cache=cache))
        assert "affinity" not in other["spec"]

        # a pod without KServe's label never reaches the webhook (objectSelector)
        before = harness.server.calls(podwait.MUTATE_PATH)
        plain = await create_pod(harness, serving_pod(claim, cache=None))
        assert "affinity" not in plain["spec"]
        assert harness.server.calls(podwait.MUTATE_PATH) == before

        # localcache down: the pod is admitted unchanged (failurePolicy Ignore)
        await harness.server.stop()
        down = await create_pod(harness, serving_pod(claim, cache=cache))
        assert "affinity" not in down["spec"]
        assert readiness.WAITS_FOR_ANNOTATION not in (down["metadata"].get("annotations") or {})


async def test_the_setting_off_admits_serving_pods_unchanged(harness: Harness) -> None:
    group = await harness.node_group()
    cache = harness.name("iris")
    await harness.cache(cache, "gs://bucket/iris")
    claim = names.serving_pvc(cache, group)
    harness.switches["servingPodsWaitForCopy"] = False  # as the ConfigMap would turn it off

    async def probe() -> wh.ApiAnswer:
        return await wh.api_request(
            harness.plane,
            "POST",
            kube.PODS.path(namespace=harness.namespace),
            serving_pod(claim, cache=cache),
            dry_run=True,
        )

    async with wh.installed(harness.plane, harness.configuration("mutating")):
        await wh.wait_until_called(harness.server, podwait.MUTATE_PATH, probe)
        created = await create_pod(harness, serving_pod(claim, cache=cache))
        assert "affinity" not in created["spec"]
