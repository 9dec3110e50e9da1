"""coreschema: core/v1 schemas extracted from Kubernetes' OpenAPI into the CRD dialect, and the
checked-in extraction is exactly what the module of the version we build produces."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcache.api import coreschema
from localcache.api.quantity import CRD_PATTERN

REF = "#/components/schemas/"
MODULE_OPENAPI = coreschema.module_openapi()
needs_module = pytest.mark.skipif(
    MODULE_OPENAPI is None,
    reason=(
        f"k8s.io/kubernetes@{coreschema.KUBERNETES_VERSION} is not in the Go module cache "
        "(`make control-plane` or `python -m localcache.api.coreschema` fetches it)"
    ),
)


def _openapi(**definitions: dict[str, Any]) -> dict[str, Any]:
    named = {coreschema.CORE + name: value for name, value in definitions.items()}
    return {"components": {"schemas": named}}


def _nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _nodes(child, f"{path}.{name}")
    if "items" in node:
        yield from _nodes(node["items"], f"{path}[]")
    if "additionalProperties" in node:
        yield from _nodes(node["additionalProperties"], f"{path}{{}}")


@needs_module
def test_checked_in_schemas_are_what_the_module_produces() -> None:
    assert MODULE_OPENAPI is not None
    fresh = coreschema.render(coreschema.extract(json.loads(MODULE_OPENAPI.read_text())))
    assert coreschema.DATA_FILE.read_text() == fresh, (
        "corev1-schemas.json is stale: run `python -m localcache.api.coreschema`"
    )


@needs_module
def test_check_mode_passes_on_the_checked_in_file() -> None:
    assert coreschema.main(["--check", "--no-download"]) == 0


def test_checked_in_file_names_its_source_and_types() -> None:
    data = coreschema.load()
    assert data["source"] == (
        f"k8s.io/kubernetes@{coreschema.KUBERNETES_VERSION} {coreschema.OPENAPI_FILE}"
    )
    assert set(data["schemas"]) == set(coreschema.TYPES)


@pytest.mark.parametrize("name", coreschema.TYPES)
def test_checked_in_schemas_are_structural(name: str) -> None:
    for path, node in _nodes(coreschema.load()["schemas"][name]):
        assert not {"$ref", "allOf", "oneOf", "default"} & set(node), path
        assert "x-kubernetes-preserve-unknown-fields" not in node, path
        assert node.get("type") or node.get("x-kubernetes-int-or-string"), path
        assert node.get("description") or path.endswith(("[]", "}")), f"{path} undescribed"


def test_checked_in_pv_spec_refuses_what_kserve_refuses() -> None:
    pv = coreschema.load()["schemas"]["PersistentVolumeSpec"]["properties"]
    assert pv["hostPath"]["required"] == ["path"]
    assert pv["accessModes"]["type"] == "array"
    assert pv["capacity"]["additionalProperties"]["pattern"] == CRD_PATTERN
    assert pv["nodeAffinity"]["properties"]["required"]["required"] == ["nodeSelectorTerms"]
    pvc = coreschema.load()["schemas"]["PersistentVolumeClaimSpec"]["properties"]
    requests = pvc["resources"]["properties"]["requests"]["additionalProperties"]
    assert requests["x-kubernetes-int-or-string"] is True


# The `required` lists of KServe's controller-gen CRD (config/crd/full/localmodel) for these
# two fields. Ours must not require more, or input KServe accepts would be refused.
KSERVE_REQUIRED = {
    "PersistentVolumeClaimSpec.dataSource": {"kind", "name"},
    "PersistentVolumeClaimSpec.dataSourceRef": {"kind", "name"},
    "PersistentVolumeClaimSpec.selector.matchExpressions[]": {"key", "operator"},
    "PersistentVolumeSpec.awsElasticBlockStore": {"volumeID"},
    "PersistentVolumeSpec.azureDisk": {"diskName", "diskURI"},
    "PersistentVolumeSpec.azureFile": {"secretName", "shareName"},
    "PersistentVolumeSpec.cephfs": {"monitors"},
    "PersistentVolumeSpec.cinder": {"volumeID"},
    "PersistentVolumeSpec.csi": {"driver", "volumeHandle"},
    "PersistentVolumeSpec.flexVolume": {"driver"},
    "PersistentVolumeSpec.gcePersistentDisk": {"pdName"},
    "PersistentVolumeSpec.glusterfs": {"endpoints", "path"},
    "PersistentVolumeSpec.hostPath": {"path"},
    "PersistentVolumeSpec.iscsi": {"iqn", "lun", "targetPortal"},
    "PersistentVolumeSpec.local": {"path"},
    "PersistentVolumeSpec.nfs": {"path", "server"},
    "PersistentVolumeSpec.nodeAffinity.required": {"nodeSelectorTerms"},
    "PersistentVolumeSpec.nodeAffinity.required.nodeSelectorTerms[].matchExpressions[]": {
        "key",
        "operator",
    },
    "PersistentVolumeSpec.nodeAffinity.required.nodeSelectorTerms[].matchFields[]": {
        "key",
        "operator",
    },
    "PersistentVolumeSpec.photonPersistentDisk": {"pdID"},
    "PersistentVolumeSpec.portworxVolume": {"volumeID"},
    "PersistentVolumeSpec.quobyte": {"registry", "volume"},
    "PersistentVolumeSpec.rbd": {"image", "monitors"},
    "PersistentVolumeSpec.scaleIO": {"gateway", "secretRef", "system"},
    "PersistentVolumeSpec.vsphereVolume": {"volumePath"},
}


def test_no_field_is_required_that_kserve_does_not_require() -> None:
    required = {
        f"{name}{path}": set(node["required"])
        for name, schema in coreschema.load()["schemas"].items()
        for path, node in _nodes(schema)
        if "required" in node
    }
    assert required == KSERVE_REQUIRED


@pytest.mark.parametrize("name", coreschema.TYPES)
def test_no_value_constraint_beyond_kserves(name: str) -> None:
    """KServe's CRD constrains values only by type and the quantity pattern: no enums, no
    lengths, no CEL. Neither may ours, or values KServe stores would be refused."""
    for path, node in _nodes(coreschema.load()["schemas"][name]):
        extra = set(node) & {"enum", "minLength", "maxLength", "minItems", "maxItems", "minimum"}
        assert not extra, path
        assert "x-kubernetes-validations" not in node, path
        assert node.get("pattern", CRD_PATTERN) == CRD_PATTERN, path


def test_refs_are_inlined_and_the_field_description_wins() -> None:
    openapi = _openapi(
        Spec={
            "type": "object",
            "description": "Spec.",
            "properties": {
                "inner": {"allOf": [{"$ref": REF + coreschema.CORE + "Inner"}], "description": "F"},
                "bare": {"$ref": REF + coreschema.CORE + "Inner"},
            },
        },
        Inner={"type": "object", "description": "Inner type.", "properties": {}},
    )
    out = coreschema.structural(openapi, "Spec")
    assert out["properties"]["inner"] == {"type": "object", "description": "F", "properties": {}}
    assert out["properties"]["bare"]["description"] == "Inner type."


def test_quantities_become_int_or_string_with_the_quantity_pattern() -> None:
    openapi = _openapi(
        Spec={
            "type": "object",
            "properties": {
                "capacity": {
                    "type": "object",
                    "additionalProperties": {"$ref": REF + coreschema.QUANTITY},
                },
                "port": {"allOf": [{"$ref": REF + coreschema.INT_OR_STRING}], "description": "P"},
            },
        }
    )
    props = coreschema.structural(openapi, "Spec")["properties"]
    assert props["capacity"]["additionalProperties"] == {
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": CRD_PATTERN,
        "x-kubernetes-int-or-string": True,
    }
    assert props["port"]["x-kubernetes-int-or-string"] is True
    assert "pattern" not in props["port"]


def test_defaults_are_dropped_so_required_fields_stay_required() -> None:
    openapi = _openapi(
        Source={
            "type": "object",
            "required": ["path"],
            "properties": {"path": {"type": "string", "default": ""}},
        }
    )
    assert coreschema.structural(openapi, "Source") == {
        "type": "object",
        "required": ["path"],
        "properties": {"path": {"type": "string"}},
    }


def test_list_and_map_annotations_and_formats_are_kept() -> None:
    annotations = {
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
    }
    openapi = _openapi(
        Spec={
            "type": "object",
            "x-kubernetes-map-type": "atomic",
            "properties": {
                "list": {"type": "array", "items": {"type": "string"}, **annotations},
                "lun": {"type": "integer", "format": "int32"},
            },
        }
    )
    out = coreschema.structural(openapi, "Spec")
    assert out["x-kubernetes-map-type"] == "atomic"
    assert out["properties"]["list"] == {
        "type": "array",
        "items": {"type": "string"},
        **annotations,
    }
    assert out["properties"]["lun"]["format"] == "int32"


@pytest.mark.parametrize(
    ("definitions", "message"),
    [
        ({"Spec": {"type": "object", "x-kubernetes-validations": []}}, "no reviewed CRD form"),
        ({"Spec": {"oneOf": [{"type": "string"}, {"type": "number"}]}}, "no reviewed CRD form"),
        ({"Spec": {"description": "no type"}}, "not structural"),
        (
            {
                "Spec": {
                    "type": "object",
                    "properties": {"me": {"$ref": REF + coreschema.CORE + "Spec"}},
                }
            },
            "recursive type",
        ),
        ({"Spec": {"$ref": REF + coreschema.CORE + "Missing"}}, "no definition"),
    ],
    ids=["unknown-keyword", "oneOf", "untyped", "recursive", "dangling-ref"],
)
def test_what_crds_cannot_express_fails_loudly(
    definitions: dict[str, dict[str, Any]], message: str
) -> None:
    with pytest.raises(coreschema.SchemaError, match=message):
        coreschema.structural(_openapi(**definitions), "Spec")


def test_check_mode_reports_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    openapi = _openapi(
        **{name: {"type": "object", "description": name} for name in coreschema.TYPES}
    )
    source = tmp_path / "openapi.json"
    source.write_text(json.dumps(openapi))
    monkeypatch.setattr(coreschema, "module_openapi", lambda: source)
    monkeypatch.setattr(coreschema, "DATA_FILE", tmp_path / "corev1-schemas.json")
    assert coreschema.main(["--check", "--no-download"]) == 1
    assert coreschema.main(["--no-download"]) == 0
    assert coreschema.main(["--check", "--no-download"]) == 0
    written = json.loads((tmp_path / "corev1-schemas.json").read_text())
    assert written["schemas"]["PersistentVolumeSpec"] == {
        "type": "object",
        "description": "PersistentVolumeSpec",
    }
