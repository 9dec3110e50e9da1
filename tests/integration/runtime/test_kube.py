"""`kube.Kube` against the real apiserver: CRUD and every patch type, a custom resource's
status subresource, paging, raw GETs, watch streams, request counting, and the mapping of
every failure onto the errors tree (status codes, refused connections, deadlines)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from localcache.devenv import crds as crd_install
from localcache.devenv.assets import free_port
from localcache.devenv.controlplane import ControlPlane
from localcache.runtime import errors, kube
from tests.integration.runtime.conftest import configmap, kubeconfig_for_server
from tests.integration.runtime.proxy import FreezableProxy

WIDGETS = kube.Resource("runtime-test.localcache.io", "v1", "widgets", "Widget")
WIDGET_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.runtime-test.localcache.io"},
    "spec": {
        "group": "runtime-test.localcache.io",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                            "status": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            },
                        },
                    }
                },
            }
        ],
    },
}


async def client_for(plane: ControlPlane, path: Path, server: str, **kwargs: Any) -> kube.Kube:
    return await kube.Kube.from_kubeconfig(kubeconfig_for_server(plane, path, server), **kwargs)


async def test_crud_and_every_patch_type(namespace: str, kube_client: kube.Kube) -> None:
    created = await kube_client.create(kube.CONFIG_MAPS, configmap(namespace, "a", x="1"))
    assert created["metadata"]["resourceVersion"]
    got = await kube_client.get(kube.CONFIG_MAPS, "a", namespace=namespace)
    assert got["data"] == {"x": "1"}

    merged = await kube_client.patch(
        kube.CONFIG_MAPS, "a", {"data": {"y": "2"}}, namespace=namespace
    )
    assert merged["data"] == {"x": "1", "y": "2"}
    ops = [{"op": "replace", "path": "/data/x", "value": "10"}]
    patched = await kube_client.patch(
        kube.CONFIG_MAPS, "a", ops, namespace=namespace, patch_type="json"
    )
    assert patched["data"]["x"] == "10"
    strategic = await kube_client.patch(
        kube.CONFIG_MAPS, "a", {"data": {"z": "3"}}, namespace=namespace, patch_type="strategic"
    )
    assert strategic["data"] == {"x": "10", "y": "2", "z": "3"}
    applied = await kube_client.patch(
        kube.CONFIG_MAPS,
        "b",
        configmap(namespace, "b", owned="yes"),
        namespace=namespace,
        patch_type="apply",
        field_manager="runtime-test",
        force=True,
    )
    assert applied["data"] == {"owned": "yes"}
    managers = {m["manager"] for m in applied["metadata"]["managedFields"]}
    assert "runtime-test" in managers

    # replace is a compare-and-swap on resourceVersion
    stale = dict(got, data={"x": "stale"})
    with pytest.raises(errors.Conflict):
        await kube_client.replace(kube.CONFIG_MAPS, stale)
    fresh = await kube_client.get(kube.CONFIG_MAPS, "a", namespace=namespace)
    replaced = await kube_client.replace(kube.CONFIG_MAPS, dict(fresh, data={"x": "new"}))
    assert replaced["data"] == {"x": "new"}

    dry = await kube_client.create(
        kube.CONFIG_MAPS, configmap(namespace, "dry", x="1"), dry_run=True
    )
    assert dry["metadata"]["name"] == "dry"
    with pytest.raises(errors.NotFound):
        await kube_client.get(kube.CONFIG_MAPS, "dry", namespace=namespace)

    with pytest.raises(errors.Conflict, match="precondition"):
        await kube_client.delete(kube.CONFIG_MAPS, "a", namespace=namespace, uid="not-the-uid")
    await kube_client.delete(
        kube.CONFIG_MAPS, "a", namespace=namespace, uid=replaced["metadata"]["uid"]
    )
    listed = await kube_client.list(kube.CONFIG_MAPS, namespace=namespace)
    assert [o["metadata"]["name"] for o in listed.items] == ["b"]
    assert listed.items[0]["kind"] == "ConfigMap"
    assert listed.items[0]["apiVersion"] == "v1"
    assert int(listed.resource_version) > 0
    counts = kube_client.requests
    assert counts["create"] == 2
    assert counts["patch"] == 4
    assert counts["delete"] == 2


async def test_status_subresource_of_a_custom_resource(
    control_plane: ControlPlane, namespace: str, kube_client: kube.Kube, tmp_path: Path
) -> None:
    crd_file = tmp_path / "widget.yaml"
    crd_file.write_text(yaml.safe_dump(WIDGET_CRD))
    await asyncio.to_thread(crd_install.install_crds, control_plane, [crd_file])
    widget = {
        "apiVersion": WIDGETS.api_version,
        "kind": "Widget",
        "metadata": {"name": "w", "namespace": namespace},
        "spec": {"size": 1},
        "status": {"ignored": True},
    }
    created = await kube_client.create(WIDGETS, widget)
    assert "status" not in created  # the main resource ignores status
    status = await kube_client.patch_status(
        WIDGETS, "w", {"status": {"phase": "Ready"}}, namespace=namespace
    )
    assert status["status"] == {"phase": "Ready"}
    assert (await kube_client.get_status(WIDGETS, "w", namespace=namespace))["status"] == {
        "phase": "Ready"
    }
    status["status"] = {"phase": "Done"}
    replaced = await kube_client.replace_status(WIDGETS, status)
    assert replaced["status"] == {"phase": "Done"}
    spec_patch = {"spec": {"size": 2}, "status": {"phase": "Overwritten"}}
    after = await kube_client.patch(WIDGETS, "w", spec_patch, namespace=namespace)
    assert after["spec"] == {"size": 2}
    assert after["status"] == {"phase": "Done"}


async def test_list_all_follows_continue_tokens(namespace: str, kube_client: kube.Kube) -> None:
    for i in range(7):
        await kube_client.create(kube.CONFIG_MAPS, configmap(namespace, f"p{i}", i=str(i)))
    before = kube_client.requests["list"]
    everything = await kube_client.list_all(kube.CONFIG_MAPS, namespace=namespace, page_size=3)
    assert sorted(o["metadata"]["name"] for o in everything.items) == [f"p{i}" for i in range(7)]
    assert kube_client.requests["list"] - before == 3
    labelled = await kube_client.list(
        kube.CONFIG_MAPS, namespace=namespace, field_selector="metadata.name=p3"
    )
    assert [o["metadata"]["name"] for o in labelled.items] == ["p3"]


async def test_raw_get_returns_text(kube_client: kube.Kube) -> None:
    version = json.loads(await kube_client.raw("/version"))
    assert version["gitVersion"].startswith("v1.")
    assert "apiserver_request_total" in await kube_client.raw("/metrics")


async def test_watch_streams_changes_and_ends_at_the_server_timeout(
    namespace: str, kube_client: kube.Kube
) -> None:
    start = await kube_client.list(kube.CONFIG_MAPS, namespace=namespace)
    await kube_client.create(kube.CONFIG_MAPS, configmap(namespace, "w", v="1"))
    await kube_client.patch(kube.CONFIG_MAPS, "w", {"data": {"v": "2"}}, namespace=namespace)
    await kube_client.delete(kube.CONFIG_MAPS, "w", namespace=namespace)
    seen: list[tuple[str, str]] = []
    async with kube_client.watch(
        kube.CONFIG_MAPS,
        namespace=namespace,
        resource_version=start.resource_version,
        timeout_seconds=2,
    ) as events:
        async for event in events:
            seen.append((event["type"], event["object"]["metadata"]["name"]))
    assert seen == [("ADDED", "w"), ("MODIFIED", "w"), ("DELETED", "w")]


async def test_status_codes_map_onto_the_error_tree(
    control_plane: ControlPlane, namespace: str, kube_client: kube.Kube, tmp_path: Path
) -> None:
    with pytest.raises(errors.NotFound) as not_found:
        await kube_client.get(kube.CONFIG_MAPS, "missing", namespace=namespace)
    assert not_found.value.reason == "NotFound"
    assert "missing" in not_found.value.message

    await kube_client.create(kube.CONFIG_MAPS, configmap(namespace, "dup"))
    with pytest.raises(errors.Conflict) as conflict:
        await kube_client.create(kube.CONFIG_MAPS, configmap(namespace, "dup"))
    assert conflict.value.already_exists

    with pytest.raises(errors.Invalid) as invalid:
        await kube_client.create(kube.CONFIG_MAPS, configmap(namespace, "Not_A_Valid_Name"))
    assert invalid.value.status == 422
    assert invalid.value.body["kind"] == "Status"

    nobody = control_plane.add_user("kube-test-nobody", [])
    path = control_plane.write_kubeconfig(nobody, tmp_path / "nobody.kubeconfig")
    async with await kube.Kube.from_kubeconfig(path) as unprivileged:
        with pytest.raises(errors.Forbidden):
            await unprivileged.list(kube.CONFIG_MAPS, namespace=namespace)


async def test_a_refused_connection_is_a_transport_error(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    server = f"https://127.0.0.1:{free_port()}"
    async with await client_for(control_plane, tmp_path / "refused", server) as client:
        with pytest.raises(errors.TransportError) as refused:
            await client.get(kube.NAMESPACES, "default")
    assert not isinstance(refused.value, errors.ApiTimeout)


async def test_an_answer_that_never_comes_is_an_api_timeout(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    proxy = FreezableProxy(upstream_port=control_plane.api_port)
    await proxy.start()
    try:
        server = f"https://127.0.0.1:{proxy.port}"
        async with await client_for(control_plane, tmp_path / "slow", server) as client:
            await client.get(kube.NAMESPACES, "default")  # an open, pooled connection
            proxy.freeze_existing()
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(errors.ApiTimeout):
                await client.get(kube.NAMESPACES, "default", request_timeout=1.0)
            assert loop.time() - started < 5
    finally:
        await proxy.close()
