"""A shared-volume cache's import Job on the real apiserver (issue 22): the Job is accepted as
built (native sidecar, podReplacementPolicy, nothing dropped), and its pod passes Pod Security
`restricted` enforcement in a tenant namespace."""

from __future__ import annotations

from typing import Any

from localcache.api import groupversion, modelcache
from localcache.caching import config, credentials, downloadcontainer, importjob, keys
from localcache.devenv.controlplane import ControlPlane

URI = "s3://bucket/llama"


def _ok(result: tuple[int, Any], what: str) -> dict[str, Any]:
    status, body = result
    assert status in (200, 201), f"{what}: expected success, got {status} {body}"
    assert isinstance(body, dict)
    return body


def _job(namespace: str) -> dict[str, Any]:
    cache = modelcache.LocalModelNamespaceCache.model_validate(
        {
            "apiVersion": groupversion.LOCAL_MODEL_NAMESPACE_CACHE.api_version,
            "kind": "LocalModelNamespaceCache",
            "metadata": {"name": "llama", "namespace": namespace, "uid": "cache-uid"},
            "spec": {"sourceModelUri": URI, "modelSize": "1Gi", "pvcRef": "shared"},
        }
    )
    return importjob.build_import_job(
        cache=cache,
        claim_uid="claim-uid",
        storage_key=keys.storage_key(URI),
        container=downloadcontainer.select_container(URI, [], config.StorageInitializerConfig()),
        injection=credentials.Injection(
            uri=URI,
            env=(
                {
                    "name": "AWS_ACCESS_KEY_ID",
                    "valueFrom": {"secretKeyRef": {"name": "s3", "key": "id"}},
                },
            ),
        ),
        local_model=config.LocalModelConfig.model_validate({"sharedPVCImportFSGroup": 2000}),
        image="localcache:dev",
    )


def test_the_import_job_is_accepted_as_built(control_plane: ControlPlane, namespace: str) -> None:
    job = _job(namespace)
    job["metadata"]["ownerReferences"] = []  # the cache does not exist here
    stored = _ok(
        control_plane.rest("POST", f"/apis/batch/v1/namespaces/{namespace}/jobs", job),
        "import Job",
    )
    spec = stored["spec"]
    assert (spec["parallelism"], spec["completions"], spec["backoffLimit"]) == (1, 1, 2)
    assert spec["podReplacementPolicy"] == "Failed"
    assert "ttlSecondsAfterFinished" not in spec
    pod = spec["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == [
        "prepare",
        "progress",
        "kserve-localmodel-download",
    ]
    assert pod["initContainers"][1]["restartPolicy"] == "Always"
    assert stored["metadata"]["annotations"] == job["metadata"]["annotations"]
    assert pod["securityContext"]["fsGroup"] == 2000


def test_the_import_pod_meets_pod_security_restricted(
    control_plane: ControlPlane, namespace: str
) -> None:
    _ok(
        control_plane.rest(
            "PATCH",
            f"/api/v1/namespaces/{namespace}",
            {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
            content_type="application/merge-patch+json",
        ),
        "restricted namespace",
    )
    template = _job(namespace)["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "import-pod", "namespace": namespace, **template["metadata"]},
        "spec": template["spec"],
    }
    pods = f"/api/v1/namespaces/{namespace}/pods"
    _ok(control_plane.rest("POST", pods, pod), "the import pod under Pod Security restricted")
    # The check is real: the same pod without runAsNonRoot is refused.
    pod["metadata"]["name"] = "import-pod-root"
    del pod["spec"]["securityContext"]["runAsNonRoot"]
    for c in pod["spec"]["initContainers"]:
        c["securityContext"].pop("runAsNonRoot", None)
    status, body = control_plane.rest("POST", pods, pod)
    assert status == 403, (status, body)
    assert "restricted" in str(body)
