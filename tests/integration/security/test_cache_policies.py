"""Issue 13 risk 4: a cache's URI may not read the download pod's own filesystem (file://, a
bare path), and a cluster cache (and the agent's Jobs in the job namespace) may name only
ServiceAccounts of the job namespace labelled localmodel.kserve.io/download=true."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from localcache.api import groupversion
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from tests.integration.security import harness

pytestmark = pytest.mark.usefixtures("policies")
LMC = f"/apis/{groupversion.API_VERSION}/localmodelcaches"
SA_LABEL = "localmodel.kserve.io/download"


def _cache(uri: str, sa: str | None = None, name: str = "") -> dict[str, Any]:
    spec: dict[str, Any] = {"sourceModelUri": uri, "modelSize": "1Gi", "nodeGroups": ["gpu"]}
    if sa:
        spec["serviceAccountName"] = sa
    return {
        "apiVersion": groupversion.API_VERSION,
        "kind": "LocalModelCache",
        "metadata": {"name": name or f"c-{uuid.uuid4().hex[:8]}"},
        "spec": spec,
    }


async def _denied(plane: ControlPlane, path: str, body: Any, what: str) -> str:
    def attempt() -> str:
        return harness.denied(plane.rest("POST", f"{path}?dryRun=All", body), what)

    return await wait_until(attempt, timeout=30, what=f"{what} is denied at admission")


@pytest.mark.parametrize(
    "uri",
    [
        "file:///var/run/secrets/kubernetes.io/serviceaccount",
        "FILE:///etc",
        "/var/run/secrets/kubernetes.io/serviceaccount/token",
        "models/bert",
    ],
)
async def test_caches_reading_the_download_pods_filesystem_are_denied(
    control_plane: ControlPlane, namespace: str, uri: str
) -> None:
    message = await _denied(control_plane, LMC, _cache(uri), f"a cluster cache of {uri}")
    assert "reads the download pod's own" in message, message
    body = _cache(uri)
    body["kind"] = "LocalModelNamespaceCache"
    path = f"/apis/{groupversion.API_VERSION}/namespaces/{namespace}/localmodelnamespacecaches"
    await _denied(control_plane, path, body, f"a namespace cache of {uri}")


def _service_account(plane: ControlPlane, name: str, *, allowed: bool) -> None:
    labels = {SA_LABEL: "true"} if allowed else {}
    body = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": name, "namespace": harness.JOB_NAMESPACE, "labels": labels},
    }
    path = f"/api/v1/namespaces/{harness.JOB_NAMESPACE}/serviceaccounts"
    harness.ok(plane.rest("POST", path, body), f"ServiceAccount {name}")


async def test_cluster_cache_may_name_only_service_accounts_labelled_for_downloads(
    control_plane: ControlPlane,
) -> None:
    suffix = uuid.uuid4().hex[:6]
    privileged, reader = f"privileged-{suffix}", f"reader-{suffix}"
    _service_account(control_plane, privileged, allowed=False)
    _service_account(control_plane, reader, allowed=True)
    try:
        message = await _denied(
            control_plane, LMC, _cache("s3://bucket/m", privileged),
            "a cluster cache naming an unlabelled ServiceAccount",
        )  # fmt: skip
        assert f"{harness.JOB_NAMESPACE}/{privileged} is not labelled" in message, message
        harness.ok(
            control_plane.rest("POST", f"{LMC}?dryRun=All", _cache("s3://bucket/m", reader)),
            "a cluster cache naming a labelled ServiceAccount",
        )
        harness.ok(
            control_plane.rest("POST", f"{LMC}?dryRun=All", _cache("s3://bucket/m")),
            "a cluster cache naming no ServiceAccount",
        )
    finally:
        for name in (privileged, reader):
            control_plane.rest(
                "DELETE", f"/api/v1/namespaces/{harness.JOB_NAMESPACE}/serviceaccounts/{name}"
            )


async def test_agent_jobs_in_the_job_namespace_run_only_as_labelled_service_accounts(
    control_plane: ControlPlane,
) -> None:
    suffix = uuid.uuid4().hex[:6]
    node, privileged, reader = f"node-{suffix}", f"privileged-{suffix}", f"reader-{suffix}"
    _service_account(control_plane, privileged, allowed=False)
    _service_account(control_plane, reader, allowed=True)
    lmn = harness.ok(
        control_plane.rest(
            "POST",
            f"/apis/{groupversion.API_VERSION}/localmodelnodes",
            {
                "apiVersion": groupversion.API_VERSION,
                "kind": "LocalModelNode",
                "metadata": {"name": node},
                "spec": {"localModels": []},
            },
        ),
        "LocalModelNode",
    )
    token = harness.agent_token(control_plane, node)
    path = f"/apis/batch/v1/namespaces/{harness.JOB_NAMESPACE}/jobs?dryRun=All"

    def job(sa: str) -> Any:
        spec = {
            "restartPolicy": "Never",
            "serviceAccountName": sa,
            "containers": [{"name": "download", "image": "storage-initializer"}],
        }
        return harness.job(
            harness.JOB_NAMESPACE, f"lmd-{uuid.uuid4().hex[:8]}", spec,
            node=node, node_uid=lmn["metadata"]["uid"], labels={"model": "bert"},
        )  # fmt: skip

    try:
        message = await wait_until(
            lambda: harness.denied(
                harness.rest_as_token(control_plane, token, "POST", path, job(privileged)),
                "an agent Job running as an unlabelled ServiceAccount",
            ),
            timeout=30,
            what="an agent Job in the job namespace as an unlabelled ServiceAccount is denied",
        )
        assert f"ServiceAccount {privileged} is not labelled" in message, message
        harness.ok(
            harness.rest_as_token(control_plane, token, "POST", path, job(reader)),
            "an agent Job running as a labelled ServiceAccount",
        )
    finally:
        control_plane.rest("DELETE", f"/apis/{groupversion.API_VERSION}/localmodelnodes/{node}")
        for name in (privileged, reader):
            control_plane.rest(
                "DELETE", f"/api/v1/namespaces/{harness.JOB_NAMESPACE}/serviceaccounts/{name}"
            )
