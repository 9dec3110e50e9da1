"""LLMInferenceService mutation by the deployed operator (the shipped webhook configuration,
RBAC and wiring): an LLMInferenceService created through v1alpha1 whose model and LoRA
adapter come only from an LLMInferenceServiceConfig named in `spec.baseRefs` gets the
namespace cache of its model and the cluster cache of its adapter. That the deployed
controller may watch LLMInferenceServiceConfigs (and their CRD) shows here: without it, the
webhook would only ever warn that the reference is unresolved.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

from localcache.api import groupversion
from localcache.api import inferenceservice as isvc_api
from localcache.api import llminferenceservice as llm_api
from localcache.caching import names
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import Cluster, Sources
from tests.e2e.realnodes.objects import LMC, LMNC

LLMISVC = groupversion.LLM_INFERENCE_SERVICE
CONFIG = groupversion.LLM_INFERENCE_SERVICE_CONFIG

pytestmark = pytest.mark.timeout(420)


def test_an_llmisvc_from_a_base_ref_gets_its_model_and_lora_adapter_caches(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    group = f"g-{run}"
    ns = cluster.namespace("llm")
    sources.add_file(f"llm-{run}/base/model.bin", os.urandom(8 * 1024))
    sources.add_file(f"llm-{run}/sql/adapter.bin", os.urandom(1024))
    base_uri = f"{sources.http_base}/llm-{run}/base/model.bin"
    adapter_uri = f"{sources.http_base}/llm-{run}/sql/adapter.bin"
    base, adapter = f"base-{run}", f"sql-{run}"
    cluster.apply(
        cluster.node_group(group),
        objects.cache(base, base_uri, group, namespace=ns),
        objects.cache(adapter, adapter_uri, group),
    )
    cluster.wait_ready(LMNC.plural, base, namespace=ns, timeout=180)
    cluster.wait_ready(LMC.plural, adapter, timeout=180)
    model = {"uri": base_uri, "lora": {"adapters": [{"name": "sql", "uri": adapter_uri}]}}
    cluster.apply(
        {
            "apiVersion": CONFIG.api_version,
            "kind": CONFIG.kind,
            "metadata": {"name": f"llama-{run}", "namespace": ns},
            "spec": {"model": model},
        }
    )
    llm = {
        "apiVersion": f"{LLMISVC.group}/v1alpha1",
        "kind": LLMISVC.kind,
        "metadata": {"name": "chat", "namespace": ns},
        "spec": {"baseRefs": [{"name": f"llama-{run}"}]},
    }
    text = json.dumps(llm)

    def resolved() -> str | None:
        """A server-side dry run's warnings, once the webhook's informer holds the config."""
        done = cluster.kubectl("create", "--dry-run=server", "-f", "-", input_text=text)
        return None if "not resolved" in done.stderr else done.stderr or "no warning"

    cluster.wait(resolved, timeout=60, what=f"the webhook resolves baseRef llama-{run} in {ns}")
    done = cluster.kubectl("create", "-f", "-", input_text=text)
    assert "Warning" not in done.stderr, done.stderr
    stored = cluster.get(LLMISVC.resource, "chat", namespace=ns) or {}
    meta = stored.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    assert labels.get(isvc_api.LOCAL_MODEL_LABEL) == base
    assert labels.get(isvc_api.LOCAL_MODEL_NAMESPACE_LABEL) == ns
    assert annotations.get(isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION) == base_uri
    assert annotations.get(isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION) == names.serving_pvc(
        base, group
    )
    assert json.loads(annotations[llm_api.LOCAL_MODEL_LORA_ANNOTATION]) == {
        "sql": {
            "cache": adapter,
        }
    }
