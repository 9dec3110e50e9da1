"""Fixtures for the cache controllers' integration tests: a per-test `Env` on the real control
plane (with kube-controller-manager, so garbage collection and PV binding are real) that
creates uniquely named nodes, node groups, caches and InferenceServices, runs the
controllers in-process through the runtime Manager, and cleans up after itself.

No kubelet runs: Nodes are created through the API and their Ready condition is patched into
`status`; tests play the node agent by patching `LocalModelNode.status`. The PV/PVC
protection controllers run in kube-controller-manager, so deleted claims and volumes go.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import pytest

from localcache.api import groupversion, inferenceservice
from localcache.caching import config as config_mod
from localcache.controllers import setup as controllers_setup
from localcache.controllers import state
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime import errors, kube, manager, metrics

Obj = dict[str, Any]
URI = "s3://mybucket/mymodel"
IMPORT_IMAGE = "localcache:integration"
"""The localcache image of shared-volume import Jobs (no kubelet runs them here)."""
INSTANCE_TYPE = "node.kubernetes.io/instance-type"
CACHE_RESOURCES = {
    groupversion.LOCAL_MODEL_CACHE.kind: state.LOCAL_MODEL_CACHES,
    groupversion.LOCAL_MODEL_NAMESPACE_CACHE.kind: state.LOCAL_MODEL_NAMESPACE_CACHES,
}


# ------------------------------------------------------------------------ session fixtures


@pytest.fixture(scope="session")
async def api(control_plane: ControlPlane, crds: list[str]) -> AsyncIterator[kube.Kube]:
    """The tests' own API client (the controllers get another, so their requests count apart)."""
    client = await kube.Kube.from_kubeconfig(control_plane.kubeconfig_path)
    async with client:
        yield client


@pytest.fixture(scope="session")
async def garbage_collector_ready(control_plane: ControlPlane, api: kube.Kube) -> None:
    """Waits until kube-controller-manager's garbage collector watches both cache kinds (it
    discovers new CRDs about every 30 s), so a test's GC expectations do not depend on how
    recently the CRDs were installed: a canary of each kind owns a ConfigMap, the canary is
    deleted, and the ConfigMap must go."""
    canary = f"gc-canary-{uuid.uuid4().hex[:6]}"
    await asyncio.to_thread(control_plane.create_namespace, canary)
    try:
        for kind, res in CACHE_RESOURCES.items():
            info = groupversion.by_kind(kind)
            meta: Obj = {"name": canary}
            if info.namespaced:
                meta["namespace"] = canary
            owner = await api.create(
                res,
                {
                    "apiVersion": info.api_version,
                    "kind": kind,
                    "metadata": meta,
                    "spec": {"sourceModelUri": URI, "modelSize": "1", "nodeGroups": ["none"]},
                },
                namespace=canary if info.namespaced else None,
            )
            ref = {
                "apiVersion": info.api_version,
                "kind": kind,
                "name": canary,
                "uid": owner["metadata"]["uid"],
            }
            dependent = f"dependent-of-{kind.lower()}"
            await api.create(
                kube.CONFIG_MAPS,
                {"metadata": {"name": dependent, "namespace": canary, "ownerReferences": [ref]}},
                namespace=canary,
            )
            await api.delete(res, canary, namespace=canary if info.namespaced else None)
            await wait_until(
                gone_by_name(api, kube.CONFIG_MAPS, dependent, canary),
                timeout=120,
                what=f"the garbage collector deletes a dependent of a {kind}",
            )
    finally:
        await asyncio.to_thread(control_plane.delete_namespace, canary)


