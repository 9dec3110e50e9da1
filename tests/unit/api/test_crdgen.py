"""The generated CRDs: names from groupversion, structural schemas with descriptions and the
validations the API contract needs, printer columns that point at real fields."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from localcache.api import coreschema, crdgen, groupversion, schema
from localcache.api.quantity import CRD_PATTERN

CRDS = {source.info.kind: crdgen.crd(source) for source in crdgen.SOURCES}


def _root(kind: str) -> dict[str, Any]:
    root: dict[str, Any] = CRDS[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return root


def _at(kind: str, *path: str) -> dict[str, Any]:
    node = _root(kind)
    for part in path:
        node = node["items"] if part == "[]" else node["properties"][part]
    return node


def _walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


def test_every_own_kind_has_a_crd_and_only_those() -> None:
    assert set(CRDS) == {info.kind for info in groupversion.OWN_KINDS}
    assert groupversion.INFERENCE_SERVICE.kind not in CRDS
    assert groupversion.CLUSTER_STORAGE_CONTAINER.kind not in CRDS


@pytest.mark.parametrize("info", groupversion.OWN_KINDS, ids=lambda i: i.kind)
def test_crd_names_come_from_groupversion(info: groupversion.KindInfo) -> None:
    crd = CRDS[info.kind]
    assert crd["metadata"]["name"] == f"{info.plural}.serving.kserve.io"
    spec = crd["spec"]
    assert spec["group"] == "serving.kserve.io"
    assert spec["scope"] == ("Namespaced" if info.namespaced else "Cluster")
    assert spec["names"] == {
        "kind": info.kind,
        "listKind": f"{info.kind}List",
        "plural": info.plural,
        "singular": info.kind.lower(),
        "shortNames": list(info.short_names),
        "categories": ["localmodel"],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert ("subresources" in version) == info.status_subresource


def test_short_names_and_status_subresources_match_the_reference() -> None:
    short = {i.kind: i.short_names for i in groupversion.OWN_KINDS}
    assert short == {
        "LocalModelCache": ("lmc",),
        "LocalModelNamespaceCache": ("lmnc",),
        "LocalModelNode": ("lmn",),
        "LocalModelNodeGroup": ("lmng",),
    }
    assert not groupversion.LOCAL_MODEL_NODE_GROUP.status_subresource
    assert groupversion.LOCAL_MODEL_NAMESPACE_CACHE.namespaced
    assert not groupversion.LOCAL_MODEL_CACHE.namespaced


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_schemas_are_structural_and_described(kind: str) -> None:
    for path, node in _walk(_root(kind), kind):
        typed = "type" in node
        int_or_string = node.get("x-kubernetes-int-or-string") is True
        assert typed or int_or_string, f"{path} has no type"
        if int_or_string:
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}]
        if path.count(".") >= 1 and not path.endswith((".metadata", "[]", "}")):
            assert node.get("description"), f"{path} has no description"


@pytest.mark.parametrize("kind", ["LocalModelCache", "LocalModelNamespaceCache"])
def test_cache_spec_carries_the_reference_validations(kind: str) -> None:
    spec = _at(kind, "spec")
    if kind == "LocalModelCache":
        assert spec["required"] == ["modelSize", "nodeGroups", "sourceModelUri"]
    else:  # KServe #6107: nodeGroups or pvcRef, exactly one
        assert spec["required"] == ["modelSize", "sourceModelUri"]
    assert _at(kind, "spec", "sourceModelUri")["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "StorageUri is immutable"}
    ]
    assert _at(kind, "spec", "nodeGroups")["minItems"] == 1
    size = _at(kind, "spec", "modelSize")
    assert size["pattern"] == CRD_PATTERN
    assert size["x-kubernetes-int-or-string"] is True
    assert set(_at(kind, "spec", "storage")["properties"]) == {"key", "parameters"}
    assert _at(kind, "status", "nodeStatus")["additionalProperties"]["enum"] == [
        "",
        "NodeNotReady",
        "NodeDownloadPending",
        "NodeDownloading",
        "NodeDownloaded",
        "NodeDownloadError",
    ]

    assert set(_at(kind, "status", "copies")["properties"]) == {"available", "total", "failed"}
    conditions = _at(kind, "status", "conditions")
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["items"]["required"] == [
        "lastTransitionTime",
        "message",
        "reason",
        "status",
        "type",
    ]


@pytest.mark.parametrize(
    ("kind", "path"),
    [
        ("LocalModelCache", ("spec", "modelSize")),
        ("LocalModelNamespaceCache", ("spec", "modelSize")),
        ("LocalModelNodeGroup", ("spec", "storageLimit")),
    ],
)
def test_sizes_must_be_positive_in_the_schema(kind: str, path: tuple[str, ...]) -> None:
    (validation,) = _at(kind, *path)["x-kubernetes-validations"]
    assert "quantity(self).isGreaterThan(quantity('0'))" in validation["rule"]
    assert "self > 0" in validation["rule"]  # the integer form of int-or-string
    assert validation["message"] == f"{path[-1]} must be greater than zero"


def test_namespace_cache_spec_has_kserves_shared_volume_rules() -> None:
    spec = _at("LocalModelNamespaceCache", "spec")
    assert spec["x-kubernetes-validations"] == [
        {
            "rule": "!(has(self.nodeGroups) && has(self.pvcRef))",
            "message": "nodeGroups and pvcRef are mutually exclusive",
        },
        {
            "rule": "has(self.nodeGroups) || has(self.pvcRef)",
            "message": "exactly one of nodeGroups or pvcRef must be set",
        },
    ]
    pvc_ref = _at("LocalModelNamespaceCache", "spec", "pvcRef")
    assert pvc_ref["maxLength"] == 253
    assert pvc_ref["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "pvcRef is immutable"}
    ]
    assert "pvcRef" not in _at("LocalModelCache", "spec")["properties"]


def test_cache_kinds_share_one_spec_and_status_schema() -> None:
    cluster = _at("LocalModelCache", "spec")["properties"]
    namespaced = dict(_at("LocalModelNamespaceCache", "spec")["properties"])
    del namespaced["pvcRef"]
    assert namespaced.keys() == cluster.keys()
    for name, field in cluster.items():
        if name != "nodeGroups":  # the namespace cache's names pvcRef in its description
            assert namespaced[name] == field, name
    assert _at("LocalModelCache", "status") == _at("LocalModelNamespaceCache", "status")


def test_only_the_cache_uri_is_immutable() -> None:
    entry = _at("LocalModelNode", "spec", "localModels", "[]")
    assert "x-kubernetes-validations" not in entry["properties"]["sourceModelUri"]
    assert entry["required"] == ["modelName", "sourceModelUri"]
    assert set(entry["properties"]) == {
        "sourceModelUri",
        "modelName",
        "namespace",
        "nodeGroup",
        "serviceAccountName",
        "storage",
    }


def test_model_status_keeps_the_reference_enum() -> None:
    model_status = _at("LocalModelNode", "status", "modelStatus")
    assert model_status["additionalProperties"] == {
        "type": "string",
        "enum": [
            "",
            "ModelDownloadPending",
            "ModelDownloading",
            "ModelDownloaded",
            "ModelDownloadError",
        ],
    }
    assert _at("LocalModelNode", "spec")["required"] == ["localModels"]


def test_node_group_pv_specs_have_the_core_schemas() -> None:
    spec = _at("LocalModelNodeGroup", "spec")
    assert spec["required"] == [
        "persistentVolumeClaimSpec",
        "persistentVolumeSpec",
        "storageLimit",
    ]
    for name, core in (
        ("persistentVolumeSpec", "PersistentVolumeSpec"),
        ("persistentVolumeClaimSpec", "PersistentVolumeClaimSpec"),
    ):
        field = spec["properties"][name]
        assert "x-kubernetes-preserve-unknown-fields" not in field
        assert field["type"] == "object"
        assert field["properties"] == coreschema.load()["schemas"][core]["properties"]
        assert field["description"].startswith("core/v1 ")
    host_path = _at("LocalModelNodeGroup", "spec", "persistentVolumeSpec", "hostPath")
    assert host_path["required"] == ["path"]
    assert _at("LocalModelNodeGroup", "spec", "storageLimit")["pattern"] == CRD_PATTERN
    assert _at("LocalModelNodeGroup", "status", "used")["x-kubernetes-int-or-string"] is True
    assert _at("LocalModelNodeGroup", "spec", "tolerations")["type"] == "array"


def _resolves(kind: str, json_path: str) -> bool:
    node = _root(kind)
    for part in json_path.lstrip(".").split("."):
        if part == "metadata":
            return True
        node = node.get("properties", {}).get(part, {})
        if not node:
            return False
        if node.get("type") == "array":
            node = node["items"]
    return True


def _without_filters(json_path: str) -> str:
    return re.sub(r"\[[^\]]*\]", "", json_path)


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_printer_columns_point_at_schema_fields(kind: str) -> None:
    columns = CRDS[kind]["spec"]["versions"][0]["additionalPrinterColumns"]
    assert columns[-1]["name"] == "Age"
    for column in columns:
        assert _resolves(kind, _without_filters(column["jsonPath"])), column


def test_printer_columns_show_what_the_spec_promises() -> None:
    def names(kind: str) -> list[str]:
        columns = CRDS[kind]["spec"]["versions"][0]["additionalPrinterColumns"]
        return [c["name"] for c in columns if not c.get("priority")]

    assert names("LocalModelCache") == ["URI", "Available", "Total", "Ready", "Age"]
    assert names("LocalModelNamespaceCache") == names("LocalModelCache")
    assert names("LocalModelNode") == ["Models", "Downloaded", "Failed", "Age"]
    assert names("LocalModelNodeGroup") == ["Limit", "Used", "Available", "Age"]


def test_generation_is_deterministic() -> None:
    assert crdgen.generate() == crdgen.generate()
    kustomization = crdgen.generate()[crdgen.KUSTOMIZATION]
    for info in groupversion.OWN_KINDS:
        assert f"- {info.plural}.yaml" in kustomization


def test_unsupported_field_types_fail_loudly() -> None:
    with pytest.raises(TypeError, match="no CRD schema"):
        schema.type_schema(float)
    with pytest.raises(TypeError, match="unions"):
        schema.type_schema(int | str)
