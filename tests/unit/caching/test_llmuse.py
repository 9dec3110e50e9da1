"""Which caches an LLMInferenceService uses: base-model labels and the LoRA annotation, each
proven by a URI; the annotation read defensively (tenant input)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import structlog

from localcache.api import inferenceservice
from localcache.caching import llmuse

URI = "hf://org/base"
LORA_URI = "hf://org/adapter"


def _llm(
    namespace: str = "team",
    *,
    labels: dict[str, str] | None = None,
    lora: Any = None,
    uri: str | None = URI,
    adapters: list[Any] | None = None,
) -> dict[str, Any]:
    annotations = {}
    if lora is not None:
        annotations[llmuse.LORA_ANNOTATION] = lora if isinstance(lora, str) else json.dumps(lora)
    model: dict[str, Any] = {}
    if uri is not None:
        model["uri"] = uri
    if adapters is not None:
        model["lora"] = {"adapters": adapters}
    return {
        "apiVersion": "serving.kserve.io/v1alpha2",
        "kind": "LLMInferenceService",
        "metadata": {
            "name": "chat",
            "namespace": namespace,
            "uid": "u1",
            "labels": labels or {},
            "annotations": annotations,
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {"model": model, "template": {"containers": [{"name": "main"}]}},
    }


BASE = {inferenceservice.LOCAL_MODEL_LABEL: "base"}
NS_BASE = {**BASE, inferenceservice.LOCAL_MODEL_NAMESPACE_LABEL: "team"}


def test_a_base_model_label_is_a_use_when_the_model_uri_is_the_caches() -> None:
    obj = _llm(labels=BASE)
    assert llmuse.used_caches(obj) == ["base"]
    assert llmuse.uses(obj, cache_namespace="", cache_name="base", cache_uri=URI) == [
        llmuse.Use("base model")
    ]
    assert llmuse.uses(obj, cache_namespace="", cache_name="base", cache_uri="hf://o/x") == []
    assert llmuse.uses(obj, cache_namespace="team", cache_name="base", cache_uri=URI) == []


def test_a_namespace_cache_label_counts_only_in_its_own_namespace() -> None:
    assert llmuse.used_caches(_llm(labels=NS_BASE)) == ["team/base"]
    assert llmuse.used_caches(_llm("other", labels=NS_BASE)) == []
    assert llmuse.uses(
        _llm(labels=NS_BASE), cache_namespace="team", cache_name="base", cache_uri=URI
    )


def test_a_model_uri_absent_from_the_spec_proves_no_use_without_base_refs() -> None:
    obj = _llm(labels=BASE, uri=None)
    obj["metadata"]["annotations"][inferenceservice.LOCAL_MODEL_SOURCE_URI_ANNOTATION] = URI
    assert llmuse.used_caches(obj) == ["base"]
    assert llmuse.uses(obj, cache_namespace="", cache_name="base", cache_uri=URI) == []


def test_a_model_from_base_refs_is_proven_by_the_uri_the_webhook_recorded() -> None:
    obj = _llm(labels=BASE, uri=None)
    obj["spec"]["baseRefs"] = [{"name": "llama-preset"}]
    assert llmuse.uses(obj, cache_namespace="", cache_name="base", cache_uri=URI) == []
    obj["metadata"]["annotations"][inferenceservice.LOCAL_MODEL_SOURCE_URI_ANNOTATION] = URI
    assert llmuse.uses(obj, cache_namespace="", cache_name="base", cache_uri=URI) == [
        llmuse.Use("base model")
    ]
    assert llmuse.uses(obj, cache_namespace="", cache_name="base", cache_uri="hf://o/x") == []
    slim = llmuse.slim(obj)
    assert llmuse.uses(slim, cache_namespace="", cache_name="base", cache_uri=URI) == [
        llmuse.Use("base model")
    ]


def test_a_lora_adapter_from_base_refs_is_proven_by_its_entrys_source_uri() -> None:
    entry = {"cache": "adapters", "sourceUri": LORA_URI}
    obj = _llm(uri=None, lora={"colorist": entry})
    assert llmuse.uses(obj, cache_namespace="", cache_name="adapters", cache_uri=LORA_URI) == []
    obj["spec"]["baseRefs"] = [{"name": "with-adapters"}]
    found = llmuse.uses(
        llmuse.slim(obj), cache_namespace="", cache_name="adapters", cache_uri=LORA_URI
    )
    assert found == [llmuse.Use("LoRA adapter", "colorist")]
    assert llmuse.uses(obj, cache_namespace="", cache_name="adapters", cache_uri=URI) == []
    # adapters in the spec itself are the proof whenever there are any
    obj["spec"]["model"]["lora"] = {"adapters": [{"name": "x", "uri": "hf://org/other"}]}
    assert llmuse.uses(obj, cache_namespace="", cache_name="adapters", cache_uri=LORA_URI) == []


def test_a_lora_adapter_is_a_use_of_the_cache_its_annotation_names() -> None:
    obj = _llm(
        lora={"colorist": {"cache": "adapters"}, "poet": {"cache": "mine", "namespace": "team"}},
        adapters=[{"name": "colorist", "uri": LORA_URI}, {"name": "poet", "uri": "s3://b/poet"}],
    )
    assert llmuse.used_caches(obj) == ["adapters", "team/mine"]
    assert llmuse.uses(obj, cache_namespace="", cache_name="adapters", cache_uri=LORA_URI) == [
        llmuse.Use("LoRA adapter", "colorist")
    ]
    assert llmuse.uses(obj, cache_namespace="team", cache_name="mine", cache_uri="s3://b/poet")
    not_served = llmuse.uses(obj, cache_namespace="", cache_name="adapters", cache_uri="s3://x")
    assert not_served == [], "an annotation alone proves nothing"


def test_a_lora_entry_naming_another_namespace_is_ignored() -> None:
    obj = _llm(lora={"a": {"cache": "theirs", "namespace": "other"}}, adapters=[{"uri": LORA_URI}])
    assert llmuse.used_caches(obj) == []
    assert llmuse.uses(obj, cache_namespace="other", cache_name="theirs", cache_uri=LORA_URI) == []


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        (json.dumps({"a": "adapters"}), "is not an object"),
        (json.dumps({"a": {"namespace": "team"}}), "names no cache"),
        (json.dumps({"a": {"cache": 3}}), "names no cache"),
        (json.dumps({f"a{i}": {"cache": "c"} for i in range(65)}), "more than 64 entries"),
        (json.dumps({"a": {"cache": "c", "pad": "x" * 20000}}), "longer than 16384"),
    ],
)
def test_an_unreadable_lora_annotation_is_no_use(raw: str, why: str) -> None:
    parsed = llmuse.parse_lora(raw)
    assert isinstance(parsed, str)
    assert why in parsed
    assert llmuse.lora_entries(_llm(lora=raw, adapters=[{"uri": LORA_URI}])) == []


def test_the_informer_transform_keeps_what_decides_a_use_and_logs_a_bad_annotation_once() -> None:
    good = _llm(labels=BASE, lora={"a": {"cache": "adapters"}}, adapters=[{"uri": LORA_URI}])
    slim = llmuse.slim(good)
    assert slim["spec"] == {"model": {"uri": URI, "lora": {"adapters": [{"uri": LORA_URI}]}}}
    assert "managedFields" not in slim["metadata"]
    assert llmuse.used_caches(slim) == llmuse.used_caches(good)
    bad = _llm(lora="{oops")
    with structlog.testing.capture_logs() as logs:
        slim_bad = llmuse.slim(bad)
    assert llmuse.LORA_ANNOTATION not in slim_bad["metadata"]["annotations"]
    events = [e for e in logs if e["event"] == "llmisvc_lora_annotation_ignored"]
    assert len(events) == 1
    assert (events[0]["name"], events[0]["reason"]) == ("chat", "not JSON")


def test_proven_keeps_only_users_of_a_namespace_caches_namespace() -> None:
    here, there = _llm(labels=NS_BASE), _llm("other", labels=NS_BASE)
    found = llmuse.proven([here, there], cache_namespace="team", cache_name="base", cache_uri=URI)
    assert [obj["metadata"]["namespace"] for obj, _ in found] == ["team"]
