"""With KServe v0.20's CRDs (no `spec.pvcRef`), the shared-volume mode is reported unavailable,
never silently run as a node-group cache (issue 22).

On the module's own control plane with KServe-shaped CRDs: kubectl's strict field validation
refuses `pvcRef` outright; KServe's sample (no nodeGroups) is refused by KServe's schema; a
cache applied without validation (`--validate=false`, as a client that does not ask for
strict validation) keeps its nodeGroups and loses pvcRef, and the controller places it on no
node and says why in a Warning Event, while a plain node-group cache beside it is placed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from localcache.caching import prunedmode
from localcache.devenv import crds as crd_install
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from tests import kserveshape
from tests.integration.crdcheck.test_crd_schema_check import (
    _install_kserve_shaped,
    controller_as_its_service_account,
)
from tests.support import schemastrip

Obj = dict[str, Any]
NS = "pruned-pvc-ref"
NODE = "pruned-node"
GROUP = "pruned-group"
CACHES = "/apis/serving.kserve.io/v1alpha1"


def _cache(name: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "LocalModelNamespaceCache",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"sourceModelUri": f"s3://models/{name}", "modelSize": "1Gi", **spec},
    }


def _apply(plane: ControlPlane, obj: Obj, tmp: Path, *args: str) -> tuple[int, str]:
    path = tmp / f"{obj['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(obj))
    done = plane.kubectl("apply", *args, "-f", str(path), check=False)
    return done.returncode, done.stdout + done.stderr


def _entries(plane: ControlPlane) -> set[str]:
    status, body = plane.rest("GET", f"{CACHES}/localmodelnodes/{NODE}")
    if status != 200:
        return set()
    return {e.get("modelName", "") for e in body.get("spec", {}).get("localModels") or []}


def _events(plane: ControlPlane, name: str) -> list[Obj]:
    selector = f"involvedObject.name={name},reason={prunedmode.REASON}"
    status, body = plane.rest("GET", f"/api/v1/namespaces/{NS}/events?fieldSelector={selector}")
    assert status == 200, body
    items: list[Obj] = body.get("items", [])
    return items


async def test_a_pruned_pvc_ref_is_reported_unavailable_and_placed_nowhere(
    schema_plane: ControlPlane, tmp_path: Path
) -> None:
    _install_kserve_shaped(schema_plane, tmp_path)
    for obj in (
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": {"pool": NODE}}},
        {
            "apiVersion": "serving.kserve.io/v1alpha1",
            "kind": "LocalModelNodeGroup",
            "metadata": {"name": GROUP},
            "spec": {
                "storageLimit": "10Gi",
                "persistentVolumeSpec": {
                    "accessModes": ["ReadWriteOnce"],
                    "capacity": {"storage": "10Gi"},
                    "hostPath": {"path": "/models", "type": ""},
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "pool", "operator": "In", "values": [NODE]}
                                    ]
                                }
                            ]
                        }
                    },
                },
                "persistentVolumeClaimSpec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "10Gi"}},
                },
            },
        },
    ):
        code, out = _apply(schema_plane, obj, tmp_path, "--server-side")
        assert code == 0, out

    shared = _cache("shared", pvcRef="shared-models", nodeGroups=[GROUP])
    code, out = _apply(schema_plane, shared, tmp_path)
    assert code != 0, out
    assert 'unknown field "spec.pvcRef"' in out, out
    sample = _cache("sample", pvcRef="shared-models")
    code, out = _apply(schema_plane, sample, tmp_path, "--validate=false")
    assert code != 0, out
    assert "spec.nodeGroups: Required value" in out, out

    code, out = _apply(schema_plane, shared, tmp_path, "--validate=false")
    assert code == 0, out
    status, stored = schema_plane.rest(
        "GET", f"{CACHES}/namespaces/{NS}/localmodelnamespacecaches/shared"
    )
    assert status == 200, stored
    assert "pvcRef" not in stored["spec"], stored
    assert prunedmode.dropped_pvc_ref(stored) == "shared-models"
    code, out = _apply(schema_plane, _cache("plain", nodeGroups=[GROUP]), tmp_path)
    assert code == 0, out

    async with controller_as_its_service_account(schema_plane, tmp_path):
        await wait_until(
            lambda: "plain" in _entries(schema_plane),
            timeout=60,
            what=f"the plain node-group cache placed on {NODE}",
        )
        await wait_until(
            lambda: bool(_events(schema_plane, "shared")),
            timeout=60,
            what=f"a {prunedmode.REASON} Warning Event about the cache whose pvcRef was pruned",
        )
        (event,) = _events(schema_plane, "shared")
        assert event["type"] == "Warning"
        assert "spec.pvcRef (shared-models) was dropped by the apiserver" in event["message"]
        assert "shared" not in _entries(schema_plane), sorted(_entries(schema_plane))


async def test_a_crd_that_drops_the_job_record_gets_no_import_job(
    schema_plane: ControlPlane, tmp_path: Path
) -> None:
    # a later KServe CRD: pvcRef and conditions, but not localcache's status.sharedVolume, in
    # which the uid of the import Job (its only proof of being ours) is recorded
    for crd in kserveshape.our_crds():
        if crd["metadata"]["name"] == "localmodelnamespacecaches.serving.kserve.io":
            for version in crd["spec"]["versions"]:
                schema = version["schema"]["openAPIV3Schema"]
                version["schema"]["openAPIV3Schema"] = schemastrip.strip(
                    schema, ["status.sharedVolume"]
                )
        (tmp_path / f"{crd['metadata']['name']}.yaml").write_text(yaml.safe_dump(crd))
    crd_install.install_crds(schema_plane, [tmp_path])
    namespace = f"{NS}-record"
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "shared-models", "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "2Gi"}},
            "storageClassName": "none",
        },
    }
    cache = _cache("record", pvcRef="shared-models")
    cache["metadata"]["namespace"] = namespace
    for obj in ({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}, claim):
        code, out = _apply(schema_plane, obj, tmp_path, "--server-side")
        assert code == 0, out
    code, out = _apply(schema_plane, cache, tmp_path, "--server-side")
    assert code == 0, out
    path = f"{CACHES}/namespaces/{namespace}/localmodelnamespacecaches/record"

    def reason() -> str:
        status, found = schema_plane.rest("GET", path)
        assert status == 200, found
        conds = (found.get("status") or {}).get("conditions") or []
        return next((str(c.get("reason")) for c in conds if c.get("type") == "Ready"), "")

    async with controller_as_its_service_account(schema_plane, tmp_path):
        await wait_until(
            lambda: reason() == prunedmode.REASON,
            timeout=60,
            what=f"Ready=False {prunedmode.REASON}: the Job's record would be dropped",
        )
        status, jobs = schema_plane.rest("GET", f"/apis/batch/v1/namespaces/{namespace}/jobs")
        assert status == 200, jobs
        assert jobs["items"] == [], [j["metadata"]["name"] for j in jobs["items"]]
