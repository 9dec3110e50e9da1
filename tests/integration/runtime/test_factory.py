"""One InformerFactory shared by the cache controllers, the admission webhooks and a node agent
on one Manager, against the real control plane: every watch target is listed and watched
once, and a cache written to the apiserver reaches every consumer's store (with every
consumer's indexes) through that one watch."""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from localcache.agent import setup as agent_setup
from localcache.api import groupversion
from localcache.caching import config as config_mod
from localcache.controllers import setup as controllers_setup
from localcache.controllers import state
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime import errors, factory, kube, manager, metrics
from localcache.runtime.keys import ObjectKey
from localcache.runtime.serving import admission
from localcache.webhooks import setup as webhooks_setup
from localcache.webhooks import validation

Obj = dict[str, Any]
LMNC = groupversion.LOCAL_MODEL_NAMESPACE_CACHE

# What the three consumers ask for, merged: (resource, consumers) per watch target without
# selectors; the agent's own targets (filtered to its node or its config) come on top.
SHARED = {
    str(state.LOCAL_MODEL_CACHES): 3,  # controllers, webhooks, agent
    str(state.LOCAL_MODEL_NAMESPACE_CACHES): 3,
    str(state.LOCAL_MODEL_NODE_GROUPS): 3,
    str(state.INFERENCE_SERVICES): 2,  # controllers, webhooks (metadata only, both)
    str(state.LOCAL_MODEL_NODES): 1,  # controllers (the agent watches only its own)
    str(kube.NODES): 2,  # controllers, webhooks (the group fit; the same slim transform)
    str(kube.PERSISTENT_VOLUMES): 1,
    str(kube.PERSISTENT_VOLUME_CLAIMS): 1,
    # controllers (serving claims, status) and webhooks (delete guard), one slim transform
    str(groupversion.LLM_INFERENCE_SERVICE.api): 2,
    str(groupversion.LLM_INFERENCE_SERVICE_CONFIG.api): 1,  # webhooks: spec.baseRefs
}
AGENT_ONLY = 3  # its LocalModelNode, its Jobs, the inferenceservice-config ConfigMap
CONTROLLER_ONLY = 1  # shared-volume caches' import Jobs (label-selected)
OPTIONAL_KIND_CRDS = 3  # KServe's CRDs by name (ISVC, LLMISVC, LLMISVC config): each kind is
# watched while served


@dataclass
class Process:
    """The components of one process, built on one Manager with one factory."""

    manager: manager.Manager
    factory: factory.InformerFactory
    informer_client: kube.Kube
    controllers: controllers_setup.CacheControllers
    webhooks: webhooks_setup.Webhooks


@pytest.fixture
async def process(
    control_plane: ControlPlane, crds: list[str], namespace: str, tmp_path: Path
) -> AsyncIterator[Process]:
    # Informers get their own client, so its request counters count only their LISTs and
    # WATCHes; the components write through another.
    watcher = await kube.Kube.from_kubeconfig(control_plane.kubeconfig_path)
    writer = await kube.Kube.from_kubeconfig(control_plane.kubeconfig_path)
    await _until_served(writer)
    registry = metrics.Metrics()
    mgr = manager.Manager(handle_signals=False, shutdown_timeout=10.0)
    shared = factory.InformerFactory(watcher, mgr)
    cfg = config_mod.parse_config({"localModel": json.dumps({"jobNamespace": namespace})})
    controllers = controllers_setup.setup(
        mgr, kube=writer, config=cfg, metrics=registry, factory=shared
    )
    webhooks = webhooks_setup.setup(
        admission.AdmissionServer(metrics=registry),
        mgr,
        client=writer,
        local_model_enabled=lambda: True,
        factory=shared,
    )
    agent_setup.setup(
        mgr,
        kube=writer,
        settings=agent_setup.AgentSettings(
            node_name=f"node-{uuid.uuid4().hex[:6]}",
            models_root=tmp_path / "models",
            config_namespace=namespace,
            watch_storage_containers=False,
        ),
        metrics=registry,
        factory=shared,
    )
    task = asyncio.create_task(mgr.run(), name="shared-factory-manager")
    try:
        await wait_until(
            lambda: mgr.started.is_set() or task.done(), timeout=60, what="the manager started"
        )
        assert not task.done(), f"manager exited with {task.result()}"
        yield Process(mgr, shared, watcher, controllers, webhooks)
    finally:
        mgr.stop()
        assert await asyncio.wait_for(task, timeout=30) == 0
        await writer.close()
        await watcher.close()


