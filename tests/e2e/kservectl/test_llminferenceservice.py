"""LLMInferenceServices served through KServe's own LLMInferenceService controller.

KServe v0.20.0's `cmd/llmisvc` merges its well-known presets (`kserve-config-llm-template`:
`vllm serve /mnt/models ...`, run here by the stand-in's `vllm`) into the workload Deployment
of an LLMInferenceService. Its controller supports no `http://` model URI: only the local-model
keys (the two labels and two annotations, set by KServe's defaulter and then by localcache's
webhook, which runs after it) make it rewrite the URI to `pvc://<claim>/models/<key>` and mount
the cache's serving claim read-only at /mnt/models. The pod then reads the cached files.

What localcache adds (issue 21) and these tests check after KServe's part: the cache lists the
LLMInferenceService in `status.llmInferenceServices`, deleting the cache is refused while it
exists, and a LoRA adapter cached by a second cache gets the `localmodel-lora` annotation and
is guarded the same way. Not here: the keys surviving KServe's defaulter with KServe's own
`localModel.enabled` false. On this bed localcache and KServe read one `inferenceservice-config`
(manifests/testbed), so the flag would switch both off; the with-kserve profile, where
localcache's own ConfigMap wins, is not what the bed deploys. The order itself is shown on the
real control plane (tests/integration/webhooks/test_llmisvc_mutation.py: a webhook that strips
the keys as KServe's defaulter does, called after localcache's, is undone by reinvocation).
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from typing import Any

import pytest

from localcache.api import groupversion
from localcache.api import inferenceservice as isvc_api
from localcache.caching import keys
from tests.e2e.kservectl import serving
from tests.e2e.realnodes import objects
from tests.e2e.realnodes.cluster import Cluster, Sources
from tests.support import kserve_controllers

pytestmark = pytest.mark.timeout(600)
Obj = dict[str, Any]
LMNC = groupversion.LOCAL_MODEL_NAMESPACE_CACHE
LLMISVC = "llminferenceservices.serving.kserve.io"
LORA_ANNOTATION = "internal.serving.kserve.io/localmodel-lora"
WORKLOAD = "app.kubernetes.io/part-of=llminferenceservice,app.kubernetes.io/name="


def llmisvc(
    name: str, namespace: str, uri: str, *, image: str, version: str = "v1alpha2",
    adapters: list[Obj] | None = None,
) -> Obj:  # fmt: skip
    """An LLMInferenceService of `uri` on the stand-in vLLM image, one replica, no router."""
    model: Obj = {"uri": uri, "name": name}
    if adapters:
        model["lora"] = {"adapters": adapters}
    main = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "resources": {
            "requests": {"cpu": "10m", "memory": "32Mi"},
            "limits": {"cpu": "500m", "memory": "128Mi"},
        },
    }
    return {
        "apiVersion": f"serving.kserve.io/{version}",
        "kind": "LLMInferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"model": model, "replicas": 1, "template": {"containers": [main]}},
    }


def _cached_model(cluster: Cluster, sources: Sources, run: str, name: str, namespace: str,
                  group: str) -> tuple[str, bytes]:  # fmt: skip
    """A new model file, its URI, and a Ready namespace cache `name` of it."""
    data = os.urandom(96 * 1024)
    sources.add_file(f"kservectl-{run}/{name}/weights.safetensors", data)
    uri = f"{sources.http_base}/kservectl-{run}/{name}/weights.safetensors"
    cluster.apply(objects.cache(name, uri, group, namespace=namespace))
    cluster.wait_ready(LMNC.plural, name, namespace=namespace, timeout=240)
    return uri, data


def _lists(cluster: Cluster, cache: str, namespace: str, name: str) -> None:
    def listed() -> bool:
        found = cluster.get(LMNC.plural, cache, namespace=namespace) or {}
        users = (found.get("status") or {}).get("llmInferenceServices") or []
        return {"namespace": namespace, "name": name} in users

    what = f"cache {namespace}/{cache} lists LLMInferenceService {name} in its status"
    cluster.wait(listed, timeout=60, what=what)


def _served_pod(cluster: Cluster, namespace: str, name: str, claim: str, key: str) -> Obj:
    """KServe's workload pod of `name`, checked to mount `claim` read-only at /mnt/models."""
    pod = serving.running_pod(
        cluster, namespace, WORKLOAD + name,
        what=f"KServe's LLMInferenceService controller renders {name} and its pod runs",
    )  # fmt: skip
    mount, volume = serving.volume_of(pod, "main", "/mnt/models")
    assert volume.get("persistentVolumeClaim", {}).get("claimName") == claim, volume
    assert mount.get("readOnly") is True, mount
    assert mount.get("subPath", "").rstrip("/") == f"models/{key}", mount
    return pod


