"""Routing serving objects to shared-volume namespace caches (issue 22): only once Ready, to
`pvc://<pvcRef>/models/<storage key><subPath>`, with no node-group key."""

from __future__ import annotations

from typing import Any

import pytest

from localcache.api import inferenceservice as isvc_api
from localcache.api import llminferenceservice as llm_api
from localcache.api import modelcache
from localcache.caching import groupfit, keys, sharedroute
from localcache.webhooks import isvc, isvchandler
from tests.unit.caching.test_groupfit import GROUPS, NODES
from tests.unit.webhooks import test_llmisvc as llm
from tests.unit.webhooks.test_isvc import apply, cache_obj, cluster, decide, isvc_obj
from tests.unit.webhooks.test_isvc import request as isvc_request

SOURCE = isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION
SHARED = sharedroute.SHARED_VOLUME_CACHE_ANNOTATION
LABEL = isvc_api.LOCAL_MODEL_LABEL
KEY = keys.storage_key("gs://bucket/model")


def ready(
    status: str = "True", *, observed: int | None = 1, reason: str | None = None
) -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": "Ready",
        "status": status,
        "reason": reason or ("ImportSucceeded" if status == "True" else "ImportRunning"),
        "message": "" if status == "True" else "the import Job is running",
        "lastTransitionTime": "2026-12-05T00:00:00Z",
    }
    if observed is not None:
        condition["observedGeneration"] = observed
    return {"conditions": [condition], "copies": {"total": 1, "available": 1}}


def shared_obj(
    name: str = "shared",
    uri: str = "gs://bucket/model",
    *,
    namespace: str = "default",
    claim: str = "models-rwx",
    status: dict[str, Any] | None = None,
    generation: int = 1,
    deleting: bool = False,
) -> dict[str, Any]:
    obj = cache_obj(name, uri, namespace=namespace, status=status, deleting=deleting)
    obj["metadata"]["generation"] = generation
    obj["spec"].pop("nodeGroups")
    obj["spec"]["pvcRef"] = claim
    return obj


def shared(**kw: Any) -> modelcache.LocalModelNamespaceCache:
    return modelcache.LocalModelNamespaceCache.from_dict(shared_obj(**kw))


# ------------------------------------------------------------------ pure rules


@pytest.mark.parametrize(
    ("source", "uri", "routed"),
    [
        ("gs://bucket/model", "gs://bucket/model", f"pvc://models-rwx/models/{KEY}"),
        ("gs://bucket/model", "gs://bucket/model/", f"pvc://models-rwx/models/{KEY}"),
        ("gs://bucket/model", "gs://bucket/model/v1/x", f"pvc://models-rwx/models/{KEY}/v1/x"),
        (
            "gs://bucket/model/",
            "gs://bucket/model/v1",
            f"pvc://models-rwx/models/{keys.storage_key('gs://bucket/model/')}/v1",
        ),
    ],
)
def test_the_routed_uri_keeps_the_sub_path(source: str, uri: str, routed: str) -> None:
    assert sharedroute.routed_uri(shared(uri=source, status=ready()), uri) == routed


@pytest.mark.parametrize(
    ("status", "generation", "why"),
    [
        (None, 1, "no status yet"),
        ({"copies": {"total": 1}}, 1, "no status yet"),
        (ready("False", reason="ImportRunning"), 1, "Ready is False (ImportRunning: the import"),
        (ready(observed=1), 2, "observed for generation 1, the spec is at generation 2"),
        (ready(observed=None), 1, "observed for generation 0"),
    ],
)
def test_a_cache_is_not_ready_until_its_current_ready_condition_is_true(
    status: dict[str, Any] | None, generation: int, why: str
) -> None:
    found = sharedroute.not_ready(shared(status=status, generation=generation))
    assert found is not None
    assert why in found


def test_a_ready_condition_of_the_current_generation_routes() -> None:
    assert sharedroute.not_ready(shared(status=ready(observed=3), generation=3)) is None


# ------------------------------------------------------------------ InferenceService


def test_before_ready_the_isvc_keeps_its_uri_with_a_warning_naming_the_cache_and_why() -> None:
    decision = decide(isvc_obj("gs://bucket/model/v1"), shared(status=ready("False")))
    assert decision.rewrites == ()
    assert decision.labels == {LABEL: None, isvc_api.LOCAL_MODEL_NAMESPACE_LABEL: None}
    assert decision.annotations[SHARED] is None
    (warning,) = decision.warnings
    assert "LocalModelNamespaceCache default/shared (claim models-rwx) is not Ready" in warning
    assert "ImportRunning: the import Job is running" in warning


