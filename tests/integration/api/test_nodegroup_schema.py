"""The node group's PV/PVC specs carry the full core/v1 schemas and sizes must be positive: on
the real apiserver with the generated CRDs, invalid input is refused at create time with the
field named, KServe's samples are still accepted unchanged (but for peer distribution, which
the apiserver turns on by default), and `kubectl explain` describes the PV fields."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcache.api import groupversion
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until_sync

LMC = groupversion.LOCAL_MODEL_CACHE
LMNC = groupversion.LOCAL_MODEL_NAMESPACE_CACHE
LMNG = groupversion.LOCAL_MODEL_NODE_GROUP
EXAMPLES = Path(__file__).resolve().parents[2] / "unit" / "api" / "examples.yaml"
KSERVE_NODE_GROUPS = [
    doc for doc in yaml.safe_load_all(EXAMPLES.read_text()) if doc["kind"] == LMNG.kind
]
PEER_DEFAULT = {"peerDistribution": {"enabled": True}}
"""What the apiserver fills in under localcache's CRDs: peer distribution is on by default."""


def _node_group(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "storageLimit": "10Gi",
        "persistentVolumeSpec": {
            "accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": "10Gi"},
            "hostPath": {"path": "/models", "type": ""},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}
                    ]
                }
            },
        },
        "persistentVolumeClaimSpec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "10Gi"}},
        },
    }
    return {
        "apiVersion": LMNG.api_version,
        "kind": LMNG.kind,
        "metadata": {"name": name},
        "spec": {**base, **spec},
    }


def _cache(info: groupversion.KindInfo, name: str, namespace: str, size: Any) -> dict[str, Any]:
    metadata = {"name": name, "namespace": namespace} if info.namespaced else {"name": name}
    return {
        "apiVersion": info.api_version,
        "kind": info.kind,
        "metadata": metadata,
        "spec": {"sourceModelUri": "gs://bucket/model", "modelSize": size, "nodeGroups": ["g"]},
    }


@pytest.fixture
def created(control_plane: ControlPlane) -> Any:
    """Paths of objects a test created, deleted afterwards (namespaced ones go with the ns)."""
    paths: list[str] = []
    yield paths
    for path in paths:
        control_plane.rest("DELETE", path)


def _create_group(plane: ControlPlane, body: dict[str, Any], created: list[str]) -> tuple[int, Any]:
    status, out = plane.rest("POST", LMNG.path(), body)
    if status == 201:
        created.append(LMNG.path(name=body["metadata"]["name"]))
    return status, out


def _refused(status: int, body: Any, *fragments: str) -> None:
    assert status == 422, body
    for fragment in fragments:
        assert fragment in body["message"], body["message"]


