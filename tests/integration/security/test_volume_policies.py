"""Issue 13 risk 1: a pod that mounts a localcache PVC (bound to a PV at the node group's
models root) is admitted only read-only at its cache's `models/<key>` subPath, as KServe's pod
mutator mounts it; only the agent's download Jobs mount a download PVC, at their staging
subPath. The shipped policies (manifests/policies) on a real apiserver."""

from __future__ import annotations

from typing import Any

import pytest

from localcache.caching import keys
from localcache.devenv.clientconfig import Credentials
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from tests.integration.security import harness

pytestmark = pytest.mark.usefixtures("policies")

KEY = keys.storage_key("s3://bucket/tenant-a/private-model")
OTHER_KEY = keys.storage_key("s3://bucket/tenant-b/private-model")
STAGING = f".staging/{KEY}-lmd-{KEY}-0123abcd-0"
STAGING_JOB = f"lmd-{KEY}-0123abcd-0"


class Refused(Exception):
    """Admission refused for good (not an AssertionError: a wait stops on it)."""


def _create_pair(plane: ControlPlane, namespace: str, claim: str, role: str) -> None:
    pv, pvc = harness.volume_pair(namespace=namespace, claim=claim, role=role, key=KEY)
    harness.ok(plane.rest("POST", "/api/v1/persistentvolumes", pv), "PV")
    harness.ok(
        plane.rest("POST", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", pvc), "PVC"
    )


@pytest.fixture
def serving_claim(control_plane: ControlPlane, namespace: str) -> Any:
    _create_pair(control_plane, namespace, "bert-gpu", "serving")
    yield "bert-gpu"
    control_plane.rest("DELETE", f"/api/v1/persistentvolumes/{namespace}-bert-gpu")


@pytest.fixture
def download_claim(control_plane: ControlPlane, namespace: str) -> Any:
    _create_pair(control_plane, namespace, "bert-gpu-download", "download")
    yield "bert-gpu-download"
    control_plane.rest("DELETE", f"/api/v1/persistentvolumes/{namespace}-bert-gpu-download")


async def _denied(
    plane: ControlPlane, creds: Credentials | None, path: str, obj: Any, what: str
) -> str:
    """Poll (dry run) until the request is denied by a policy: the policies' parameter
    informers sync after the policies are applied. Returns the denial message."""

    def attempt() -> str:
        status, body = plane.rest("POST", f"{path}?dryRun=All", obj, creds=creds)
        assert status in (403, 422), f"{status} {body}"
        return harness.denied((status, body), what)

    return await wait_until(attempt, timeout=30, what=f"{what} is denied at admission")


def _pods(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/pods"


async def test_tenant_pod_mounting_the_serving_claim_without_subpath_is_denied_with_the_reason(
    control_plane: ControlPlane, namespace: str, tenant: Credentials, serving_claim: str
) -> None:
    spec = harness.pod_spec(serving_claim, {"readOnly": True})
    message = await _denied(
        control_plane, tenant, _pods(namespace), harness.pod(namespace, "snoop", spec),
        "a tenant pod mounting the serving PVC at its root",
    )  # fmt: skip
    assert f"subPath models/{KEY}" in message, message
    assert "every tenant's models" in message, message


async def test_tenant_pod_mounting_the_serving_claim_read_write_is_denied(
    control_plane: ControlPlane, namespace: str, tenant: Credentials, serving_claim: str
) -> None:
    spec = harness.pod_spec(serving_claim, {"subPath": f"models/{KEY}", "readOnly": False})
    message = await _denied(
        control_plane, tenant, _pods(namespace), harness.pod(namespace, "writer", spec),
        "a tenant pod mounting the serving PVC read-write",
    )  # fmt: skip
    assert "readOnly: true" in message, message


@pytest.mark.parametrize(
    "mount",
    [
        {"subPath": f"models/{OTHER_KEY}", "readOnly": True},
        {"subPath": "models", "readOnly": True},
        {"subPath": STAGING, "readOnly": True},
        {"subPathExpr": f"models/{KEY}", "readOnly": True},
    ],
    ids=["another-cache", "models-dir", "staging", "subpathexpr"],
)
async def test_tenant_pod_with_any_other_subpath_is_denied(
    control_plane: ControlPlane,
    namespace: str,
    tenant: Credentials,
    serving_claim: str,
    mount: dict[str, Any],
) -> None:
    spec = harness.pod_spec(serving_claim, mount)
    await _denied(
        control_plane, tenant, _pods(namespace), harness.pod(namespace, "other", spec),
        f"a tenant pod mounting the serving PVC with {mount}",
    )  # fmt: skip


async def test_init_container_mount_is_checked_too(
    control_plane: ControlPlane, namespace: str, tenant: Credentials, serving_claim: str
) -> None:
    spec = harness.pod_spec(serving_claim, {"subPath": f"models/{KEY}", "readOnly": True})
    spec["initContainers"] = [
        {"name": "init", "image": "busybox",
         "volumeMounts": [{"name": "models", "mountPath": "/all"}]}
    ]  # fmt: skip
    await _denied(
        control_plane, tenant, _pods(namespace), harness.pod(namespace, "init", spec),
        "an init container mounting the serving PVC at its root",
    )  # fmt: skip


@pytest.mark.parametrize("sub", ["", "/", "/model1"])
async def test_isvc_style_serving_pod_read_only_at_its_key_is_admitted(
    control_plane: ControlPlane, namespace: str, tenant: Credentials, serving_claim: str, sub: str
) -> None:
    # what KServe's pod mutator produces: models/<key><subPath>, readOnly (ref §6.4)
    await _denied(
        control_plane, tenant, _pods(namespace),
        harness.pod(namespace, "probe", harness.pod_spec(serving_claim, {"readOnly": True})),
        "the probe pod without subPath (the policy is in force)",
    )  # fmt: skip
    spec = harness.pod_spec(serving_claim, {"subPath": f"models/{KEY}{sub}", "readOnly": True})
    harness.ok(
        control_plane.rest(
            "POST", _pods(namespace), harness.pod(namespace, "isvc", spec), creds=tenant
        ),
        "the ISVC-style serving pod",
    )


async def test_pods_without_localcache_claims_are_not_affected(
    control_plane: ControlPlane, namespace: str, tenant: Credentials, serving_claim: str
) -> None:
    pvc = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "own-data", "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }  # fmt: skip
    harness.ok(
        control_plane.rest(
            "POST", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", pvc, creds=tenant
        ),
        "the tenant's own PVC",
    )
    spec = harness.pod_spec("own-data", {})
    harness.ok(
        control_plane.rest(
            "POST", _pods(namespace), harness.pod(namespace, "own", spec), creds=tenant
        ),
        "a pod mounting the tenant's own PVC read-write at its root",
    )


async def test_download_claim_staging_mount_only_for_the_agents_jobs(
    control_plane: ControlPlane, namespace: str, tenant: Credentials, download_claim: str
) -> None:
    mount = {"subPath": STAGING, "readOnly": False}
    spec = harness.pod_spec(download_claim, mount)
    job_owner = {
        "apiVersion": "batch/v1", "kind": "Job", "name": STAGING_JOB,
        "uid": "00000000-0000-0000-0000-000000000001", "controller": True,
    }  # fmt: skip
    message = await _denied(
        control_plane, tenant, _pods(namespace),
        harness.pod(namespace, "forged", spec, owner=job_owner),
        "a tenant pod (claiming to belong to a download Job) writing the staging folder",
    )  # fmt: skip
    assert "only the localcache agent's download Jobs may mount it" in message, message
    tenant_job = harness.job(namespace, STAGING_JOB, spec, node="node-1", node_uid="u")
    await _denied(
        control_plane, tenant, f"/apis/batch/v1/namespaces/{namespace}/jobs", tenant_job,
        "a tenant Job writing the staging folder",
    )  # fmt: skip
    # The Job controller creates the pods of a Job; its identity may mount the staging subPath
    # of the owning Job, and only that one.
    job_controller = control_plane.service_account_credentials("kube-system", "job-controller")
    harness.grant(control_plane, namespace, job_controller.user)
    wrong = {**job_owner, "name": "lmd-some-other-job-0"}
    await _denied(
        control_plane, job_controller, _pods(namespace),
        harness.pod(namespace, "other-job", spec, owner=wrong),
        "a Job's pod mounting the staging folder of another Job",
    )  # fmt: skip
    harness.ok(
        control_plane.rest(
            "POST", _pods(namespace), harness.pod(namespace, "download", spec, owner=job_owner),
            creds=job_controller,
        ),
        "the download Job's pod created by the Job controller",
    )  # fmt: skip


async def test_updating_an_admitted_pod_is_not_refused(
    control_plane: ControlPlane, namespace: str, tenant: Credentials, download_claim: str
) -> None:
    """The Job controller removes its tracking finalizer from a finished download pod with an
    UPDATE (no subresource): the policy must not fail on it, or the Job never completes (seen
    on real nodes: "no such key" on `request.subResource`)."""
    job_owner = {
        "apiVersion": "batch/v1", "kind": "Job", "name": STAGING_JOB,
        "uid": "00000000-0000-0000-0000-000000000002", "controller": True,
    }  # fmt: skip
    await _denied(
        control_plane, tenant, _pods(namespace),
        harness.pod(namespace, "probe", harness.pod_spec(download_claim, {})),
        "the probe pod mounting the download PVC at its root (the policy is in force)",
    )  # fmt: skip
    job_controller = control_plane.service_account_credentials("kube-system", "job-controller")
    harness.grant(control_plane, namespace, job_controller.user)
    pod = harness.pod(
        namespace,
        "tracked",
        harness.pod_spec(download_claim, {"subPath": STAGING}),
        owner=job_owner,
    )
    pod["metadata"]["finalizers"] = ["batch.kubernetes.io/job-tracking"]
    patch = {"metadata": {"finalizers": None, "labels": {"seen": "yes"}}}

    def finalizer_removed() -> bool:
        # The Job named as owner does not exist (Jobs here are refused by another policy), so
        # the garbage collector deletes the pod, at a time of its own: CI once saw it gone
        # before the patch. Then the pod is made again; any other answer ends the wait.
        harness.ok(
            control_plane.rest("POST", _pods(namespace), pod, creds=job_controller),
            "the download Job's pod, with the Job controller's tracking finalizer",
        )
        status, body = control_plane.rest(
            "PATCH", f"{_pods(namespace)}/tracked", patch, creds=job_controller,
            content_type="application/merge-patch+json",
        )  # fmt: skip
        if status == 404:
            raise AssertionError("the garbage collector deleted the pod before the patch")
        if status != 200:
            raise Refused(f"removing the tracking finalizer was refused: {status} {body}")
        return True

    await wait_until(finalizer_removed, timeout=30, interval=0.5, what="the finalizer removed")


async def test_a_tenants_own_rwx_claim_is_left_alone_for_shared_volume_caches(
    control_plane: ControlPlane, namespace: str, tenant: Credentials, serving_claim: str
) -> None:
    """Issue 22: a shared-volume cache's claim is the tenant's own (any name, RWX, bound to a
    volume localcache did not make): a serving pod mounting it the way KServe's `pvc://`
    storage path does (mounted readOnly, subPath below models/<key>) and an import-style Job
    writing it at subPath models are admitted while the policies confine localcache's claims."""
    await _denied(
        control_plane, tenant, _pods(namespace),
        harness.pod(namespace, "probe", harness.pod_spec(serving_claim, {"readOnly": True})),
        "the probe pod without subPath (the policy is in force)",
    )  # fmt: skip
    claim, pv_name = "team-models", f"{namespace}-nfs"
    pv = {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteMany"],
            "nfs": {"server": "192.0.2.1", "path": "/exports/models"},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }  # fmt: skip
    pvc = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"], "volumeName": pv_name,
            "resources": {"requests": {"storage": "5Gi"}},
        },
    }  # fmt: skip
    harness.ok(control_plane.rest("POST", "/api/v1/persistentvolumes", pv), "the NFS PV")
    try:
        harness.ok(
            control_plane.rest(
                "POST", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", pvc, creds=tenant
            ),
            "the tenant's RWX claim",
        )
        # KServe v0.20's pod mutator for pvc://<claim>/<path>: the claim as volume
        # kserve-pvc-source, mounted readOnly at /mnt/models with subPath <path>
        serving = harness.pod_spec(claim, {"subPath": f"models/{KEY}/v1", "readOnly": True})
        serving["volumes"][0]["name"] = "kserve-pvc-source"
        serving["containers"][0]["volumeMounts"][0]["name"] = "kserve-pvc-source"
        harness.ok(
            control_plane.rest(
                "POST", _pods(namespace), harness.pod(namespace, "served", serving), creds=tenant
            ),
            "a serving pod mounting the tenant's claim as KServe's pvc:// path does",
        )
        importer = harness.pod_spec(claim, {"subPath": "models"})
        job = {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "shared-import", "namespace": namespace},
            "spec": {"template": {"spec": importer}},
        }  # fmt: skip
        harness.ok(
            control_plane.rest(
                "POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", job, creds=tenant
            ),
            "an import-style Job writing the tenant's claim at subPath models",
        )
    finally:
        control_plane.rest("DELETE", f"/api/v1/persistentvolumes/{pv_name}")