def test_without_status_the_warning_says_so() -> None:
    (warning,) = decide(isvc_obj("gs://bucket/model"), shared()).warnings
    assert "not Ready (no status yet)" in warning


def test_after_ready_the_isvc_is_routed_to_the_claim_without_node_group_keys() -> None:
    decision = decide(isvc_obj("gs://bucket/model/v1", framework="sklearn"), shared(status=ready()))
    assert decision.rewrites == (
        ("/spec/predictor/sklearn/storageUri", f"pvc://models-rwx/models/{KEY}/v1"),
    )
    assert decision.labels == dict.fromkeys(isvc.LABEL_KEYS)
    assert decision.annotations == {
        SOURCE: "gs://bucket/model/v1",
        isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION: None,
        SHARED: "shared",
    }
    assert decision.warnings == ()


def test_a_ready_shared_namespace_cache_wins_over_a_cluster_cache() -> None:
    decision = decide(
        isvc_obj("gs://bucket/model"),
        cluster("global", "gs://bucket/model"),
        shared(status=ready()),
    )
    assert decision.annotations[SHARED] == "shared"
    assert decision.choice is None


def test_a_not_ready_shared_cache_counts_as_absent_so_a_cluster_cache_serves() -> None:
    decision = decide(
        isvc_obj("gs://bucket/model"), cluster("global", "gs://bucket/model"), shared()
    )
    assert decision.rewrites == ()
    assert decision.labels[LABEL] == "global"
    assert decision.annotations[SHARED] is None
    assert any("not Ready (no status yet)" in w for w in decision.warnings)
    assert not any("node groups" in w for w in decision.warnings)


def test_a_shared_cache_of_another_namespace_is_not_used() -> None:
    decision = decide(isvc_obj("gs://bucket/model"), shared(namespace="other", status=ready()))
    assert decision.rewrites == ()
    assert decision.warnings == ()


def test_a_shared_cache_being_deleted_is_not_used() -> None:
    decision = decide(isvc_obj("gs://bucket/model"), shared(status=ready(), deleting=True))
    assert decision.rewrites == ()


def test_the_more_specific_node_group_namespace_cache_wins_over_a_broader_shared_one() -> None:
    node_group = modelcache.LocalModelNamespaceCache.from_dict(
        cache_obj("deep", "gs://bucket/model/v1", namespace="default")
    )
    decision = decide(isvc_obj("gs://bucket/model/v1"), shared(status=ready()), node_group)
    assert decision.labels[LABEL] == "deep"
    assert decision.rewrites == ()


@pytest.mark.parametrize(
    "annotations",
    [{}, {isvc_api.DISABLE_LOCAL_MODEL_ANNOTATION: "true"}],
)
def test_an_isvc_routed_before_is_left_alone(annotations: dict[str, str]) -> None:
    obj = isvc_obj(
        f"pvc://models-rwx/models/{KEY}",
        annotations={SHARED: "shared", SOURCE: "gs://bucket/model", **annotations},
    )
    decision = decide(obj, shared(status=ready()), cluster("global", "gs://bucket/model"))
    assert (decision.labels, decision.annotations, decision.rewrites) == ({}, {}, ())


def test_disabled_or_off_local_models_do_not_route() -> None:
    disabled = isvc_obj(
        "gs://bucket/model", annotations={isvc_api.DISABLE_LOCAL_MODEL_ANNOTATION: ""}
    )
    assert decide(disabled, shared(status=ready())).rewrites == ()
    assert (
        decide(isvc_obj("gs://bucket/model"), shared(status=ready()), enabled=False).rewrites == ()
    )


async def test_the_mutator_patches_the_storage_uri() -> None:
    stores = llm.Stores()  # reuse its stores: the ISVC mutator reads the same kinds
    stores.namespace_caches.upsert(shared_obj(status=ready()))
    mutator = isvchandler.IsvcMutator(
        caches=stores.caches.view(),
        namespace_caches=stores.namespace_caches.view(),
        node_groups=stores.node_groups.view(),
        enabled=lambda: True,
        synced=lambda: True,
    )
    obj = isvc_obj("gs://bucket/model/v1")
    answer = await mutator(isvc_request(obj))
    patched = apply(obj, answer.patch)
    assert patched["spec"]["predictor"]["model"]["storageUri"] == (
        f"pvc://models-rwx/models/{KEY}/v1"
    )
    assert patched["metadata"]["annotations"] == {SOURCE: "gs://bucket/model/v1", SHARED: "shared"}
    assert "labels" not in patched["metadata"] or not patched["metadata"]["labels"]


