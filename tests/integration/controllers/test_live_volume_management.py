"""`disableVolumeManagement` from the live ConfigMap, on the composed controller process.

The process is built as `localcache controller` builds it (`app.run_components` with the
controller and webhook components, settings parsed from its environment), so the
configuration comes from the ConfigMap through the shared informer, which syncs only once the
Manager runs. Issue 19: the cache controllers read the setting at set-up, before that sync,
so they always managed InferenceServices' volumes and wrote `status.inferenceServices`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from localcache import app
from localcache import settings as settings_mod
from localcache.caching import names
from localcache.controllers import state
from localcache.devenv.waiting import wait_until
from localcache.runtime import kube, manager
from tests.integration.controllers.conftest import Env, exists, gone

pytestmark = pytest.mark.kcm

CONFIG_MAP = "inferenceservice-config"


def _config(namespace: str, *, job_namespace: str, disabled: bool) -> dict[str, Any]:
    local_model = {
        "enabled": True,
        "jobNamespace": job_namespace,
        "disableVolumeManagement": disabled,
    }
    return {
        "metadata": {"name": CONFIG_MAP, "namespace": namespace},
        "data": {"localModel": json.dumps(local_model)},
    }


@contextlib.asynccontextmanager
async def _controller_process(env: Env, config_namespace: str) -> AsyncIterator[None]:
    """`localcache controller` in-process: its Manager, from settings read as the CLI reads
    them (no webhook server, no lease: this test's namespace only)."""
    settings = settings_mod.from_args(
        argparse.Namespace(),
        "controller",
        {
            "KUBECONFIG": str(env.plane.kubeconfig_path),
            "POD_NAMESPACE": config_namespace,
            "LOCALCACHE_METRICS_PORT": "0",
            "LOCALCACHE_BIND_ADDRESS": "127.0.0.1",
            "LOCALCACHE_WEBHOOK_PORT": "0",
            "LOCALCACHE_LEADER_ELECT": "false",
        },
    )
    built: list[manager.Manager] = []
    components = app.Components(controller=True, webhooks=True)
    task = asyncio.create_task(
        app.run_components(settings, components, on_manager=built.append, handle_signals=False),
        name=f"controller-process-{env.suffix}",
    )
    try:
        await wait_until(
            lambda: (bool(built) and built[0].started.is_set()) or task.done(),
            timeout=60,
            what="the controller process synced its informers and started",
        )
        assert not task.done(), f"the controller process exited with {task.result()}"
        yield
        assert not task.done(), f"the controller process exited with {task.result()}"
    finally:
        for mgr in built:
            mgr.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=30)


async def _stays(check: Callable[[], Awaitable[bool]], *, seconds: float, what: str) -> None:
    """Fail as soon as `check()` is False within `seconds` (a negative: nothing to wait for)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        assert await check(), f"no longer true: {what}"
        await asyncio.sleep(0.2)


async def test_a_configmap_disabling_volume_management_is_obeyed_by_the_controller_process(
    env: Env,
) -> None:
    group = env.name("gpu")
    await env.group(group, group)
    await env.node(env.name("node"), group)
    isvc_ns = await env.namespace_("isvcs")
    config_ns = env.namespace
    await env.api.create(
        kube.CONFIG_MAPS,
        _config(config_ns, job_namespace=env.namespace, disabled=True),
        namespace=config_ns,
    )
    name = env.name("off")
    serving_pv = names.serving_pv(name, group, isvc_ns)
    async with _controller_process(env, config_ns):
        try:
            await env.cache(name, [group])
            await env.isvc("plain", isvc_ns, cache=name)
            await env.wait_status(
                name,
                copies={"available": 0, "total": 1, "failed": 0},
                what=f"the controller reconciled cache {name}",
            )

            async def unmanaged() -> bool:
                found = await env.cache_status(name)
                return (
                    "inferenceServices" not in found
                    and not await exists(env, kube.PERSISTENT_VOLUMES, serving_pv)()
                )

            await _stays(
                unmanaged,
                seconds=5,
                what=f"cache {name} has no status.inferenceServices and no serving PV "
                "while the ConfigMap disables volume management",
            )

            # The ConfigMap takes effect live: enabling volume management reconciles the cache
            # (which also shows the InferenceService was seen all along).
            enabled = _config(config_ns, job_namespace=env.namespace, disabled=False)
            await env.api.patch(
                kube.CONFIG_MAPS, CONFIG_MAP, {"data": enabled["data"]}, namespace=config_ns
            )
            await env.wait_status(
                name,
                inferenceServices=[{"namespace": isvc_ns, "name": "plain"}],
                what=f"cache {name} lists its InferenceService once volume management is on",
            )
            await wait_until(
                exists(env, kube.PERSISTENT_VOLUMES, serving_pv),
                what=f"serving PV {serving_pv} created once volume management is on",
            )
        finally:
            # while the process runs, so that it removes its finalizer
            await env.api.delete(state.LOCAL_MODEL_CACHES, name)
            await wait_until(
                gone(env, state.LOCAL_MODEL_CACHES, name), timeout=60, what=f"{name} deleted"
            )
