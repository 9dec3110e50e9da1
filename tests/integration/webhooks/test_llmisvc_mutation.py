"""LLMInferenceService mutation through the real apiserver: it calls our server over TLS.

The webhook configurations are the shipped ones (manifests/webhook/), scoped to each test by
the `harness` fixture (harness.py, conftest.py); the LLMInferenceService and
LLMInferenceServiceConfig CRDs are the test stand-ins of manifests/test (both versions).
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from localcache.api import groupversion
from localcache.api import inferenceservice as isvc_api
from localcache.api import llminferenceservice as llm_api
from localcache.caching import names
from localcache.runtime import metrics
from localcache.runtime.keys import ObjectKey
from localcache.runtime.serving import admission, review
from localcache.webhooks import llmisvc
from tests.integration.webhooks.harness import (
    DOWNLOADED,
    LLMISVC,
    LLMISVC_CONFIG,
    Harness,
    Obj,
    llmisvc_obj,
)
from tests.support import webhooks as wh

LORA = llm_api.LOCAL_MODEL_LORA_ANNOTATION
STRIP_PATH = "/strip-local-model-keys"


def local_model_metadata(obj: Obj) -> tuple[dict[str, str], dict[str, str]]:
    meta = obj.get("metadata") or {}
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k in llmisvc.LABEL_KEYS}
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k in llmisvc.ANNOTATION_KEYS
    }
    return labels, annotations


async def create(harness: Harness, obj: Obj, version: str | None = None) -> wh.ApiAnswer:
    """POST `obj` in the harness's namespace through the version of its apiVersion."""
    version = version or obj["apiVersion"].rsplit("/", 1)[1]
    info = dataclasses.replace(groupversion.LLM_INFERENCE_SERVICE, version=version)
    path = info.path(namespace=harness.namespace)
    answer = await wh.api_request(harness.plane, "POST", path, obj)
    assert answer.status == 201, answer.body
    return answer


async def stored(harness: Harness, name: str) -> tuple[dict[str, str], dict[str, str]]:
    return local_model_metadata(await harness.get(LLMISVC, name, harness.namespace))


async def config(harness: Harness, name: str, namespace: str, spec: Obj) -> None:
    body = {
        "apiVersion": groupversion.LLM_INFERENCE_SERVICE_CONFIG.api_version,
        "kind": groupversion.LLM_INFERENCE_SERVICE_CONFIG.kind,
        "metadata": {"name": name},
        "spec": spec,
    }
    await harness.client.create(LLMISVC_CONFIG, body, namespace=namespace)
    await harness.seen(harness.hooks.llm_configs, ObjectKey(namespace, name))


# ------------------------------------------------------------------------------ tests


@pytest.mark.parametrize("version", ["v1alpha1", "v1alpha2"])
async def test_both_versions_get_the_namespace_cache_first_then_the_cluster_cache(
    harness: Harness, version: str
) -> None:
    group = await harness.node_group()
    ns = harness.namespace
    cluster_name = harness.name("llama")
    await harness.cache(cluster_name, "hf://org/llama", status=DOWNLOADED)
    await harness.cache("team-8b", "hf://org/llama/8b", namespace=ns, status=DOWNLOADED)
    async with harness.mutating(llm=True):
        own = await create(harness, llmisvc_obj("own", "hf://org/llama/8b", version=version))
        shared = await create(harness, llmisvc_obj("shared", "hf://org/llama/70b", version=version))
        assert own.warnings == shared.warnings == ()
        assert await stored(harness, "own") == (
            {isvc_api.LOCAL_MODEL_LABEL: "team-8b", isvc_api.LOCAL_MODEL_NAMESPACE_LABEL: ns},
            {
                isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION: "hf://org/llama/8b",
                isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION: names.serving_pvc("team-8b", group),
            },
        )
        assert await stored(harness, "shared") == (
            {isvc_api.LOCAL_MODEL_LABEL: cluster_name},
            {
                isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION: "hf://org/llama",
                isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION: names.serving_pvc(cluster_name, group),
            },
        )
        # An update that opts out removes the keys (KServe's defaulter does the same).
        current = await harness.get(LLMISVC, "own", ns)
        current["metadata"]["annotations"] = {isvc_api.DISABLE_LOCAL_MODEL_ANNOTATION: ""}
        await harness.client.replace(LLMISVC, current, namespace=ns)
        assert await stored(harness, "own") == ({}, {})