def gone_by_name(
    client: kube.Kube, res: kube.Resource, name: str, namespace: str | None
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            await client.get(res, name, namespace=namespace)
        except errors.NotFound:
            return True
        return False

    return check


# ------------------------------------------------------------------------ the environment


class Controllers:
    """The controllers of one test, run by a runtime Manager on their own API client."""

    def __init__(
        self,
        mgr: manager.Manager,
        task: asyncio.Task[int],
        client: kube.Kube,
        handle: controllers_setup.CacheControllers,
    ) -> None:
        self.manager = mgr
        self.task = task
        self.kube = client
        self.handle = handle

    def writes(self) -> int:
        return sum(self.kube.requests[v] for v in ("create", "update", "patch", "delete"))

    async def stop(self) -> None:
        self.manager.stop()
        await asyncio.wait_for(self.task, timeout=30)
        await self.kube.close()


class Env:
    """One test's world: unique names, a job namespace, helpers, and cleanup."""

    def __init__(self, plane: ControlPlane, client: kube.Kube, namespace: str) -> None:
        self.plane = plane
        self.api = client
        self.namespace = namespace
        self.suffix = uuid.uuid4().hex[:6]
        self.controllers: Controllers | None = None
        self._caches: list[tuple[str, str, str]] = []  # (kind, namespace, name)
        self._nodes: list[str] = []
        self._groups: list[str] = []
        self._namespaces: list[str] = []

    def name(self, base: str) -> str:
        return f"{base}-{self.suffix}"

    # ---- controllers ----------------------------------------------------------------
    async def start(self, **local_model: Any) -> Controllers:
        settings = {"jobNamespace": self.namespace, **local_model}
        cfg = config_mod.parse_config({"localModel": json.dumps(settings)})
        client = await kube.Kube.from_kubeconfig(self.plane.kubeconfig_path)
        mgr = manager.Manager(handle_signals=False, shutdown_timeout=10.0)
        handle = controllers_setup.setup(
            mgr, kube=client, config=cfg, metrics=metrics.Metrics(), import_image=IMPORT_IMAGE
        )
        task = asyncio.create_task(mgr.run(), name=f"test-manager-{self.suffix}")
        await wait_until(
            lambda: mgr.started.is_set() or task.done(), timeout=60, what="the manager started"
        )
        if task.done():
            raise AssertionError(f"manager exited with {task.result()}")
        self.controllers = Controllers(mgr, task, client, handle)
        return self.controllers

    async def stop(self) -> None:
        if self.controllers is not None:
            controllers, self.controllers = self.controllers, None
            await controllers.stop()

    # ---- objects --------------------------------------------------------------------
    async def namespace_(self, base: str = "ns") -> str:
        name = self.name(base)
        await asyncio.to_thread(self.plane.create_namespace, name)
        self._namespaces.append(name)
        return name

    async def group(self, name: str, instance_type: str, *, limit: str = "10Gi") -> str:
        body = {
            "apiVersion": groupversion.LOCAL_MODEL_NODE_GROUP.api_version,
            "kind": groupversion.LOCAL_MODEL_NODE_GROUP.kind,
            "metadata": {"name": name},
            "spec": {
                "storageLimit": limit,
                "persistentVolumeSpec": {
                    "accessModes": ["ReadWriteOnce"],
                    "capacity": {"storage": "2Gi"},
                    "hostPath": {"path": "/models", "type": ""},
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "standard",
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {
                                            "key": INSTANCE_TYPE,
                                            "operator": "In",
                                            "values": [instance_type],
                                        }
                                    ]
                                }
                            ]
                        }
                    },
                },
                "persistentVolumeClaimSpec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "2Gi"}},
                    "storageClassName": "standard",
                },
            },
        }
        await self.api.create(state.LOCAL_MODEL_NODE_GROUPS, body)
        self._groups.append(name)
        return name

    async def node(self, name: str, instance_type: str | None, *, ready: bool = True) -> str:
        labels = {"kubernetes.io/hostname": name}
        if instance_type:
            labels[INSTANCE_TYPE] = instance_type
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        await self.api.create(kube.NODES, body)
        self._nodes.append(name)
        await self.set_ready(name, ready)
        return name

    async def set_ready(self, name: str, ready: bool) -> None:
        condition = {
            "type": "Ready",
            "status": "True" if ready else "False",
            "reason": "KubeletReady" if ready else "KubeletNotReady",
            "message": "set by the test",
        }
        await self.api.patch_status(
            kube.NODES, name, {"status": {"conditions": [condition]}}, patch_type="strategic"
        )

    async def label(self, node: str, instance_type: str | None) -> None:
        await self.api.patch(
            kube.NODES, node, {"metadata": {"labels": {INSTANCE_TYPE: instance_type}}}
        )

    async def delete_node(self, node: str) -> None:
        await self.api.delete(kube.NODES, node)

    async def cache(
        self,
        name: str,
        groups: list[str],
        *,
        namespace: str | None = None,
        uri: str = URI,
        size: str = "1Gi",
        **spec: Any,
    ) -> Obj:
        info = (
            groupversion.LOCAL_MODEL_NAMESPACE_CACHE
            if namespace
            else groupversion.LOCAL_MODEL_CACHE
        )
        meta: Obj = {"name": name}
        if namespace:
            meta["namespace"] = namespace
        body = {
            "apiVersion": info.api_version,
            "kind": info.kind,
            "metadata": meta,
            "spec": {"sourceModelUri": uri, "modelSize": size, "nodeGroups": groups, **spec},
        }
        created = await self.api.create(CACHE_RESOURCES[info.kind], body, namespace=namespace)
        self._caches.append((info.kind, namespace or "", name))
        return created

    def track_caches(self, kind: str, namespace: str, names: list[str]) -> None:
        """Caches created by other means, to delete after the test."""
        self._caches.extend((kind, namespace, name) for name in names)

    async def isvc(
        self,
        name: str,
        namespace: str,
        *,
        cache: str,
        cache_namespace: str | None = None,
        node_group: str | None = None,
        uri: str = URI,
    ) -> Obj:
        """An InferenceService of `uri`, labelled (as the webhook would) with `cache`."""
        labels = {inferenceservice.LOCAL_MODEL_LABEL: cache}
        if cache_namespace:
            labels[inferenceservice.LOCAL_MODEL_NAMESPACE_LABEL] = cache_namespace
        annotations = {inferenceservice.LOCAL_MODEL_SOURCE_URI_ANNOTATION: uri}
        if node_group:
            annotations[inferenceservice.NODE_GROUP_ANNOTATION] = node_group
        body = {
            "apiVersion": groupversion.INFERENCE_SERVICE.api_version,
            "kind": groupversion.INFERENCE_SERVICE.kind,
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": labels,
                "annotations": annotations,
            },
            "spec": {"predictor": {"model": {"storageUri": uri}}},
        }
        return await self.api.create(state.INFERENCE_SERVICES, body)

    # ---- reads ----------------------------------------------------------------------
    async def get(self, res: kube.Resource, name: str, namespace: str | None = None) -> Obj | None:
        try:
            return await self.api.get(res, name, namespace=namespace)
        except errors.NotFound:
            return None

    async def get_cache(self, name: str, namespace: str | None = None) -> Obj | None:
        res = state.LOCAL_MODEL_NAMESPACE_CACHES if namespace else state.LOCAL_MODEL_CACHES
        return await self.get(res, name, namespace)

    async def entries(self, node: str) -> dict[tuple[str, str], Obj]:
        """The node's LocalModelNode entries by (namespace, modelName)."""
        lmn = await self.get(state.LOCAL_MODEL_NODES, node)
        found = ((lmn or {}).get("spec") or {}).get("localModels") or []
        return {(e.get("namespace") or "", e["modelName"]): e for e in found}

    async def set_model_status(self, node: str, statuses: Mapping[str, str]) -> None:
        """Play the agent: set `status.modelStatus` keys on the node's LocalModelNode."""
        await self.api.patch_status(
            state.LOCAL_MODEL_NODES, node, {"status": {"modelStatus": dict(statuses)}}
        )

    async def cache_status(self, name: str, namespace: str | None = None) -> Obj:
        return ((await self.get_cache(name, namespace)) or {}).get("status") or {}

    async def wait_status(
        self,
        name: str,
        namespace: str | None = None,
        *,
        what: str,
        within: float = 30,
        **want: Any,
    ) -> Obj:
        async def check() -> Obj:
            found = await self.cache_status(name, namespace)
            return found if all(found.get(k) == v for k, v in want.items()) else {}

        return await wait_until(check, timeout=within, what=what)

    # ---- cleanup --------------------------------------------------------------------
    async def cleanup(self) -> None:
        for kind, namespace, name in self._caches:
            with contextlib.suppress(errors.NotFound):
                await self.api.delete(CACHE_RESOURCES[kind], name, namespace=namespace or None)
        if self.controllers is not None:
            for kind, namespace, name in self._caches:
                await wait_until(
                    gone(self, CACHE_RESOURCES[kind], name, namespace or None),
                    timeout=60,
                    what=f"cache {namespace}/{name} is deleted after the test",
                )
        await self.stop()
        for kind, namespace, name in self._caches:  # only left when the controllers were down
            with contextlib.suppress(errors.NotFound):
                await self.api.patch(
                    CACHE_RESOURCES[kind],
                    name,
                    {"metadata": {"finalizers": None}},
                    namespace=namespace or None,
                )
        for node in self._nodes:
            with contextlib.suppress(errors.NotFound):
                await self.api.delete(kube.NODES, node)
        for node in self._nodes:
            await wait_until(
                gone(self, state.LOCAL_MODEL_NODES, node),
                timeout=60,
                what=f"LocalModelNode {node} is garbage-collected after the test",
            )
        for group in self._groups:
            with contextlib.suppress(errors.NotFound):
                await self.api.delete(state.LOCAL_MODEL_NODE_GROUPS, group)
        for namespace in self._namespaces:
            await asyncio.to_thread(self.plane.delete_namespace, namespace)


