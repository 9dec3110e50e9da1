"""The generated CRDs on the real apiserver: they install, the server enforces the API
contract with messages that name the field, and kubectl shows columns and descriptions."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcache.api import groupversion, modelcache, modelnode, nodegroup, peer
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until_sync

LMC = groupversion.LOCAL_MODEL_CACHE
LMNC = groupversion.LOCAL_MODEL_NAMESPACE_CACHE
LMN = groupversion.LOCAL_MODEL_NODE
LMNG = groupversion.LOCAL_MODEL_NODE_GROUP
CACHE_KINDS = [LMC, LMNC]
MERGE_PATCH = "application/merge-patch+json"
EXAMPLES = list(
    yaml.safe_load_all(
        (Path(__file__).resolve().parents[2] / "unit" / "api" / "examples.yaml").read_text()
    )
)


def _ns(info: groupversion.KindInfo, namespace: str) -> str | None:
    return namespace if info.namespaced else None


def _cache(info: groupversion.KindInfo, name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    metadata = {"name": name, "namespace": namespace} if info.namespaced else {"name": name}
    return {
        "apiVersion": info.api_version,
        "kind": info.kind,
        "metadata": metadata,
        "spec": {
            "sourceModelUri": "gs://bucket/model",
            "modelSize": "1Gi",
            "nodeGroups": ["gpu"],
            **spec,
        },
    }


def _node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": LMN.api_version,
        "kind": LMN.kind,
        "metadata": {"name": name},
        "spec": {"localModels": [{"sourceModelUri": "gs://bucket/model", "modelName": "m"}]},
    }


def _node_group(name: str, limit: Any = "10Gi") -> dict[str, Any]:
    return {
        "apiVersion": LMNG.api_version,
        "kind": LMNG.kind,
        "metadata": {"name": name},
        "spec": {
            "storageLimit": limit,
            "persistentVolumeSpec": {
                "capacity": {"storage": "10Gi"},
                "local": {"path": "/models"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": []}},
            },
            "persistentVolumeClaimSpec": {"resources": {"requests": {"storage": "10Gi"}}},
        },
    }


def _create(
    plane: ControlPlane, info: groupversion.KindInfo, body: dict[str, Any], namespace: str
) -> tuple[int, Any]:
    return plane.rest("POST", info.path(namespace=_ns(info, namespace)), body)


def _must_create(
    plane: ControlPlane, info: groupversion.KindInfo, body: dict[str, Any], namespace: str
) -> dict[str, Any]:
    status, created = _create(plane, info, body, namespace)
    assert status == 201, created
    return dict(created)


def _rejected(status: int, body: Any, *fragments: str) -> None:
    assert status == 422, body
    message = body["message"]
    for fragment in fragments:
        assert fragment in message, message


@pytest.fixture
def cleanup(control_plane: ControlPlane) -> Any:
    """Cluster-scoped objects to delete after the test (namespaced ones go with the ns)."""
    paths: list[str] = []
    yield paths
    for path in paths:
        control_plane.rest("DELETE", path)


def test_all_crds_install_and_are_established(control_plane: ControlPlane, crds: list[str]) -> None:
    read_only = (groupversion.LLM_INFERENCE_SERVICE, groupversion.LLM_INFERENCE_SERVICE_CONFIG)
    expected = {info.crd_name for info in (*groupversion.ALL_KINDS, *read_only)}
    assert set(crds) == expected
    for name in crds:
        status, body = control_plane.rest(
            "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
        )
        assert status == 200
        conditions = {c["type"]: c["status"] for c in body["status"]["conditions"]}
        assert conditions["Established"] == "True", name
        assert conditions["NamesAccepted"] == "True", name


@pytest.mark.parametrize("info", CACHE_KINDS, ids=lambda i: i.kind)
def test_cache_without_source_uri_is_rejected(
    control_plane: ControlPlane, crds: list[str], namespace: str, info: groupversion.KindInfo
) -> None:
    body = _cache(info, f"{namespace}-nouri", namespace)
    del body["spec"]["sourceModelUri"]
    _rejected(*_create(control_plane, info, body, namespace), "spec.sourceModelUri", "Required")


@pytest.mark.parametrize("info", CACHE_KINDS, ids=lambda i: i.kind)
def test_cache_with_empty_node_groups_is_rejected(
    control_plane: ControlPlane, crds: list[str], namespace: str, info: groupversion.KindInfo
) -> None:
    body = _cache(info, f"{namespace}-nogroups", namespace, nodeGroups=[])
    _rejected(*_create(control_plane, info, body, namespace), "spec.nodeGroups", "at least 1")


@pytest.mark.parametrize("info", CACHE_KINDS, ids=lambda i: i.kind)
def test_a_source_uri_over_the_length_limit_is_rejected(
    control_plane: ControlPlane,
    crds: list[str],
    namespace: str,
    info: groupversion.KindInfo,
    cleanup: list[str],
) -> None:
    """Security review finding 5: a 900 KB URI is copied into every LocalModelNode of its
    groups, which then pass etcd's size limit."""
    limit = modelcache.MAX_SOURCE_URI_LENGTH
    uri = "s3://bucket/" + "k" * 900_000
    body = _cache(info, f"{namespace}-long", namespace, sourceModelUri=uri)
    status, answer = _create(control_plane, info, body, namespace)
    _rejected(status, answer, "spec.sourceModelUri", f"may not be more than {limit} bytes")
    at_limit = "s3://bucket/" + "k" * (limit - len("s3://bucket/"))
    body = _cache(info, f"{namespace}-edge", namespace, sourceModelUri=at_limit)
    _must_create(control_plane, info, body, namespace)
    cleanup.append(info.path(namespace=_ns(info, namespace), name=f"{namespace}-edge"))


