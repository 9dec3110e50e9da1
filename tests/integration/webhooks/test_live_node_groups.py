"""A node group the validator's informer has not delivered yet is read from the real
apiserver (`webhooks.livegroups`).

A CI run saw `kubectl apply` of a group and a cache naming it denied: "LocalModelNodeGroup …
not found", the cache's admission having come before the group's watch event. Here the
validator's node-group store is one that has not seen the group (an empty store: the moment
before the event), the group exists in the apiserver, and the reader the shipped setup uses
(`livegroups.reader`) finds it.
"""

from __future__ import annotations

from pathlib import Path

from localcache.runtime import kube, store
from localcache.runtime.keys import ObjectKey
from localcache.webhooks import livegroups, validation
from tests.integration.webhooks.harness import Harness
from tests.unit.webhooks.test_validation import Stores, request


def _behind(harness: Harness, *, live: bool) -> validation.CacheValidator:
    stores = Stores()
    stores.node_groups = store.Store()  # has not seen any group yet
    reader = livegroups.reader(harness.client) if live else None
    return stores.validator(namespaced=True, read_node_group=reader)


async def test_a_group_the_store_has_not_seen_is_read_from_the_apiserver(harness: Harness) -> None:
    group = await harness.node_group()
    missing = harness.name("missing")
    cache = harness.cache_obj("m", "gs://b/m", groups=[group], namespaced=True)
    cache["metadata"]["namespace"] = harness.namespace
    create = request("CREATE", obj=cache, namespace=harness.namespace)
    assert not (await _behind(harness, live=False)(create)).allowed, "the race, without the read"
    assert (await _behind(harness, live=True)(create)).allowed
    cache["spec"]["nodeGroups"] = [group, missing]
    answer = await _behind(harness, live=True)(
        request("CREATE", obj=cache, namespace=harness.namespace)
    )
    assert not answer.allowed
    assert answer.message == f"spec.nodeGroups[1]: LocalModelNodeGroup {missing} not found"


async def test_the_reader_answers_none_for_a_group_that_does_not_exist(harness: Harness) -> None:
    group = await harness.node_group()
    read = livegroups.reader(harness.client)
    found = await read(group)
    assert found is not None
    assert found["metadata"]["name"] == group
    assert await read(harness.name("missing")) is None


async def test_the_shipped_handler_admits_a_cache_whose_group_its_store_has_not_seen(
    harness: Harness,
) -> None:
    """Through `webhooks.setup` and kubectl: the group is taken out of the handler's own
    store (as if its watch event were still on the way); the cache is admitted."""
    group = await harness.node_group()
    harness.hooks.node_groups.store.delete(ObjectKey("", group))
    async with harness.validating():
        cache = harness.cache_obj("m", "gs://b/m", groups=[group], namespaced=True)
        done = await harness.kubectl_create(cache, harness.namespace)
        assert done.returncode == 0, done.stderr


async def test_a_reader_the_apiserver_refuses_finds_nothing(
    harness: Harness, tmp_path: Path
) -> None:
    group = await harness.node_group()
    nobody = harness.plane.add_user(f"nobody-{harness.token}", [])
    config = harness.plane.write_kubeconfig(nobody, tmp_path / "nobody.kubeconfig")
    client = await kube.Kube.from_kubeconfig(config)
    try:
        assert await livegroups.reader(client)(group) is None  # 403: logged, missing
    finally:
        await client.close()