Check = Callable[[], Awaitable[bool]]


def exists(env: Env, res: kube.Resource, name: str, namespace: str | None = None) -> Check:
    """A `wait_until` predicate: the object exists."""

    async def check() -> bool:
        return (await env.get(res, name, namespace)) is not None

    return check


def gone(env: Env, res: kube.Resource, name: str, namespace: str | None = None) -> Check:
    """A `wait_until` predicate: the object does not exist."""
    return gone_by_name(env.api, res, name, namespace)


def phase_is(env: Env, res: kube.Resource, name: str, namespace: str | None, phase: str) -> Check:
    """A `wait_until` predicate: the PV/PVC exists with `status.phase` = `phase`."""

    async def check() -> bool:
        obj = await env.get(res, name, namespace)
        return bool(obj) and ((obj or {}).get("status") or {}).get("phase") == phase

    return check


async def wait_bound_pair(env: Env, *, pv: str, pvc: str, namespace: str, role: str) -> None:
    """Waits until PV `pv` exists and PVC `namespace/pvc` is Bound."""
    await wait_until(exists(env, kube.PERSISTENT_VOLUMES, pv), what=f"{role} PV {pv} exists")
    await wait_until(
        phase_is(env, kube.PERSISTENT_VOLUME_CLAIMS, pvc, namespace, "Bound"),
        what=f"{role} PVC {pvc} is bound in {namespace}",
    )