@pytest.mark.parametrize("version", ["v1alpha2", "v1alpha1"])
def test_kserve_renders_an_llmisvc_whose_pod_reads_the_cached_model_read_only(
    cluster: Cluster, sources: Sources, kserve: kserve_controllers.KServeControllers,
    version: str,
) -> None:  # fmt: skip
    run = uuid.uuid4().hex[:6]
    namespace = cluster.namespace("kserve-llm")
    group = f"g{run}"  # one word: the claim keeps KServe's plain `<cache>-<group>` name
    cluster.apply(cluster.node_group(group))
    uri, data = _cached_model(cluster, sources, run, "llm", namespace, group)

    cluster.create(llmisvc("chat", namespace, uri, image=kserve.runtime_image, version=version))
    created = cluster.get(LLMISVC, "chat", namespace=namespace) or {}
    found = serving.local_model_keys(created)
    claim = found.get(isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION)
    assert found == {
        isvc_api.LOCAL_MODEL_LABEL: "llm",
        isvc_api.LOCAL_MODEL_NAMESPACE_LABEL: namespace,
        isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION: uri,
        isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION: claim,
    }, created["metadata"]
    assert claim

    pod = _served_pod(cluster, namespace, "chat", claim, keys.storage_key(uri))
    read = serving.model_files_read(cluster, namespace, pod["metadata"]["name"], "main")
    assert read["error"] is None, read
    assert read["model_dir"] == "/mnt/models", read
    assert read["files"] == {"weights.safetensors": hashlib.sha256(data).hexdigest()}, read

    # localcache's part (issue 21): the cache tracks it and refuses to go while it is used
    _lists(cluster, "llm", namespace, "chat")
    refusal = serving.delete_refused(cluster, LMNC.plural, "llm", namespace)
    assert f"{namespace}/chat" in refusal, refusal


def test_kserves_controller_mounts_the_claim_its_keys_name_and_the_pod_reads_the_model(
    cluster: Cluster, sources: Sources, kserve: kserve_controllers.KServeControllers
) -> None:
    """KServe's part alone, on what localcache did before issue 21: an InferenceService of the
    same model in the namespace makes localcache create the serving claim; KServe's defaulter
    (its `localModel.enabled` is true here) sets the LLMInferenceService's keys, naming the
    claim `<cache>-<node group>`; KServe's controller rewrites the `http://` URI it cannot
    serve to that claim, mounts it read-only at /mnt/models, and the pod reads the files."""
    run = uuid.uuid4().hex[:6]
    namespace = cluster.namespace("kserve-llm-claim")
    group = f"g{run}"  # one word: the claim keeps KServe's plain `<cache>-<group>` name
    cluster.apply(cluster.node_group(group))
    uri, data = _cached_model(cluster, sources, run, "llm", namespace, group)
    cluster.apply(kserve_controllers.serving_runtime(namespace, kserve.runtime_image))
    cluster.create(objects.isvc("anchor", namespace, uri))
    anchor = cluster.get(groupversion.INFERENCE_SERVICE.plural, "anchor", namespace=namespace)
    claim = serving.local_model_keys(anchor or {}).get(isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION)
    assert claim, f"the InferenceService got no serving claim: {anchor}"
    cluster.wait_bound(claim, namespace=namespace, timeout=120)

    cluster.create(llmisvc("chat", namespace, uri, image=kserve.runtime_image))
    created = cluster.get(LLMISVC, "chat", namespace=namespace) or {}
    keys_set = serving.local_model_keys(created)
    assert keys_set.get(isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION) == claim, (
        f"the LLMInferenceService's claim is not the InferenceService's {claim}: {keys_set}"
    )
    pod = _served_pod(cluster, namespace, "chat", claim, keys.storage_key(uri))
    read = serving.model_files_read(cluster, namespace, pod["metadata"]["name"], "main")
    assert read["error"] is None, read
    assert read["files"] == {"weights.safetensors": hashlib.sha256(data).hexdigest()}, read


def test_a_lora_adapter_cached_by_a_second_cache_is_annotated_listed_and_guarded(
    cluster: Cluster, sources: Sources, kserve: kserve_controllers.KServeControllers
) -> None:
    """KServe v0.20.0's controller mounts LoRA adapters only from pvc:// (and downloads hf://,
    s3://); reading the `localmodel-lora` annotation is KServe #5690, after v0.20. So KServe's
    part shown here is the base model's; the adapter's is localcache's: the annotation, a claim
    of the plain `<cache>-<node group>` name KServe recomputes, the listing and the guard."""
    run = uuid.uuid4().hex[:6]
    namespace = cluster.namespace("kserve-lora")
    group = f"g{run}"  # one word: the claim keeps KServe's plain `<cache>-<group>` name
    cluster.apply(cluster.node_group(group))
    uri, _ = _cached_model(cluster, sources, run, "base", namespace, group)
    adapter_uri, _ = _cached_model(cluster, sources, run, "adapter", namespace, group)

    adapters = [{"name": "sql", "uri": adapter_uri}]
    obj = llmisvc("tuned", namespace, uri, image=kserve.runtime_image, adapters=adapters)
    created_run = cluster.create(obj, check=False)
    assert created_run.returncode == 0, created_run.stderr
    created = cluster.get(LLMISVC, "tuned", namespace=namespace) or {}
    annotations = created["metadata"].get("annotations") or {}
    assert LORA_ANNOTATION in annotations, created["metadata"]
    assert json.loads(annotations[LORA_ANNOTATION]) == {
        "sql": {"cache": "adapter", "namespace": namespace}
    }
    cluster.wait_bound(
        f"adapter-{group}", namespace=namespace, timeout=120
    )  # KServe #5690 recomputes it

    _lists(cluster, "base", namespace, "tuned")
    _lists(cluster, "adapter", namespace, "tuned")
    refusal = serving.delete_refused(cluster, LMNC.plural, "adapter", namespace)
    assert f"{namespace}/tuned" in refusal, refusal
