"""Users of a cache and the serving claims they need: LLMInferenceServices (base model and LoRA
adapter) beside InferenceServices, and old hash-named claims kept while a user names them."""

from __future__ import annotations

import json
from typing import Any

import structlog

from localcache.api import inferenceservice, modelcache
from localcache.caching import llmuse, names
from localcache.controllers import clustercache, namespacecache, state, users
from localcache.runtime import store

URI = "hf://org/base"
SPEC = {"sourceModelUri": URI, "modelSize": "1Gi", "nodeGroups": ["gpu-a100", "gpu-h100"]}


def _cache(name: str = "llama", namespace: str = "") -> Any:
    meta = {"name": name, "uid": "u", **({"namespace": namespace} if namespace else {})}
    kind = modelcache.LocalModelNamespaceCache if namespace else modelcache.LocalModelCache
    return kind.from_dict({"metadata": meta, "spec": SPEC})


def _obj(
    kind: str, namespace: str, name: str, *, labels: Any = None, annotations: Any = None
) -> dict[str, Any]:
    return {
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"u-{name}",
            "labels": labels or {},
            "annotations": annotations or {},
        },
    }


def _llm(namespace: str, name: str, **kw: Any) -> dict[str, Any]:
    obj = _obj("LLMInferenceService", namespace, name, **kw)
    obj["spec"] = {"model": {"uri": URI, "lora": {"adapters": [{"name": "a", "uri": URI}]}}}
    return obj


def _stores(*llms: dict[str, Any]) -> state.Stores:
    llm_store = store.Store(indexers=users.LLMISVC_INDEXERS)
    for obj in llms:
        llm_store.upsert(obj)
    empty = store.Store()
    return state.Stores(
        caches=empty,
        namespace_caches=empty,
        nodes=empty,
        local_model_nodes=empty,
        node_groups=empty,
        persistent_volumes=empty,
        persistent_volume_claims=empty,
        inference_services=empty,
        llm_inference_services=llm_store,
    )


def test_base_model_and_lora_users_need_a_claim_in_their_namespace() -> None:
    cache = _cache()
    base = _llm("prod", "chat", labels={inferenceservice.LOCAL_MODEL_LABEL: "llama"})
    lora = _llm(
        "lab",
        "tuned",
        annotations={
            llmuse.LORA_ANNOTATION: json.dumps({"a": {"cache": "llama"}}),
            inferenceservice.NODE_GROUP_ANNOTATION: "gpu-h100",
        },
    )
    stranger = _llm("x", "other", labels={inferenceservice.LOCAL_MODEL_LABEL: "else"})
    found = users.llm_users_of(clustercache.SCOPE, _stores(base, lora, stranger), cache)
    assert sorted((u.obj["metadata"]["name"], u.uses) for u in found) == [
        ("chat", [llmuse.Use("base model")]),
        ("tuned", [llmuse.Use("LoRA adapter", "a")]),
    ]
    wanted = users.serving(cache, isvcs=[], llm_users=found)
    assert wanted.pairs == {("prod", "gpu-a100"), ("lab", "gpu-h100")}
    assert wanted.legacy == set()
    assert users.tracked(u.obj for u in found) == [
        {"namespace": "lab", "name": "tuned"},
        {"namespace": "prod", "name": "chat"},
    ]


def test_a_namespace_cache_is_used_only_from_its_namespace() -> None:
    label = {
        inferenceservice.LOCAL_MODEL_LABEL: "llama",
        inferenceservice.LOCAL_MODEL_NAMESPACE_LABEL: "team",
    }
    here, there = _llm("team", "chat", labels=label), _llm("other", "chat", labels=label)
    found = users.llm_users_of(namespacecache.SCOPE, _stores(here, there), _cache("llama", "team"))
    assert [u.obj["metadata"]["namespace"] for u in found] == ["team"]


def test_an_old_hashed_claim_is_kept_while_a_user_names_it() -> None:
    cache = _cache()
    old_claim = names.legacy_serving_pvc("llama", "gpu-a100")
    assert old_claim != names.serving_pvc("llama", "gpu-a100") == "llama-gpu-a100"
    pvc = inferenceservice.LOCAL_MODEL_PVC_NAME_ANNOTATION
    isvcs = [
        _obj("InferenceService", "prod", "old", annotations={pvc: old_claim}),
        _obj("InferenceService", "prod", "new", annotations={pvc: "llama-gpu-a100"}),
        _obj("InferenceService", "dev", "new", annotations={pvc: "llama-gpu-a100"}),
    ]
    wanted = users.serving(cache, isvcs=isvcs, llm_users=[])
    assert wanted.pairs == {("prod", "gpu-a100"), ("dev", "gpu-a100")}
    assert wanted.legacy == {("prod", "gpu-a100")}


def test_a_lora_claim_name_over_253_characters_is_logged() -> None:
    long_cache = "m" * 250
    cache = _cache(long_cache)
    lora = _llm(
        "lab",
        "tuned",
        annotations={llmuse.LORA_ANNOTATION: json.dumps({"a": {"cache": long_cache}})},
    )
    found = users.llm_users_of(clustercache.SCOPE, _stores(lora), cache)
    with structlog.testing.capture_logs() as logs:
        wanted = users.serving(cache, isvcs=[], llm_users=found)
    assert wanted.pairs == {("lab", "gpu-a100")}
    assert [e["event"] for e in logs] == ["lora_claim_name_not_plain"]


def test_an_update_that_changes_a_use_passes_the_predicate() -> None:
    before = _llm("prod", "chat")
    after = _llm("prod", "chat", annotations={llmuse.LORA_ANNOTATION: "{}"})
    assert users.llmisvc_changed(before, after)
    assert not users.llmisvc_changed(before, _llm("prod", "chat"))


def test_status_lists_are_sorted_distinct_and_bounded() -> None:
    objs = [_obj("X", f"ns{i:05d}", "a") for i in range(users.MAX_TRACKED + 5)]
    listed = users.tracked([*reversed(objs), objs[0]])
    assert len(listed) == users.MAX_TRACKED
    assert listed[0] == {"namespace": "ns00000", "name": "a"}
    assert listed == sorted(listed, key=lambda e: (e["namespace"], e["name"]))
