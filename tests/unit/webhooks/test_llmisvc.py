"""LLMInferenceService mutation: KServe's defaulter cases (both versions), baseRefs, LoRA."""

from __future__ import annotations

import json
from typing import Any

import pytest

from localcache.api import inferenceservice as isvc_api
from localcache.api import llminferenceservice as llm_api
from localcache.runtime import store
from localcache.runtime.crds import optional
from localcache.runtime.serving import review
from localcache.webhooks import llmbase, llmisvc
from tests.unit.caching.test_groupfit import GROUPS, NODES
from tests.unit.webhooks.test_isvc import apply, cache_obj

LABEL = isvc_api.LOCAL_MODEL_LABEL
NS_LABEL = isvc_api.LOCAL_MODEL_NAMESPACE_LABEL
SOURCE = isvc_api.LOCAL_MODEL_SOURCE_URI_ANNOTATION
PVC = isvc_api.LOCAL_MODEL_PVC_NAME_ANNOTATION
LORA = llm_api.LOCAL_MODEL_LORA_ANNOTATION
NS = "team"
KSERVE = "kserve"


def llm_obj(
    uri: str | None = "hf://org/llama",
    *,
    version: str = "v1alpha2",
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    base_refs: list[Any] | None = None,
    adapters: Any = None,
    storage_initializer: bool | None = None,
) -> dict[str, Any]:
    model: dict[str, Any] = {}
    if uri is not None:
        model["uri"] = uri
    if adapters is not None:
        model["lora"] = {"adapters": adapters}
    spec: dict[str, Any] = {"model": model} if model else {}
    if base_refs is not None:
        spec["baseRefs"] = base_refs
    if storage_initializer is not None:
        spec["storageInitializer"] = {"enabled": storage_initializer}
    meta: dict[str, Any] = {"name": "llm", "namespace": NS}
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    return {
        "apiVersion": f"serving.kserve.io/{version}",
        "kind": "LLMInferenceService",
        "metadata": meta,
        "spec": spec,
    }


