"""Cache validation through the real apiserver: each rule denies, and kubectl shows why.

Uses the `harness` fixture (harness.py, conftest.py: shipped configurations, scoped to each
test).
"""

from __future__ import annotations

from localcache.api import inferenceservice as isvc_api
from localcache.runtime.keys import ObjectKey
from tests.integration.webhooks.harness import DOWNLOADED, ISVC, Harness, isvc_obj

DENIED = "denied the request: "
CRD_LMC = "localmodelcaches.serving.kserve.io"
CRD_LMNC = "localmodelnamespacecaches.serving.kserve.io"


async def test_a_missing_node_group_is_denied_for_both_kinds(harness: Harness) -> None:
    group = await harness.node_group()
    missing = harness.name("missing")
    async with harness.validating():
        cluster = harness.cache_obj(harness.name("m"), "gs://b/m", groups=[group, missing])
        done = await harness.kubectl_create(cluster)
        assert done.returncode != 0
        assert f"{DENIED}spec.nodeGroups[1]: LocalModelNodeGroup {missing} not found" in done.stderr
        namespaced = harness.cache_obj("m", "gs://b/m", groups=[missing], namespaced=True)
        done = await harness.kubectl_create(namespaced, harness.namespace)
        assert done.returncode != 0
        assert f"{DENIED}spec.nodeGroups[0]: LocalModelNodeGroup {missing} not found" in done.stderr
        fine = await harness.kubectl_create(
            harness.cache_obj("m", "gs://b/m", namespaced=True), harness.namespace
        )
        assert fine.returncode == 0, fine.stderr


async def test_a_duplicate_uri_among_cluster_caches_is_denied(harness: Harness) -> None:
    await harness.node_group()
    first, second = harness.name("first"), harness.name("second")
    await harness.cache(first, "gs://b/model")
    async with harness.validating():
        done = await harness.kubectl_create(harness.cache_obj(second, "gs://b/model/"))
        assert done.returncode != 0
        assert (
            f"{DENIED}spec.sourceModelUri: LocalModelCache {first} has the same StorageURI "
            "gs://b/model" in done.stderr
        )
        # A namespace cache may cache the same model for its own namespace.
        ns_copy = harness.cache_obj("copy", "gs://b/model", namespaced=True)
        done = await harness.kubectl_create(ns_copy, harness.namespace)
        assert done.returncode == 0, done.stderr


async def test_names_may_not_collide_across_the_two_kinds(harness: Harness) -> None:
    await harness.node_group()
    cluster_name, ns_name = harness.name("cluster"), harness.name("nscache")
    await harness.cache(cluster_name, "gs://b/one")
    await harness.cache(ns_name, "gs://b/two", namespace=harness.namespace)
    async with harness.validating():
        as_ns = harness.cache_obj(cluster_name, "gs://b/three", namespaced=True)
        done = await harness.kubectl_create(as_ns, harness.namespace)
        assert done.returncode != 0
        assert f"{DENIED}metadata.name: LocalModelCache {cluster_name} has the same name" in (
            done.stderr
        )
        done = await harness.kubectl_create(harness.cache_obj(ns_name, "gs://b/four"))
        assert done.returncode != 0
        assert (
            f"{DENIED}metadata.name: LocalModelNamespaceCache {harness.namespace}/{ns_name} "
            "has the same name" in done.stderr
        )


async def test_a_cache_beyond_the_node_groups_storage_limit_is_denied(harness: Harness) -> None:
    group = await harness.node_group(limit="10Gi")
    await harness.cache(harness.name("a"), "gs://b/a", size="6Gi")
    await harness.cache("a-again", "gs://b/a", size="6Gi", namespace=harness.namespace)
    async with harness.validating():
        big = harness.cache_obj(harness.name("big"), "gs://b/big", size="5Gi")
        done = await harness.kubectl_create(big)
        assert done.returncode != 0
        assert (
            f"{DENIED}spec.modelSize: LocalModelNodeGroup {group} has storageLimit 10Gi, but its "
            "models would need 11Gi: 6Gi used by 1 other model URI(s) plus 5Gi for gs://b/big"
        ) in done.stderr
        fits = harness.cache_obj(harness.name("fits"), "gs://b/fits", size="4Gi")
        done = await harness.kubectl_create(fits)
        assert done.returncode == 0, done.stderr


async def test_a_cache_in_use_cannot_be_deleted_until_its_isvc_is_gone(harness: Harness) -> None:
    await harness.node_group()
    name = harness.name("used")
    await harness.cache(name, "gs://b/model", status=DOWNLOADED)
    async with harness.mutating(), harness.validating():
        done = await harness.kubectl_create(isvc_obj("iris", "gs://b/model"), harness.namespace)
        assert done.returncode == 0, done.stderr
        key = ObjectKey(harness.namespace, "iris")
        await harness.seen(harness.hooks.inference_services, key)
        refused = await harness.kubectl("delete", CRD_LMC, name)
        assert refused.returncode != 0
        assert (
            f"{DENIED}status.inferenceServices: LocalModelCache {name} is being used by "
            f"InferenceService {harness.namespace}/iris" in refused.stderr
        )
        removed = await harness.kubectl("delete", "-n", harness.namespace, ISVC.plural, "iris")
        assert removed.returncode == 0, removed.stderr
        await harness.gone(harness.hooks.inference_services, key)
        deleted = await harness.kubectl("delete", CRD_LMC, name)
        assert deleted.returncode == 0, deleted.stderr


async def test_an_isvc_listed_in_status_that_no_longer_exists_does_not_block_deletion(
    harness: Harness,
) -> None:
    await harness.node_group()
    name = harness.name("stale")
    status = {**DOWNLOADED, "inferenceServices": [{"namespace": harness.namespace, "name": "gone"}]}
    await harness.cache(name, "gs://b/model", status=status)
    async with harness.validating():
        done = await harness.kubectl("delete", CRD_LMC, name)
    assert done.returncode == 0, done.stderr


async def test_a_namespace_cache_in_use_cannot_be_deleted(harness: Harness) -> None:
    await harness.node_group()
    ns = harness.namespace
    await harness.cache("ns-model", "gs://b/model", namespace=ns, status=DOWNLOADED)
    async with harness.mutating(), harness.validating():
        done = await harness.kubectl_create(isvc_obj("iris", "gs://b/model"), ns)
        assert done.returncode == 0, done.stderr
        stored = await harness.get(ISVC, "iris", ns)
        assert stored["metadata"]["labels"][isvc_api.LOCAL_MODEL_NAMESPACE_LABEL] == ns
        await harness.seen(harness.hooks.inference_services, ObjectKey(ns, "iris"))
        refused = await harness.kubectl("delete", "-n", ns, CRD_LMNC, "ns-model")
    assert refused.returncode != 0
    assert (
        f"{DENIED}status.inferenceServices: LocalModelNamespaceCache {ns}/ns-model is being "
        f"used by InferenceService {ns}/iris" in refused.stderr
    )


async def test_with_the_server_stopped_cache_creation_fails(harness: Harness) -> None:
    await harness.node_group()
    async with harness.validating():
        await harness.server.stop()
        done = await harness.kubectl_create(harness.cache_obj(harness.name("m"), "gs://b/m"))
        assert done.returncode != 0
        assert "failed calling webhook" in done.stderr
        ns_done = await harness.kubectl_create(
            harness.cache_obj("m", "gs://b/m", namespaced=True), harness.namespace
        )
        assert ns_done.returncode != 0
        assert "failed calling webhook" in ns_done.stderr
    missing = await harness.kubectl("get", CRD_LMC, harness.name("m"))
    assert missing.returncode != 0
