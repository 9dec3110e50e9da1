"""Admission of the spec's own values through the real apiserver (issue 14): a source URI
without a download path is refused with the supported schemes, unless a
ClusterStorageContainer for download Jobs claims it; names up to 63 characters (the longest
label value, issue 21: test_webhook_rules.py refuses longer ones) are admitted, their derived
names shortened where they would not fit."""

from __future__ import annotations

from localcache.api import groupversion, storage
from localcache.devenv.waiting import wait_until
from localcache.runtime.keys import ObjectKey
from tests.integration.webhooks.harness import Harness

DENIED = "denied the request: "
CSC = groupversion.CLUSTER_STORAGE_CONTAINER.api


async def test_uris_without_a_download_path_are_denied_listing_the_schemes(
    harness: Harness,
) -> None:
    await harness.node_group()
    async with harness.validating():
        for uri in ("my-model", "ftp://host/model"):
            cluster = harness.cache_obj(harness.name("m"), uri)
            done = await harness.kubectl_create(cluster)
            assert done.returncode != 0
            assert f"{DENIED}spec.sourceModelUri: no download path supports '{uri}'" in (
                done.stderr
            )
            assert "supported schemes are gs://, s3://" in done.stderr
            namespaced = harness.cache_obj("m", uri, namespaced=True)
            done = await harness.kubectl_create(namespaced, harness.namespace)
            assert done.returncode != 0
            assert f"{DENIED}spec.sourceModelUri: no download path supports '{uri}'" in (
                done.stderr
            )
        fine = harness.cache_obj("hf", "hf://org/model", namespaced=True)
        done = await harness.kubectl_create(fine, harness.namespace)
        assert done.returncode == 0, done.stderr


async def test_a_storage_container_for_download_jobs_makes_its_scheme_admissible(
    harness: Harness,
) -> None:
    await harness.node_group()
    scheme = f"x{harness.token}"
    name = harness.name("fetcher")
    body = {
        "apiVersion": groupversion.CLUSTER_STORAGE_CONTAINER.api_version,
        "kind": groupversion.CLUSTER_STORAGE_CONTAINER.kind,
        "metadata": {"name": name},
        "spec": {
            "container": {"name": "fetch", "image": "example/fetcher:1"},
            "supportedUriFormats": [{"prefix": f"{scheme}://"}],
            "workloadType": storage.WORKLOAD_LOCAL_MODEL_DOWNLOAD_JOB,
        },
    }
    uri = f"{scheme}://host/model"
    async with harness.validating():
        before = await harness.kubectl_create(
            harness.cache_obj("m", uri, namespaced=True), harness.namespace
        )
        assert before.returncode != 0
        assert "no download path supports" in before.stderr
        containers = harness.hooks.storage_containers
        assert containers is not None
        await harness.client.create(CSC, body)
        harness.cluster_objects.append((CSC, name))
        await wait_until(
            lambda: containers.store.get(ObjectKey("", name)) is not None,
            timeout=15,
            what=f"the webhooks' ClusterStorageContainer informer holds {name}",
        )
        after = await harness.kubectl_create(
            harness.cache_obj("m", uri, namespaced=True), harness.namespace
        )
        assert after.returncode == 0, after.stderr


async def test_a_namespace_cache_with_a_63_character_name_is_admitted(harness: Harness) -> None:
    await harness.node_group()
    async with harness.validating():
        long = harness.cache_obj("m" * 63, "gs://b/long", namespaced=True)
        done = await harness.kubectl_create(long, harness.namespace)
        assert done.returncode == 0, done.stderr
        longer = harness.cache_obj("m" * 240, "gs://b/longer", namespaced=True)
        done = await harness.kubectl_create(longer, harness.namespace)
        assert done.returncode != 0
        assert f"{DENIED}metadata.name: " in done.stderr
