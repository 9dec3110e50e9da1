"""Issue 13 risk 3: the agent's token acts only for the node named in it (the node-name claim
of a bound ServiceAccount token, as a pod on that node gets it): it writes only its own
LocalModelNode, and creates Jobs only pinned to and owned by its node, in a namespace with a
namespace cache (as the ServiceAccount that cache names) or in the job namespace."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from localcache.agent.jobs import jobs
from localcache.api import groupversion, modelnode, nodegroup
from localcache.caching import config, credentials, downloadcontainer, keys
from localcache.devenv.clientconfig import Credentials
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from tests.integration.security import harness

pytestmark = pytest.mark.usefixtures("policies")
LMN = f"/apis/{groupversion.API_VERSION}/localmodelnodes"


def _lmn(plane: ControlPlane, name: str) -> str:
    body = {
        "apiVersion": groupversion.API_VERSION,
        "kind": "LocalModelNode",
        "metadata": {"name": name},
        "spec": {"localModels": []},
    }
    return str(
        harness.ok(plane.rest("POST", LMN, body), f"LocalModelNode {name}")["metadata"]["uid"]
    )


@pytest.fixture
def nodes(control_plane: ControlPlane) -> Iterator[dict[str, str]]:
    """Two LocalModelNodes, node name -> uid."""
    suffix = uuid.uuid4().hex[:6]
    names = [f"node-1-{suffix}", f"node-2-{suffix}"]
    yield {name: _lmn(control_plane, name) for name in names}
    for name in names:
        control_plane.rest("DELETE", f"{LMN}/{name}")


def _namespace_cache(plane: ControlPlane, namespace: str, name: str, sa: str | None) -> None:
    spec: dict[str, Any] = {
        "sourceModelUri": f"s3://bucket/{name}",
        "modelSize": "1Gi",
        "nodeGroups": ["gpu"],
    }
    if sa:
        spec["serviceAccountName"] = sa
    body = {
        "apiVersion": groupversion.API_VERSION,
        "kind": "LocalModelNamespaceCache",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    path = f"/apis/{groupversion.API_VERSION}/namespaces/{namespace}/localmodelnamespacecaches"
    harness.ok(plane.rest("POST", path, body), f"LocalModelNamespaceCache {namespace}/{name}")


def _download_spec(sa: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "kserve-localmodel-download", "image": "storage-initializer"}],
    }
    if sa:
        spec["serviceAccountName"] = sa
    return spec


def _jobs(namespace: str, dry_run: bool = False) -> str:
    return f"/apis/batch/v1/namespaces/{namespace}/jobs" + ("?dryRun=All" if dry_run else "")


async def _eventually_denied(call: Any, what: str) -> str:
    def attempt() -> str:
        return harness.denied(call(), what)

    return await wait_until(attempt, timeout=30, what=f"{what} is denied at admission")


async def test_agent_token_carries_its_node_and_writes_only_that_nodes_status(
    control_plane: ControlPlane, nodes: dict[str, str]
) -> None:
    node1, node2 = nodes
    token = harness.agent_token(control_plane, node1)
    patch: dict[str, Any] = {"status": {"modelStatus": {}}}
    message = await _eventually_denied(
        lambda: harness.rest_as_token(
            control_plane, token, "PATCH", f"{LMN}/{node2}/status?dryRun=All", patch
        ),
        f"the agent of {node1} updating {node2}'s status",
    )
    assert f"may write only its own LocalModelNode, not {node2}" in message, message
    harness.ok(
        harness.rest_as_token(control_plane, token, "PATCH", f"{LMN}/{node1}/status", patch),
        f"the agent of {node1} updating its own status",
    )


async def test_agent_identity_without_a_node_claim_is_denied(
    control_plane: ControlPlane, nodes: dict[str, str]
) -> None:
    node1 = next(iter(nodes))
    creds = control_plane.service_account_credentials(harness.AGENT_NS, harness.AGENT_SA)
    message = await _eventually_denied(
        lambda: control_plane.rest(
            "PATCH",
            f"{LMN}/{node1}/status?dryRun=All",
            {"status": {"modelStatus": {}}},
            creds=creds,
            content_type="application/merge-patch+json",
        ),
        "the agent's identity without a bound pod token",
    )
    assert "names none" in message, message


async def test_agent_creates_jobs_only_in_namespaces_with_a_namespace_cache(
    control_plane: ControlPlane, namespace: str, nodes: dict[str, str]
) -> None:
    node1, node2 = nodes
    token = harness.agent_token(control_plane, node1)

    def create(ns: str, job: dict[str, Any], dry_run: bool = True) -> Any:
        return harness.rest_as_token(control_plane, token, "POST", _jobs(ns, dry_run), job)

    def job(ns: str, *, node: str = node1, sa: str | None = None, model: str = "bert") -> Any:
        return harness.job(
            ns, f"lmd-{uuid.uuid4().hex[:8]}", _download_spec(sa),
            node=node, node_uid=nodes[node], labels={"model": model},
        )  # fmt: skip

    for ns in (namespace, "kube-system"):
        await _eventually_denied(
            lambda ns=ns: create(ns, job(ns)),
            f"the agent creating a Job in {ns}, which has no namespace cache",
        )
    _namespace_cache(control_plane, namespace, "bert", "bert-reader")
    await wait_until(
        lambda: create(namespace, job(namespace, sa="bert-reader"))[0] == 201,
        timeout=30,
        what="the agent may create a Job in a namespace with a namespace cache",
    )
    harness.ok(create(namespace, job(namespace, sa="bert-reader"), dry_run=False), "the Job")
    message = harness.denied(
        create(namespace, job(namespace, sa="namespace-admin")),
        "a Job of cache bert running as a ServiceAccount the cache does not name",
    )
    assert "runs as the ServiceAccount the cache names" in message, message
    message = harness.denied(
        create(namespace, job(namespace, node=node2, sa="bert-reader")),
        f"the agent of {node1} creating a Job for {node2}",
    )
    assert f"owned by LocalModelNode {node1}" in message, message
    pinned_elsewhere = job(namespace, sa="bert-reader")
    pinned_elsewhere["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node2}
    message = harness.denied(
        create(namespace, pinned_elsewhere), f"a Job of {node1}'s agent pinned to {node2}"
    )
    assert "pinned to that node" in message, message


async def test_the_agents_real_download_job_and_its_pod_are_admitted(
    control_plane: ControlPlane, namespace: str, nodes: dict[str, str]
) -> None:
    """The Job as agent/jobs.py builds it passes every policy, and so does its pod as the Job
    controller creates it (the staging subPath, read-write)."""
    node1 = next(iter(nodes))
    uri = "s3://bucket/bert"
    key = keys.storage_key(uri)
    entry = modelnode.LocalModelInfo.model_validate(
        {"sourceModelUri": uri, "modelName": "bert", "nodeGroup": "gpu", "namespace": namespace}
    )
    node = modelnode.LocalModelNode.model_validate(
        {"metadata": {"name": node1, "uid": nodes[node1]}, "spec": {"localModels": []}}
    )
    group = nodegroup.LocalModelNodeGroup.model_validate(
        {
            "metadata": {"name": "gpu"},
            "spec": {
                "storageLimit": "10Gi",
                "persistentVolumeSpec": {"hostPath": {"path": "/mnt/models"}},
                "persistentVolumeClaimSpec": {},
            },
        }
    )
    job = jobs.build_job(
        entry=entry, node=node, node_group=group, storage_key=key, attempt=0,
        container=downloadcontainer.select_container(uri, [], config.StorageInitializerConfig()),
        injection=credentials.Injection(uri=uri, service_account_name="bert-reader"),
        local_model=config.LocalModelConfig(), suffix="abcd1234",
        run_as_user=65532,  # the DaemonSet's agent uid
    )  # fmt: skip
    pod_spec = job["spec"]["template"]["spec"]
    claim = pod_spec["volumes"][0]["persistentVolumeClaim"]["claimName"]
    pv, pvc = harness.volume_pair(namespace=namespace, claim=claim, role="download", key=key)
    harness.ok(control_plane.rest("POST", "/api/v1/persistentvolumes", pv), "download PV")
    try:
        harness.ok(
            control_plane.rest(
                "POST", f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", pvc
            ),
            "download PVC",
        )
        _namespace_cache(control_plane, namespace, "bert", "bert-reader")
        token = harness.agent_token(control_plane, node1)
        created = await wait_until(
            lambda: harness.ok(
                harness.rest_as_token(control_plane, token, "POST", _jobs(namespace), job),
                "the agent's real download Job",
            ),
            timeout=30,
            what="the agent's real download Job is admitted",
        )
        job_controller = control_plane.service_account_credentials("kube-system", "job-controller")
        harness.grant(control_plane, namespace, job_controller.user)
        owner = {
            "apiVersion": "batch/v1", "kind": "Job", "name": created["metadata"]["name"],
            "uid": created["metadata"]["uid"], "controller": True,
        }  # fmt: skip
        pod = harness.pod(namespace, f"{created['metadata']['name']}-x", pod_spec, owner=owner)
        harness.ok(
            control_plane.rest(
                "POST", f"/api/v1/namespaces/{namespace}/pods", pod, creds=job_controller
            ),
            "the download Job's pod",
        )
    finally:
        control_plane.rest("DELETE", f"/api/v1/persistentvolumes/{pv['metadata']['name']}")


@pytest.mark.parametrize(
    ("what", "change", "says"),
    [
        (
            "privileged",
            {
                "containers": [
                    {"securityContext": {"privileged": True, "allowPrivilegeEscalation": True}}
                ]
            },
            "unprivileged",
        ),
        ("root", {"securityContext": {"runAsUser": 0, "runAsNonRoot": False}}, "non-root"),
        (
            "a capability",
            {
                "containers": [
                    {"securityContext": {"capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}}
                ]
            },
            "every capability dropped",
        ),
        ("hostPID", {"hostPID": True}, "no host namespace"),
        ("hostNetwork", {"hostNetwork": True}, "no host namespace"),
        (
            "hostPath /",
            {"volumes": [{"name": "host", "hostPath": {"path": "/"}}]},
            "no hostPath",
        ),
        (
            "an init container",
            {"initContainers": [{"name": "i", "image": "busybox"}]},
            "no init container but one",
        ),
    ],
)
async def test_a_stolen_agent_token_gets_no_privileged_job_even_owned_by_and_pinned_to_its_node(
    control_plane: ControlPlane,
    nodes: dict[str, str],
    what: str,
    change: dict[str, Any],
    says: str,
) -> None:
    """Security review findings 7 and 14b: the Job passes the owner and pin rules; its shape is
    what the policy now refuses (in the job namespace, where no namespace cache is needed)."""
    node = next(iter(nodes))
    token = harness.agent_token(control_plane, node)
    job = harness.job(
        harness.JOB_NAMESPACE,
        f"lmd-{uuid.uuid4().hex[:8]}",
        _download_spec(),
        node=node,
        node_uid=nodes[node],
    )
    pod = job["spec"]["template"]["spec"]
    for key, value in change.items():
        if key == "containers":
            for container, extra in zip(pod["containers"], value, strict=False):
                for field, setting in extra.items():
                    container[field] = {**container.get(field, {}), **setting}
        elif key == "securityContext":
            pod["securityContext"] = {**pod["securityContext"], **value}
        else:
            pod[key] = value

    def create(body: dict[str, Any]) -> Any:
        return harness.rest_as_token(
            control_plane, token, "POST", _jobs(harness.JOB_NAMESPACE, True), body
        )

    await wait_until(
        lambda: create(harness.job(
            harness.JOB_NAMESPACE, f"lmd-{uuid.uuid4().hex[:8]}", _download_spec(), node=node,
            node_uid=nodes[node],
        ))[0] == 201,
        timeout=30,
        what="the agent may create a restricted Job of its node in the job namespace",
    )  # fmt: skip
    message = harness.denied(create(job), f"a Job of the agent's token with {what}")
    assert says in message, message


async def test_a_tenants_own_job_in_a_namespace_without_a_namespace_cache_is_admitted(
    control_plane: ControlPlane, namespace: str, tenant: Credentials
) -> None:
    """The namespace rule's parameters are looked up before its matchConditions: without the
    binding's selector of download Jobs, every Job of a namespace without a namespace cache
    was denied ("no params found for policy binding"), whoever created it."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "nightly", "namespace": namespace, "labels": {"node": "node-1"}},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox", "command": ["true"]}],
                }
            }
        },
    }
    # the other policies of this package deny while their parameters sync: wait for one
    token = harness.agent_token(control_plane, "node-probe")
    await _eventually_denied(
        lambda: harness.rest_as_token(
            control_plane, token, "POST", _jobs(namespace, True), harness.job(
                namespace, "lmd-probe", _download_spec(), node="node-probe", node_uid="u"
            ),
        ),
        "the agent creating a Job in a namespace without a namespace cache",
    )  # fmt: skip
    status, body = control_plane.rest("POST", _jobs(namespace, True), job, creds=tenant)
    assert status == 201, f"a tenant's own Job was refused: {status} {body}"
