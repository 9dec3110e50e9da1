"""Issue 21 (3): copy readiness labels on Nodes follow the LocalModelNodes' status, on the real
apiserver: a label appears when a node's copy is downloaded, and goes when the copy goes, the
node leaves the group, the cache is deleted, or `servingPodsWaitForCopy` is turned off. Labels
that are not localcache's are never touched."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from localcache.api import inferenceservice
from localcache.caching import readiness as readiness_rules
from localcache.controllers import readiness, state
from localcache.devenv.waiting import wait_until
from localcache.runtime import factory, kube, manager, metrics
from tests.integration.controllers.conftest import Env, lists_exactly

DOWNLOADED = "ModelDownloaded"
Obj = dict[str, Any]


class Labels:
    """The readiness controllers on their own Manager, with a switchable setting."""

    def __init__(self) -> None:
        self.enabled = True
        self.handle: readiness.ReadinessControllers | None = None


@pytest.fixture
async def labels(env: Env) -> AsyncIterator[Labels]:
    held = Labels()
    client = await kube.Kube.from_kubeconfig(env.plane.kubeconfig_path)
    mgr = manager.Manager(handle_signals=False, shutdown_timeout=10.0)
    held.handle = readiness.setup(
        mgr,
        kube_api=client,
        enabled=lambda: held.enabled,
        metrics=metrics.Metrics(),
        factory=factory.InformerFactory(client, mgr),
    )
    task = asyncio.create_task(mgr.run(), name=f"readiness-manager-{env.suffix}")
    try:
        await wait_until(lambda: mgr.started.is_set() or task.done(), what="the manager started")
        assert not task.done(), f"manager exited with {task.result()}"
        yield held
    finally:
        mgr.stop()
        await asyncio.wait_for(task, timeout=30)
        await client.close()


def node_labels(env: Env, node: str) -> Callable[[], Awaitable[dict[str, str]]]:
    async def read() -> dict[str, str]:
        obj = await env.get(kube.NODES, node)
        return dict(((obj or {}).get("metadata") or {}).get("labels") or {})

    return read


def has_label(
    env: Env, node: str, key: str, *, present: bool = True
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return ((await node_labels(env, node)()).get(key) == "true") == present

    return check


async def test_labels_follow_downloads_group_membership_deletion_and_the_setting(
    env: Env, labels: Labels
) -> None:
    group = env.name("gpu")
    await env.group(group, group)
    first = await env.node(env.name("first"), group)
    second = await env.node(env.name("second"), group)
    await env.api.patch(kube.NODES, first, {"metadata": {"labels": {"team": "ml"}}})
    await env.start()
    iris, llama = env.name("iris"), env.name("llama")
    await env.cache(iris, [group])
    await env.cache(llama, [group])
    for node in (first, second):
        await wait_until(
            lists_exactly(env, node, {("", iris), ("", llama)}), what=f"{node} lists both caches"
        )
    iris_key, llama_key = readiness_rules.label_key(iris), readiness_rules.label_key(llama)

    # a downloaded copy labels its node; a copy still downloading does not
    await env.set_model_status(first, {iris: DOWNLOADED, llama: "ModelDownloading"})
    await env.set_model_status(second, {iris: "ModelDownloading"})
    await wait_until(has_label(env, first, iris_key), what=f"{first} is labelled ready for {iris}")
    assert (await node_labels(env, first)())["team"] == "ml"
    assert llama_key not in await node_labels(env, first)()
    assert iris_key not in await node_labels(env, second)()

    await env.set_model_status(first, {llama: DOWNLOADED})
    await env.set_model_status(second, {iris: DOWNLOADED})
    await wait_until(has_label(env, first, llama_key), what=f"{first} ready for {llama}")
    await wait_until(has_label(env, second, iris_key), what=f"{second} ready for {iris}")

    # the copy goes (a failed re-download): the label goes
    await env.set_model_status(second, {iris: "ModelDownloadError"})
    await wait_until(
        has_label(env, second, iris_key, present=False), what=f"{second} loses {iris}'s label"
    )

    # the cache is deleted: its label goes from every node, the other cache's stays
    await env.api.delete(state.LOCAL_MODEL_CACHES, llama)
    await wait_until(
        has_label(env, first, llama_key, present=False),
        what=f"{first} loses the label of deleted cache {llama}",
    )
    assert (await node_labels(env, first)()).get(iris_key) == "true"

    # the node leaves the group: its labels go (its LocalModelNode no longer lists the cache)
    await env.label(first, None)
    await wait_until(
        has_label(env, first, iris_key, present=False),
        what=f"{first}, out of the group, loses {iris}'s label",
    )
    assert (await node_labels(env, first)())["team"] == "ml"

    # the setting is turned off: every label of ours goes, others stay
    await env.label(first, group)
    await wait_until(lists_exactly(env, first, {("", iris)}), what=f"{first} lists {iris} again")
    await env.set_model_status(first, {iris: DOWNLOADED})
    await env.set_model_status(second, {iris: DOWNLOADED})
    for node in (first, second):
        await wait_until(has_label(env, node, iris_key), what=f"{node} ready for {iris} again")
    labels.enabled = False
    assert labels.handle is not None
    labels.handle.config_changed()
    for node in (first, second):
        await wait_until(
            has_label(env, node, iris_key, present=False),
            what=f"{node} loses {iris}'s label with servingPodsWaitForCopy off",
        )
    assert (await node_labels(env, first)())["team"] == "ml"


async def test_a_pod_the_scheduler_refused_gets_an_event_naming_the_nodes_still_downloading(
    env: Env, labels: Labels
) -> None:
    group = env.name("gpu")
    await env.group(group, group)
    done = await env.node(env.name("done"), group)
    slow = await env.node(env.name("slow"), group)
    await env.start()
    cache = env.name("llama")
    await env.cache(cache, [group])
    for node in (done, slow):
        await wait_until(lists_exactly(env, node, {("", cache)}), what=f"{node} lists {cache}")
    await env.set_model_status(done, {cache: DOWNLOADED})
    await env.set_model_status(slow, {cache: "ModelDownloading"})
    namespace = await env.namespace_("serving")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "predictor-0",
            "labels": {inferenceservice.LOCAL_MODEL_LABEL: cache},
            "annotations": {readiness_rules.WAITS_FOR_ANNOTATION: cache},
        },
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]},
    }
    await env.api.create(kube.PODS, pod, namespace=namespace)
    # play the scheduler (none runs here): the pod fits no node
    refused = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity",
    }
    await env.api.patch_status(
        kube.PODS, "predictor-0", {"status": {"conditions": [refused]}}, namespace=namespace
    )

    async def waiting_event() -> Obj:
        found = await env.api.list(kube.EVENTS, namespace=namespace)
        for event in found.items:
            if event.get("reason") == readiness.WAITING_REASON:
                return event
        return {}

    event = await wait_until(
        waiting_event, timeout=30, what="a WaitingForModelCopy Event on the refused pod"
    )
    assert event["involvedObject"]["name"] == "predictor-0"
    assert event["type"] == "Warning"
    assert f"LocalModelCache {cache}" in event["message"]
    assert f"nodes still downloading: {slow} (ModelDownloading);" in event["message"]
    assert f"complete on: {done} (" in event["message"]