async def _until_served(client: kube.Kube) -> None:
    """Right after the CRDs are installed their storage may still answer 429 for a moment;
    wait until every kind lists (on the writer), so the informers' counts are exact."""

    async def lists(res: kube.Resource) -> bool:
        try:
            await client.list(res, limit=1)
        except errors.TooManyRequests:
            return False
        return True

    for res in (
        state.LOCAL_MODEL_CACHES,
        state.LOCAL_MODEL_NAMESPACE_CACHES,
        state.LOCAL_MODEL_NODES,
        state.LOCAL_MODEL_NODE_GROUPS,
        state.INFERENCE_SERVICES,
    ):
        await wait_until(functools.partial(lists, res), timeout=60, what=f"{res} is served")


def namespace_cache(namespace: str, name: str) -> Obj:
    return {
        "apiVersion": LMNC.api_version,
        "kind": LMNC.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"sourceModelUri": "gs://bucket/model", "modelSize": "1Gi", "nodeGroups": ["g"]},
    }


async def test_each_target_is_listed_and_watched_once_for_all_consumers(
    process: Process,
) -> None:
    informers = len(SHARED) + AGENT_ONLY + CONTROLLER_ONLY + OPTIONAL_KIND_CRDS
    requests = process.informer_client.requests

    await wait_until(
        lambda: requests["watch"] >= informers,
        timeout=30,
        what=f"{informers} informers watch",
    )
    stats = process.factory.stats()
    assert [s.informer.errors for s in stats] == [0] * informers
    assert requests["list"] == informers  # 18 without the factory
    assert requests["watch"] == informers
    assert len(stats) == informers
    unfiltered = {
        str(s.target.resource): s.consumers
        for s in stats
        if s.target.namespace is None
        and s.target.label_selector is None
        and s.target.field_selector is None
    }
    assert unfiltered == SHARED
    per_resource = collections.Counter(str(s.target.resource) for s in stats)
    assert per_resource[str(state.INFERENCE_SERVICES)] == 1, "both read metadata only: shared"
    assert per_resource[str(state.LOCAL_MODEL_NODES)] == 2, "the agent's is filtered to its node"
    for s in stats:
        assert s.informer.synced, s.target
        assert (s.informer.relists, s.informer.watch_restarts) == (0, 0), s.target


async def test_a_cache_reaches_the_webhook_and_controller_stores_through_one_watch(
    process: Process, control_plane: ControlPlane, namespace: str
) -> None:
    hooks, handle = process.webhooks, process.controllers
    assert hooks.namespace_caches is handle.informers["namespace_caches"]
    assert hooks.inference_services is handle.inference_services
    name = f"model-{uuid.uuid4().hex[:6]}"
    key = ObjectKey(namespace, name)
    async with await kube.Kube.from_kubeconfig(control_plane.kubeconfig_path) as api:
        await api.create(
            state.LOCAL_MODEL_NAMESPACE_CACHES,
            namespace_cache(namespace, name),
            namespace=namespace,
        )

        def reconciled_in_both() -> bool:
            seen_by_hooks = hooks.namespace_caches.reader().get(key)
            seen_by_controllers = handle.stores.namespace_caches.get(key)
            return (
                seen_by_hooks is not None
                and seen_by_controllers is seen_by_hooks
                and bool(seen_by_hooks["metadata"].get("finalizers"))
            )

        # The finalizer is the controller's own write, seen back through the shared watch:
        # its handler on the shared informer enqueued the cache.
        await wait_until(
            reconciled_in_both,
            timeout=30,
            what=f"{LMNC.kind} {key} reaches both stores and is reconciled",
        )
        store = hooks.namespace_caches.store
        webhook_index = store.by_index(validation.NAME_INDEX, name)
        # Other tests' namespace caches on a group "g" may linger in namespaces being deleted.
        controller_index = [
            o
            for o in handle.stores.namespace_caches.by_index(state.BY_NODE_GROUP, "g")
            if o["metadata"]["namespace"] == namespace
        ]
        assert [o["metadata"]["name"] for o in webhook_index] == [name]
        assert [o["metadata"]["name"] for o in controller_index] == [name]
        assert "managedFields" not in webhook_index[0]["metadata"]

        await api.delete(state.LOCAL_MODEL_NAMESPACE_CACHES, name, namespace=namespace)
        await wait_until(
            lambda: handle.stores.namespace_caches.get(key) is None,
            timeout=30,
            what=f"{LMNC.kind} {key} is finalized and leaves the shared store",
        )
    isvcs = hooks.inference_services.store
    assert {state.BY_CACHE_LABEL, validation.USED_CACHE_INDEX} <= set(isvcs.index_names)
    assert all(s.informer.watch_restarts == 0 for s in process.factory.stats())