def test_a_node_entry_uri_over_the_length_limit_is_rejected(
    control_plane: ControlPlane, crds: list[str]
) -> None:
    body = _node("long-uri-node")
    body["spec"]["localModels"][0]["sourceModelUri"] = "s3://b/" + "k" * 5000
    status, answer = _create(control_plane, LMN, body, "")
    _rejected(status, answer, "sourceModelUri", "may not be more than")


@pytest.mark.parametrize("info", CACHE_KINDS, ids=lambda i: i.kind)
def test_changing_source_uri_is_rejected_as_immutable(
    control_plane: ControlPlane,
    crds: list[str],
    namespace: str,
    info: groupversion.KindInfo,
    cleanup: list[str],
) -> None:
    name = f"{namespace}-immutable"
    _must_create(control_plane, info, _cache(info, name, namespace), namespace)
    path = info.path(namespace=_ns(info, namespace), name=name)
    cleanup.append(path)
    status, body = control_plane.rest(
        "PATCH", path, {"spec": {"sourceModelUri": "gs://bucket/other"}}, content_type=MERGE_PATCH
    )
    _rejected(status, body, "spec.sourceModelUri", "StorageUri is immutable")
    # Other fields stay mutable.
    status, body = control_plane.rest(
        "PATCH", path, {"spec": {"nodeGroups": ["gpu", "cpu"]}}, content_type=MERGE_PATCH
    )
    assert status == 200, body


@pytest.mark.parametrize("info", CACHE_KINDS, ids=lambda i: i.kind)
def test_model_size_that_is_not_a_quantity_is_rejected(
    control_plane: ControlPlane, crds: list[str], namespace: str, info: groupversion.KindInfo
) -> None:
    body = _cache(info, f"{namespace}-lots", namespace, modelSize="lots")
    _rejected(*_create(control_plane, info, body, namespace), "spec.modelSize", "lots")


def test_storage_limit_that_is_not_a_quantity_is_rejected(
    control_plane: ControlPlane, crds: list[str], namespace: str
) -> None:
    body = _node_group(f"{namespace}-lots", limit="lots")
    _rejected(*_create(control_plane, LMNG, body, namespace), "spec.storageLimit", "lots")


def test_unknown_model_status_is_rejected_through_the_status_subresource(
    control_plane: ControlPlane, crds: list[str], namespace: str, cleanup: list[str]
) -> None:
    name = f"{namespace}-node"
    _must_create(control_plane, LMN, _node(name), namespace)
    path = LMN.path(name=name)
    cleanup.append(path)
    status, body = control_plane.rest(
        "PATCH",
        f"{path}/status",
        {"status": {"modelStatus": {"m": "ModelDownloaded"}}},
        content_type=MERGE_PATCH,
    )
    assert status == 200, body
    status, body = control_plane.rest(
        "PATCH",
        f"{path}/status",
        {"status": {"modelStatus": {"m": "Done"}}},
        content_type=MERGE_PATCH,
    )
    _rejected(status, body, "status.modelStatus.m", "Unsupported value", "ModelDownloaded")