def config_obj(name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "serving.kserve.io/v1alpha2",
        "kind": "LLMInferenceServiceConfig",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def request(obj: dict[str, Any], *, version: str = "v1alpha2") -> review.Request:
    return review.Request(
        uid="uid-1",
        kind=review.GroupVersionKind("serving.kserve.io", version, "LLMInferenceService"),
        resource=review.GroupVersionResource("serving.kserve.io", version, "llminferenceservices"),
        namespace=NS,
        name="llm",
        operation="CREATE",
        user=review.UserInfo(),
        object=obj,
        old_object=None,
    )


class Stores:
    def __init__(self) -> None:
        self.caches = store.Store()
        self.namespace_caches = store.Store()
        self.node_groups = store.Store()
        self.configs = store.Store()
        self.nodes = store.Store()
        self.configs_served = True
        self.configs_syncing = False
        self.enabled = True
        for group in ("gpu1", "gpu2"):
            self.node_groups.upsert({"metadata": {"name": group}, "spec": {}})

    def mutator(self) -> llmisvc.LlmIsvcMutator:
        stores = self

        class Configs:
            def get(self, key: Any) -> dict[str, Any] | None:
                if stores.configs_syncing:
                    raise optional.NotSynced("listing")
                return stores.configs.view().get(key)

            def list(self, namespace: str | None = None) -> list[dict[str, Any]]:
                return stores.configs.view().list(namespace)

        return llmisvc.LlmIsvcMutator(
            caches=self.caches.view(),
            namespace_caches=self.namespace_caches.view(),
            node_groups=self.node_groups.view(),
            nodes=self.nodes.view(),
            configs=Configs(),
            configs_served=lambda: self.configs_served,
            kserve_namespace=KSERVE,
            enabled=lambda: self.enabled,
            synced=lambda: True,
        )

    async def mutate(self, obj: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
        version = obj["apiVersion"].rsplit("/", 1)[1]
        answer = await self.mutator()(request(obj, version=version))
        assert answer.allowed
        return apply(obj, answer.patch)["metadata"], answer.warnings


def cached() -> Stores:
    stores = Stores()
    stores.caches.upsert(cache_obj("llama", "hf://org/llama"))
    stores.namespace_caches.upsert(cache_obj("team-llama", "hf://org/llama/8b", namespace=NS))
    stores.caches.upsert(cache_obj("adapter", "hf://org/adapter"))
    return stores


STALE = {LABEL: "old", NS_LABEL: "x"}, {SOURCE: "hf://old", PVC: "old-gpu1", LORA: "{}"}


# ------------------------------------------------------------------ base model


@pytest.mark.parametrize("version", ["v1alpha1", "v1alpha2"])
async def test_both_versions_get_the_namespace_cache_first_then_the_cluster_cache(
    version: str,
) -> None:
    stores = cached()
    meta, warnings = await stores.mutate(llm_obj("hf://org/llama/8b", version=version))
    assert warnings == ()
    assert meta["labels"] == {LABEL: "team-llama", NS_LABEL: NS}
    assert meta["annotations"] == {SOURCE: "hf://org/llama/8b", PVC: "team-llama-gpu1"}
    meta, _ = await stores.mutate(llm_obj("hf://org/llama/70b", version=version))
    assert meta["labels"] == {LABEL: "llama"}
    assert meta["annotations"] == {SOURCE: "hf://org/llama", PVC: "llama-gpu1"}


async def test_the_node_group_annotation_picks_the_claim() -> None:
    meta, _ = await cached().mutate(llm_obj(annotations={isvc_api.NODE_GROUP_ANNOTATION: "gpu2"}))
    assert meta["annotations"][PVC] == "llama-gpu2"


async def test_an_unknown_node_group_removes_the_keys_with_a_warning() -> None:
    meta, warnings = await cached().mutate(
        llm_obj(annotations={isvc_api.NODE_GROUP_ANNOTATION: "cpu"}, labels=STALE[0])
    )
    assert LABEL not in meta.get("labels", {})
    assert any("node group cpu" in w for w in warnings)


@pytest.mark.parametrize(
    ("annotations", "enabled", "storage_initializer"),
    [
        ({isvc_api.DISABLE_LOCAL_MODEL_ANNOTATION: "false"}, True, None),
        ({}, False, None),
        ({}, True, False),
    ],
    ids=["disable-annotation", "localModel-disabled", "storageInitializer-disabled"],
)
async def test_opting_out_removes_all_five_keys(
    annotations: dict[str, str], enabled: bool, storage_initializer: bool | None
) -> None:
    stores = cached()
    stores.enabled = enabled
    obj = llm_obj(
        labels=STALE[0],
        annotations={**STALE[1], **annotations},
        adapters=[{"name": "a", "uri": "hf://org/adapter"}],
        storage_initializer=storage_initializer,
    )
    meta, warnings = await stores.mutate(obj)
    assert "labels" not in meta or not set(meta["labels"]) & set(llmisvc.LABEL_KEYS)
    assert not set(meta.get("annotations", {})) & set(llmisvc.ANNOTATION_KEYS)
    assert bool(warnings) == (storage_initializer is False)


async def test_no_model_uri_and_no_base_refs_removes_stale_keys() -> None:
    meta, warnings = await cached().mutate(llm_obj(None, labels=STALE[0], annotations=STALE[1]))
    assert warnings == ()
    assert not set(meta.get("labels", {})) & set(llmisvc.LABEL_KEYS)
    assert not set(meta.get("annotations", {})) & set(llmisvc.ANNOTATION_KEYS)


async def test_a_cache_without_a_copy_warns() -> None:
    stores = Stores()
    stores.caches.upsert(cache_obj("llama", "hf://org/llama", status=None))
    meta, warnings = await stores.mutate(llm_obj())
    assert meta["labels"] == {LABEL: "llama"}
    assert len(warnings) == 1
    assert "no downloaded copy" in warnings[0]


# ------------------------------------------------------------------ baseRefs


async def test_the_uri_of_a_base_config_is_used_own_namespace_before_kserves() -> None:
    stores = cached()
    stores.configs.upsert(config_obj("base", KSERVE, {"model": {"uri": "hf://org/llama/70b"}}))
    meta, warnings = await stores.mutate(llm_obj(None, base_refs=[{"name": "base"}]))
    assert warnings == ()
    assert meta["labels"] == {LABEL: "llama"}
    stores.configs.upsert(config_obj("base", NS, {"model": {"uri": "hf://org/llama/8b"}}))
    meta, _ = await stores.mutate(llm_obj(None, base_refs=[{"name": "base"}]))
    assert meta["labels"] == {LABEL: "team-llama", NS_LABEL: NS}


async def test_later_base_refs_and_the_llmisvc_itself_win() -> None:
    stores = cached()
    stores.configs.upsert(config_obj("a", NS, {"model": {"uri": "hf://nowhere/a"}}))
    stores.configs.upsert(config_obj("b", NS, {"model": {"uri": "hf://org/llama/8b"}}))
    refs = [{"name": "a"}, {"name": "b"}]
    meta, _ = await stores.mutate(llm_obj(None, base_refs=refs))
    assert meta["labels"][LABEL] == "team-llama"
    meta, _ = await stores.mutate(llm_obj("hf://org/llama/70b", base_refs=refs))
    assert meta["labels"] == {LABEL: "llama"}


async def test_storage_initializer_and_adapters_come_from_base_configs_too() -> None:
    stores = cached()
    stores.configs.upsert(
        config_obj(
            "lora",
            NS,
            {"model": {"lora": {"adapters": [{"name": "a", "uri": "hf://org/adapter"}]}}},
        )
    )
    stores.configs.upsert(config_obj("off", NS, {"storageInitializer": {"enabled": False}}))
    meta, _ = await stores.mutate(llm_obj(base_refs=[{"name": "lora"}]))
    assert json.loads(meta["annotations"][LORA]) == {"a": {"cache": "adapter"}}
    meta, _ = await stores.mutate(llm_obj(base_refs=[{"name": "lora"}, {"name": "off"}]))
    assert LABEL not in meta.get("labels", {})
    assert LORA not in meta.get("annotations", {})


@pytest.mark.parametrize(
    ("setup", "refs", "reason"),
    [
        ("missing", [{"name": "gone"}], "exists in none of the namespaces kserve, team"),
        ("absent", [{"name": "base"}], "LLMInferenceServiceConfig kind is not served"),
        ("syncing", [{"name": "base"}], "still listing LLMInferenceServiceConfigs"),
        ("unnamed", [{}], "spec.baseRefs[0] has no name"),
        ("many", [{"name": "base"}] * 17, "lists 17 configurations, more than the 16"),
        ("template", [{"name": "tmpl"}], "holds a template"),
    ],
)
async def test_unresolved_base_refs_warn_and_leave_the_keys(
    setup: str, refs: list[dict[str, str]], reason: str
) -> None:
    stores = cached()
    stores.configs.upsert(config_obj("base", NS, {"model": {"uri": "hf://org/llama"}}))
    stores.configs.upsert(config_obj("tmpl", NS, {"model": {"uri": "hf://{{ .Name }}"}}))
    stores.configs_served = setup != "absent"
    stores.configs_syncing = setup == "syncing"
    obj = llm_obj(None, base_refs=refs, labels=STALE[0], annotations=STALE[1])
    meta, warnings = await stores.mutate(obj)
    assert meta["labels"] == STALE[0]
    assert meta["annotations"] == STALE[1]
    assert any(reason in w and "spec.baseRefs not resolved" in w for w in warnings), warnings


async def test_unresolved_base_refs_still_match_the_llmisvcs_own_uri() -> None:
    stores = cached()
    meta, warnings = await stores.mutate(llm_obj(base_refs=[{"name": "gone"}]))
    assert meta["labels"] == {LABEL: "llama"}
    assert len(warnings) == 1


def test_a_config_is_looked_up_in_the_llmisvc_namespace_then_kserves() -> None:
    asked: list[tuple[str, str]] = []

    def lookup(namespace: str, name: str) -> dict[str, Any] | None:
        asked.append((namespace, name))
        return None

    spec = llm_api.LLMInferenceServiceSpec.from_dict({"baseRefs": [{"name": "x"}]})
    resolved = llmbase.resolve(spec, namespace=NS, kserve_namespace=KSERVE, lookup=lookup)
    assert asked == [(NS, "x"), (KSERVE, "x")]
    assert resolved.unresolved is not None


# ------------------------------------------------------------------ LoRA


async def test_lora_adapters_are_matched_and_written_as_kserve_writes_them() -> None:
    stores = cached()
    stores.namespace_caches.upsert(cache_obj("ns-adapter", "hf://org/b&c", namespace=NS))
    adapters = [
        {"name": "zeta", "uri": "hf://org/adapter/v2"},
        {"name": "alpha", "uri": "hf://org/b&c"},
        {"name": "remote", "uri": "hf://elsewhere/x"},
    ]
    meta, warnings = await stores.mutate(llm_obj(adapters=adapters))
    assert warnings == ()
    assert meta["annotations"][LORA] == (
        '{"alpha":{"cache":"ns-adapter","namespace":"team"},"zeta":{"cache":"adapter"}}'
    )
    assert meta["labels"] == {LABEL: "llama"}


async def test_the_lora_annotation_goes_when_no_adapter_matches() -> None:
    obj = llm_obj(adapters=[{"name": "r", "uri": "hf://elsewhere/x"}], annotations=STALE[1])
    meta, _ = await cached().mutate(obj)
    assert LORA not in meta["annotations"]


async def test_malformed_adapters_are_skipped_with_warnings_and_the_count_is_bounded() -> None:
    stores = cached()
    bad = [{"name": "a", "uri": "hf://org/adapter"}, "x", {"name": "b"}, {"uri": 3}]
    meta, warnings = await stores.mutate(llm_obj(adapters=bad))
    assert set(json.loads(meta["annotations"][LORA])) == {"a"}
    assert [w for w in warnings if "has no name or no uri" in w] == [
        f"spec.model.lora.adapters[{i}] has no name or no uri" for i in (1, 2, 3)
    ]
    many = [{"name": f"a{i}", "uri": "hf://org/adapter"} for i in range(70)]
    meta, warnings = await stores.mutate(llm_obj(adapters=many))
    assert len(json.loads(meta["annotations"][LORA])) == llmisvc.MAX_ADAPTERS
    assert any("only the first 64 of 70" in w for w in warnings)
    _, warnings = await stores.mutate(llm_obj(adapters={"name": "a"}))
    assert "spec.model.lora.adapters is not a list" in warnings


def test_the_config_informer_keeps_only_the_model_fields() -> None:
    obj = config_obj(
        "c", NS, {"model": {"uri": "hf://x"}, "template": {"containers": [{"name": "big"}]}}
    )
    slim = llmisvc.config_use(obj)
    assert slim["spec"] == {"model": {"uri": "hf://x"}}
    assert slim["metadata"]["name"] == "c"


# ------------------------------------------------------------------ node group fit (#5914)


async def test_the_node_group_follows_the_workload_templates_node_selector() -> None:
    """KServe #5914: an LLMInferenceService whose template asks for the second group's nodes
    gets that group's claim, not `nodeGroups[0]`; prefill templates must fit too."""
    stores = Stores()
    for model in GROUPS.values():
        stores.node_groups.upsert(model.model_dump(by_alias=True, exclude_none=True))
    stores.caches.upsert(
        {
            **cache_obj("llama", "hf://org/llama"),
            "spec": {
                "sourceModelUri": "hf://org/llama",
                "modelSize": "1Gi",
                "nodeGroups": ["a100", "h100"],
            },
        }
    )
    for node in NODES:
        stores.nodes.upsert(node)
    mutator = stores.mutator()
    obj = llm_obj()
    obj["spec"]["template"] = {"nodeSelector": {"gpu": "h100"}, "containers": []}
    answer = await mutator(request(obj))
    meta = apply(obj, answer.patch)["metadata"]
    assert meta["annotations"][PVC] == "llama-h100"
    assert answer.warnings == ()
    # a prefill template that only fits the other group: no group fits both, warned
    obj["spec"]["prefill"] = {"template": {"nodeSelector": {"gpu": "a100"}}}
    answer = await mutator(request(obj))
    assert apply(obj, answer.patch)["metadata"]["annotations"][PVC] == "llama-a100"
    assert any("spec.prefill.template" in w for w in answer.warnings), answer.warnings
