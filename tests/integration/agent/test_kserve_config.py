"""The agent of the with-kserve profile (`--config-map localcache-config --kserve-config
<ns>/inferenceservice-config`) reads KServe's ConfigMap read-only under its own: KServe's
storageInitializer applies, localcache's own keys (jobNamespace) win, and a change of
KServe's ConfigMap reaches the next Job without a restart."""

from __future__ import annotations

import json
from collections.abc import Callable

from localcache.devenv.waiting import wait_until
from localcache.runtime import keys
from tests.integration.agent.harness import Agent, Obj, entry

KSERVE_IMAGE = "registry.example/kserve/storage-initializer:v0.20.0"
NEXT_IMAGE = "registry.example/kserve/storage-initializer:v0.20.1"


def _config_map(name: str, **sections: Obj) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name},
        "data": {k: json.dumps(v) for k, v in sections.items()},
    }


def _image(job: Obj) -> str:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return str(container["image"])


async def test_kserve_settings_apply_under_localcache_own(
    agent: Agent, other_namespace: Callable[[], str]
) -> None:
    kserve_ns = other_namespace()
    kserve = _config_map(
        "inferenceservice-config",
        storageInitializer={"image": KSERVE_IMAGE, "memoryLimit": "3Gi"},
        localModel={"jobNamespace": "kserve-localmodel-jobs", "enabled": False},
    )
    await agent.create(f"/api/v1/namespaces/{kserve_ns}/configmaps", kserve)
    own = _config_map(
        "localcache-config",
        localModel={
            "jobNamespace": agent.namespace,
            "downloadRetryBackoffInSecs": 1,
            "downloadRetryMaxBackoffInSecs": 2,
        },
    )
    await agent.create(f"/api/v1/namespaces/{agent.namespace}/configmaps", own)

    await agent.start(
        config_map="localcache-config",
        kserve_config=keys.ObjectKey(kserve_ns, "inferenceservice-config"),
    )
    await agent.set_models([entry("iris", group=agent.group)])
    [job] = await agent.wait_jobs(1)  # in agent.namespace: localcache's jobNamespace won
    assert _image(job) == KSERVE_IMAGE
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["memory"] == "3Gi"

    await agent.patch(
        f"/api/v1/namespaces/{kserve_ns}/configmaps/inferenceservice-config",
        {"data": {"storageInitializer": json.dumps({"image": NEXT_IMAGE})}},
    )
    await agent.set_models(
        [entry("iris", group=agent.group), entry("resnet", "s3://b/resnet", group=agent.group)]
    )

    async def next_job_uses_new_image() -> bool:
        return any(_image(j) == NEXT_IMAGE for j in await agent.jobs())

    await wait_until(
        next_job_uses_new_image,
        timeout=30,
        what="a Job created after KServe's ConfigMap changed uses its new image",
    )