# ------------------------------------------------------------------ LLMInferenceService


def llm_stores(status: dict[str, Any] | None) -> llm.Stores:
    stores = llm.Stores()
    stores.namespace_caches.upsert(
        shared_obj("base", "hf://org/llama", namespace=llm.NS, status=status)
    )
    stores.namespace_caches.upsert(
        shared_obj("lora", "hf://org/adapter", namespace=llm.NS, status=status, claim="loras")
    )
    return stores


async def mutate(stores: llm.Stores, obj: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    answer = await stores.mutator()(llm.request(obj))
    assert answer.allowed
    return apply(obj, answer.patch), answer.warnings


ADAPTERS = [{"name": "a", "uri": "hf://org/adapter/v2"}, {"name": "b", "uri": "hf://else/x"}]


async def test_llmisvc_before_ready_keeps_its_uris_with_warnings() -> None:
    obj = llm.llm_obj("hf://org/llama", adapters=ADAPTERS)
    patched, warnings = await mutate(llm_stores(ready("False")), obj)
    assert patched["spec"] == obj["spec"]
    assert SHARED not in (patched["metadata"].get("annotations") or {})
    assert any("team/base (claim models-rwx) is not Ready" in w for w in warnings)
    assert any(w.startswith("LoRA adapter a: ") and "team/lora" in w for w in warnings)


async def test_llmisvc_base_model_and_adapter_are_routed_once_ready() -> None:
    obj = llm.llm_obj("hf://org/llama", adapters=ADAPTERS)
    patched, warnings = await mutate(llm_stores(ready()), obj)
    model = patched["spec"]["model"]
    assert model["uri"] == f"pvc://models-rwx/models/{keys.storage_key('hf://org/llama')}"
    assert model["lora"]["adapters"] == [
        {"name": "a", "uri": f"pvc://loras/models/{keys.storage_key('hf://org/adapter')}/v2"},
        {"name": "b", "uri": "hf://else/x"},
    ]
    annotations = patched["metadata"]["annotations"]
    assert annotations == {SOURCE: "hf://org/llama", SHARED: "base,lora"}
    assert llm_api.LOCAL_MODEL_LORA_ANNOTATION not in annotations
    assert not patched["metadata"].get("labels")
    assert warnings == ()


async def test_an_llmisvc_routed_before_is_left_alone() -> None:
    stores = llm_stores(ready())
    first, _ = await mutate(stores, llm.llm_obj("hf://org/llama", adapters=ADAPTERS))
    again, warnings = await mutate(stores, first)
    assert again == first
    assert warnings == ()


async def test_a_uri_from_base_refs_is_not_rewritten_and_the_warning_says_why() -> None:
    stores = llm_stores(ready())
    stores.configs.upsert(llm.config_obj("cfg", llm.NS, {"model": {"uri": "hf://org/llama"}}))
    obj = llm.llm_obj(None, base_refs=[{"name": "cfg"}])
    patched, warnings = await mutate(stores, obj)
    assert patched["spec"] == obj["spec"]
    assert any("comes from spec.baseRefs" in w for w in warnings)


# ------------------------------------------------------------------ node-group logic skips them


def test_the_node_group_annotation_and_a_constrained_workload_do_not_stop_routing() -> None:
    fit = groupfit.GroupFit(
        node_groups=GROUPS,
        nodes=NODES,
        workloads=(groupfit.Workload.of({"nodeSelector": {"pool": "h"}}, "the predictor"),),
    )
    obj = isvc_obj("gs://bucket/model", annotations={isvc_api.NODE_GROUP_ANNOTATION: "a100"})
    decision = decide(obj, shared(status=ready()), fit=fit, node_group_exists=lambda _: True)
    assert decision.rewrites == (
        ("/spec/predictor/model/storageUri", f"pvc://models-rwx/models/{KEY}"),
    )
    assert decision.warnings == ()


def test_a_shared_cache_alone_gives_no_node_group_warning() -> None:
    decision = decide(isvc_obj("gs://bucket/model"), shared(), node_group_exists=lambda _: False)
    assert not any("node group" in w for w in decision.warnings)
