"""The test control plane is real: CRDs and watches, garbage collection, RBAC."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client, config, watch

from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until, wait_until_sync

GROUP = "foundation.localcache.test"
PLURAL = "widgets"


def _widget_crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "properties": {"size": {"type": "integer"}},
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def _established(plane: ControlPlane, name: str) -> bool:
    status, body = plane.rest(
        "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    )
    conditions = ((body.get("status") or {}).get("conditions") or []) if status == 200 else []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="module")
def widget_crd(control_plane: ControlPlane) -> str:
    crd = _widget_crd()
    status, body = control_plane.rest(
        "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd
    )
    assert status in (201, 409), body
    name = str(crd["metadata"]["name"])
    wait_until_sync(
        lambda: _established(control_plane, name), timeout=30, what=f"CRD {name} Established"
    )
    # Established is not yet served: the storage may still answer 429 "(re)initializing".
    wait_until_sync(
        lambda: control_plane.rest("GET", f"/apis/{GROUP}/v1/{PLURAL}")[0] == 200,
        timeout=30,
        what=f"CRD {name} serves list requests",
    )
    return name


async def test_custom_object_is_observed_through_a_kubernetes_asyncio_watch(
    control_plane: ControlPlane, widget_crd: str, namespace: str
) -> None:
    api_client = await config.new_client_from_config(config_file=str(control_plane.kubeconfig_path))
    async with api_client:
        custom = client.CustomObjectsApi(api_client)
        listing = await custom.list_namespaced_custom_object(GROUP, "v1", namespace, PLURAL)
        seen: list[tuple[str, str]] = []

        async def observe() -> None:
            w = watch.Watch()
            async with w.stream(
                custom.list_namespaced_custom_object,
                GROUP,
                "v1",
                namespace,
                PLURAL,
                resource_version=listing["metadata"]["resourceVersion"],
                timeout_seconds=30,
            ) as stream:
                async for event in stream:
                    seen.append((event["type"], event["object"]["metadata"]["name"]))
                    if event["type"] == "DELETED":
                        return

        observer = asyncio.create_task(observe(), name="widget-watch")
        body = {
            "apiVersion": f"{GROUP}/v1",
            "kind": "Widget",
            "metadata": {"name": "w1"},
            "spec": {"size": 3},
        }
        await custom.create_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, body)
        await custom.patch_namespaced_custom_object(
            GROUP,
            "v1",
            namespace,
            PLURAL,
            "w1",
            {"spec": {"size": 4}},
            _content_type="application/merge-patch+json",  # type: ignore[call-arg]
        )
        await custom.delete_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, "w1")
        await asyncio.wait_for(observer, timeout=30)
    assert seen == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]


@pytest.mark.kcm
async def test_owned_object_is_garbage_collected_after_its_owner_is_deleted(
    control_plane: ControlPlane, namespace: str
) -> None:
    if not control_plane.with_kcm:
        pytest.skip("kube-controller-manager binary not available")
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    status, owner = control_plane.rest(
        "POST", base, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner"}}
    )
    assert status == 201, owner
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "owner",
                    "uid": owner["metadata"]["uid"],
                }
            ],
        },
    }
    status, body = control_plane.rest("POST", base, dependent)
    assert status == 201, body
    status, _ = control_plane.rest("DELETE", f"{base}/owner")
    assert status == 200

    await wait_until(
        lambda: control_plane.rest("GET", f"{base}/dependent")[0] == 404,
        timeout=60,
        what="kube-controller-manager's garbage collector deletes ConfigMap 'dependent'",
    )


async def test_rbac_denies_a_service_account_until_a_role_binding_allows_it(
    control_plane: ControlPlane, namespace: str
) -> None:
    sa = f"reader-{uuid.uuid4().hex[:6]}"
    status, body = control_plane.rest(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}},
    )
    assert status == 201, body
    creds = control_plane.service_account_credentials(namespace, sa)
    pods = f"/api/v1/namespaces/{namespace}/pods"

    status, body = control_plane.rest("GET", pods, creds=creds)
    assert status == 403, f"expected RBAC to deny list pods, got {status}: {body}"
    assert f"system:serviceaccount:{namespace}:{sa}" in body["message"]

    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    status, body = control_plane.rest(
        "POST",
        f"{rbac}/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        },
    )
    assert status == 201, body
    status, body = control_plane.rest(
        "POST",
        f"{rbac}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "pod-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
        },
    )
    assert status == 201, body

    await wait_until(
        lambda: control_plane.rest("GET", pods, creds=creds)[0] == 200,
        timeout=30,
        what=f"ServiceAccount {sa} may list pods after the RoleBinding",
    )
    status, _ = control_plane.rest("DELETE", f"{rbac}/rolebindings/pod-reader")
    assert status == 200
    await wait_until(
        lambda: control_plane.rest("GET", pods, creds=creds)[0] == 403,
        timeout=30,
        what=f"ServiceAccount {sa} is denied again once the RoleBinding is gone",
    )


def test_apiserver_reports_the_version_it_was_built_as(control_plane: ControlPlane) -> None:
    status, body = control_plane.rest("GET", "/version")
    assert status == 200
    assert body["gitVersion"] == control_plane.bin_dir.name or body["major"] == "1", body
    assert body["gitVersion"].startswith("v1."), body
