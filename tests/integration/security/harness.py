"""Helpers of the admission-policy tests: requests as a bearer token (a bound ServiceAccount
token, as a pod on a node gets one), objects in the shapes localcache creates them."""

from __future__ import annotations

from typing import Any

from localcache.agent.jobs import jobs
from localcache.devenv.controlplane import ControlPlane

Obj = dict[str, Any]
AGENT_NS, AGENT_SA = "kserve", "kserve-localmodelnode-agent"
JOB_NAMESPACE = "kserve-localmodel-jobs"
MANAGED_BY = {"app.kubernetes.io/managed-by": "localcache"}
KEY_ANNOTATION = "localmodel.kserve.io/storage-key"
ROLE_ANNOTATION = "localmodel.kserve.io/volume-role"


def rest_as_token(
    plane: ControlPlane, token: str, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    """One request to the apiserver authenticated by `token` alone (no client certificate)."""
    content_type = "application/merge-patch+json" if method == "PATCH" else "application/json"
    return plane.rest(method, path, body, token=token, content_type=content_type)


def ok(result: tuple[int, Any], what: str) -> Obj:
    status, body = result
    assert status in (200, 201), f"{what}: expected success, got {status} {body}"
    assert isinstance(body, dict)
    return body


def denied(result: tuple[int, Any], what: str) -> str:
    """The denial message of a request refused at admission (403 or 422 with a message)."""
    status, body = result
    assert status in (403, 422), f"{what}: expected a denial, got {status} {body}"
    message = body.get("message", "") if isinstance(body, dict) else str(body)
    assert "ValidatingAdmissionPolicy" in message, f"{what}: not an admission denial: {message}"
    return str(message)


def agent_token(
    plane: ControlPlane, node: str, *, namespace: str = AGENT_NS, service_account: str = AGENT_SA
) -> str:
    """A token of the agent's ServiceAccount bound to an agent pod on `node`: the apiserver
    puts the node's name into the token (authentication.kubernetes.io/node-name). The pod
    (named `agent-<node>-...`) stays: the token is valid while it exists."""
    pod = ok(
        plane.rest(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"generateName": f"agent-{node}-"},
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": service_account,
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "agent", "image": "localcache"}],
                },
            },
        ),
        f"agent pod on {node}",
    )
    review = ok(
        plane.rest(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {
                    "expirationSeconds": 3600,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": pod["metadata"]["name"],
                        "uid": pod["metadata"]["uid"],
                    },
                },
            },
        ),
        f"token of the agent pod on {node}",
    )
    return str(review["status"]["token"])


def volume_pair(
    *, namespace: str, claim: str, role: str, key: str, path: str = "/mnt/models"
) -> tuple[Obj, Obj]:
    """A PV and its PVC as the controller creates them (controllers/volumes.py)."""
    meta = {"labels": dict(MANAGED_BY), "annotations": {ROLE_ANNOTATION: role, KEY_ANNOTATION: key}}
    pv_name = f"{namespace}-{claim}"
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name, **meta},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": path},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": namespace,
                "name": claim,
            },
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace, **meta},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "volumeName": pv_name,
        },
    }
    return pv, pvc


def pod_spec(claim: str, mount: Obj) -> Obj:
    return {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "main",
                "image": "busybox",
                "volumeMounts": [{"name": "models", "mountPath": "/mnt/models", **mount}],
            }
        ],
        "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": claim}}],
    }


def pod(namespace: str, name: str, spec: Obj, *, owner: Obj | None = None) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace}
    if owner:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def job(
    namespace: str,
    name: str,
    spec: Obj,
    *,
    node: str,
    node_uid: str,
    labels: Obj | None = None,
) -> Obj:
    """A Job in the shape of agent/jobs.py: pinned to `node`, owned by its LocalModelNode,
    non-root and restricted (what `spec` sets itself wins)."""
    security = {"runAsNonRoot": True, "runAsUser": 65532, **(spec.get("securityContext") or {})}
    containers = [
        {**c, "securityContext": {**jobs.RESTRICTED_CONTAINER, **(c.get("securityContext") or {})}}
        for c in spec.get("containers") or []
    ]
    spec = {
        **spec,
        "nodeSelector": {"kubernetes.io/hostname": node},
        "securityContext": security,
        "containers": containers,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"storageKey": "0123456789abcdef", "model": "probe", **(labels or {})},
            "ownerReferences": [
                {
                    "apiVersion": "serving.kserve.io/v1alpha1",
                    "kind": "LocalModelNode",
                    "name": node,
                    "uid": node_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"template": {"spec": spec}},
    }


def grant(plane: ControlPlane, namespace: str, user: str) -> None:
    """Let `user` create and read pods, Jobs and PVCs in `namespace` (what a tenant may do)."""
    if plane.kubectl("get", "role", "workloads", "-n", namespace, check=False).returncode:
        plane.kubectl(
            "create", "role", "workloads", "-n", namespace, "--verb=create,get,list,delete",
            "--resource=pods,persistentvolumeclaims,jobs.batch",
        )  # fmt: skip
    plane.kubectl(
        "create", "rolebinding", f"workloads-{abs(hash(user)) % 10**8}", "-n", namespace,
        "--role=workloads", f"--user={user}",
    )  # fmt: skip