async def test_a_base_ref_supplies_the_uri_and_an_unresolved_one_warns(harness: Harness) -> None:
    await harness.node_group()
    ns = harness.namespace
    cache = harness.name("llama")
    await harness.cache(cache, "hf://org/llama", status=DOWNLOADED)
    await config(harness, "llama-base", ns, {"model": {"uri": "hf://org/llama/8b"}})
    async with harness.mutating(llm=True):
        based = await create(
            harness, llmisvc_obj("based", None, spec={"baseRefs": [{"name": "llama-base"}]})
        )
        assert based.warnings == ()
        labels, _ = await stored(harness, "based")
        assert labels == {isvc_api.LOCAL_MODEL_LABEL: cache}
        missing = await create(
            harness, llmisvc_obj("missing", None, spec={"baseRefs": [{"name": "nope"}]})
        )
        assert any(
            "spec.baseRefs not resolved" in w and "LLMInferenceServiceConfig nope" in w
            for w in missing.warnings
        ), missing.warnings
        assert await stored(harness, "missing") == ({}, {})


async def test_lora_adapters_get_the_lora_annotation(harness: Harness) -> None:
    await harness.node_group()
    ns = harness.namespace
    await harness.cache("adapter", "hf://org/adapter", namespace=ns, status=DOWNLOADED)
    spec = {
        "model": {
            "lora": {
                "adapters": [
                    {"name": "sql", "uri": "hf://org/adapter/sql"},
                    {"name": "remote", "uri": "hf://elsewhere/x"},
                ]
            }
        }
    }
    async with harness.mutating(llm=True):
        answer = await create(harness, llmisvc_obj("lora", "hf://org/base", spec=spec))
        assert answer.warnings == ()
        labels, annotations = await stored(harness, "lora")
    assert labels == {}
    assert json.loads(annotations[LORA]) == {
        "sql": {
            "cache": "adapter",
            "namespace": ns,
        }
    }


async def _strip(request: review.Request) -> review.Response:
    """KServe's defaulter with localModel.enabled false: remove every local-model key."""
    obj = request.object or {}
    return review.patched(
        review.metadata_patch(
            obj,
            labels=dict.fromkeys(llmisvc.LABEL_KEYS),
            annotations=dict.fromkeys(llmisvc.ANNOTATION_KEYS),
        )
    )


@pytest.mark.parametrize("policy", ["IfNeeded", "Never"])
async def test_the_keys_survive_a_later_webhook_that_strips_them(
    harness: Harness, policy: str
) -> None:
    """A stripping webhook whose configuration sorts after ours runs after ours; only
    reinvocation (the shipped IfNeeded) gives ours the last word. `Never` is the control."""
    await harness.node_group()
    cache = harness.name("llama")
    await harness.cache(cache, "hf://org/llama", status=DOWNLOADED)
    stripper = admission.AdmissionServer(metrics=metrics.Metrics())
    stripper.register(STRIP_PATH, _strip, on_failure="error")
    ours = harness.configuration("mutating")
    for hook in ours["webhooks"]:
        hook["reinvocationPolicy"] = policy
    async with wh.run_webhook_server(stripper) as server:
        strip_config = wh.configuration(
            "Mutating",
            f"zz-t{harness.token}-strip",  # after ours (`t<token>-localmodel…`) in name order
            [
                wh.webhook_entry(
                    f"strip.t{harness.token}.localcache.test",
                    url=server.url(STRIP_PATH),
                    ca_pem=server.ca_pem,
                    rules=[
                        wh.rule(
                            resources=["llminferenceservices"],
                            api_groups=["serving.kserve.io"],
                            api_versions=["v1alpha1", "v1alpha2"],
                        )
                    ],
                    namespace=harness.namespace,
                )
            ],
        )
        probe_body = llmisvc_obj("probe", "hf://probe/m")

        async def probe() -> wh.ApiAnswer:
            return await wh.api_request(
                harness.plane,
                "POST",
                groupversion.LLM_INFERENCE_SERVICE.path(namespace=harness.namespace),
                {**probe_body, "metadata": {"generateName": "probe-"}},
                dry_run=True,
            )

        async with wh.installed(harness.plane, ours), wh.installed(harness.plane, strip_config):
            await wh.wait_until_called(harness.server, llmisvc.MUTATE_PATH, probe)
            await wh.wait_until_called(server, STRIP_PATH, probe)
            await create(harness, llmisvc_obj("kept", "hf://org/llama/8b"))
            labels, _ = await stored(harness, "kept")
    assert server.calls(STRIP_PATH) >= 1
    if policy == "IfNeeded":
        assert labels == {isvc_api.LOCAL_MODEL_LABEL: cache}
    else:
        assert labels == {}