def test_reference_examples_are_accepted_and_read_back_by_the_models(
    control_plane: ControlPlane, crds: list[str], namespace: str, cleanup: list[str]
) -> None:
    models = {
        LMC.kind: (LMC, modelcache.LocalModelCache),
        LMNC.kind: (LMNC, modelcache.LocalModelNamespaceCache),
        LMN.kind: (LMN, modelnode.LocalModelNode),
        LMNG.kind: (LMNG, nodegroup.LocalModelNodeGroup),
    }
    for index, example in enumerate(e for e in EXAMPLES if e["kind"] in models):
        info, model = models[example["kind"]]
        doc = copy.deepcopy(example)
        doc["metadata"] = {"name": f"{namespace}-ex{index}"}
        if info.namespaced:
            doc["metadata"]["namespace"] = namespace
        doc["spec"].pop("imagePullSecrets", None)  # a newer KServe field: pruned by our CRD
        created = _must_create(control_plane, info, doc, namespace)
        if not info.namespaced:
            cleanup.append(info.path(name=doc["metadata"]["name"]))
        parsed = model.model_validate(created)
        if info is LMNG:  # on by default (the apiserver fills it in)
            doc["spec"].setdefault("peerDistribution", peer.PeerDistributionSpec().to_dict())
            assert created["spec"]["peerDistribution"] == {"enabled": True}
        assert parsed.to_dict()["spec"] == doc["spec"]


def test_kubectl_get_shows_the_columns(
    control_plane: ControlPlane,
    crds: list[str],
    namespace: str,
    cleanup: list[str],
    tmp_path: Path,
) -> None:
    lmc, lmn, lmng = f"{namespace}-lmc", f"{namespace}-lmn", f"{namespace}-lmng"
    _must_create(control_plane, LMC, _cache(LMC, lmc, namespace), namespace)
    _must_create(control_plane, LMNC, _cache(LMNC, "nscache", namespace), namespace)
    _must_create(control_plane, LMN, _node(lmn), namespace)
    _must_create(control_plane, LMNG, _node_group(lmng), namespace)
    cleanup.extend([LMC.path(name=lmc), LMN.path(name=lmn), LMNG.path(name=lmng)])
    condition = {
        "type": "Ready",
        "status": "True",
        "reason": "AllDownloaded",
        "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    for path, patch in [
        (
            f"{LMC.path(name=lmc)}/status",
            {"status": {"copies": {"available": 1, "total": 2}, "conditions": [condition]}},
        ),
        (
            f"{LMN.path(name=lmn)}/status",
            {"status": {"summary": {"total": 3, "downloaded": 2, "failed": 1}}},
        ),
        (LMNG.path(name=lmng), {"status": {"used": "4Gi", "available": "6Gi"}}),
    ]:
        status, body = control_plane.rest("PATCH", path, patch, content_type=MERGE_PATCH)
        assert status == 200, body

    result = control_plane.kubectl(
        f"--cache-dir={tmp_path}", "get", "lmc,lmnc,lmn,lmng", "-A", check=False
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout

    def row(name: str) -> list[str]:
        lines = [line.split() for line in out.splitlines() if name in line.split()]
        assert len(lines) == 1, out
        return lines[0]

    headers = {
        word for line in out.splitlines() if line.startswith("NAME") for word in line.split()
    }
    assert {"URI", "AVAILABLE", "TOTAL", "READY", "AGE"} <= headers
    assert {"MODELS", "DOWNLOADED", "FAILED", "LIMIT", "USED", "NAMESPACE"} <= headers
    assert row(f"localmodelcache.serving.kserve.io/{lmc}")[1:5] == [
        "gs://bucket/model",
        "1",
        "2",
        "True",
    ]
    assert row(f"localmodelnode.serving.kserve.io/{lmn}")[1:4] == ["3", "2", "1"]
    assert row(f"localmodelnodegroup.serving.kserve.io/{lmng}")[1:4] == ["10Gi", "4Gi", "6Gi"]
    assert row("localmodelnamespacecache.serving.kserve.io/nscache")[0] == namespace

    by_category = control_plane.kubectl(f"--cache-dir={tmp_path}", "get", "localmodel", "-A")
    for name in (lmc, lmn, lmng, "nscache"):
        assert name in by_category.stdout


def test_kubectl_explain_prints_field_descriptions(
    control_plane: ControlPlane, crds: list[str], tmp_path: Path
) -> None:
    def explain() -> str | None:
        result = control_plane.kubectl(
            f"--cache-dir={tmp_path}", "explain", "localmodelcache.spec.storage", check=False
        )
        text = result.stdout
        return text if result.returncode == 0 and "parameters" in text else None

    text = wait_until_sync(
        explain, timeout=30, what="kubectl explain localmodelcache.spec.storage succeeds"
    )
    assert text is not None
    assert "Credentials from the storage-config secret" in text
    assert "Key inside the storage-config secret" in text
    assert "STORAGE_OVERRIDE_CONFIG" in text
