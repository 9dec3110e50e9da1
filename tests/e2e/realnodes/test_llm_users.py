"""An LLMInferenceService's LoRA adapter, on real nodes: the claim KServe's LLMInferenceService
controller recomputes (`<cache>-<nodeGroup>`, KServe #5690) exists in the service's namespace
for a node group whose name has a `-` (hash-shortened before issue 21); a pod mounting it the
way KServe mounts a local model reads the adapter's files; the cache lists the service;
deleting the cache is refused while it exists, and the claim goes with the service.

KServe's own LLMInferenceService controller is not run here: the LLMInferenceService is
created as KServe's defaulter leaves it (the annotation), on the stand-in CRD.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import pytest

from localcache.api import groupversion
from localcache.caching import keys, llmuse
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import Cluster, Sources
from tests.e2e.realnodes.objects import LMC

Obj = dict[str, Any]
LLM = groupversion.LLM_INFERENCE_SERVICE

pytestmark = pytest.mark.timeout(480)


def _llmisvc(name: str, namespace: str, *, cache: str, adapter_uri: str) -> Obj:
    return {
        "apiVersion": LLM.api_version,
        "kind": LLM.kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {llmuse.LORA_ANNOTATION: json.dumps({"colorist": {"cache": cache}})},
        },
        "spec": {
            "model": {
                "uri": "hf://org/base-not-cached",
                "name": "base",
                "lora": {"adapters": [{"name": "colorist", "uri": adapter_uri}]},
            }
        },
    }


def _phase(cluster: Cluster, pod: str, namespace: str) -> str | None:
    return ((cluster.get("pod", pod, namespace=namespace) or {}).get("status") or {}).get("phase")


def test_a_lora_adapter_is_read_through_kserves_plain_claim_name(
    cluster: Cluster, sources: Sources
) -> None:
    run = uuid.uuid4().hex[:6]
    group = f"gpu-{run}"
    node = cluster.node_names[0]
    sources.add_file(f"lora-{run}/colorist/adapter_model.bin", os.urandom(16 * 1024))
    uri = f"{sources.http_base}/lora-{run}/colorist/adapter_model.bin"
    cache = f"colorist-{run}"
    cluster.apply(cluster.node_group(group), objects.cache(cache, uri, group))
    cluster.wait_ready(LMC.plural, cache, timeout=180)

    ns = cluster.namespace("llm")
    cluster.create(_llmisvc("chat", ns, cache=cache, adapter_uri=uri))
    claim = f"{cache}-{group}"  # what KServe's LLMInferenceService controller mounts
    cluster.wait_bound(claim, namespace=ns, timeout=120)

    key = keys.storage_key(uri)
    cluster.create(
        objects.digest_pod("reader", ns, claim=claim, sub_path=f"models/{key}", node=node)
    )
    cluster.wait(
        lambda: _phase(cluster, "reader", ns) in ("Succeeded", "Failed") or None,
        timeout=180,
        what="the pod mounting the LoRA claim runs to its end",
    )
    assert _phase(cluster, "reader", ns) == "Succeeded", cluster.kubectl("logs", "-n", ns, "reader")
    seen = json.loads(cluster.kubectl("logs", "-n", ns, "reader").stdout)
    on_disk = cluster.model_files(node, key)
    assert seen == on_disk, f"the pod read {seen}, the node holds {on_disk}"
    assert seen, "the adapter's folder is empty"

    def listed() -> list[Obj] | None:
        status = (cluster.get(LMC.plural, cache) or {}).get("status") or {}
        found: list[Obj] = status.get("llmInferenceServices") or []
        return found or None

    assert cluster.wait(listed, timeout=60, what=f"{cache} lists its LLM user") == [
        {"namespace": ns, "name": "chat"}
    ]
    refused = cluster.kubectl("delete", LMC.crd_name, cache, check=False)
    assert refused.returncode != 0
    assert f"LLMInferenceService {ns}/chat (LoRA adapter colorist)" in refused.stderr

    cluster.kubectl("delete", "pod", "-n", ns, "reader", "--wait=true")
    cluster.kubectl("delete", LLM.crd_name, "-n", ns, "chat")
    cluster.wait(
        lambda: cluster.get("pvc", claim, namespace=ns) is None or None,
        timeout=120,
        what=f"claim {ns}/{claim} is deleted with its last user",
    )
    cluster.kubectl("delete", LMC.crd_name, cache)
