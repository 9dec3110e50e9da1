"""Deleting a cache that an LLMInferenceService uses (base model or LoRA adapter) is refused
through the real apiserver, naming it beside the InferenceService users; allowed once it goes.

LLMInferenceServices are created labelled/annotated as the webhooks would leave them (their
mutation is not under test here), on KServe's stand-in CRD (both versions served).
"""

from __future__ import annotations

import json
from typing import Any

from localcache.api import groupversion
from localcache.api import inferenceservice as isvc_api
from localcache.caching import llmuse
from localcache.runtime import kube
from localcache.runtime.keys import ObjectKey
from tests.integration.webhooks.harness import DOWNLOADED, Harness, isvc_obj

DENIED = "denied the request: "
CRD_LMC = "localmodelcaches.serving.kserve.io"
CRD_LMNC = "localmodelnamespacecaches.serving.kserve.io"
LLM = groupversion.LLM_INFERENCE_SERVICE
V1ALPHA1 = kube.Resource(LLM.group, "v1alpha1", LLM.plural, LLM.kind, namespaced=True)

Obj = dict[str, Any]


def llm_obj(
    name: str,
    *,
    version: str = "v1alpha2",
    uri: str = "gs://b/base",
    labels: dict[str, str] | None = None,
    lora: dict[str, Any] | None = None,
    adapter_uri: str = "gs://b/adapter",
) -> Obj:
    annotations = {llmuse.LORA_ANNOTATION: json.dumps(lora)} if lora else {}
    return {
        "apiVersion": f"{LLM.group}/{version}",
        "kind": LLM.kind,
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations},
        "spec": {
            "model": {
                "uri": uri,
                "lora": {"adapters": [{"name": "colorist", "uri": adapter_uri}]},
            }
        },
    }


async def test_a_cluster_cache_used_by_an_llm_base_model_cannot_be_deleted(
    harness: Harness,
) -> None:
    await harness.node_group()
    name = harness.name("llm-base")
    ns = harness.namespace
    await harness.cache(name, "gs://b/base", status=DOWNLOADED)
    llms = harness.hooks.llm_inference_services
    labels = {isvc_api.LOCAL_MODEL_LABEL: name}
    await harness.client.create(LLM.api, llm_obj("chat", labels=labels), namespace=ns)
    await harness.seen(llms, ObjectKey(ns, "chat"))
    async with harness.mutating(), harness.validating():
        done = await harness.kubectl_create(isvc_obj("iris", "gs://b/base"), ns)
        assert done.returncode == 0, done.stderr
        await harness.seen(harness.hooks.inference_services, ObjectKey(ns, "iris"))
        refused = await harness.kubectl("delete", CRD_LMC, name)
        assert refused.returncode != 0
        assert (
            f"status.inferenceServices: LocalModelCache {name} is being used by "
            f"InferenceService {ns}/iris" in refused.stderr
        )
        assert (
            f"status.llmInferenceServices: LocalModelCache {name} is being used by "
            f"LLMInferenceService {ns}/chat (base model)" in refused.stderr
        )
        removed = await harness.kubectl("delete", "-n", ns, "inferenceservices", "iris")
        assert removed.returncode == 0, removed.stderr
        await harness.gone(harness.hooks.inference_services, ObjectKey(ns, "iris"))
        still = await harness.kubectl("delete", CRD_LMC, name)
        assert still.returncode != 0
        assert f"{DENIED}status.llmInferenceServices: LocalModelCache {name}" in still.stderr
        await harness.client.delete(LLM.api, "chat", namespace=ns)
        await harness.gone(llms, ObjectKey(ns, "chat"))
        deleted = await harness.kubectl("delete", CRD_LMC, name)
        assert deleted.returncode == 0, deleted.stderr


async def test_a_namespace_cache_used_by_a_lora_adapter_cannot_be_deleted(
    harness: Harness,
) -> None:
    await harness.node_group()
    ns = harness.namespace
    await harness.cache("adapters", "gs://b/adapter", namespace=ns, status=DOWNLOADED)
    llms = harness.hooks.llm_inference_services
    lora = {"colorist": {"cache": "adapters", "namespace": ns}}
    tuned = llm_obj("tuned", version="v1alpha1", lora=lora)
    await harness.client.create(V1ALPHA1, tuned, namespace=ns)
    forged = llm_obj("forged", lora=lora, adapter_uri="gs://b/elsewhere")  # URI not served
    await harness.client.create(LLM.api, forged, namespace=ns)
    for name in ("tuned", "forged"):
        await harness.seen(llms, ObjectKey(ns, name))
    async with harness.validating():
        refused = await harness.kubectl("delete", "-n", ns, CRD_LMNC, "adapters")
        assert refused.returncode != 0
        assert (
            f"{DENIED}status.llmInferenceServices: LocalModelNamespaceCache {ns}/adapters is "
            f"being used by LLMInferenceService {ns}/tuned (LoRA adapter colorist)"
            in refused.stderr
        )
        assert "more" not in refused.stderr, "an annotation without the adapter's URI is no use"
        await harness.client.delete(V1ALPHA1, "tuned", namespace=ns)
        await harness.gone(llms, ObjectKey(ns, "tuned"))
        deleted = await harness.kubectl("delete", "-n", ns, CRD_LMNC, "adapters")
        assert deleted.returncode == 0, deleted.stderr
