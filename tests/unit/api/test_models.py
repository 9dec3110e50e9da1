"""The API models: reference-shaped objects round-trip unchanged, typed access works, and
invalid objects fail naming the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from localcache.api import (
    groupversion,
    inferenceservice,
    meta,
    modelcache,
    modelnode,
    nodegroup,
    storage,
)
from localcache.api.quantity import Quantity

EXAMPLES = list(yaml.safe_load_all((Path(__file__).parent / "examples.yaml").read_text()))
MODELS: dict[str, type[meta.KubeObject]] = {
    "LocalModelCache": modelcache.LocalModelCache,
    "LocalModelNamespaceCache": modelcache.LocalModelNamespaceCache,
    "LocalModelNode": modelnode.LocalModelNode,
    "LocalModelNodeGroup": nodegroup.LocalModelNodeGroup,
    "ClusterStorageContainer": storage.ClusterStorageContainer,
    "InferenceService": inferenceservice.InferenceService,
}


def _example(kind: str, name: str) -> dict[str, Any]:
    for doc in EXAMPLES:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return copy.deepcopy(doc)
    raise LookupError(f"no example {kind} {name}")


@pytest.mark.parametrize(
    "doc", EXAMPLES, ids=[f"{d['kind']}-{d['metadata']['name']}" for d in EXAMPLES]
)
def test_example_objects_round_trip_unchanged(doc: dict[str, Any]) -> None:
    model = MODELS[doc["kind"]]
    parsed = model.model_validate(copy.deepcopy(doc))
    assert parsed.to_dict() == doc
    assert parsed.model_dump(by_alias=True, exclude_none=True, mode="json") == doc
    # And through JSON text, as the API client sends it.
    assert json.loads(json.dumps(parsed.to_dict())) == doc


def test_every_kind_has_an_example() -> None:
    assert {doc["kind"] for doc in EXAMPLES} == set(MODELS)


def test_unknown_fields_survive_at_every_level() -> None:
    doc = _example("LocalModelCache", "iris")
    doc["topLevelExtra"] = {"a": 1}
    doc["metadata"]["labels"] = {"x": "y"}
    doc["metadata"]["somethingNew"] = True
    doc["spec"]["futureSpecField"] = ["v"]
    doc["spec"]["storage"] = {"key": "k", "futureStorageField": {"deep": None}}
    doc["status"]["copies"]["futureCount"] = 7
    parsed = modelcache.LocalModelCache.model_validate(copy.deepcopy(doc))
    assert parsed.to_dict() == doc


def test_cache_fields_are_typed() -> None:
    cache = modelcache.LocalModelCache.model_validate(_example("LocalModelCache", "iris"))
    assert cache.name == "iris"
    assert cache.namespace == ""
    assert cache.spec.source_model_uri == "s3://mybucket/mymodel"
    assert cache.spec.model_size == Quantity("251Mi")
    assert cache.spec.node_groups == ["gpu1", "gpu2"]
    assert cache.status is not None
    assert cache.status.node_status == {
        "node-1": modelcache.NodeStatus.DOWNLOADED,
        "node-2": modelcache.NodeStatus.DOWNLOADED,
    }
    assert cache.status.copies is not None
    assert cache.status.copies.failed is None  # omitted by KServe when zero
    assert cache.metadata.finalizers == [modelcache.FINALIZER]


def test_integer_model_size_stays_an_integer() -> None:
    cache = modelcache.LocalModelCache.model_validate(_example("LocalModelCache", "s3-model"))
    assert cache.spec.model_size == Quantity("5Gi")
    assert cache.to_dict()["spec"]["modelSize"] == 5368709120


def test_conditions_parse_to_the_standard_shape() -> None:
    cache = modelcache.LocalModelCache.model_validate(_example("LocalModelCache", "s3-model"))
    assert cache.status is not None
    assert cache.status.conditions is not None
    ready = cache.status.conditions[0]
    assert ready.type == modelcache.CONDITION_READY
    assert ready.status is meta.ConditionStatus.FALSE
    assert ready.observed_generation == 1


def test_new_cache_built_in_code_serialises_to_kubernetes_json() -> None:
    cache = modelcache.LocalModelNamespaceCache(
        metadata=meta.ObjectMeta(name="m", namespace="ns"),
        spec=modelcache.LocalModelNamespaceCacheSpec(
            source_model_uri="gs://b/m",
            model_size=Quantity("1Gi"),
            node_groups=["g"],
            storage=storage.LocalModelStorageSpec(key="k"),
        ),
    )
    assert cache.to_dict() == {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "LocalModelNamespaceCache",
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {
            "sourceModelUri": "gs://b/m",
            "modelSize": "1Gi",
            "nodeGroups": ["g"],
            "storage": {"key": "k"},
        },
    }


def test_default_api_version_and_kind_come_from_groupversion() -> None:
    for kind, model in MODELS.items():
        info = groupversion.by_kind(kind)
        assert model.model_fields["api_version"].default == info.api_version
        assert model.model_fields["kind"].default == kind


def test_local_model_node_entries_and_status() -> None:
    node = modelnode.LocalModelNode.model_validate(_example("LocalModelNode", "node-1"))
    cluster_entry, ns_entry = node.spec.local_models
    assert (cluster_entry.namespace, cluster_entry.model_name) == (None, "iris")
    assert (ns_entry.namespace, ns_entry.model_name, ns_entry.node_group) == (
        "team-a",
        "ns-model",
        "sklearn-nodegroup",
    )
    assert ns_entry.storage is not None
    assert ns_entry.storage.parameters == {"bucket": "mybucket"}
    assert node.status is not None
    assert node.status.model_status is not None
    assert node.status.model_status["team-a/ns-model"] is modelnode.ModelStatus.DOWNLOADING
    assert node.status.model_progress is not None
    assert node.status.model_progress["team-a/ns-model"].attempts == 2


def test_summary_counts_model_status() -> None:
    summary = modelnode.ModelSummary.of(
        {
            "a": modelnode.ModelStatus.DOWNLOADED,
            "b": modelnode.ModelStatus.DOWNLOAD_ERROR,
            "ns/c": modelnode.ModelStatus.DOWNLOADED,
            "d": modelnode.ModelStatus.DOWNLOAD_PENDING,
        }
    )
    assert (summary.total, summary.downloaded, summary.failed) == (4, 2, 1)


def test_node_group_accessors_read_the_pv_spec() -> None:
    group = nodegroup.LocalModelNodeGroup.model_validate(_example("LocalModelNodeGroup", "gpu1"))
    assert group.spec.storage_limit == Quantity("2Gi")
    assert group.spec.local_path() == "/models"
    terms = group.spec.node_selector_terms()
    assert terms is not None
    assert terms[0]["matchExpressions"][0]["values"] == ["gpu1"]
    assert group.spec.tolerations is not None
    assert group.spec.tolerations[0].key == "nvidia.com/gpu"
    assert group.status is not None
    assert group.status.used == 0


def test_node_group_without_node_affinity_selects_nothing() -> None:
    doc = _example("LocalModelNodeGroup", "workers")
    del doc["spec"]["persistentVolumeSpec"]["nodeAffinity"]
    group = nodegroup.LocalModelNodeGroup.model_validate(doc)
    assert group.spec.node_selector_terms() is None
    assert group.spec.local_path() == "/models"


def test_storage_container_matches_prefix_then_regex() -> None:
    csc = storage.ClusterStorageContainer.model_validate(
        _example("ClusterStorageContainer", "default")
    )
    assert csc.workload_type == storage.WORKLOAD_INIT_CONTAINER
    assert not csc.is_disabled
    assert csc.supports_uri("gs://bucket/model")
    assert csc.supports_uri("https://acct.blob.core.windows.net/c/m")
    assert not csc.supports_uri("hf://org/model")
    job_csc = storage.ClusterStorageContainer.model_validate(
        _example("ClusterStorageContainer", "hf-downloader")
    )
    assert job_csc.workload_type == storage.WORKLOAD_LOCAL_MODEL_DOWNLOAD_JOB
    assert job_csc.supports_uri("hf://org/model")


def test_storage_container_with_bad_regex_names_itself() -> None:
    doc = _example("ClusterStorageContainer", "default")
    doc["spec"]["supportedUriFormats"] = [{"regex": "(unclosed"}]
    csc = storage.ClusterStorageContainer.model_validate(doc)
    with pytest.raises(ValueError, match="storage container default"):
        csc.supports_uri("gs://x")


@pytest.mark.parametrize("key", inferenceservice.PREDICTOR_KEYS)
def test_isvc_storage_uri_comes_from_every_predictor_key(key: str) -> None:
    isvc = inferenceservice.InferenceService.model_validate(
        {
            "metadata": {"name": "i", "namespace": "n"},
            "spec": {"predictor": {key: {"storageUri": f"gs://b/{key}", "runtime": "r"}}},
        }
    )
    assert isvc.storage_uri == f"gs://b/{key}"


def test_isvc_without_storage_uri_has_none() -> None:
    no_predictor = inferenceservice.InferenceService.model_validate({"metadata": {"name": "i"}})
    custom = inferenceservice.InferenceService.model_validate(
        {"metadata": {"name": "i"}, "spec": {"predictor": {"containers": [{"name": "c"}]}}}
    )
    no_uri = inferenceservice.InferenceService.model_validate(
        {"metadata": {"name": "i"}, "spec": {"predictor": {"model": {"runtime": "r"}}}}
    )
    assert no_predictor.storage_uri is None
    assert custom.storage_uri is None
    assert no_uri.storage_uri is None


def test_isvc_reads_user_annotations_and_labels() -> None:
    isvc = inferenceservice.InferenceService.model_validate(
        _example("InferenceService", "sklearn-iris")
    )
    assert isvc.storage_uri == "gs://kfserving-examples/models/sklearn/1.0/model"
    assert isvc.node_group == "gpu2"
    assert not isvc.local_model_disabled
    labelled = inferenceservice.InferenceService.model_validate(
        _example("InferenceService", "huggingface-llama3")
    )
    assert labelled.labels[inferenceservice.LOCAL_MODEL_LABEL] == "meta-llama3-8b-instruct"
    disabled = inferenceservice.InferenceService.model_validate(
        {"metadata": {"name": "i", "annotations": {"serving.kserve.io/disable-localmodel": ""}}}
    )
    assert disabled.local_model_disabled


@pytest.mark.parametrize(
    ("mutate", "location"),
    [
        (lambda d: d["spec"].pop("sourceModelUri"), ("spec", "sourceModelUri")),
        (lambda d: d["spec"].update(nodeGroups=[]), ("spec", "nodeGroups")),
        (lambda d: d["spec"].update(modelSize="lots"), ("spec", "modelSize")),
        (lambda d: d["spec"].update(modelSize=True), ("spec", "modelSize")),
        (lambda d: d["status"]["nodeStatus"].update(n="Bogus"), ("status", "nodeStatus", "n")),
    ],
    ids=["missing-uri", "empty-node-groups", "bad-size", "bool-size", "bad-node-status"],
)
def test_invalid_cache_fails_naming_the_field(mutate: Any, location: tuple[str, ...]) -> None:
    doc = _example("LocalModelCache", "iris")
    mutate(doc)
    with pytest.raises(pydantic.ValidationError) as caught:
        modelcache.LocalModelCache.model_validate(doc)
    assert [tuple(e["loc"]) for e in caught.value.errors()] == [location]


def test_bad_model_size_message_is_clear() -> None:
    doc = _example("LocalModelCache", "iris")
    doc["spec"]["modelSize"] = "lots"
    with pytest.raises(pydantic.ValidationError, match=r"spec\.modelSize[\s\S]*'lots'"):
        modelcache.LocalModelCache.model_validate(doc)


def test_unknown_model_status_value_is_rejected() -> None:
    doc = _example("LocalModelNode", "node-1")
    doc["status"]["modelStatus"]["iris"] = "Done"
    with pytest.raises(pydantic.ValidationError, match="modelStatus"):
        modelnode.LocalModelNode.model_validate(doc)
