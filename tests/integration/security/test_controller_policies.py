"""The controller's token creates Jobs in every namespace (shared-volume import Jobs, issue 22);
the policies `localcache-controller-jobs` and `localcache-controller-job-serviceaccounts` pin
what it can create with that: the import Job as localcache builds it is admitted, and a stolen
token gets no other Job, no hostPath, no root, no ServiceAccount the cache does not name, and no
Job in a namespace without a namespace cache."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcache.api import groupversion, modelcache
from localcache.caching import config, credentials, downloadcontainer, importjob, keys
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from tests.integration.security import harness

pytestmark = pytest.mark.usefixtures("policies")
BASE = Path(__file__).resolve().parents[3] / "manifests" / "base"
CONTROLLER = ("kserve", "kserve-localmodel-controller-manager")
URI = "s3://bucket/llama"
Obj = dict[str, Any]


@pytest.fixture
def controller_rbac(control_plane: ControlPlane) -> Iterator[None]:
    path = str(BASE / "controller-rbac.yaml")
    control_plane.kubectl("apply", "--server-side", "--force-conflicts", "-f", path)
    yield
    control_plane.kubectl("delete", "--ignore-not-found", "-f", path, check=False)


def _cache(plane: ControlPlane, namespace: str) -> modelcache.LocalModelNamespaceCache:
    body = {
        "apiVersion": groupversion.LOCAL_MODEL_NAMESPACE_CACHE.api_version,
        "kind": "LocalModelNamespaceCache",
        "metadata": {"name": "llama", "namespace": namespace},
        "spec": {
            "sourceModelUri": URI,
            "modelSize": "1Gi",
            "pvcRef": "shared",
            "serviceAccountName": "reader",
        },
    }
    path = f"/apis/{groupversion.API_VERSION}/namespaces/{namespace}/localmodelnamespacecaches"
    stored = harness.ok(plane.rest("POST", path, body), "the shared-volume cache")
    return modelcache.LocalModelNamespaceCache.model_validate(stored)


def _import_job(cache: modelcache.LocalModelNamespaceCache) -> Obj:
    return importjob.build_import_job(
        cache=cache,
        claim_uid="claim-uid",
        storage_key=keys.storage_key(URI),
        container=downloadcontainer.select_container(URI, [], config.StorageInitializerConfig()),
        injection=credentials.Injection(uri=URI, service_account_name="reader"),
        local_model=config.LocalModelConfig(),
        image="localcache:dev",
    )


async def test_the_controller_token_creates_only_import_jobs_of_their_shape(
    control_plane: ControlPlane, namespace: str, controller_rbac: None
) -> None:
    token = control_plane.service_account_credentials(*CONTROLLER)

    def create(ns: str, job: Obj) -> tuple[int, Any]:
        return control_plane.rest(
            "POST", f"/apis/batch/v1/namespaces/{ns}/jobs?dryRun=All", job, creds=token
        )

    # before any namespace cache: nothing may be created there
    bare = _import_job(
        modelcache.LocalModelNamespaceCache.model_validate(
            {
                "metadata": {"name": "llama", "namespace": namespace, "uid": "u"},
                "spec": {"sourceModelUri": URI, "modelSize": "1Gi", "pvcRef": "shared"},
            }
        )
    )
    await wait_until(
        lambda: harness.denied(create(namespace, bare), "an import Job with no cache there"),
        timeout=30,
        what="a Job of the controller in a namespace without a namespace cache is denied",
    )
    # anyone else's Job there, even labelled like one of ours, is not looked at
    theirs = copy.deepcopy(bare)
    theirs["metadata"]["labels"].pop(importjob.LABEL_IMPORT)
    jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs?dryRun=All"
    harness.ok(
        control_plane.rest("POST", jobs, theirs),
        "a tenant's Job labelled model, in a namespace without a namespace cache",
    )
    job = _import_job(_cache(control_plane, namespace))
    await wait_until(
        lambda: harness.ok(create(namespace, job), "the import Job as built"),
        timeout=30,
        what="the import Job as localcache builds it is admitted for the controller",
    )

    def variant(change: Any) -> Obj:
        changed = copy.deepcopy(job)
        change(changed)
        return changed

    pod = ["spec", "template", "spec"]

    def at(obj: Obj, path: list[str]) -> Obj:
        for key in path:
            obj = obj[key]
        return obj

    denied = {
        "not an import Job": variant(lambda j: j["metadata"].update(name="backdoor")),
        "a hostPath volume": variant(
            lambda j: at(j, pod)["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
        ),
        "root": variant(lambda j: at(j, pod)["securityContext"].update(runAsUser=0)),
        "a privileged container": variant(
            lambda j: at(j, pod)["containers"][0]["securityContext"].update(
                privileged=True, allowPrivilegeEscalation=True
            )
        ),
        "the host network": variant(lambda j: at(j, pod).update(hostNetwork=True)),
        "another ServiceAccount": variant(
            lambda j: at(j, pod).update(serviceAccountName="kube-admin")
        ),
    }
    for what, bad in denied.items():
        message = harness.denied(create(namespace, bad), f"an import Job with {what}")
        assert "localcache controller" in message or "import Job" in message, message
