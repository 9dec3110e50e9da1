"""Start in any order: the controller, the webhooks and the agent start and serve without
KServe's InferenceService and ClusterStorageContainer CRDs, begin watching those kinds when
the CRDs appear (no restart), stop when they go and resume when they come back.

Every test runs on the module's own control plane (`private_plane`), never the session's:
installing and deleting KServe's stand-in CRDs there would break other tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localcache.agent import setup as agent_setup
from localcache.api import groupversion, storage
from localcache.api import inferenceservice as isvc_api
from localcache.caching import config as config_mod
from localcache.controllers import setup as controllers_setup
from localcache.devenv import crds as crd_install
from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime import factory, kube, manager, metrics
from localcache.runtime.crds import optional
from localcache.runtime.keys import ObjectKey
from localcache.runtime.serving import admission
from localcache.webhooks import setup as webhooks_setup
from tests.integration.agent.harness import IMAGE, Agent, entry
from tests.integration.anyorder.conftest import CSC_CRD, ISVC_CRD
from tests.integration.webhooks.harness import Harness, isvc_obj
from tests.support import webhooks as wh

Obj = dict[str, Any]
ISVC = groupversion.INFERENCE_SERVICE
CSC = groupversion.CLUSTER_STORAGE_CONTAINER
LMC = groupversion.LOCAL_MODEL_CACHE


@dataclass
class Process:
    """Controller and webhooks on one Manager and one factory, as `localcache controller`."""

    manager: manager.Manager
    task: asyncio.Task[int]
    controllers: controllers_setup.CacheControllers
    hooks: webhooks_setup.Webhooks
    harness: Harness

    def alive(self) -> None:
        assert not self.task.done(), f"the manager exited with {self.task.result()}"


@contextlib.asynccontextmanager
async def controller_process(plane: ControlPlane) -> AsyncIterator[Process]:
    token = uuid.uuid4().hex[:6]
    namespaces = [f"anyorder-{token}", f"anyorder-{token}-b"]
    for ns in namespaces:
        await asyncio.to_thread(plane.create_namespace, ns)
    async with contextlib.AsyncExitStack() as stack:
        for ns in namespaces:
            stack.push_async_callback(asyncio.to_thread, plane.delete_namespace, ns)
        client = await kube.Kube.from_kubeconfig(plane.kubeconfig_path)
        stack.push_async_callback(client.close)
        registry = metrics.Metrics()
        mgr = manager.Manager(handle_signals=False, shutdown_timeout=10, cache_sync_timeout=30)
        shared = factory.InformerFactory(client, mgr)
        cfg = config_mod.parse_config({"localModel": json.dumps({"jobNamespace": namespaces[0]})})
        controllers = controllers_setup.setup(
            mgr, kube=client, config=cfg, metrics=registry, factory=shared
        )
        adm = admission.AdmissionServer(metrics=registry)
        hooks = webhooks_setup.setup(
            adm,
            mgr,
            client=client,
            local_model_enabled=lambda: True,
            factory=shared,
            storage_containers=True,
        )
        task = asyncio.create_task(mgr.run(), name=f"anyorder manager {token}")

        async def stop() -> None:
            mgr.stop()
            assert await asyncio.wait_for(task, timeout=30) == 0, "the manager's exit code"

        stack.push_async_callback(stop)
        await wait_until(
            lambda: mgr.started.is_set() or task.done(),
            timeout=40,
            what="the controller started without KServe's CRDs",
        )
        server = await stack.enter_async_context(wh.run_webhook_server(adm))
        harness = Harness(plane, client, hooks, server, token, namespaces)
        stack.push_async_callback(harness.cleanup)
        process = Process(mgr, task, controllers, hooks, harness)
        process.alive()
        yield process


async def availability(
    opt: optional.OptionalInformer, want: optional.Availability, *, what: str
) -> None:
    await wait_until(lambda: opt.availability is want, timeout=30, what=what)


def delete_crd(plane: ControlPlane, name: str) -> None:
    status, body = plane.rest("DELETE", f"{crd_install.CRD_PATH}/{name}")
    assert status in (200, 202), f"deleting CRD {name}: {status} {body}"


def crd_gone(plane: ControlPlane, name: str) -> bool:
    status, _ = plane.rest("GET", f"{crd_install.CRD_PATH}/{name}")
    return status == 404


async def tracked_isvcs(process: Process, name: str) -> list[Obj]:
    cache = await process.harness.get(LMC.api, name)
    return list((cache.get("status") or {}).get("inferenceServices") or [])


async def test_the_controller_starts_without_kserve_then_watches_isvcs_when_the_crd_appears(
    private_plane: ControlPlane,
) -> None:
    async with controller_process(private_plane) as process:
        isvcs = process.controllers.inference_services
        assert isvcs is not None
        assert isvcs is process.hooks.inference_services, "one shared optional informer"
        assert isvcs.availability is optional.Availability.ABSENT
        assert process.hooks.synced(), "an absent kind does not hold the webhooks back"
        harness = process.harness
        group = await harness.node_group()
        name = harness.name("model")
        await harness.client.create(
            LMC.api, harness.cache_obj(name, "gs://bucket/model", groups=[group])
        )

        async def reconciled() -> bool:
            cache = await harness.get(LMC.api, name)
            return bool(cache["metadata"].get("finalizers")) and bool(cache.get("status"))

        await wait_until(reconciled, timeout=30, what=f"cache {name} reconciled without KServe")

        await asyncio.to_thread(crd_install.install_crds, private_plane, [ISVC_CRD])
        await availability(
            isvcs, optional.Availability.SYNCED, what="InferenceServices watched after the CRD"
        )
        async with harness.mutating():
            done = await harness.kubectl_create(
                isvc_obj("iris", "gs://bucket/model/v1"), harness.namespace
            )
            assert done.returncode == 0, done.stderr
        isvc = await harness.get(ISVC.api, "iris", harness.namespace)
        labels = isvc["metadata"].get("labels") or {}
        assert labels.get(isvc_api.LOCAL_MODEL_LABEL) == name, "the webhook mutated the ISVC"

        async def tracks_iris() -> bool:
            return await tracked_isvcs(process, name) == [
                {"namespace": harness.namespace, "name": "iris"}
            ]

        await wait_until(tracks_iris, timeout=30, what=f"cache {name} lists ISVC iris (mapping)")
        process.alive()


async def test_deleting_the_isvc_crd_stops_its_watch_and_recreating_it_resumes(
    private_plane: ControlPlane,
) -> None:
    crd = crd_install.load_crds([ISVC_CRD])[0]["metadata"]["name"]
    await asyncio.to_thread(crd_install.install_crds, private_plane, [ISVC_CRD])
    async with controller_process(private_plane) as process:
        isvcs = process.controllers.inference_services
        assert isvcs is not None
        await availability(isvcs, optional.Availability.SYNCED, what="ISVCs watched at start")
        ns = process.harness.namespace
        await process.harness.client.create(ISVC.api, isvc_obj("before", "gs://b/m"), namespace=ns)
        await wait_until(
            lambda: isvcs.reader().get(ObjectKey(ns, "before")) is not None,
            timeout=30,
            what="the ISVC informer holds ISVC before",
        )

        await asyncio.to_thread(delete_crd, private_plane, crd)
        await availability(isvcs, optional.Availability.ABSENT, what="the ISVC watch stopped")
        assert isvcs.current is None
        assert isvcs.reader().list() == [], "no ISVCs while the kind is not served"
        await wait_until(
            lambda: crd_gone(private_plane, crd), timeout=60, what=f"CRD {crd} deleted"
        )
        process.alive()
        assert all(inf.synced.is_set() for inf in process.controllers.informers.values())

        await asyncio.to_thread(crd_install.install_crds, private_plane, [ISVC_CRD])
        await availability(isvcs, optional.Availability.SYNCED, what="the ISVC watch resumed")
        await process.harness.client.create(ISVC.api, isvc_obj("after", "gs://b/m"), namespace=ns)
        await wait_until(
            lambda: isvcs.reader().get(ObjectKey(ns, "after")) is not None,
            timeout=30,
            what="the resumed ISVC informer holds ISVC after",
        )
        assert isvcs.reader().get(ObjectKey(ns, "before")) is None, "deleted with its CRD"
        process.alive()
    await asyncio.to_thread(delete_crd, private_plane, crd)
    await wait_until(lambda: crd_gone(private_plane, crd), timeout=60, what=f"CRD {crd} deleted")


def _image(job: Obj) -> str:
    return str(job["spec"]["template"]["spec"]["containers"][0]["image"])


async def test_the_agent_uses_a_storage_container_created_after_its_crd_appeared(
    private_plane: ControlPlane, tmp_path: Path
) -> None:
    namespace = f"anyorder-agent-{uuid.uuid4().hex[:6]}"
    await asyncio.to_thread(private_plane.create_namespace, namespace)
    root = tmp_path / "models-root"
    root.mkdir()
    node = Agent(private_plane, namespace=namespace, root=root)
    csc_name = f"fetcher-{uuid.uuid4().hex[:6]}"
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(asyncio.to_thread, private_plane.delete_namespace, namespace)
        stack.push_async_callback(node.close)
        await node.configure()
        group = await node.node_group()
        client = await kube.Kube.from_kubeconfig(private_plane.kubeconfig_path)
        stack.push_async_callback(client.close)
        mgr = manager.Manager(handle_signals=False, shutdown_timeout=10, cache_sync_timeout=30)
        shared = factory.InformerFactory(client, mgr)
        agent_setup.setup(
            mgr,
            kube=client,
            settings=agent_setup.AgentSettings(
                node_name=node.node,
                models_root=root,
                config_namespace=namespace,
                job_backoff_limit=0,
            ),
            metrics=metrics.Metrics(),
            factory=shared,
        )
        containers = shared.optional_informer(CSC.api)
        task = asyncio.create_task(mgr.run(), name=f"anyorder agent {node.node}")

        async def stop() -> None:
            mgr.stop()
            assert await asyncio.wait_for(task, timeout=30) == 0, "the agent's exit code"

        stack.push_async_callback(stop)
        await wait_until(
            lambda: mgr.started.is_set() or task.done(),
            timeout=40,
            what="the agent started without KServe's CRDs",
        )
        assert not task.done()
        assert containers.availability is optional.Availability.ABSENT

        await node.set_models([entry("first", "s3://mybucket/first", group=group)])
        (first,) = await node.wait_jobs(1)
        assert _image(first) == IMAGE, "without the CRD: storageInitializer.image"

        await asyncio.to_thread(crd_install.install_crds, private_plane, [CSC_CRD])
        stack.push_async_callback(asyncio.to_thread, _delete_crd_of, private_plane, CSC_CRD)
        await availability(
            containers, optional.Availability.SYNCED, what="storage containers watched"
        )
        await client.create(
            CSC.api,
            {
                "apiVersion": CSC.api_version,
                "kind": CSC.kind,
                "metadata": {"name": csc_name},
                "spec": {
                    "container": {"name": "fetch", "image": "example/fetcher:1"},
                    "supportedUriFormats": [{"prefix": "s3://mybucket/"}],
                    "workloadType": storage.WORKLOAD_LOCAL_MODEL_DOWNLOAD_JOB,
                },
            },
        )
        await wait_until(
            lambda: containers.reader().get(ObjectKey("", csc_name)) is not None,
            timeout=30,
            what=f"the agent's informer holds ClusterStorageContainer {csc_name}",
        )
        await node.set_models(
            [
                entry("first", "s3://mybucket/first", group=group),
                entry("second", "s3://mybucket/second", group=group),
            ]
        )
        jobs = await node.wait_jobs(2)
        (second,) = [j for j in jobs if j["metadata"]["uid"] != first["metadata"]["uid"]]
        assert _image(second) == "example/fetcher:1", "the new container's image"
        assert not task.done()


def _delete_crd_of(plane: ControlPlane, path: Path) -> None:
    delete_crd(plane, crd_install.load_crds([path])[0]["metadata"]["name"])