def _with(spec: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    *parents, leaf = path.split(".")
    node = out
    for part in parents:
        node = node[part]
    if value is None:
        del node[leaf]
    else:
        node[leaf] = value
    return out


@pytest.mark.parametrize(
    ("path", "value", "fragments"),
    [
        (
            "persistentVolumeSpec.capacity.storage",
            "100 GB",
            ("spec.persistentVolumeSpec.capacity.storage", "should match"),
        ),
        (
            "persistentVolumeSpec.hostPath.path",
            None,
            ("spec.persistentVolumeSpec.hostPath.path", "Required value"),
        ),
        (
            "persistentVolumeSpec.accessModes",
            "ReadWriteOnce",
            ("spec.persistentVolumeSpec.accessModes", "must be of type array"),
        ),
        (
            "persistentVolumeClaimSpec.accessModes",
            "ReadWriteOnce",
            ("spec.persistentVolumeClaimSpec.accessModes", "must be of type array"),
        ),
        (
            "persistentVolumeClaimSpec.resources.requests.storage",
            "ten gigs",
            ("spec.persistentVolumeClaimSpec.resources.requests.storage", "should match"),
        ),
        (
            "persistentVolumeSpec.nodeAffinity.required.nodeSelectorTerms",
            [{"matchExpressions": [{"key": "gpu"}]}],
            ("nodeSelectorTerms[0].matchExpressions[0].operator", "Required value"),
        ),
    ],
    ids=[
        "capacity-not-a-quantity",
        "hostPath-without-path",
        "pv-accessModes-as-string",
        "pvc-accessModes-as-string",
        "pvc-request-not-a-quantity",
        "selector-without-operator",
    ],
)
def test_invalid_pv_and_pvc_specs_are_refused_naming_the_field(
    control_plane: ControlPlane,
    crds: list[str],
    namespace: str,
    created: list[str],
    path: str,
    value: Any,
    fragments: tuple[str, ...],
) -> None:
    body = _node_group(f"{namespace}-bad")
    body["spec"] = _with(body["spec"], path, value)
    _refused(*_create_group(control_plane, body, created), *fragments)


@pytest.mark.parametrize("limit", ["-1Gi", "0", -1, 0], ids=["-1Gi", "zero", "-1", "0"])
def test_non_positive_storage_limit_is_refused(
    control_plane: ControlPlane, crds: list[str], namespace: str, created: list[str], limit: Any
) -> None:
    body = _node_group(f"{namespace}-limit", storageLimit=limit)
    _refused(
        *_create_group(control_plane, body, created),
        "spec.storageLimit",
        "storageLimit must be greater than zero",
    )


@pytest.mark.parametrize("info", [LMC, LMNC], ids=lambda i: i.kind)
@pytest.mark.parametrize("size", ["-1Gi", "-200Gi", "0", -1], ids=["-1Gi", "-200Gi", "0", "-1"])
def test_non_positive_model_size_is_refused(
    control_plane: ControlPlane,
    crds: list[str],
    namespace: str,
    info: groupversion.KindInfo,
    size: Any,
) -> None:
    body = _cache(info, f"{namespace}-size", namespace, size)
    status, out = control_plane.rest(
        "POST", info.path(namespace=namespace if info.namespaced else None), body
    )
    _refused(status, out, "spec.modelSize", "modelSize must be greater than zero")


@pytest.mark.parametrize("info", [LMC, LMNC], ids=lambda i: i.kind)
@pytest.mark.parametrize("size", ["1Gi", "500M", 1073741824, "1e9"])
def test_positive_model_sizes_are_accepted(
    control_plane: ControlPlane,
    crds: list[str],
    namespace: str,
    created: list[str],
    info: groupversion.KindInfo,
    size: Any,
) -> None:
    body = _cache(info, f"{namespace}-ok", namespace, size)
    path = info.path(namespace=namespace if info.namespaced else None)
    status, out = control_plane.rest("POST", path, body)
    assert status == 201, out
    assert out["spec"]["modelSize"] == size
    if not info.namespaced:
        created.append(info.path(name=body["metadata"]["name"]))


@pytest.mark.parametrize("sample", range(len(KSERVE_NODE_GROUPS)))
def test_kserve_sample_node_groups_are_accepted_unchanged(
    control_plane: ControlPlane, crds: list[str], namespace: str, created: list[str], sample: int
) -> None:
    body = copy.deepcopy(KSERVE_NODE_GROUPS[sample])
    body["metadata"] = {"name": f"{namespace}-kserve{sample}"}
    status, out = _create_group(control_plane, body, created)
    assert status == 201, out
    assert out["spec"] == {**body["spec"], **PEER_DEFAULT}


def test_peer_distribution_is_on_by_default_and_stays_off_when_turned_off(
    control_plane: ControlPlane, crds: list[str], namespace: str, created: list[str]
) -> None:
    status, out = _create_group(control_plane, _node_group(f"{namespace}-peer"), created)
    assert status == 201, out
    assert out["spec"]["peerDistribution"] == {"enabled": True}
    knobs = {"maxUploads": 4}  # a knob without `enabled`: still on
    body = _node_group(f"{namespace}-knobs", peerDistribution=knobs)
    status, out = _create_group(control_plane, body, created)
    assert status == 201, out
    assert out["spec"]["peerDistribution"] == {"enabled": True, "maxUploads": 4}
    body = _node_group(f"{namespace}-off", peerDistribution={"enabled": False})
    status, out = _create_group(control_plane, body, created)
    assert status == 201, out
    assert out["spec"]["peerDistribution"] == {"enabled": False}
    status, out = control_plane.rest("GET", LMNG.path(name=f"{namespace}-off"))
    assert status == 200, out
    assert out["spec"]["peerDistribution"] == {"enabled": False}


def test_integer_sizes_are_accepted_in_the_pv_and_pvc(
    control_plane: ControlPlane, crds: list[str], namespace: str, created: list[str]
) -> None:
    body = _node_group(f"{namespace}-ints", storageLimit=10737418240)
    body["spec"]["persistentVolumeSpec"]["capacity"]["storage"] = 10737418240
    body["spec"]["persistentVolumeClaimSpec"]["resources"]["requests"]["storage"] = 10737418240
    status, out = _create_group(control_plane, body, created)
    assert status == 201, out
    assert out["spec"] == {**body["spec"], **PEER_DEFAULT}


def test_kubectl_explain_describes_the_pv_spec(
    control_plane: ControlPlane, crds: list[str], tmp_path: Path
) -> None:
    def explain() -> str | None:
        result = control_plane.kubectl(
            f"--cache-dir={tmp_path}",
            "explain",
            "localmodelnodegroup.spec.persistentVolumeSpec.hostPath",
            check=False,
        )
        return result.stdout if result.returncode == 0 and "path" in result.stdout else None

    text = wait_until_sync(
        explain,
        timeout=30,
        what="kubectl explain localmodelnodegroup.spec.persistentVolumeSpec.hostPath succeeds",
    )
    assert text is not None
    assert "path\t<string> -required-" in text, text
    assert "path of the directory on the host" in text, text
    assert "type\t<string>" in text, text
