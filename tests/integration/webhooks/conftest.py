"""The `harness` fixture of the webhook integration tests (see harness.py)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest

from localcache.devenv.controlplane import ControlPlane
from localcache.devenv.waiting import wait_until
from localcache.runtime import kube, manager, metrics
from localcache.runtime.serving import admission
from localcache.webhooks import setup as webhook_setup
from tests.integration.webhooks.harness import Harness
from tests.support import webhooks as wh


async def _stop(mgr: manager.Manager, task: asyncio.Task[int]) -> None:
    mgr.stop()
    assert await task == 0


@pytest.fixture
async def harness(
    control_plane: ControlPlane, crds: list[str], namespace: str
) -> AsyncIterator[Harness]:
    token = uuid.uuid4().hex[:6]
    second = f"{namespace[:50]}-b"
    await asyncio.to_thread(control_plane.create_namespace, second)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(asyncio.to_thread, control_plane.delete_namespace, second)
        client = await kube.Kube.from_kubeconfig(control_plane.kubeconfig_path)
        stack.push_async_callback(client.close)
        adm = admission.AdmissionServer(metrics=metrics.Metrics())
        mgr = manager.Manager(handle_signals=False, shutdown_timeout=5)
        switches = {"servingPodsWaitForCopy": True}  # live settings a test may flip
        hooks = webhook_setup.setup(
            adm,
            mgr,
            client=client,
            local_model_enabled=lambda: True,
            storage_containers=True,
            pods_wait_for_copy=lambda: switches["servingPodsWaitForCopy"],
        )
        task = asyncio.create_task(mgr.run(), name=f"webhook manager {token}")
        stack.push_async_callback(_stop, mgr, task)
        await wait_until(mgr.started.is_set, timeout=30, what="the webhook informers synced")
        # KServe's kinds are optional informers: they settle (list) on their own schedule.
        await wait_until(hooks.synced, timeout=30, what="the webhooks' optional informers settled")
        server = await stack.enter_async_context(wh.run_webhook_server(adm))
        env = Harness(
            control_plane, client, hooks, server, token, [namespace, second], switches=switches
        )
        stack.push_async_callback(env.cleanup)
        yield env