def lists_exactly(env: Env, node: str, want: set[tuple[str, str]]) -> Check:
    """A `wait_until` predicate: the node's LocalModelNode lists exactly these entries."""

    async def check() -> bool:
        return set(await env.entries(node)) == want

    return check


@pytest.fixture
async def env(
    control_plane: ControlPlane,
    api: kube.Kube,
    garbage_collector_ready: None,
    namespace: str,
) -> AsyncIterator[Env]:
    world = Env(control_plane, api, namespace)
    try:
        yield world
    finally:
        await world.cleanup()


# ------------------------------------------------------------------------ apiserver metrics

_SAMPLE = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def apiserver_writes(plane: ControlPlane, resources: set[str]) -> dict[str, int]:
    """Write requests the apiserver has served for `resources` (by plural), from /metrics,
    per "<verb> <resource>[/<subresource>] <code>". Delete-collection requests (which the
    apiserver also labels DELETE) are left out: the namespace controller sends them while it
    empties the namespaces of earlier tests, and no controller of ours ever does."""
    status, text = plane.rest("GET", "/metrics")
    assert status == 200, text
    found: dict[str, int] = {}
    for line in str(text).splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = dict(_LABEL.findall(match["labels"]))
        if labels.get("verb") not in WRITE_VERBS or labels.get("resource") not in resources:
            continue
        if labels["verb"] == "DELETE" and labels.get("scope") != "resource":
            continue  # a delete-collection: the namespace controller emptying a namespace
        sub = f"/{labels['subresource']}" if labels.get("subresource") else ""
        key = f"{labels['verb']} {labels['resource']}{sub} {labels.get('code', '')}"
        found[key] = found.get(key, 0) + int(float(match["value"]))
    return found


def grown(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """The counters that grew between two `apiserver_writes` readings."""
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
